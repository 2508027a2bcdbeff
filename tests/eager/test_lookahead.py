"""`snapstore.KerasLookahead`: Lookahead next to a Keras optimizer, eagerly.

The trajectory is checked step by step, bit for bit, against a numpy
implementation of Zhang et al.'s rule around plain SGD with fed gradients
(float32 and float64 weights), eagerly and inside a `tf.function`; with
`fit`, the callback is checked against the rule applied to the weights each
batch ends with.
"""

import re
import warnings

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from snapstore import _keras
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
  lookahead = snapstore.KerasLookahead(opt, k=k, alpha=alpha, var_list=var_list)
  assert isinstance(lookahead, snapstore.KerasLookahead)
  store = lookahead.store()
  assert store.slots.pinned() == ["slow"]
  keys = list(store.keys)
  fast = list(store.variables.values())
  assert {v.dtype for v in fast} == {tf.float32, tf.float64}
  by_id = {id(v): key for key, v in store.variables.items()}
  unwrapped = [_keras.keras_variable_value(v) for v in var_list]
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
  lookahead = snapstore.KerasLookahead(opt, k=k, alpha=alpha, var_list=model)
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
  lookahead = snapstore.KerasLookahead(opt, k=5, alpha=0.5, var_list=wide)
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


# -- with SnapshotCallback: a rolled-back batch never happened for Lookahead ----

B, NB = 16, 8  # batch size, batches per epoch
BAD = 3


def _fit_data(bad=None):
  """NB batches; batch `bad` (if any) has a NaN example, or is left out."""
  rng = np.random.RandomState(0)
  x = rng.randn(B * NB, 3).astype(np.float32)
  y = np.tanh(x @ rng.randn(3, 1)).astype(np.float32)
  if bad == "nan":
    common.spoil(x, y, BAD * B)
  elif bad == "left_out":
    keep = np.r_[0 : BAD * B, (BAD + 1) * B : B * NB]
    x, y = x[keep], y[keep]
  return x, y


def _lookahead_fit(data, snapshot_callback=None, order="snapshot_first"):
  """A 2-epoch fit of Adam with Lookahead(k=2): the state it ends with."""
  model = common.small_model(seed=3)
  opt = keras.optimizers.Adam(0.01)
  model.compile(optimizer=opt, loss="mse", metrics=["mae"])
  lookahead = snapstore.KerasLookahead(opt, k=2, alpha=0.5, var_list=model)
  callbacks = [lookahead.callback()]
  if snapshot_callback is not None:
    if order == "snapshot_first":
      callbacks.insert(0, snapshot_callback)
    else:
      callbacks.append(snapshot_callback)
  model.fit(
    *data,
    batch_size=B,
    epochs=2,
    shuffle=False,
    verbose=0,
    callbacks=callbacks,
  )
  slow = list(lookahead.store().arrays("slow").values())
  state = values(common.state_variables(model, opt))
  return state, slow, int(lookahead.counter.numpy())


HOW = {
  "every_batch": dict(every_n_batches=1),
  "in_step_copy": dict(in_step=True),
  "in_step_skip": dict(in_step=True, in_step_undo="skip"),
}


@pytest.mark.parametrize("order", ["snapshot_first", "lookahead_first"])
@pytest.mark.parametrize("how", sorted(HOW))
def test_a_rolled_back_batch_never_happened_for_lookahead(how, order):
  # Lookahead counted the rolled-back batch (16 instead of 14) and synced
  # from it; listed first, it synced the slow weights from the NaN weights
  # before the rollback, which left them NaN.
  if how == "in_step_skip":
    # The gated update rounds otherwise than an ungated one: the reference
    # is the same program (as in test_callback.py).
    reference = _fit_data("left_out"), snapstore.SnapshotCallback(**HOW[how])
  else:
    reference = _fit_data("left_out"), None
  state, slow, counter = _lookahead_fit(*reference, order=order)
  assert counter == 2 * (NB - 1)
  callback = snapstore.SnapshotCallback(**HOW[how])
  got_state, got_slow, got_counter = _lookahead_fit(
    _fit_data("nan"), callback, order
  )
  assert callback.rollbacks == 2  # the NaN batch, in each epoch
  assert got_counter == counter
  assert all(np.all(np.isfinite(a)) for a in got_slow)
  assert_bits_equal(slow, got_slow)
  assert len(state) > 20  # weights, Adam's slots and iterations
  assert_bits_equal(state, got_state)


def _compiled_with_lookahead():
  model = common.small_model(seed=3)
  opt = keras.optimizers.Adam(0.01)
  model.compile(optimizer=opt, loss="mse", metrics=["mae"])
  return model, snapstore.KerasLookahead(opt, k=2, alpha=0.5, var_list=model)


class _AtBatchBegin(keras.callbacks.Callback):
  """The weights and Lookahead's state at the start of every batch."""

  def __init__(self, lookahead):
    super(_AtBatchBegin, self).__init__()
    slow = lookahead.store().slots.shadows(0).values()
    self.variables = [lookahead.counter] + list(slow)
    self.seen = []

  def on_train_batch_begin(self, batch, logs=None):
    state = common.state_variables(self.model, self.model.optimizer)
    self.seen.append(values(self.variables + state))


@pytest.mark.parametrize("order", ["snapshot_first", "lookahead_first"])
def test_a_rollback_over_several_batches_takes_lookahead_back_too(order):
  # Snapshots before batches 0, 3, 6; batch 4 is NaN: back to the start of
  # batch 3, which Lookahead had counted (3 -> 4) and synced after (k=2).
  model, lookahead = _compiled_with_lookahead()
  recorder = _AtBatchBegin(lookahead)
  snapshots = snapstore.SnapshotCallback(every_n_batches=3)
  callbacks = [snapshots, lookahead.callback()]
  if order == "lookahead_first":
    callbacks.reverse()
  x, y = _fit_data()
  common.spoil(x, y, 4 * B)
  model.fit(
    x,
    y,
    batch_size=B,
    epochs=1,
    shuffle=False,
    verbose=0,
    callbacks=callbacks + [recorder],
  )
  assert snapshots.rollbacks == 1
  # The counter at the start of each batch: batch 4 undone with batch 3.
  assert [int(seen[0]) for seen in recorder.seen] == [0, 1, 2, 3, 4, 3, 4, 5]
  slow = slice(1, len(recorder.variables))
  moved = zip(recorder.seen[3][slow], recorder.seen[4][slow])
  assert any(a.tobytes() != b.tobytes() for a, b in moved)  # the sync
  assert_bits_equal(recorder.seen[3], recorder.seen[5])
  assert int(lookahead.counter.numpy()) == 6  # 8 batches, 2 undone


# -- the class, and the old spelling -----------------------------------------------


def test_keras_lookahead_is_not_an_optimizer_wrapper():
  _, wide = _layers()
  lookahead = snapstore.KerasLookahead(keras.optimizers.SGD(LR), var_list=wide)
  assert isinstance(lookahead, snapstore.KerasLookahead)
  assert not isinstance(lookahead, snapstore.Lookahead)
  assert not isinstance(lookahead, tf.compat.v1.train.Optimizer)


def test_lookahead_of_a_keras_optimizer_is_deprecated():
  # For one release, snapstore.Lookahead(keras_optimizer) still makes a
  # KerasLookahead, warning with the new spelling at the caller's line.
  _, wide = _layers()
  opt = keras.optimizers.SGD(LR)
  with pytest.warns(DeprecationWarning) as caught:
    lookahead = snapstore.Lookahead(opt, 3, 0.25, name="old", var_list=wide)
  caught = [w for w in caught if "snapstore" in str(w.message)]
  assert len(caught) == 1
  assert re.search(
    r"snapstore.Lookahead\(keras_optimizer, \.\.\.\) is deprecated.*"
    r"use snapstore.KerasLookahead\(keras_optimizer, k, alpha, "
    r"var_list=model\)",
    str(caught[0].message),
  )
  assert caught[0].filename == __file__
  assert type(lookahead) is snapstore.KerasLookahead
  assert (lookahead.optimizer, lookahead.k, lookahead.alpha) == (opt, 3, 0.25)
  assert list(lookahead.variables())[0] == "old/counter"


def test_lookahead_of_a_tf_train_optimizer_is_not_deprecated():
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    opt = snapstore.Lookahead(tf.compat.v1.train.GradientDescentOptimizer(LR))
  assert isinstance(opt, snapstore.Lookahead)


def test_keras_lookahead_refuses_a_tf_train_optimizer():
  _, wide = _layers()
  with pytest.raises(TypeError, match="use snapstore.Lookahead"):
    snapstore.KerasLookahead(
      tf.compat.v1.train.GradientDescentOptimizer(LR), var_list=wide
    )


# -- errors --------------------------------------------------------------------


def test_var_list_is_required():
  with pytest.raises(ValueError, match="needs the variables it trains"):
    snapstore.KerasLookahead(keras.optimizers.SGD(LR), k=2)


def test_use_locking_is_graph_modes():
  _, wide = _layers()
  with pytest.raises(ValueError, match="use_locking=True is for graph mode"):
    snapstore.KerasLookahead(
      keras.optimizers.SGD(LR), 2, 0.5, True, var_list=wide
    )


def test_a_variable_that_is_not_a_float():
  with pytest.raises(ValueError, match="Lookahead trains float variables"):
    snapstore.KerasLookahead(
      keras.optimizers.SGD(LR), var_list=[tf.Variable(3, name="n")]
    )


def test_not_built_inside_a_tf_function():
  _, wide = _layers()
  opt = keras.optimizers.SGD(LR)

  @tf.function
  def build():
    snapstore.KerasLookahead(opt, var_list=wide)

  with pytest.raises(snapstore.ModeError, match="cannot be built inside"):
    build()


def test_fit_with_several_steps_per_execution_is_refused():
  model = common.small_model()
  opt = keras.optimizers.SGD(LR)
  model.compile(optimizer=opt, loss="mse", steps_per_execution=2)
  lookahead = snapstore.KerasLookahead(opt, k=2, var_list=model)
  x, y = common.batches(1)[0]
  with pytest.raises(ValueError, match="steps_per_execution=2"):
    model.fit(x, y, verbose=0, callbacks=[lookahead.callback()])
  assert int(lookahead.counter.numpy()) == 0


def test_fit_with_another_optimizer_is_refused():
  model = common.small_model()
  model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
  lookahead = snapstore.KerasLookahead(
    keras.optimizers.SGD(LR), k=2, var_list=model
  )
  x, y = common.batches(1)[0]
  with pytest.raises(ValueError, match="not the one this Lookahead follows"):
    model.fit(x, y, verbose=0, callbacks=[lookahead.callback()])


def _fit_once(model, callbacks, data=None):
  model.fit(
    *(data or _fit_data()),
    batch_size=B,
    epochs=1,
    shuffle=False,
    verbose=0,
    callbacks=callbacks,
  )


@pytest.mark.parametrize("given", ["store", "function"])
@pytest.mark.parametrize("how", ["every_batch", "in_step_copy"])
def test_a_store_of_your_own_without_lookaheads_state_is_refused(how, given):
  model, lookahead = _compiled_with_lookahead()
  store = snapstore.SnapshotStore(var_list=model, optimizer=model.optimizer)
  if given == "function":
    store = lambda model, store=store: store  # noqa: E731
  callback = snapstore.SnapshotCallback(store, **HOW[how])
  before = values(model.weights)
  with pytest.raises(
    ValueError,
    match=r"store 'snapstore' does not cover the state that "
    r"LookaheadCallback keeps in this fit \(Lookahead/counter, "
    r"Lookahead/slow/.*store=None.*lookahead.variables\(\)",
  ):
    _fit_once(model, [callback, lookahead.callback()])
  assert int(lookahead.counter.numpy()) == 0
  assert_bits_equal(before, values(model.weights))
  assert "train_step" not in vars(model)  # in-step: its wrapper taken off


@pytest.mark.parametrize("how", ["every_batch", "in_step_copy"])
def test_a_store_of_your_own_with_lookaheads_state_rolls_it_back(how):
  reference, lookahead = _compiled_with_lookahead()
  _fit_once(reference, [lookahead.callback()], _fit_data("left_out"))
  expected = list(lookahead.store().arrays("slow").values())
  model, lookahead = _compiled_with_lookahead()
  full = snapstore.SnapshotStore(var_list=model, optimizer=model.optimizer)
  store = snapstore.SnapshotStore(
    var_list=dict(full.variables, **lookahead.variables()), max_to_keep=2
  )
  callback = snapstore.SnapshotCallback(store, **HOW[how])
  _fit_once(model, [lookahead.callback(), callback], _fit_data("nan"))
  assert callback.rollbacks == 1
  assert int(lookahead.counter.numpy()) == NB - 1
  assert_bits_equal(expected, list(lookahead.store().arrays("slow").values()))
  assert_bits_equal(values(reference.weights), values(model.weights))


def test_two_snapshot_callbacks_with_one_lookahead_are_refused():
  model, lookahead = _compiled_with_lookahead()
  callbacks = [
    snapstore.SnapshotCallback(every_n_batches=1),
    lookahead.callback(),
    snapstore.SnapshotCallback(every_n_batches=2),
  ]
  with pytest.raises(
    ValueError,
    match="LookaheadCallback follows the rollbacks of one SnapshotCallback, "
    "but this fit has two.*Pass fit one SnapshotCallback",
  ):
    _fit_once(model, callbacks)
  assert int(lookahead.counter.numpy()) == 0


def test_each_fit_pairs_only_its_own_callbacks():
  # A Lookahead callback and a SnapshotCallback of an earlier fit are not
  # paired in a later one: alone, Lookahead counts every batch itself, and
  # a SnapshotCallback alone no longer steps it.
  model, lookahead = _compiled_with_lookahead()
  follower = lookahead.callback()
  snapshots = snapstore.SnapshotCallback(every_n_batches=1)
  _fit_once(model, [follower, snapshots])
  assert int(lookahead.counter.numpy()) == NB
  _fit_once(model, [follower])
  assert int(lookahead.counter.numpy()) == 2 * NB
  _fit_once(model, [snapshots])
  assert int(lookahead.counter.numpy()) == 2 * NB
