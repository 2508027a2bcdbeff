"""`FitKeeper`: the one interface of what does `SnapshotCallback`'s work in `fit`.

`SnapshotCallback` (`training/keras_callback.py`) is a facade: at each
`on_train_begin` it picks a keeper by the engine `fit` runs on and by
`in_step`, and hands every Keras callback method to it. Each keeper answers
the same calls:

    keeper = Keeper(options)             # once per callback and engine
    keeper.start(model, params)          # on_train_begin (may raise)
    keeper.begin_epoch(epoch)            # on_epoch_begin
    keeper.before_batch()                # on_train_batch_begin
    keeper.after_batch(batch, logs)      # on_train_batch_end (may roll back)
    keeper.end_epoch()                   # on_epoch_end
    keeper.finish()                      # on_train_end
    keeper.store, keeper.snapshots, keeper.rollbacks, keeper.trusted

The keepers: graph mode's (`training/graph_fit.py`), and eagerly the
between-batch keeper (`training/batch_keeper.py`) and the in-step one
(`training/in_step_keeper.py`).
"""

import abc
import collections

# What the callback was given, checked (`SnapshotCallback`'s Args):
#   store: a store, a function `model -> store`, or None (the default store);
#   timer_args: `(every_secs, every_steps)` for tf.train.SecondOrStepTimer,
#     or None in-step;
#   monitor: the batch-log key to check, or None;
#   max_consecutive_rollbacks: an int, or None;
#   on_rollback: a function, or None;
#   backoff: the learning-rate factor at each rollback, or None;
#   in_step: whether the train step takes the snapshots;
#   in_step_tag: the tag pinned to the in-step slot (None unless in_step);
#   in_step_undo: "copy" or "skip".
FitOptions = collections.namedtuple(
  "FitOptions",
  [
    "store",
    "timer_args",
    "monitor",
    "max_consecutive_rollbacks",
    "on_rollback",
    "backoff",
    "in_step",
    "in_step_tag",
    "in_step_undo",
  ],
)


class FitKeeper(abc.ABC):
  """Snapshots and rollbacks for one `SnapshotCallback`, in `fit`.

  Made by the callback at its first `on_train_begin` on an engine and kept
  across `fit` calls on that engine.

  Args:
    options: The callback's `FitOptions`.
  """

  # The store of the current `fit` (None before the first), the snapshots
  # taken and the rollbacks made; each keeper keeps them up to date.
  store = None
  snapshots = 0
  rollbacks = 0

  def __init__(self, options):
    self.options = options

  @classmethod
  def check_made(cls):
    """Refuses making the callback where this keeper could never run."""

  @property
  @abc.abstractmethod
  def trusted(self):
    """The tag a rollback would restore now, or None."""

  @abc.abstractmethod
  def start(self, model, params):
    """`on_train_begin`: checks, then the store for this `fit`.

    Args:
      model: The model `fit` trains.
      params: The callbacks' `params` of this `fit` (one dict per `fit`).
    """

  def begin_epoch(self, epoch):
    """`on_epoch_begin`."""
    del epoch

  def end_epoch(self):
    """`on_epoch_end`."""

  def before_batch(self):
    """`on_train_batch_begin`."""

  @abc.abstractmethod
  def after_batch(self, batch, logs):
    """`on_train_batch_end`: rolls back when the monitored value is not finite.

    Args:
      batch: The index of the batch in its epoch (Keras's `batch`).
      logs: The batch logs.
    """

  def finish(self):
    """`on_train_end`."""
