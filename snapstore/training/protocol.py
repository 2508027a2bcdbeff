"""What `SnapshotHook` and `SnapshotCallback` share, on either engine.

Both take a snapshot every N steps (batches) or seconds, trust it once the
loss of the step it was taken before is finite, and roll back to the newest
trusted snapshot when a loss is not (the protocol: `training/hooks.py`). This
module holds what they have in common: checking the options they share, the
counts they report (`Protocol`), and reading the value to check from Keras's
batch logs (`monitored_value`).

    class SnapshotHook(protocol.Protocol, tf.train.SessionRunHook):
      def __init__(self, store, every_n_steps=None, ...):
        self._configure(store, False, every_n_steps, every_n_secs,
                        "every_n_steps", max_consecutive_rollbacks, on_rollback)
"""

from snapstore.core import checks
from snapstore.store import SnapshotStore


class Protocol(object):
  """The options and counts `SnapshotHook` and `SnapshotCallback` share.

  A subclass calls `_configure` in its constructor and sets `self._keeper`,
  the object doing the work (with `store`, `rollbacks`, `snapshots` and
  `trusted`), when training starts.
  """

  def _configure(
    self,
    store,
    allow_none,
    every_n_steps,
    every_n_secs,
    steps_name,
    max_consecutive_rollbacks,
    on_rollback,
    timed=True,
  ):
    """Checks and keeps the shared options.

    Args:
      store: A `SnapshotStore`, a function returning one, or (if
        `allow_none`) None.
      allow_none: Whether `store` may be None (a default store).
      every_n_steps: The period in steps, or None.
      every_n_secs: The period in seconds, or None.
      steps_name: The name of `every_n_steps` in the subclass, for messages.
      max_consecutive_rollbacks: An int >= 0, or None.
      on_rollback: A function, or None.
      timed: False when no period applies (in-step snapshots).

    Raises:
      TypeError: A bad `store` or `on_rollback`.
      ValueError: A bad period or `max_consecutive_rollbacks`.
    """
    if not (
      isinstance(store, SnapshotStore)
      or callable(store)
      or (allow_none and store is None)
    ):
      raise TypeError(
        "store must be a SnapshotStore, a function returning "
        "one%s, got %r." % (" or None" if allow_none else "", store)
      )
    self._timer_args = (
      timer_args(every_n_steps, every_n_secs, steps_name) if timed else None
    )
    if max_consecutive_rollbacks is not None:
      checks.integer(max_consecutive_rollbacks, "max_consecutive_rollbacks", 0)
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = checks.function(on_rollback, "on_rollback")
    self._keeper = None

  @property
  def store(self):
    """The store, once training has started (None before)."""
    return self._keeper.store if self._keeper else None

  @property
  def rollbacks(self):
    """Rollbacks since training started."""
    return self._keeper.rollbacks if self._keeper else 0

  @property
  def snapshots(self):
    """Snapshots taken since training started (0 when the train step
    takes them: `in_step_tag`, `in_step`)."""
    return self._keeper.snapshots if self._keeper else 0

  @property
  def trusted(self):
    """Tag of the newest snapshot known to give a finite loss (or None)."""
    return self._keeper.trusted if self._keeper else None


def timer_args(every_n_steps, every_n_secs, steps_name):
  """`(every_secs, every_steps)` for `tf.train.SecondOrStepTimer`, checked.

  Raises:
    ValueError: Both or neither given, or a value that is not > 0.
  """
  if (every_n_steps is None) == (every_n_secs is None):
    raise ValueError("Pass exactly one of %s and every_n_secs." % steps_name)
  if every_n_steps is not None:
    return None, checks.integer(every_n_steps, steps_name, 1)
  if checks.number(every_n_secs, "every_n_secs") <= 0:
    raise ValueError("every_n_secs must be > 0, got %r." % (every_n_secs,))
  return float(every_n_secs), None


def monitored_value(monitor, logs):
  """`logs[monitor]` (None without a monitor), for both engines' callbacks.

  Raises:
    ValueError: The logs have no `monitor`.
  """
  if monitor is None:
    return None
  if not logs or monitor not in logs:
    raise ValueError(
      "The batch logs have no %r to check (they have %s); "
      "pass monitor= one of them, or None." % (monitor, sorted(logs or ()))
    )
  return logs[monitor]
