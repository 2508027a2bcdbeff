"""`snapstore.Lookahead` with a Keras optimizer, on the eager engine.

The trajectory is checked step by step, bit for bit, against a numpy
implementation of Zhang et al.'s rule around plain SGD with fed gradients
(float32 and float64 weights), eagerly and inside a `tf.function`; with
`fit`, the callback is checked against the rule applied to the weights each
batch ends with.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from snapstore import _tf
from snapstore.training.lookahead import KerasLookahead
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values

LR = 0.1


def _layers():
  """A float32 model and a float64 layer: the fast weights."""
  model = common.small_model(seed=2)
  wide = keras.layers.Dense(2, dtype="float64", name="d64")
  wide.build((3,))
  return model, wide


def _numpy_rule(theta, phi, grads, t, k, alpha):
  """One inner SGD step, then Lookahead's synchronization every k steps."""
  for key in theta:
    dtype = theta[key].dtype.type
    theta[key] = theta[key] - grads[key] * dtype(np.float32(LR))
    if t % k == 0:
      phi[key] = phi[key] + dtype(alpha) * (theta[key] - phi[key])
      theta[key] = phi[key].copy()


@pytest.mark.parametrize("inside", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("k,alpha", [(1, 0.5), (3, 0.3), (4, 0.8)])
def test_every_step_equals_the_numpy_rule(k, alpha, inside):
  model, wide = _layers()
  opt = keras.optimizers.SGD(LR)
  var_list = list(model.trainable_variables) + list(wide.trainable_variables)
  lookahead = snapstore.Lookahead(opt, k=k, alpha=alpha, var_list=var_list)
  assert isinstance(lookahead, KerasLookahead)
  store = lookahead.store()
  assert store.slots.pinned() == ["slow"]
  keys = list(store.keys)
  fast = list(store.variables.values())
  assert {v.dtype for v in fast} == {tf.float32, tf.float64}
  by_id = {id(v): key for key, v in store.variables.items()}
  unwrapped = [_tf.keras_variable_value(v) for v in var_list]
  order = [
    by_id[id(v if u is None else u)] for v, u in zip(var_list, unwrapped)
  ]

  def step(*grads):
    opt.apply_gradients(zip(grads, var_list))
    return lookahead.update()

  run = tf.function(step) if inside else step
  theta = dict(zip(keys, values(fast)))
  phi = {key: value.copy() for key, value in theta.items()}
  assert_bits_equal(list(phi.values()), list(store.arrays("slow").values()))
  rng = np.random.RandomState(k)
  traces = None
  for t in range(1, 3 * k + 3):
    grads = {
      key: rng.randn(*theta[key].shape).astype(theta[key].dtype) for key in keys
    }
    synced = run(*[grads[key] for key in order])
    if inside:
      traces = traces or run.experimental_get_tracing_count()
    assert bool(synced) == (t % k == 0)
    sgd_only = {
      key: theta[key] - grads[key] * theta[key].dtype.type(np.float32(LR))
      for key in keys
    }
    _numpy_rule(theta, phi, grads, t, k, alpha)
    if t % k == 0:  # the rule moved the weights: a missed sync would show
      assert any(not np.array_equal(sgd_only[key], theta[key]) for key in keys)
    assert_bits_equal([theta[key] for key in keys], values(fast))
    assert_bits_equal(
      [phi[key] for key in keys], list(store.arrays("slow").values())
    )
  assert int(lookahead.counter.numpy()) == 3 * k + 2
  if inside:
    assert run.experimental_get_tracing_count() == traces


class _Recorder(keras.callbacks.Callback):
  """Records the fast weights each batch ends with."""

  def __init__(self, variables):
    super(_Recorder, self).__init__()
    self.variables = variables
    self.seen = []

  def on_train_batch_end(self, batch, logs=None):
    self.seen.append(values(self.variables))


def test_the_fit_callback_synchronizes_every_k_batches():
  model = common.small_model(seed=3)
  opt = keras.optimizers.SGD(0.05, momentum=0.9)
  model.compile(optimizer=opt, loss="mse")
  k, alpha = 3, 0.5
  lookahead = snapstore.Lookahead(opt, k=k, alpha=alpha, var_list=model)
  fast = list(lookahead.store().variables.values())
  before, after = _Recorder(fast), _Recorder(fast)
  x = np.concatenate([b[0] for b in common.batches(8, seed=2)])
  y = np.concatenate([b[1] for b in common.batches(8, seed=2)])
  phi = values(fast)
  model.fit(
    x,
    y,
    batch_size=16,
    epochs=1,
    shuffle=False,
    verbose=0,
    callbacks=[before, lookahead.callback(), after],
  )
  assert len(before.seen) == len(after.seen) == 8
  for t, (pre, post) in enumerate(zip(before.seen, after.seen), 1):
    if t % k == 0:
      phi = [p + np.float32(alpha) * (q - p) for p, q in zip(phi, pre)]
      assert_bits_equal(phi, post)
    else:
      assert_bits_equal(pre, post)
  assert_bits_equal(phi, list(lookahead.store().arrays("slow").values()))
  assert int(lookahead.counter.numpy()) == 8


def test_evaluate_with_the_slow_weights_and_reset():
  model, wide = _layers()
  opt = keras.optimizers.SGD(LR)
  lookahead = snapstore.Lookahead(opt, k=5, alpha=0.5, var_list=wide)
  grads = [np.full([3, 2], 0.25), np.full([2], -0.5)]
  opt.apply_gradients(zip(grads, wide.trainable_variables))
  lookahead.update()
  slow = list(lookahead.store().arrays("slow").values())
  current = values(wide.trainable_variables)
  fast = list(lookahead.store().variables.values())
  assert_bits_equal(slow, lookahead.evaluate_with(lambda: values(fast)))
  assert_bits_equal(current, values(wide.trainable_variables))
  with pytest.raises(ZeroDivisionError):
    lookahead.evaluate_with(lambda: 1 / 0)
  assert_bits_equal(current, values(wide.trainable_variables))
  lookahead.reset()  # e.g. after loading the weights to start from
  assert int(lookahead.counter.numpy()) == 0
  assert_bits_equal(
    values(fast), list(lookahead.store().arrays("slow").values())
  )


# -- errors --------------------------------------------------------------------


def test_var_list_is_required():
  with pytest.raises(ValueError, match="needs the variables it trains"):
    snapstore.Lookahead(keras.optimizers.SGD(LR), k=2)


def test_use_locking_is_graph_modes():
  _, wide = _layers()
  with pytest.raises(ValueError, match="use_locking=True is for graph mode"):
    snapstore.Lookahead(keras.optimizers.SGD(LR), 2, 0.5, True, var_list=wide)


def test_a_variable_that_is_not_a_float():
  with pytest.raises(ValueError, match="Lookahead trains float variables"):
    snapstore.Lookahead(
      keras.optimizers.SGD(LR), var_list=[tf.Variable(3, name="n")]
    )


def test_not_built_inside_a_tf_function():
  _, wide = _layers()
  opt = keras.optimizers.SGD(LR)

  @tf.function
  def build():
    snapstore.Lookahead(opt, var_list=wide)

  with pytest.raises(snapstore.ModeError, match="cannot be built inside"):
    build()


def test_fit_with_several_steps_per_execution_is_refused():
  model = common.small_model()
  opt = keras.optimizers.SGD(LR)
  model.compile(optimizer=opt, loss="mse", steps_per_execution=2)
  lookahead = snapstore.Lookahead(opt, k=2, var_list=model)
  x, y = common.batches(1)[0]
  with pytest.raises(ValueError, match="steps_per_execution=2"):
    model.fit(x, y, verbose=0, callbacks=[lookahead.callback()])
  assert int(lookahead.counter.numpy()) == 0


def test_fit_with_another_optimizer_is_refused():
  model = common.small_model()
  model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
  lookahead = snapstore.Lookahead(keras.optimizers.SGD(LR), k=2, var_list=model)
  x, y = common.batches(1)[0]
  with pytest.raises(ValueError, match="not the one this Lookahead follows"):
    model.fit(x, y, verbose=0, callbacks=[lookahead.callback()])
