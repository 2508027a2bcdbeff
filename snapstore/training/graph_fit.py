"""`SnapshotCallback` in a graph-mode `fit` (TF1-style Keras).

`tf.keras` on TF 1.15 and 2.15, tf-keras on TF 2.16+ with
TF_USE_LEGACY_KERAS=1, in a program that chose graph mode. Each batch is a
step of `SnapshotHook`'s protocol (`training/hooks.py`), run in
`tf.keras.backend.get_session()` by a `step_keeper.StepKeeper`. The default
store is a device store of the model's weights and its optimizer's state,
built once per graph. Eager-only options (`in_step`, `backoff`) are refused
at `on_train_begin`.
"""

from snapstore._keras import KERAS_3_FIX
from snapstore._tf import tf
from snapstore._keras import uses_keras_3
from snapstore.store import SnapshotStore
from snapstore.training import fit_keeper
from snapstore.training import protocol
from snapstore.training import step_keeper


class GraphFitKeeper(fit_keeper.FitKeeper):
  """Graph mode's keeper: a `StepKeeper` per `fit`, in Keras's session.

  Args:
    options: The callback's `fit_keeper.FitOptions`.

  Raises:
    ValueError: `in_step` or `backoff`, which are for eager `fit`.
  """

  def __init__(self, options):
    super(GraphFitKeeper, self).__init__(options)
    if options.in_step:
      raise ValueError(
        "in_step= is for eager fit; in graph mode, build the train op with "
        "store.slots.snapshot_before(..., if_finite=loss) and train it under "
        "SnapshotHook(store, loss=loss, in_step_tag=tag)."
      )
    if options.backoff is not None:
      raise ValueError(
        "backoff= is for eager fit; in graph mode, lower the learning rate "
        "in on_rollback=, which is called with the session."
      )
    self._stores = step_keeper.StorePerGraph("SnapshotCallback")
    self._steps = None  # this fit's StepKeeper

  @classmethod
  def check_made(cls):
    """Raises RuntimeError where `tf.keras` is Keras 3: no graph mode."""
    if uses_keras_3():
      raise RuntimeError(
        "SnapshotCallback needs TF1-style Keras, but tf.keras is Keras 3 "
        "here, and the callback is being made in graph mode. Keras 3 trains "
        "eagerly: make the callback (and call fit) with eager execution on, "
        "TensorFlow 2's default. For graph mode, %s" % KERAS_3_FIX
      )

  # The store and counts are this fit's StepKeeper's.

  @property
  def store(self):
    return self._steps.store if self._steps else None

  @property
  def snapshots(self):
    return self._steps.snapshots if self._steps else 0

  @property
  def rollbacks(self):
    return self._steps.rollbacks if self._steps else 0

  @property
  def trusted(self):
    return self._steps.trusted if self._steps else None

  def start(self, model, params):
    del params
    options = self.options
    graph = tf.keras.backend.get_session().graph
    factory = options.store if options.store is not None else _keras_store
    store = self._stores.get(options.store, graph, lambda: factory(model))
    self._steps = step_keeper.StepKeeper(
      store,
      tf.train.SecondOrStepTimer(*options.timer_args),
      options.monitor is not None,
      options.max_consecutive_rollbacks,
      options.on_rollback,
    )

  def before_batch(self):
    self._steps.before_step(tf.keras.backend.get_session())

  def after_batch(self, batch, logs):
    del batch
    value = protocol.monitored_value(self.options.monitor, logs)
    self._steps.after_step(tf.keras.backend.get_session(), value)


def _keras_store(model):
  """A device store of the model's weights and its optimizer's state."""
  optimizer = model.optimizer
  var_list = list(model.weights)
  inner = getattr(optimizer, "optimizer", None)
  if isinstance(inner, tf.train.Optimizer):  # Keras's TFOptimizer wrapper
    var_list.append(optimizer.iterations)
    optimizer = inner
  if optimizer is not None and not optimizer.variables():
    optimizer = None  # plain SGD: nothing beyond the weights
  return SnapshotStore(
    var_list=var_list,
    optimizer=optimizer,
    mode="device",
    max_to_keep=2,
    name="snapshot_callback",
  )
