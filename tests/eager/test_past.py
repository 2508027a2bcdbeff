"""`store.slots.past(fn, slot)` eagerly: `fn` computed from a slot, no copy.

Every value is checked against the same function on a separate model (or
separate variables) holding the slot's values, bit for bit, eagerly and
inside a `tf.function`; gradients too (to the inputs; none to the current
variables).
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras


def _mlp(seed, name=None):
  keras.utils.set_random_seed(seed)
  return keras.Sequential(
    [
      keras.Input((5,)),
      keras.layers.Dense(16, activation="relu"),
      keras.layers.BatchNormalization(),
      keras.layers.Dense(16, activation="tanh"),
      keras.layers.Dense(3),
    ],
    name=name,
  )


def _cnn(seed, name=None):
  keras.utils.set_random_seed(seed)
  return keras.Sequential(
    [
      keras.Input((8, 8, 2)),
      keras.layers.Conv2D(4, 3, activation="relu"),
      keras.layers.Flatten(),
      keras.layers.Dense(2, activation="softmax"),
    ],
    name=name,
  )


def _inputs(model, seed=3):
  shape = (7,) + tuple(model.inputs[0].shape[1:])
  return tf.constant(np.random.RandomState(seed).randn(*shape), tf.float32)


def _store_with_target(make):
  """(online, target, store): `store` over `online`, its slot 0 holding
  `target`'s values (built by the same code, independently initialised)."""
  online, target = make(1), make(2)
  store = snapstore.SnapshotStore(var_list=online, mode="device")
  store.slots.pin(0, "target")
  store.load_arrays(target, tag="target")
  return online, target, store


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_past_is_the_separate_model_bit_for_bit_eagerly(make):
  online, target, store = _store_with_target(make)
  past = store.slots.past(lambda x: online(x, training=False), 0)
  x = _inputs(online)
  expected = target(x, training=False).numpy()
  assert not np.array_equal(online(x, training=False).numpy(), expected)
  assert_bits_equal([expected], [past(x).numpy()])


@pytest.mark.parametrize("make", [_mlp, _cnn], ids=["mlp", "cnn"])
def test_past_is_the_separate_model_bit_for_bit_inside_a_function(make):
  online, target, store = _store_with_target(make)
  past = store.slots.past(lambda x: online(x, training=False), 0)

  @tf.function
  def both(x):
    return target(x, training=False), past(x)

  @tf.function
  def current(x):
    return online(x, training=False)

  x = _inputs(online)
  expected, got = both(x)
  assert_bits_equal([expected.numpy()], [got.numpy()])
  assert not np.array_equal(current(x).numpy(), got.numpy())


@pytest.mark.parametrize(
  "in_function", [False, True], ids=["eager", "function"]
)
def test_gradients_flow_to_the_inputs_as_through_the_separate_model(
  in_function,
):
  online, target, store = _store_with_target(_mlp)
  past = store.slots.past(lambda x: online(x, training=False), 0)

  def grads(x):
    with tf.GradientTape(persistent=True) as tape:
      tape.watch(x)
      expected = tf.reduce_sum(tf.square(target(x, training=False)))
      got = tf.reduce_sum(tf.square(past(x)))
    to_online = tape.gradient(got, online.trainable_variables)
    return (
      tape.gradient(expected, x),
      tape.gradient(got, x),
      [g is None for g in to_online],
    )

  if in_function:
    grads = tf.function(grads)
  expected, got, none = grads(_inputs(online))
  assert_bits_equal([expected.numpy()], [got.numpy()])
  assert all(bool(n) for n in none)


def test_a_tape_is_told_nothing_of_the_current_variables():
  online, _, store = _store_with_target(_mlp)
  past = store.slots.past(lambda x: online(x, training=False), 0)
  x = _inputs(online)
  past(x)  # traced (TensorFlow tells tapes of every read while it traces)
  with tf.GradientTape() as tape:
    past(x)
  assert tape.watched_variables() == ()


def test_past_reads_the_slot_when_it_runs_without_retracing():
  online, _, store = _store_with_target(_mlp)
  past = store.slots.past(lambda x: online(x, training=False), 0)
  step = tf.function(lambda x: past(x))
  x = _inputs(online)
  before = step(x).numpy()
  store.snapshot("target")  # the slot now holds the online values
  after = step(x).numpy()
  on_online = tf.function(lambda x: online(x, training=False))
  assert_bits_equal([on_online(x).numpy()], [after])
  assert not np.array_equal(before, after)
  traces = past.function.experimental_get_tracing_count()
  for _ in range(3):
    step(x)
    past(x)
  assert_bits_equal([online(x, training=False).numpy()], [past(x).numpy()])
  assert past.function.experimental_get_tracing_count() == traces
  assert step.experimental_get_tracing_count() == 1


def test_past_of_a_module_and_of_plain_variables():
  class Net(tf.Module):
    def __init__(self, seed):
      super(Net, self).__init__()
      rng = np.random.RandomState(seed)
      self.w = tf.Variable(rng.randn(4, 3).astype(np.float32))
      self.b = tf.Variable(rng.randn(3).astype(np.float32))

    def __call__(self, x):
      return tf.nn.relu(tf.matmul(x, self.w) + self.b)

  online, other = Net(0), Net(1)
  x = tf.constant(np.random.RandomState(2).randn(6, 4), tf.float32)
  for var_list, source in (
    (online, other),
    ([online.w, online.b], [other.w, other.b]),
  ):
    store = snapstore.SnapshotStore(var_list=var_list, name="net")
    store.slots.pin(0, "target")
    store.load_arrays(source, tag="target")
    past = store.slots.past(online, 0)
    assert_bits_equal([other(x).numpy()], [past(x).numpy()])
    assert_bits_equal(
      [other(x).numpy()], [tf.function(lambda x: past(x))(x).numpy()]
    )
    store.close()


def test_past_of_a_tf_function_that_already_ran_reads_the_slot():
  online, target, store = _store_with_target(_mlp)
  act = tf.function(lambda x: online(x, training=False))
  x = _inputs(online)
  act(x)  # traced with the current variables
  past = store.slots.past(act, 0)
  on_target = tf.function(lambda x: target(x, training=False))
  assert_bits_equal([on_target(x).numpy()], [past(x).numpy()])
  current = act(x).numpy()  # act itself still reads the current variables
  assert not np.array_equal(current, past(x).numpy())
  assert_bits_equal(
    [tf.function(lambda x: online(x, training=False))(x).numpy()], [current]
  )


def test_a_function_that_writes_a_covered_variable_is_refused():
  online, _, store = _store_with_target(_mlp)
  before = common.values(store.slots.shadows(0).values())
  past = store.slots.past(lambda x: online(x, training=True), 0)
  with pytest.raises(ValueError, match=r"writes variables of the store \("):
    past(_inputs(online))
  assert_bits_equal(before, common.values(store.slots.shadows(0).values()))


def test_a_function_that_creates_variables_is_refused():
  online, _, store = _store_with_target(_mlp)
  late = keras.layers.Dense(2)  # not built: its first call makes variables
  past = store.slots.past(lambda x: late(online(x, training=False)), 0)
  with pytest.raises(ValueError, match="creates a variable"):
    past(_inputs(online))


def test_tensors_are_refused_with_the_eager_way():
  online, _, store = _store_with_target(_mlp)
  with pytest.raises(TypeError, match="takes a function of the model"):
    store.slots.past(online(_inputs(online)), 0)


def test_a_slot_that_does_not_exist_is_refused():
  online, _, store = _store_with_target(_mlp)
  with pytest.raises(ValueError, match="slot"):
    store.slots.past(lambda x: online(x), 1)


def test_past_under_mirrored_strategy_equals_the_target_on_every_replica():
  strategy = common.mirrored()
  with strategy.scope():
    online, target = _mlp(1), _mlp(2)
  store = snapstore.SnapshotStore(var_list=online, mode="device")
  store.slots.pin(0, "target")
  store.load_arrays(target, tag="target")
  past = store.slots.past(lambda x: online(x, training=False), 0)
  x = _inputs(online)

  @tf.function
  def replicas(x):
    return strategy.run(
      lambda x: (target(x, training=False), past(x)), args=(x,)
    )

  expected, got = replicas(x)
  for e, g in zip(
    strategy.experimental_local_results(expected),
    strategy.experimental_local_results(got),
  ):
    assert_bits_equal([e.numpy()], [g.numpy()])
  assert_bits_equal([target(x, training=False).numpy()], [past(x).numpy()])
