"""Keras as snapstore meets it: which Keras `tf.keras` is, and Keras's private parts.

TensorFlow 1.15 and 2.15 bring TF1-style Keras (Keras 2) as `tf.keras`;
TensorFlow 2.16+ brings Keras 3, or tf-keras with `TF_USE_LEGACY_KERAS=1`.
This module tells them apart without importing Keras, and is, with
`_tf.py`, the one place that reads private attributes: here Keras's (its
variables' backing `tf.Variable`, a model's layers, an optimizer's state,
what `fit` schedules on), one function each, saying what it is for.
"""

import os

from snapstore._tf import cluster_coordinator
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore._tf import VERSION

KERAS_3_FIX = (
  "Keras 3 has no graph mode: build the store eagerly (without "
  "tf.compat.v1.disable_v2_behavior() and outside tf.Graph().as_default()), "
  "where snapstore's eager engine takes Keras 3 models, variables and "
  "optimizers. For graph mode, use TF1-style Keras: install tf-keras "
  "(`pip install tf-keras`, the version matching TensorFlow) and set "
  "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported."
)


def _keras_major():
  """The major version of the installed `keras` package, or None."""
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top

    return int(metadata.version("keras").split(".")[0])
  except Exception:  # pylint: disable=broad-except
    return None  # no importlib.metadata (Python 3.7), or no keras package


def uses_keras_3():
  """True if `tf.keras` is Keras 3 (TF 2.16+ without TF_USE_LEGACY_KERAS=1).

  Decided as TF's own lazy loader decides, without importing Keras.
  """
  if VERSION < (2, 16):
    return (
      False  # tf.keras is TensorFlow's own Keras 2 (or the keras 2 package)
    )
  if os.environ.get("TF_USE_LEGACY_KERAS", None) in ("true", "True", "1"):
    return False  # tf-keras
  return (
    _keras_major() or 3
  ) >= 3  # no keras package: no TF1-style Keras either


def is_keras_3_object(obj):
  """True for an object of Keras 3: a model, a layer, a `keras.Variable`."""
  return _is_keras_3_class(type(obj))


def _is_keras_3_class(cls):
  return (cls.__module__ or "").split(".")[0] == "keras" and (
    _keras_major() or 0
  ) >= 3


def keras_callback_base():
  """The base class of `SnapshotCallback`: the `Callback` of `tf.keras`.

  TF1-style Keras's (TF 1.15, TF 2.15's Keras 2, tf-keras), whose `fit` runs
  in graph mode or eagerly; or Keras 3's (TF 2.16+ without
  TF_USE_LEGACY_KERAS=1), whose `fit` runs only eagerly (TensorFlow imports
  Keras 3 itself there, so this costs no import). Where neither imports, a
  stand-in whose constructor raises a RuntimeError saying why and how to fix
  it, so that importing snapstore does not fail.
  """
  if uses_keras_3():
    try:
      import keras  # pylint: disable=g-import-not-at-top

      return keras.callbacks.Callback
    except ImportError as e:
      return _no_graph_mode_keras("Keras 3 cannot be imported (%s)" % e)
  try:
    base = tf.keras.callbacks.Callback
  except ImportError as e:  # e.g. TF_USE_LEGACY_KERAS=1 without tf-keras
    return _no_graph_mode_keras("it cannot be imported (%s)" % e)
  if _is_keras_3_class(base):  # TensorFlow chose Keras 3 before snapstore ran
    return _no_graph_mode_keras("tf.keras is Keras 3 here")
  return base


def _no_graph_mode_keras(problem):
  class NoGraphModeKeras(object):
    """Stands in for Keras's Callback where there is no TF1-style Keras."""

    def __init__(self, *args, **kwargs):
      del args, kwargs
      raise RuntimeError(
        "%s needs TF1-style Keras, but %s. %s"
        % (type(self).__name__, problem, KERAS_3_FIX)
      )

  return NoGraphModeKeras


def keras_variable_value(variable):
  """The `tf.Variable` a Keras 3 `keras.Variable` holds, or None if unbuilt.

  `kv.value` is it outside an autocast scope; inside one (a mixed-precision
  layer's `call`) it is a cast tensor, while `kv._value` is always the
  variable (None for a deferred variable not built yet).
  """
  value = getattr(variable, "_value", None)
  if isinstance(value, tf_variables.Variable):
    return value
  value = getattr(variable, "value", None)
  return value if isinstance(value, tf_variables.Variable) else None


# -- private attributes of Keras objects -----------------------------------------
# pylint: disable=protected-access


def keras_layers(model):
  """Every layer of a Keras model, nested ones included
  (`_flatten_layers`, Keras 3 and tf-keras), or []."""
  flatten = getattr(model, "_flatten_layers", None)
  return list(flatten()) if callable(flatten) else []


def keras_trained_variables(opt):
  """The variables a Keras 3 optimizer was built on
  (`_trainable_variables`), or ()."""
  return getattr(opt, "_trainable_variables", None) or ()


def keras_hyperparameters(opt):
  """A tf-keras optimizer's hyperparameters (`_hyper`), {} elsewhere."""
  return getattr(opt, "_hyper", None) or {}


def keras_learning_rate(opt):
  """What a Keras optimizer keeps its learning rate in (`_learning_rate`),
  or None."""
  return getattr(opt, "_learning_rate", None)


def keras_steps_per_execution(model):
  """How many steps a compiled Keras model runs between batch ends: Keras
  3's `steps_per_execution`, or tf-keras's, which keeps it in a variable
  (`_steps_per_execution`); None if it does not say."""
  steps = getattr(model, "steps_per_execution", None)
  if steps is None:
    steps = getattr(model, "_steps_per_execution", None)
  return steps


# -- SnapshotCallback: Keras's fit, read and set here only ----------------------
# pylint: disable=protected-access


def schedules_on_coordinator(strategy):
  """Whether Keras's `fit` schedules the steps of a model under `strategy` on
  a `ClusterCoordinator` (`_should_use_with_coordinator`: True for
  `ParameterServerStrategy` v2; False for None and every other strategy)."""
  return bool(getattr(strategy, "_should_use_with_coordinator", False))


def keras_fit_coordinator(model):
  """The `ClusterCoordinator` Keras's `fit` schedules `model`'s steps on:
  the one tf-keras's `fit` made (`model._cluster_coordinator`, one per
  strategy, before `on_train_begin`), else the strategy's
  (`cluster_coordinator`); None without one."""
  coordinator = getattr(model, "_cluster_coordinator", None)
  if coordinator is None:
    coordinator = cluster_coordinator(model.distribute_strategy)
  return coordinator


def take_tensor_logs(callback, take):
  """Whether tf-keras hands a callback's batch hooks the logs as they come
  (tensors; a `RemoteValue` under `ParameterServerStrategy` v2, whose `fit`
  refuses batch hooks of a callback that does not take them so) rather
  than as numpy values (`Callback._supports_tf_logs`)."""
  callback._supports_tf_logs = bool(take)


# pylint: enable=protected-access
