"""What the eager tests share: the Keras in use, models, and bit-exact checks."""

import os

import numpy as np
import pytest
import tensorflow as tf

from snapstore import _tf

# The Keras `tf.keras` is here: Keras 3 (TF 2.16+ without TF_USE_LEGACY_KERAS),
# tf-keras (with it), or TF 2.15's Keras 2.
KERAS_3 = _tf.uses_keras_3()
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


def batches(n, seed=1, nan_at=()):
  rng = np.random.RandomState(seed)
  out = []
  for i in range(n):
    x = rng.rand(16, 3).astype(np.float32)
    y = rng.rand(16, 1).astype(np.float32)
    if i in nan_at:
      x[0, 0] = np.nan
    out.append((x, y))
  return out


def state_variables(model, optimizer):
  """Every variable a bit-exact rollback must restore, unwrapped."""
  out = []
  for v in list(model.variables) + list(_opt_vars(optimizer)):
    inner = _tf.keras_variable_value(v) if KERAS_3 else v
    out.append(inner if inner is not None else v)
  return out


def _opt_vars(optimizer):
  variables = optimizer.variables
  return variables() if callable(variables) else variables


needs_keras_3 = pytest.mark.skipif(
  not KERAS_3, reason="Keras 3 is not tf.keras here (%s)" % KERAS_NAME
)
needs_keras_2 = pytest.mark.skipif(KERAS_3, reason="tf.keras is Keras 3 here")
ON_TF2 = _tf.VERSION[0] >= 2
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
