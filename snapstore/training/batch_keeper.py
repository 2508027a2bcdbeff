"""Eager `fit`: snapshots between batches, rolled back from the batch hook.

`BatchKeeper` does `SnapshotCallback(every_n_batches=N)`'s work when `fit`
runs eagerly (Keras 3 with the TensorFlow backend, tf-keras, TF 2.15's
Keras 2). Its contract:

- Before a batch, when the timer says so, it snapshots the store (default:
  the model's state, `training/keras_state.py`) and copies the compiled
  metrics the store does not cover to the host.
- After a batch whose `logs[monitor]` is not finite, it restores the newest
  snapshot held whose trainable weights are finite (dropping those whose
  are not), puts the metrics of that snapshot back (resets those it holds
  no value of), multiplies the learning rate by `backoff`, and calls
  `on_rollback()`. Training goes on with the next batch.
- `NonFiniteError` after `max_consecutive_rollbacks` rollbacks in a row, or
  when no snapshot held has finite weights.
- With `steps_per_execution=N` a rollback undoes the whole execution.

Why the logged running mean is the right value to check, how metrics made
in the first step are covered, and how callbacks following the rollbacks
and parameter servers are served: docs/design/callback.md.
"""

import numpy as np

from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore import errors
from snapstore.core.distributed import components
from snapstore.training import fit_coordinator
from snapstore.training import fit_keeper
from snapstore.training import followers
from snapstore.training import keras_state
from snapstore.training import protocol


class BatchKeeper(fit_keeper.FitKeeper, followers.Leader):
  """Snapshots and rollbacks between batches, for one `SnapshotCallback`.

  Made by the callback on its first eager `on_train_begin` and kept across
  `fit` calls, so that a second `fit` of the same model reuses the store.

  Args:
    options: The callback's `fit_keeper.FitOptions`.
  """

  def __init__(self, options):
    super(BatchKeeper, self).__init__(options)
    self._built_for = None  # (model, optimizer) the store was made for
    self._model = None
    self._rate = None  # the learning-rate variable `backoff` multiplies
    self._fits = 0
    self._period = None  # (fit, epoch): metrics are reset at each epoch
    self._tags = []  # (tag, period) of our snapshots, oldest first
    self._first_batch = False
    self._covered = frozenset()  # ids of the store's variables
    self._metric_vars = []  # metric variables the store does not cover
    # tag -> [(variable, component, numpy value)]
    self._metric_copies = {}
    self._timer = None
    self._coordinator = None  # fit's ClusterCoordinator (PS strategy v2)
    self._consecutive = 0
    self.step = 0

  @property
  def trusted(self):
    """The tag a rollback would restore now (the newest snapshot held)."""
    held = self._held()
    return held[-1][0] if held else None

  # -- fit ---------------------------------------------------------------------

  def start(self, model, params=None):
    """`on_train_begin`: checks, then the store (built or reused), traced now.

    Args:
      model: The model `fit` trains.
      params: The callbacks' `params` of this `fit` (one dict per `fit`):
        which callbacks following rollbacks are in it.

    Raises:
      ValueError: `backoff` with a learning rate that is not a variable; a
        store built in graph mode, or one of your own without the state of a
        callback following rollbacks; a follower led by another callback;
        the default store's own checks.
      TypeError: A store function that returns no `SnapshotStore`.
    """
    options = self.options
    rate = keras_state.learning_rate(model, options.backoff)
    self._coordinator = fit_coordinator.of(model)
    self._join()
    followed = self.lead(model, params)
    if self._default:
      _check_built(model)
      optimizer = model.optimizer
      if (
        self.store is None
        or self._built_for != (model, optimizer)
        or not followers.covers(self.store, followed)
      ):
        self._set_store(
          keras_state.default_store(model, followed), (model, optimizer)
        )
        keras_state.warm_up(self.store, model)
    elif self.store is None or (
      self._built_for is not None and self._built_for[0] is not model
    ):
      store = keras_state.own_store(options.store, model)
      keras_state.check_not_graph_store(store)
      self._set_store(store, (model, None))
    if not self._default:
      self.check_covers(self.store, followed)
    self._model = model
    self._rate = rate
    self._metric_vars = self._uncovered_metrics()
    self._fits += 1
    self._period = (self._fits, None)
    self._timer = tf.train.SecondOrStepTimer(*options.timer_args)
    self._consecutive = 0
    self.step = 0
    self._first_batch = True

  def begin_epoch(self, epoch):
    """`on_epoch_begin`: fit has just reset the metrics."""
    self._period = (self._fits, epoch)

  def end_epoch(self):
    """`on_epoch_end`: the default store is rebuilt to cover new metrics."""
    if not (self._default and self._metric_vars):
      return
    model = self._model
    self._join()
    self._set_store(
      keras_state.default_store(model, self.followed()),
      (model, model.optimizer),
    )
    keras_state.warm_up(self.store, model)
    self._metric_vars = self._uncovered_metrics()
    # The state now is what the next batch starts from: its snapshot.
    self._take()

  def before_batch(self):
    """`on_train_batch_begin`: a snapshot when the timer says so."""
    if self._timer.should_trigger_for_step(self.step):
      self._join()
      self._take()

  def after_batch(self, batch, logs):
    """`on_train_batch_end`: rolls back when the monitored value is not finite.

    Raises:
      ValueError: The logs have no `monitor`.
      NonFiniteError: Nothing to roll back to, or too many rollbacks in a row.
    """
    del batch  # counted here: `batch` starts from 0 at each epoch
    options = self.options
    if options.monitor is not None:
      # PS strategy v2: the scheduled step's logs. Waits for that step (so
      # the loop runs one step at a time while a loss is checked).
      logs = fit_coordinator.fetched(logs)
    value = protocol.monitored_value(options.monitor, logs)
    value = None if value is None else np.asarray(value)
    step, self.step = self.step, self.step + 1
    if self._first_batch:
      # Keras made its compiled metrics in this step: copy them from now on.
      self._first_batch = False
      self._metric_vars = self._uncovered_metrics()
    if value is None or np.all(np.isfinite(value)):
      self._consecutive = 0
      self.stand()
      return
    self._join()
    tag, period = self._roll_back(value, step)
    self._restore_metrics(tag, period)
    if self._rate is not None:
      self._rate.assign(
        self._rate * tf2.constant(options.backoff, self._rate.dtype),
        read_value=False,
      )
    self.rollbacks += 1
    self._consecutive += 1
    if options.on_rollback is not None:
      options.on_rollback()
    limit = options.max_consecutive_rollbacks
    if limit is not None and self._consecutive > limit:
      raise errors.NonFiniteError(
        "The loss is %s at batch %d: %d rollbacks in a row, more than "
        "max_consecutive_rollbacks=%d. The variables hold snapshot %r, taken "
        "after the last batch whose loss was finite."
        % (value, step, self._consecutive, limit, tag)
      )

  # -- parts -------------------------------------------------------------------

  @property
  def _default(self):
    return self.options.store is None

  def _set_store(self, store, built_for):
    self.store = store
    self._built_for = built_for
    self._covered = frozenset(id(v) for v in store.variables.values())
    self._tags = []
    self._metric_copies = {}

  def _held(self):
    return [(t, p) for t, p in self._tags if t in self.store]

  def _join(self):
    """Under PS strategy v2: waits until no scheduled step runs."""
    if self._coordinator is not None:
      self._coordinator.join()

  def _take(self):
    """A snapshot for the batch at `self.step`."""
    tag = self.store.snapshot()
    self._timer.update_last_triggered_step(self.step)
    self.snapshots += 1
    # Only the tags the store still holds: the list stays as short as the
    # store's snapshots, however long the fit.
    self._tags = [(t, p) for t, p in self._held() if t != tag]
    self._tags.append((tag, self._period))
    self._copy_metrics(tag)

  def _roll_back(self, value, step):
    """Restores the newest held snapshot with finite weights: (tag, period).

    A snapshot whose trainable weights are not finite (an update made them
    NaN while its own loss was finite) is dropped, and the one before it
    restored. The check runs on the restored variables (eager ops, no trace).
    """
    trainable = keras_state.trainable_floats(self._model)
    for tag, period in reversed(self._held()):
      self.store.restore(tag)
      if keras_state.all_finite(trainable):
        return tag, period
      self.store.delete(tag)
    raise errors.NonFiniteError(
      "The loss is %s at batch %d and there is no snapshot with finite "
      "weights to roll back to (the store holds %s). The weights were not "
      "finite before this fit's first snapshot: check the model's "
      "initialization or the weights loaded into it."
      % (value, step, self.store.tags())
    )

  def _copy_metrics(self, tag):
    """Copies the metric variables' values for snapshot `tag` (host)."""
    held = set(t for t, _ in self._tags)
    for old in [t for t in self._metric_copies if t not in held]:
      del self._metric_copies[old]
    if self._metric_vars:
      # Component by component: a metric under a strategy keeps a total
      # per replica (sync-on-read), whose read is their sum, and whose
      # assign in cross-replica context would give each replica a share.
      self._metric_copies[tag] = [
        (v, part, part.numpy())
        for v in self._metric_vars
        for part in components(v)
      ]

  def _restore_metrics(self, tag, period):
    """Puts back the metrics of snapshot `tag`; resets the rest.

    Metrics it holds no value of (made in the failing first step), and all
    of them when it is from an earlier epoch (fit resets them at each epoch
    start), are reset: their state before the first batch of this epoch.
    """
    same = period == self._period
    copies = self._metric_copies.get(tag, []) if same else []
    for _, part, value in copies:
      with tf.device(part.device):
        part.assign(value, read_value=False)
    put_back = (self._covered if same else frozenset()) | set(
      id(v) for v, _, _ in copies
    )
    for metric in self._model.metrics:
      if not all(
        id(keras_state.inner(v)) in put_back for v in metric.variables
      ):
        metric.reset_state()

  def _uncovered_metrics(self):
    return [
      v
      for v in keras_state.metric_variables(self._model)
      if id(v) not in self._covered
    ]


def _check_built(model):
  """Refuses a default store over optimizers that have no state yet.

  Raises:
    ValueError: Names them, and how to build them.
  """
  unbuilt = keras_state.unbuilt_optimizers(model)
  if unbuilt:
    raise ValueError(
      "SnapshotCallback's store covers every optimizer %s holds, but "
      "these have no state yet: %s. Keras makes an optimizer's state at "
      "its first apply_gradients, after the snapshot taken before the "
      "first batch, which could then not restore it. Build each before "
      "fit (optimizer.build(<the variables it updates>)), or use "
      "in_step=True, which makes them before its store."
      % (
        type(model).__name__,
        ", ".join(
          "%s (%s)" % (keras_state.held_name(model, o), type(o).__name__)
          for o in unbuilt
        ),
      )
    )
