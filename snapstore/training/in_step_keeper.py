"""Eager `fit`: `SnapshotCallback(in_step=True)`, undoing a bad step inside it.

`InStepKeeper` is the keeper (`fit_keeper.FitKeeper`) of an eager `fit`
whose train step takes the snapshots. Its contract:

- At `on_train_begin` it checks the strategy and the store, makes the
  rollback counts (one int64 pair, per replica), and replaces the model's
  `train_step` (`training/train_step.py`) with one that undoes, in the
  compiled step, a step whose `logs[monitor]` is not finite
  (`training/in_step_undo.py`, by `in_step_undo`). No batch hook takes a
  snapshot, and with `steps_per_execution=N` exactly the bad steps are undone.
- After each execution it calls `on_rollback()` once per step undone, and
  raises `NonFiniteError` after more than `max_consecutive_rollbacks` in a
  row (counted in steps) or when the weights are not finite after a
  rollback. After one step whose logged value is finite it reads nothing.
- `on_train_end` (and every raise) puts the original `train_step` back.
- Refused under `ParameterServerStrategy` (steps of several workers run at
  once: a step has no start of its own).

The mechanism and its costs: docs/design/callback.md, "In-step mode".
"""

import math

import numpy as np

from snapstore._tf import tf2
from snapstore import errors
from snapstore.store import SnapshotStore
from snapstore.training import fit_coordinator
from snapstore.training import fit_keeper
from snapstore.training import followers
from snapstore.training import in_step_undo
from snapstore.training import keras_state
from snapstore.training import train_step


class InStepKeeper(fit_keeper.FitKeeper, followers.Leader):
  """In-step snapshots and rollbacks for `SnapshotCallback(in_step=True)`.

  Made by the callback on its first eager `on_train_begin` and kept across
  `fit` calls.

  Args:
    options: The callback's `fit_keeper.FitOptions`: its store (a device
      store, a function `model -> store`, or None for the default store),
      `in_step_tag` (the tag pinned to the slot the step copies into) and
      `in_step_undo` ("copy" or "skip") among them.

  Attributes:
    model: The model of the current `fit`.
    counts: int64 [rollbacks, in a row], written in the step.
    replicas: Replicas in sync under the model's strategy.
  """

  def __init__(self, options):
    super(InStepKeeper, self).__init__(options)
    self._undo = in_step_undo.WAYS[options.in_step_undo](self)
    self._prepared = False  # this fit's step traced (and the way decided)
    self.model = None
    self._rate = None  # the learning-rate variable `backoff` multiplies
    self.counts = None
    self._counts_for = None  # the strategy the counts were made under
    self.replicas = 1
    self._seen = 0  # rollbacks of this fit counted so far
    self._last_batch = -1  # the `batch` of the last on_train_batch_end
    self.step = 0

  @property
  def store(self):
    """The store the step copies into ("copy"; None for "skip")."""
    return self._undo.store

  @property
  def trusted(self):
    """The slot's tag once a store exists (the start of the newest step
    whose loss was finite; before the first one, the start of `fit`).
    None when steps are undone by skipping their update: nothing is kept."""
    tag = self.options.in_step_tag
    if self.store is None or tag not in self.store:
      return None
    return tag

  # -- fit ---------------------------------------------------------------------

  def start(self, model, params=None):
    """`on_train_begin`: checks, then wraps `model.train_step`.

    Args:
      model: The model `fit` trains.
      params: The callbacks' `params` of this `fit` (one dict per `fit`).

    Raises:
      ValueError: `ParameterServerStrategy`; `backoff` with a learning rate
        that is not a variable; "skip" under a strategy that merges the
        update; a store of your own built in graph mode, without device
        slots or without the state of a callback following rollbacks; a
        follower led by another callback.
    """
    options = self.options
    strategy = model.distribute_strategy
    if fit_coordinator.of(model) is not None:
      raise ValueError(
        "SnapshotCallback(in_step=True) cannot run under "
        "ParameterServerStrategy: fit schedules "
        "each step on a worker through a ClusterCoordinator, and steps on "
        "different workers run at the same time, reading and writing the "
        "same variables on the parameter servers, so a step has no start "
        "of its own to copy or to go back to (its rollback would undo "
        "other steps' updates). Use SnapshotCallback(every_n_batches=...): "
        "it waits for the scheduled steps (coordinator.join()) before each "
        "snapshot and rollback."
      )
    rate = keras_state.learning_rate(model, options.backoff)
    self._undo.check(strategy)
    followed = self.lead(model, params)
    if isinstance(options.store, SnapshotStore):
      keras_state.check_in_step_store(options.store)
      if options.in_step_undo == "copy":
        self.check_covers(options.store, followed)
    if self.counts is None or self._counts_for is not strategy:
      # Under a strategy, one component per replica, each written by its
      # replica alone (aggregation NONE): every replica takes the same
      # decision, so they hold the same counts.
      with strategy.scope():
        self.counts = tf2.Variable(
          [0, 0],
          dtype=tf2.int64,
          trainable=False,
          name="snapshot_callback",
          aggregation=tf2.VariableAggregation.NONE,
        )
      self._counts_for = strategy
    self.replicas = strategy.num_replicas_in_sync
    self.counts.assign([0, 0], read_value=False)
    self._seen = 0
    self._last_batch = -1
    self.model = model
    self._rate = rate
    self.step = 0
    self._prepared = self._undo.start(model, strategy)
    train_step.wrap(model, self._traced)

  def begin_epoch(self, epoch):
    del epoch  # a step's rollback never crosses an epoch
    self._last_batch = -1  # batches count from 0 again

  def after_batch(self, batch, logs):
    """`on_train_batch_end`: counts the steps' rollbacks, raises when due.

    Raises:
      NonFiniteError: Too many rollbacks in a row, or weights that are not
        finite after a rollback.
    """
    options = self.options
    self.step += 1
    steps, self._last_batch = batch - self._last_batch, batch
    value = _logged((logs or {}).get(options.monitor))
    if (
      steps == 1 and self.replicas == 1 and value is not None and _finite(value)
    ):
      # One step ran, and the value it checked is finite: no rollback, and
      # no read of the counts (a read costs as much as a small step's copy).
      # (With replicas, the logs hold one replica's value; the step decided
      # on all of theirs.)
      self.stand()
      return
    rollbacks, consecutive = (int(c) for c in self.counts.numpy())
    new, self._seen = rollbacks - self._seen, rollbacks
    if not new:
      self.stand()
      return
    self.rollbacks += new
    if options.on_rollback is not None:
      for _ in range(new):
        options.on_rollback()
    if consecutive and not keras_state.all_finite(
      keras_state.trainable_floats(self.model)
    ):
      self.finish()
      if options.in_step_undo == "skip":
        raise errors.NonFiniteError(
          "The loss is %s at batch %d, and the weights were already not "
          "finite when that step started: an earlier update, whose loss was "
          "finite, made them so. in_step_undo='skip' undoes a step by not "
          "applying its update and keeps no older state to go back to. Use "
          "in_step_undo='copy', which goes back to the start of the step "
          "before, or every_n_batches=1." % (value, batch)
        )
      raise errors.NonFiniteError(
        "The loss is %s at batch %d and there is no snapshot with finite "
        "weights to roll back to: neither the start of the step nor %r (the "
        "start of the newest step whose loss was finite) has them. The "
        "weights were not finite before this fit's first step: check the "
        "model's initialization or the weights loaded into it."
        % (value, batch, options.in_step_tag)
      )
    limit = options.max_consecutive_rollbacks
    if limit is not None and consecutive > limit:
      self.finish()
      raise errors.NonFiniteError(
        "The loss is %s at batch %d: %d rollbacks in a row, more than "
        "max_consecutive_rollbacks=%d. The variables hold the state after "
        "the last step whose loss was finite (each step was rolled back in "
        "the step)." % (value, batch, consecutive, limit)
      )

  def finish(self):
    """`on_train_end` (and before raising): puts `train_step` back."""
    if self.model is not None:
      train_step.unwrap(self.model)

  # -- in the step ---------------------------------------------------------------

  def _traced(self, step, data):
    """At a trace of the wrapped step: the step, undone in the step when its
    `monitor` value is not finite; the first trace in a fit prepares the
    way first (`in_step_undo`)."""
    if not self._prepared:
      self._undo.prepare(self.model, step, data)
      self._prepared = True
    return self._undo.guarded(step, data)

  def rolled_back(self, counts, local):
    """In a rollback branch: counts it, and cuts the learning rate.

    Args:
      counts: The counts variable (the replica's own component).
      local: Gives the replica's own component of a variable.
    """
    counts.assign_add(tf2.constant([1, 1], tf2.int64), read_value=False)
    if self._rate is not None:
      rate = local(self._rate)
      rate.assign(
        rate * tf2.constant(self.options.backoff, rate.dtype),
        read_value=False,
      )


def _logged(value):
  """A logged value as numpy (the value itself when it is no tensor).

  tf-keras hands a callback that takes its logs as they come
  (`_supports_tf_logs`) tensors.
  """
  numpy = getattr(value, "numpy", None)
  return value if numpy is None else numpy()


def _finite(value):
  """Whether every element of a logged value (number, array) is finite."""
  if isinstance(value, (float, np.floating)):  # a loss: once per batch
    return math.isfinite(value)
  return bool(np.all(np.isfinite(np.asarray(value))))
