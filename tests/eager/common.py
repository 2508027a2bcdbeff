"""What the eager tests share: the Keras in use, models, and bit-exact checks."""

import os

import numpy as np
import pytest
import tensorflow as tf

from snapstore import _tf

from snapstore import _keras

# The Keras `tf.keras` is here: Keras 3 (TF 2.16+ without TF_USE_LEGACY_KERAS),
# tf-keras (with it), or TF 2.15's Keras 2.
KERAS_3 = _keras.uses_keras_3()
if KERAS_3:
  import keras  # pylint: disable=g-import-not-at-top
else:
  keras = tf.keras
KERAS_NAME = "keras3" if KERAS_3 else "keras2"

MODES = ["device", "host", "disk"]


def mode_options(mode, tmp_path):
  if mode == "disk":
    return dict(spill_path=str(tmp_path / "spill.h5"), memory_budget=0)
  return {}


def values(variables):
  """Copies of the variables' values, as numpy arrays."""
  return [np.array(v.numpy(), copy=True) for v in variables]


def assert_bits_equal(expected, actual):
  """Bit-for-bit equality of two lists of arrays (NaN payloads, -0.0)."""
  assert len(expected) == len(actual)
  for i, (a, b) in enumerate(zip(expected, actual)):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, i
    assert a.tobytes() == b.tobytes(), "array %d differs" % i


def small_model(seed=0, dropout=False):
  """Dense - BatchNorm - [Dropout] - Dense, built, with fixed weights."""
  keras.utils.set_random_seed(seed)
  layers = [
    keras.Input((3,)),
    keras.layers.Dense(8, activation="relu", name="d1"),
    keras.layers.BatchNormalization(name="bn"),
  ]
  if dropout:
    layers.append(keras.layers.Dropout(0.3, seed=seed, name="drop"))
  layers.append(keras.layers.Dense(1, name="out"))
  return keras.Sequential(layers, name="net")


def actor(seed, width):
  """A 3 -> 1 DDPG actor, Dense(width) - tanh, with fixed weights."""
  keras.utils.set_random_seed(seed)
  return keras.Sequential(
    [
      keras.Input((3,)),
      keras.layers.Dense(width, activation="relu"),
      keras.layers.Dense(1, activation="tanh"),
    ]
  )


def critic(seed, width):
  """A (state 3, action 1) -> Q critic, Dense(width), with fixed weights."""
  keras.utils.set_random_seed(seed)
  state = keras.Input((3,))
  action = keras.Input((1,))
  hidden = keras.layers.Dense(width, activation="relu")(
    keras.layers.Concatenate()([state, action])
  )
  return keras.Model([state, action], keras.layers.Dense(1)(hidden))


def transitions(n, batch, seed=4):
  """`n` batches of (state, action, reward, next state) for the DDPG nets."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    s = rng.randn(batch, 3).astype(np.float32)
    a = rng.uniform(-1, 1, (batch, 1)).astype(np.float32)
    r = rng.randn(batch, 1).astype(np.float32)
    s2 = rng.randn(batch, 3).astype(np.float32)
    out.append(tuple(tf.constant(x) for x in (s, a, r, s2)))
  return out


def batches(n, seed=1, nan_at=()):
  rng = np.random.RandomState(seed)
  out = []
  for i in range(n):
    x = rng.rand(16, 3).astype(np.float32)
    y = rng.rand(16, 1).astype(np.float32)
    if i in nan_at:
      spoil(x, y, 0)
    out.append((x, y))
  return out


def spoil(x, y, rows):
  """Makes the examples `rows` of (x, y) NaN, in place: their loss is NaN.

  The target too, not only the input: on a CPU where TensorFlow runs oneDNN,
  a traced Dense layer with a ReLU (one fused kernel) can turn a NaN input
  into 0s, so that the loss of a NaN input alone is finite while its
  gradient is NaN (an update that makes the weights NaN, not a NaN loss).
  """
  x[rows, 0] = np.nan
  y[rows, 0] = np.nan


def mse(y, prediction):
  """The mean squared error, a scalar."""
  return tf.reduce_mean(tf.square(prediction - y))


def keras_mse():
  """Keras's mean squared error, reduced to a scalar (Keras 3 reduces it
  itself; Keras 2's "none" gives one per example, averaged here)."""
  loss = keras.losses.MeanSquaredError(
    reduction="sum_over_batch_size" if KERAS_3 else "none"
  )
  return lambda y, prediction: tf.reduce_mean(loss(y, prediction))


def replicated_step(
  strategy, model, optimizer, loss=mse, reduce=False, in_step=None
):
  """A `tf.function` train step `step(x, y)` run on every replica.

  Each replica computes `loss(y, model(x))` under a GradientTape and calls
  `optimizer.apply_gradients` inside `strategy.run` (the optimizer
  all-reduces the gradients).

  Args:
    strategy: The `tf.distribute` strategy the model was made under.
    model: The Keras model.
    optimizer: Its Keras optimizer.
    loss: `loss(y, prediction)`, a scalar tensor.
    reduce: Return the SUM of the replicas' losses instead of the
      per-replica losses.
    in_step: An `InStepSnapshot` (`store.slots.snapshot_in_step()`): each
      replica begins it at the top of its step and commits it after the
      update, if its loss is finite.

  Returns:
    The step function.
  """

  @tf.function
  def step(x, y):
    def replica(x, y):
      start = in_step.begin() if in_step is not None else None
      with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
      grads = tape.gradient(value, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      if start is not None:
        start.commit(if_finite=value)
      return value

    losses = strategy.run(replica, args=(x, y))
    if reduce:
      return strategy.reduce("SUM", losses, axis=None)
    return losses

  return step


def state_variables(model, optimizer):
  """Every variable a bit-exact rollback must restore, unwrapped."""
  out = []
  for v in list(model.variables) + list(_opt_vars(optimizer)):
    inner = _keras.keras_variable_value(v) if KERAS_3 else v
    out.append(inner if inner is not None else v)
  return out + optimizer_extras(optimizer, out)


def _opt_vars(optimizer):
  variables = optimizer.variables
  return variables() if callable(variables) else variables


# Hyperparameters (set by the user, never by a step; a legacy optimizer keeps
# each in a variable), which a rollback leaves alone.
_HYPERPARAMETERS = frozenset(
  ["learning_rate", "beta_1", "beta_2", "decay", "momentum", "rho", "epsilon"]
)


def loss_scale_optimizer(inner):
  """Keras's LossScaleOptimizer around `inner` (Keras 3 or tf-keras)."""
  if KERAS_3:
    return keras.optimizers.LossScaleOptimizer(inner)
  return keras.mixed_precision.LossScaleOptimizer(inner)


def optimizer_extras(optimizer, listed=()):
  """The `tf.Variable`s a checkpoint of `optimizer` saves beyond `listed`
  (its `variables`), hyperparameters left out: tf-keras keeps a
  LossScaleOptimizer's loss scale and Nadam's momentum product there."""
  known = set(id(v) for v in listed)
  out = []
  for obj in tf.train.TrackableView(optimizer).descendants():
    if not isinstance(obj, tf.Variable) or id(obj) in known:
      continue
    if obj.name.split(":")[0].split("/")[-1] in _HYPERPARAMETERS:
      continue
    known.add(id(obj))
    out.append(obj)
  return out


needs_keras_3 = pytest.mark.skipif(
  not KERAS_3, reason="Keras 3 is not tf.keras here (%s)" % KERAS_NAME
)
needs_keras_2 = pytest.mark.skipif(KERAS_3, reason="tf.keras is Keras 3 here")
ON_TF2 = _tf.VERSION[0] >= 2
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


_MIRRORED = {}


def mirrored(devices=("/cpu:0", "/cpu:1")):
  """The process's one MirroredStrategy over `devices` (made on first use).

  TensorFlow numbers the collectives of every MirroredStrategy object from
  the same keys, and the process's collective executor keeps what it
  learned of each: two strategies' all-reduces of different shapes can meet
  on one key ("Shape mismatch in the collective instance"), after which
  every later collective of the process aborts (README, "One
  MirroredStrategy per process"). So tests share one per device list.
  """
  key = tuple(devices)
  if key not in _MIRRORED:
    _MIRRORED[key] = tf.distribute.MirroredStrategy(list(devices))
  return _MIRRORED[key]
