"""Graph mode: the snapshots and rollbacks of a training loop, step by step.

`StepKeeper` does the work of `SnapshotHook` and of `SnapshotCallback` in a
graph-mode `fit`: before a step it takes a snapshot when the timer says so
(or, in-step, counts on the train op's own copy), and after the step it
trusts that snapshot if the loss is finite, or restores the newest trusted
one (the protocol: `training/hooks.py`). Every call runs in the session it
is given. `StorePerGraph` builds a store from a function once per graph.

    keeper = StepKeeper(store, timer, watching=True,
                        max_consecutive_rollbacks=3, on_rollback=None)
    keeper.before_step(session)
    keeper.after_step(session, loss_value)   # may restore, or raise
"""

import numpy as np

from snapstore.core import checks
from snapstore.engines.graph import attached
from snapstore import errors
from snapstore.store import SnapshotStore


class StepKeeper(object):
  """Periodic (or in-step) snapshots, trusted after a finite loss; rollback when not.

  Args:
    store: The `SnapshotStore`.
    timer: A `tf.train.SecondOrStepTimer`, or None with `in_step_tag`.
    watching: Whether a loss is checked after each step.
    max_consecutive_rollbacks: Raise after this many rollbacks in a row, or
      None.
    on_rollback: A function of the session, or None.
    in_step_tag: The tag the train op snapshots under when its loss is
      finite, or None (the keeper takes the snapshots).

  Raises:
    ValueError: Rolling back on a loss with a store that keeps fewer than 2
      snapshots (without `in_step_tag`).
  """

  def __init__(
    self,
    store,
    timer,
    watching,
    max_consecutive_rollbacks,
    on_rollback,
    in_step_tag=None,
  ):
    if (
      in_step_tag is None
      and watching
      and store.max_to_keep is not None
      and store.max_to_keep < 2
    ):
      raise ValueError(
        "Rolling back on a loss needs a store that keeps 2 snapshots (the "
        "trusted one and the one being checked); this one keeps %d. Create it "
        "with max_to_keep=2." % store.max_to_keep
      )
    self.store = store
    self._timer = timer  # None in-step
    self._in_step_tag = in_step_tag
    self._watching = watching
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = on_rollback
    self.step = 0
    # Tag of the newest snapshot known to give a finite loss.
    self.trusted = None
    self._checking = None  # tag of the snapshot taken before this step
    self._consecutive = 0
    self.snapshots = 0
    self.rollbacks = 0

  def distrust(self):
    """Forgets the trusted snapshot and the one being checked."""
    self.trusted = self._checking = None
    self._consecutive = 0

  def before_step(self, session):
    """Before a step: a snapshot when the timer says so (in-step: none)."""
    if self._in_step_tag is not None:
      # The step's own run copies into the slot if its loss is finite.
      self._checking = self._in_step_tag
      return
    if not self._timer.should_trigger_for_step(self.step):
      return
    tag = self.store.snapshot(session=session)
    self._timer.update_last_triggered_step(self.step)
    self.snapshots += 1
    if self._watching:
      self._checking = tag
    else:
      self.trusted = tag

  def after_step(self, session, value):
    """After a step: trusts its snapshot, or rolls back on a loss `value`
    that is not finite.

    Raises:
      ValueError: No loss value to check.
      NonFiniteError: Nothing trusted to roll back to, or too many
        rollbacks in a row.
    """
    step, self.step = self.step, self.step + 1
    if not self._watching:
      return
    if value is None:
      raise ValueError("No loss value for step %d to check." % step)
    value = np.asarray(value)
    if np.all(np.isfinite(value)):
      if self._checking is not None:
        self.trusted, self._checking = self._checking, None
      self._consecutive = 0
      return
    if self._checking is not None and self._in_step_tag is None:
      # Its parameters gave this loss: never roll back to it.
      if self._checking in self.store:
        self.store.delete(self._checking)
      self._timer.reset()
    # (In-step, the run skipped its copy: the slot still holds what it held.)
    self._checking = None
    if self.trusted is None or self.trusted not in self.store:
      if self._in_step_tag is not None:
        held = (
          "no step has had a finite loss yet, so %r holds no parameters "
          "known to give one" % (self._in_step_tag,)
        )
      else:
        held = "the store holds %s" % (self.store.tags(),)
      raise errors.NonFiniteError(
        "The loss is %s at step %d and there is no trusted snapshot to roll "
        "back to (%s)." % (value, step, held)
      )
    self.store.restore(self.trusted, session=session)
    self.rollbacks += 1
    self._consecutive += 1
    if self._on_rollback is not None:
      self._on_rollback(session)
    if (
      self._max_consecutive is not None
      and self._consecutive > self._max_consecutive
    ):
      raise errors.NonFiniteError(
        "The loss is %s at step %d: %d rollbacks in a row, more than "
        "max_consecutive_rollbacks=%d. The variables hold snapshot %r, the "
        "newest one that gave a finite loss."
        % (value, step, self._consecutive, self._max_consecutive, self.trusted)
      )


class StorePerGraph(object):
  """The store of a hook or callback: given, or built once per graph.

  Args:
    owner: The hook's or callback's class name, for messages.
  """

  def __init__(self, owner):
    self._owner = owner
    self._stores = attached.PerObject("hook_store")  # dies with its graph

  def get(self, store, graph, build):
    """`store` if a SnapshotStore, else the one `build()` made for `graph`.

    Raises:
      TypeError: `build()` returned no `SnapshotStore`.
      GraphMismatchError: The store is of another graph than `graph`.
    """
    if not isinstance(store, SnapshotStore):
      store = self._stores.get(graph)
      # Built once per graph: a graph is often finalized later.
      if store is None:
        with graph.as_default():
          store = build()
        if not isinstance(store, SnapshotStore):
          raise TypeError(
            "The store function returned %r, not a SnapshotStore." % (store,)
          )
        self._stores.set(graph, store)
    checks.same_graph(
      store,
      graph,
      "%s's store" % self._owner,
      than="the one being run",
      fix="With an Estimator (which builds a new graph for each train() call), "
      "pass a function that creates the store.",
    )
    return store
