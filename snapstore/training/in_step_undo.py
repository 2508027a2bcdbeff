"""`SnapshotCallback` in eager `fit`: Keras 3 (TensorFlow backend) and tf-keras.

`SnapshotCallback` (hooks.py) hands its work to `EagerKeeper` when eager
execution is on at `on_train_begin`: always with Keras 3, and with tf-keras or
TF 2.15's Keras 2 unless the program chose graph mode.

What the default store covers, so that a rollback is exact (training goes on
as if the rolled-back batches had not been there, bit for bit):

- the model's variables: weights, batch-norm statistics, and with Keras 3 the
  seed generators' states (a `Dropout` replays the same masks);
- the optimizer's state: slots and `iterations` (Adam's bias correction counts
  steps), not the learning rate, so that a rollback never undoes `backoff`.
  An optimizer not built yet is built at `on_train_begin`
  (`optimizer.build(model.trainable_variables)`, what Keras does on the first
  step), so that its slots are covered from the first batch on;
- the compiled metrics' state: batch logs hold the epoch's running means, so a
  rollback puts them back too (see below).

Which loss is checked. Keras's batch logs hold the epoch's running mean of
the loss, not the batch's own loss: once a batch's loss is NaN, the mean
stays NaN. Because every rollback also puts the metrics back, the mean is
finite before each batch, so it turns non-finite exactly when the batch's own
loss is (or when the sum overflows). The callback checks `logs[monitor]`;
no extra read of the batch's loss is needed.

Metrics. Keras builds its compiled metrics in the first step of `fit`, after
`on_train_begin`, where the default store is built and its copies traced
(traced there, not in a batch hook: tf-keras warns about slow hooks). Metric
variables the store does not cover are copied to the host at each snapshot
(a few scalars; Keras has just read the logs, so this waits for nothing) and
written back at a rollback; at the end of the epoch in which they appeared,
the default store is rebuilt to cover them (its snapshots are dropped, and
it takes one at once, for the next batch). A store of your own never covers
them: they are copied to the host at every snapshot. Metrics a snapshot
holds no value of (made in the failing first step), and all metrics when the
snapshot is from an earlier epoch (fit resets them at each epoch start), are
reset instead (`reset_state()`): their state before the first batch counted
in this epoch.

Rollback protocol. A snapshot taken before a batch holds the state after
batches whose own losses were all finite. When a batch's loss is not finite,
the newest such snapshot is restored (the state before that batch when
snapshotting every batch), unless its trainable weights are not finite (an
update made them NaN while its loss was finite): that one is dropped and the
one before it is restored (a store of your own may keep 1 snapshot; it then
has no older one to fall back to). Then training goes on with the next batch.

With `steps_per_execution=N`, Keras calls the batch hooks once per N steps,
so a rollback undoes the whole execution (in-step mode does not).

Callbacks with state of their own. A callback that changes state of its own
at a batch's end, as Lookahead's (`lookahead.callback()`: a step counter and
the slow weights), would count a rolled-back batch and synchronize after it,
or, called first, synchronize from the NaN weights before the rollback. Such
a callback follows the rollbacks (`follow_rollbacks`): in a `fit` with a
`SnapshotCallback` (Keras hands all callbacks of one `fit` one `params`
dict, which pairs them), the default store covers its state (a store of your
own must, or `fit` is refused), and its update is called from the
`SnapshotCallback`'s batch end after each batch that stands, in place of its
own. So in either order the `fit` ends as the same `fit` without the
rolled-back batches, also when a rollback goes back several batches. In-step,
the update follows the verdict of the step (read at the batch end).

In-step mode (`SnapshotCallback(in_step=True)`). A snapshot from a batch
hook costs a traced call of its own (a fraction of a millisecond: a sizeable
share of a small model's step). In-step, `on_train_begin` replaces the
model's `train_step` on the instance with one that, in the compiled step
itself, reads the state at the step's start
(`store.slots.snapshot_in_step()`'s `begin()`, before anything writes a
variable), runs the original step, and then, in a `tf.cond` on the step's
logs[monitor] (kept a function call with one replica, so that the rollback
branch costs nothing until taken; lowered, its nodes would pass through the
executor at every step): when finite, commits those reads into the slot (so
the slot holds the start of the newest step whose loss was finite, under the
tag "before_step"); when not, writes them back into the variables (the step
is undone, inside the step), counts the rollback, and multiplies the
learning rate by `backoff`. Then `model.make_train_function(force=True)`, so
that fit's next batch runs it. A bad step never leaves the compiled loop, so
with `steps_per_execution=N` exactly the bad steps are undone. The batch
hooks take no snapshot. After an execution of one step whose logged value is
finite there was no rollback (the step checked that value), and the hook
returns at once; after any other execution it reads the counts (one read of
2 integers), calls `on_rollback` once per rollback and raises
`NonFiniteError` after too many in a row (counted in steps), or when the
weights are not finite after a rollback. `on_train_end` puts the original
`train_step` back (and before the callback raises; a fit stopped by another
exception leaves the wrapper, which the callback's next fit replaces).

All state the step touches must exist before the step reads it: at the first
trace of the wrapped step in each fit, the original step is traced once more
in a scratch `tf.function` that never runs, so that what Keras builds in the
first step (the optimizer's slots, the compiled metrics; with the TensorFlow
backend made under `init_scope`, so real variables) exists; then the store
and its slot are made (under `init_scope`), covering it. A store of your own
must be a device store (1 slot is enough); metric variables it does not
cover are restored from the step's start too. If the start's trainable
weights are not finite (the update before made them NaN while its loss was
finite), the slot is restored instead: one step further back.

Skipping the update (`in_step_undo="skip"`). Copying costs a read and an
assign per variable and a pass over the state at every step: 9-13% of a
1-2 ms step. Most of that state (weights, optimizer slots, `iterations`) is
written only by the optimizer's update, which Keras's own `train_step` calls
after the loss is known, and after it has updated the "loss" metric whose
result the logs give. So instead the wrapped step calls the update under a
`tf.cond` on that metric's result being finite (`engines/eager/skip_update.py`;
lowered, so that the update's ops run in the step's executor as without
it), and reads at its start only what the rest
of the step writes, found on the scratch trace (every variable whose handle
an op outside the update takes and may write: batch-norm statistics, seed
states, the metrics), putting those back when the update was skipped. The
result is the copy's (the test suite checks both against a fit without the
bad batch), without a copy. What it cannot do: go one step further back
(there is no older state): a rollback whose start has weights that are not
finite raises `NonFiniteError`. It is refused, at the first trace, with the
reason, for a model with its own `train_step` (or `compute_metrics`,
`get_metrics_result`: then the logged value is not known where the update
runs), a `monitor` that is not a metric updated before the update, a step
that calls `apply_gradients` other than once or writes, outside the update,
a resource that is no variable of the model, its optimizer or its metrics;
and at `on_train_begin` under any strategy but the default one and
`OneDeviceStrategy` (`MirroredStrategy` even with one replica: there the
update's `merge_call` cannot run inside a `tf.cond` in replica context).

With `jit_compile=True`, XLA compiles the step with the in-step ops into
other fusions than the step without them: batch-norm statistics may differ
in the last bit from a run without the callback; against the same in-step
program the rollback is exact.

Under a strategy with replicas (`MirroredStrategy`), the wrapped step runs
in each replica: the decision is taken on every replica's value (an
all-reduce of the finite flag: one replica's NaN reaches all through the
summed gradients, while its logged loss is its own), and every write (the
slot, the rollback, the counts, the learning rate) goes to the replica's own
component, so no write needs a `merge_call` inside the `tf.cond`. The first
trace runs in replica context, where the scratch trace and the store's
shadows cannot be made; so the store is made at `on_train_begin`, after the
optimizer and (tf-keras) the compiled loss and metrics are built there from
the model's outputs, and a first step that still makes variables is refused
at its trace. The batch hook always reads the counts (the logs hold one
replica's value).

Under `MultiWorkerMirroredStrategy` every worker runs the same `fit`: the
logged loss is reduced over all replicas, so every worker's callback rolls
back at the same batch, and a restore is coordinated
(`snapstore/engines/eager/multi_worker.py`: each worker restores the same tag, or
none does).

Parameter servers (`ParameterServerStrategy` v2, tf-keras and TF 2.15's
Keras 2). `fit` schedules each step on a worker through a
`ClusterCoordinator` and hands the batch hooks its logs as a `RemoteValue`;
it refuses batch hooks of a callback that does not take them so
(`_supports_tf_logs`), which this one does under that strategy. A snapshot
or a restore while scheduled steps run would copy a mix of states (the
store refuses it), so the callback calls `coordinator.join()` before each
snapshot and rollback, and (for `monitor`) fetches each batch's logs, which
waits for that step: while a loss is checked, fit runs one step at a time,
on one worker at a time (the price of an exact rollback: a step running
beside the bad one would start from its NaN). With `monitor=None` the steps
between snapshots run concurrently. `in_step=True` is refused: concurrent
steps on several workers read and write the same variables, so a step has
no start of its own to go back to.
"""

import collections
import functools
import math
import weakref

import numpy as np

from snapstore._tf import is_keras_3_object
from snapstore._tf import keep_cond_as_call
from snapstore._tf import keras_variable_value
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.engines.eager import distributed as eager_distributed
from snapstore.engines.eager import skip_update
from snapstore.engines.eager import variables as eager_variables
from snapstore import errors
from snapstore.store import SnapshotStore


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


# -- callbacks with state of their own (module doc) ----------------------------

# Callbacks following rollbacks, oldest first (weakly: a callback lives as
# long as its owner keeps it), and who leads each: (keeper, that fit's
# params); the keeper weakly, or it would keep its followers alive here.
_FOLLOWERS = []
_LEADERS = weakref.WeakKeyDictionary()


def follow_rollbacks(callback):
  """Makes a Keras callback follow the rollbacks of `SnapshotCallback`.

  For a callback that changes state of its own at a batch's end (Lookahead's
  slow weights and step counter). In an eager `fit` with a
  `SnapshotCallback`, that callback leads it: its store covers the state
  `callback.rollback_variables()` returns (`{key: variable}`), and it calls
  `callback.batch_stands()` after each batch it does not roll back, from
  its own batch end, once it has decided. The callback's own batch end then
  does nothing (`is_led`): a rolled-back batch never happened for it either,
  whichever of the two `fit` calls first.
  """
  _FOLLOWERS[:] = [ref for ref in _FOLLOWERS if ref() is not None]
  _FOLLOWERS.append(weakref.ref(callback))


def is_led(callback):
  """Whether a `SnapshotCallback` of the callback's current `fit` leads it
  (calls its `batch_stands()`)."""
  led = _LEADERS.get(callback)
  params = getattr(callback, "params", None)
  return led is not None and params is not None and led[1] is params


def _lead(keeper, model, params):
  """The followers in the `fit` of `params`, over `model`: led by `keeper`.

  A `fit` gives all its callbacks one `params` dict, so a follower of an
  earlier `fit` is never taken.

  Raises:
    ValueError: One of them is led by another `SnapshotCallback` of this fit.
  """
  if params is None:
    return []
  found = []
  for ref in _FOLLOWERS:
    callback = ref()
    if (
      callback is None
      or getattr(callback, "params", None) is not params
      or getattr(callback, "model", None) is not model
    ):
      continue
    led = _LEADERS.get(callback)
    if led is not None and led[1] is params and led[0]() is not keeper:
      raise ValueError(
        "%s follows the rollbacks of one SnapshotCallback, but this fit has "
        "two: each would roll back and update it. Pass fit one "
        "SnapshotCallback." % type(callback).__name__
      )
    _LEADERS[callback] = (weakref.ref(keeper), params)
    found.append(callback)
  return found


def followed_state(followers):
  """`{key: variable}` of the followers' state (`rollback_variables()`)."""
  out = collections.OrderedDict()
  for follower in followers:
    for key, variable in follower.rollback_variables().items():
      out[eager_variables.unique_key(key, out)] = variable
  return out


def _covers(store, followed):
  covered = set(id(v) for v in store.variables.values())
  return all(id(v) in covered for v in followed.values())


def _check_covers(store, followed, followers):
  """Refuses a store of your own without the followers' state.

  Raises:
    ValueError: The store leaves some of it out; names it, and the fix.
  """
  covered = set(id(v) for v in store.variables.values())
  missing = [k for k, v in followed.items() if id(v) not in covered]
  if missing:
    raise ValueError(
      "SnapshotCallback's store %r does not cover the state that %s keeps "
      "in this fit (%s), so a rollback would leave it as the rolled-back "
      "batches made it. Pass store=None (the default store covers it), or "
      "add that state to your store's var_list (Lookahead's: "
      "lookahead.variables())."
      % (
        store.name,
        " and ".join(sorted(set(type(f).__name__ for f in followers))),
        ", ".join(missing[:5] + (["..."] if len(missing) > 5 else [])),
      )
    )


class _Keeper(object):
  """What both eager keepers hold: the callback's rollback options, and the
  store, model and learning-rate variable of the current `fit`."""

  def __init__(
    self, store_arg, monitor, max_consecutive_rollbacks, on_rollback, backoff
  ):
    self._store_arg = store_arg
    self._monitor = monitor
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = on_rollback
    self._backoff = backoff
    self.store = None
    self._built_for = None  # (model, optimizer) the store was made for
    self._model = None
    self._rate = None  # the learning-rate variable `backoff` multiplies
    self._followers = []  # callbacks of this fit following its rollbacks

  def _lead(self, model, params):
    """Takes the callbacks of this `fit` that follow rollbacks (see
    "Callbacks with state of their own" in the module doc): their state."""
    self._followers = _lead(self, model, params)
    return followed_state(self._followers)

  def _stand(self):
    """After a batch that is not rolled back: the followers' updates."""
    for follower in self._followers:
      follower.batch_stands()


class EagerKeeper(_Keeper):
  """Snapshots and rollbacks for one `SnapshotCallback` in eager `fit`.

  Made by the callback on its first eager `on_train_begin` and kept across
  `fit` calls, so that a second `fit` of the same model reuses the store.

  Args:
    store_arg: The callback's `store` argument (a store, a function
      `model -> store`, or None for the default store).
    timer_args: `(every_secs, every_steps)` for `tf.train.SecondOrStepTimer`.
    monitor: The batch-log key to check, or None.
    max_consecutive_rollbacks: See `SnapshotCallback`.
    on_rollback: A function of no arguments, or None.
    backoff: The learning-rate factor at each rollback, or None.
  """

  def __init__(
    self,
    store_arg,
    timer_args,
    monitor,
    max_consecutive_rollbacks,
    on_rollback,
    backoff,
  ):
    super(EagerKeeper, self).__init__(
      store_arg, monitor, max_consecutive_rollbacks, on_rollback, backoff
    )
    self._timer_args = timer_args
    self._fits = 0
    self._period = None  # (fit, epoch): metrics are reset at each epoch
    self._tags = []  # (tag, period) of our snapshots, oldest first
    self._first_batch = False
    self._covered = frozenset()  # ids of the store's variables
    self._metric_vars = []  # metric variables the store does not cover
    self._metric_copies = {}  # tag -> [(variable, numpy value)]
    self._timer = None
    self._coordinator = None  # fit's ClusterCoordinator (PS strategy v2)
    self._consecutive = 0
    self.step = 0
    self.snapshots = 0
    self.rollbacks = 0

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
    rate = _learning_rate(model, self._backoff)
    self._coordinator = _coordinator(model)
    self._join()
    followed = self._lead(model, params)
    if self._default:
      unbuilt = _unbuilt_optimizers(model)
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
              "%s (%s)" % (_held_name(model, o), type(o).__name__)
              for o in unbuilt
            ),
          )
        )
      optimizer = model.optimizer
      if (
        self.store is None
        or self._built_for != (model, optimizer)
        or not _covers(self.store, followed)
      ):
        self._set_store(_default_store(model, followed), (model, optimizer))
        _warm_up(self.store, model)
    elif self.store is None or (
      self._built_for is not None and self._built_for[0] is not model
    ):
      store = self._store_arg
      if not isinstance(store, SnapshotStore):
        store = store(model)
        if not isinstance(store, SnapshotStore):
          raise TypeError(
            "The store function returned %r, not a SnapshotStore." % (store,)
          )
      _check_eager_store(store)
      self._set_store(store, (model, None))
    if not self._default:
      _check_covers(self.store, followed, self._followers)
    self._model = model
    self._rate = rate
    self._metric_vars = self._uncovered_metrics()
    self._fits += 1
    self._period = (self._fits, None)
    self._timer = tf.train.SecondOrStepTimer(*self._timer_args)
    self._consecutive = 0
    self.step = 0
    self._first_batch = True

  def epoch(self, epoch):
    """`on_epoch_begin`: fit has just reset the metrics."""
    self._period = (self._fits, epoch)

  def end_epoch(self):
    """`on_epoch_end`: the default store is rebuilt to cover new metrics."""
    if not (self._default and self._metric_vars):
      return
    model = self._model
    self._join()
    self._set_store(
      _default_store(model, followed_state(self._followers)),
      (model, model.optimizer),
    )
    _warm_up(self.store, model)
    self._metric_vars = self._uncovered_metrics()
    # The state now is what the next batch starts from: its snapshot.
    self._take()

  def before_batch(self):
    """`on_train_batch_begin`: a snapshot when the timer says so."""
    if self._timer.should_trigger_for_step(self.step):
      self._join()
      self._take()

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

  def after_batch(self, logs):
    """`on_train_batch_end`: rolls back when the monitored value is not finite.

    Raises:
      ValueError: The logs have no `monitor`.
      NonFiniteError: Nothing to roll back to, or too many rollbacks in a row.
    """
    if self._monitor is not None and isinstance(logs, _REMOTE_VALUE):
      # PS strategy v2: the scheduled step's logs. Waits for that step (so
      # the loop runs one step at a time while a loss is checked).
      logs = logs.fetch()
    value = monitored_value(self._monitor, logs)
    value = None if value is None else np.asarray(value)
    step, self.step = self.step, self.step + 1
    if self._first_batch:
      # Keras made its compiled metrics in this step: copy them from now on.
      self._first_batch = False
      self._metric_vars = self._uncovered_metrics()
    if value is None or np.all(np.isfinite(value)):
      self._consecutive = 0
      self._stand()
      return
    self._join()
    tag, period = self._roll_back(value, step)
    self._restore_metrics(tag, period)
    if self._rate is not None:
      self._rate.assign(
        self._rate * tf2.constant(self._backoff, self._rate.dtype),
        read_value=False,
      )
    self.rollbacks += 1
    self._consecutive += 1
    if self._on_rollback is not None:
      self._on_rollback()
    if (
      self._max_consecutive is not None
      and self._consecutive > self._max_consecutive
    ):
      raise errors.NonFiniteError(
        "The loss is %s at batch %d: %d rollbacks in a row, more than "
        "max_consecutive_rollbacks=%d. The variables hold snapshot %r, taken "
        "after the last batch whose loss was finite."
        % (value, step, self._consecutive, self._max_consecutive, tag)
      )

  # -- parts -------------------------------------------------------------------

  @property
  def _default(self):
    return self._store_arg is None

  def _set_store(self, store, built_for):
    self.store = store
    self._built_for = built_for
    self._covered = frozenset(id(v) for v in store.variables.values())
    self._tags = []
    self._metric_copies = {}

  def _held(self):
    return [(t, p) for t, p in self._tags if t in self.store]

  def _join(self):
    """Under PS strategy v2: waits until no scheduled step runs (module doc)."""
    if self._coordinator is not None:
      self._coordinator.join()

  def _roll_back(self, value, step):
    """Restores the newest held snapshot with finite weights: (tag, period).

    A snapshot whose trainable weights are not finite (an update made them
    NaN while its own loss was finite) is dropped, and the one before it
    restored. The check runs on the restored variables (eager ops, no trace).
    """
    trainable = [
      v
      for v in (_inner(w) for w in self._model.trainable_variables)
      if v.dtype.is_floating
    ]
    for tag, period in reversed(self._held()):
      self.store.restore(tag)
      if _all_finite(trainable):
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
      self._metric_copies[tag] = [(v, v.numpy()) for v in self._metric_vars]

  def _restore_metrics(self, tag, period):
    """Puts back the metrics of snapshot `tag`; resets the rest (module doc)."""
    same = period == self._period
    copies = self._metric_copies.get(tag, []) if same else []
    for variable, value in copies:
      variable.assign(value, read_value=False)
    put_back = (self._covered if same else frozenset()) | set(
      id(v) for v, _ in copies
    )
    for metric in self._model.metrics:
      if not all(id(_inner(v)) in put_back for v in metric.variables):
        metric.reset_state()

  def _uncovered_metrics(self):
    return [
      v for v in _metric_variables(self._model) if id(v) not in self._covered
    ]


class InStepKeeper(_Keeper):
  """In-step snapshots and rollbacks for `SnapshotCallback(in_step=...)`.

  See "In-step mode" in the module doc. Made by the callback on its first
  eager `on_train_begin` and kept across `fit` calls.

  Args:
    store_arg: The callback's `store` argument (a device store, a function
      `model -> store`, or None for the default store).
    tag: The tag pinned to the slot the step copies into.
    monitor: The key of the train step's logs to check.
    max_consecutive_rollbacks: See `SnapshotCallback`.
    on_rollback: A function of no arguments, or None.
    backoff: The learning-rate factor at each rollback, or None.
    undo: "copy" or "skip": how a step is undone (see "In-step mode" in the
      module doc).
  """

  def __init__(
    self,
    store_arg,
    tag,
    monitor,
    max_consecutive_rollbacks,
    on_rollback,
    backoff,
    undo="copy",
  ):
    super(InStepKeeper, self).__init__(
      store_arg, monitor, max_consecutive_rollbacks, on_rollback, backoff
    )
    self._tag = tag
    self.undo = undo
    self._prepared = False  # this fit's step traced (and the way decided)
    self._snap = None  # the store's InStepSnapshot ("copy")
    self._decider = None  # the metric logged as `monitor` ("skip")
    self._counts = None  # int64 [rollbacks, consecutive], written in the step
    self._counts_for = None  # the strategy the counts were made under
    self._replicas = 1
    self._seen = 0  # rollbacks of this fit counted so far
    self.step = 0
    self.snapshots = 0  # the step copies; the callback takes none
    self.rollbacks = 0

  @property
  def trusted(self):
    """The slot's tag once a store exists (the start of the newest step
    whose loss was finite; before the first one, the start of `fit`).
    None when steps are undone by skipping their update: nothing is kept."""
    if self.store is None or self._tag not in self.store:
      return None
    return self._tag

  # -- fit ---------------------------------------------------------------------

  def start(self, model, params=None):
    """`on_train_begin`: checks, then wraps `model.train_step` (module doc).

    Args:
      model: The model `fit` trains.
      params: The callbacks' `params` of this `fit` (see `EagerKeeper`).

    Raises:
      ValueError: `backoff` with a learning rate that is not a variable; a
        store of your own built in graph mode, without device slots or
        without the state of a callback following rollbacks; a follower led
        by another callback.
    """
    strategy = model.distribute_strategy
    if _coordinator(model) is not None:
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
    rate = _learning_rate(model, self._backoff)
    replicas = strategy.num_replicas_in_sync
    if self.undo == "skip" and _merges_updates(strategy):
      raise ValueError(
        "SnapshotCallback(in_step_undo='skip') cannot run under %s (%d "
        "replica%s): it puts the optimizer's update under a tf.cond, and "
        "there the update aggregates the gradients across replicas (a "
        "merge_call), which TensorFlow refuses inside control flow in "
        "replica context. Use in_step_undo='copy'."
        % (type(strategy).__name__, replicas, "" if replicas == 1 else "s")
      )
    followed = self._lead(model, params)
    if isinstance(self._store_arg, SnapshotStore):
      _check_in_step_store(self._store_arg)
      if self.undo == "copy":
        _check_covers(self._store_arg, followed, self._followers)
    if self._counts is None or self._counts_for is not strategy:
      # Under a strategy, one component per replica, each written by its
      # replica alone (aggregation NONE): every replica takes the same
      # decision, so they hold the same counts.
      with strategy.scope():
        self._counts = tf2.Variable(
          [0, 0],
          dtype=tf2.int64,
          trainable=False,
          name="snapshot_callback",
          aggregation=tf2.VariableAggregation.NONE,
        )
      self._counts_for = strategy
    self._replicas = replicas
    self._counts.assign([0, 0], read_value=False)
    self._seen = 0
    self._last_batch = -1  # the `batch` of the last on_train_batch_end
    self._model = model
    self._rate = rate
    self.step = 0
    self._snap = None  # made again at the first trace of this fit's step
    self._decider = None
    self._prepared = False
    if self._replicas > 1:
      self._prepared = True
      # The first trace runs in replica context, where neither the scratch
      # trace (the step's gradient all-reduce cannot run in a nested
      # function there) nor the store's shadows can be made: made now.
      with strategy.scope():
        _build_compiled_metrics(model)
        # (Builds the optimizer too, in the strategy's scope.)
        made = _default_variables(model)
        self._made_with = frozenset(id(v) for v in made)
        self._make_store(model)
    _wrap_train_step(model, self)

  def epoch(self, epoch):
    del epoch  # a step's rollback never crosses an epoch
    self._last_batch = -1  # batches count from 0 again

  def end_epoch(self):
    pass

  def before_batch(self):
    pass

  def after_batch(self, batch, logs):
    """`on_train_batch_end`: counts the steps' rollbacks, raises when due.

    Raises:
      NonFiniteError: Too many rollbacks in a row, or weights that are not
        finite after a rollback.
    """
    self.step += 1
    steps, self._last_batch = batch - self._last_batch, batch
    value = _logged((logs or {}).get(self._monitor))
    if (
      steps == 1
      and self._replicas == 1
      and value is not None
      and (_finite(value))
    ):
      # One step ran, and the value it checked is finite: no rollback, and
      # no read of the counts (a read costs as much as a small step's copy).
      # (With replicas, the logs hold one replica's value; the step decided
      # on all of theirs.)
      self._stand()
      return
    rollbacks, consecutive = (int(c) for c in self._counts.numpy())
    new, self._seen = rollbacks - self._seen, rollbacks
    if not new:
      self._stand()
      return
    self.rollbacks += new
    if self._on_rollback is not None:
      for _ in range(new):
        self._on_rollback()
    if consecutive and not _all_finite(_trainable_floats(self._model)):
      self.finish(self._model)
      if self.undo == "skip":
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
        % (value, batch, self._tag)
      )
    if (
      self._max_consecutive is not None and consecutive > self._max_consecutive
    ):
      self.finish(self._model)
      raise errors.NonFiniteError(
        "The loss is %s at batch %d: %d rollbacks in a row, more than "
        "max_consecutive_rollbacks=%d. The variables hold the state after "
        "the last step whose loss was finite (each step was rolled back in "
        "the step)." % (value, batch, consecutive, self._max_consecutive)
      )

  def finish(self, model):
    """`on_train_end` (and before raising): puts `train_step` back."""
    _unwrap_train_step(model)

  # -- in the step ---------------------------------------------------------------

  def prepare(self, model, step, data):
    """At a trace of the wrapped step: state built, store or reads ready.

    The first trace in a fit first traces `step` once more in a scratch
    `tf.function` that never runs: what Keras makes in the first step (the
    optimizer's slots, the compiled metrics; Keras makes variables under
    `init_scope`, so they are real) is made there, so that what is restored
    covers it. (Not under `init_scope` itself: that pauses gradient tapes.)
    For "copy", the store and its slot are then made eagerly, under
    `init_scope`; for "skip", the same trace shows what the step writes
    outside the optimizer's update (`_check_skip`).

    Raises:
      ValueError: in_step_undo="skip" for a step it cannot undo (why).
    """
    if self._prepared:
      return
    specs = tf2.nest.map_structure(
      lambda t: tf2.type_spec_from_value(t) if tf2.is_tensor(t) else t, data
    )
    scratch = tf2.function(step, autograph=False)
    if self.undo == "skip":
      with skip_update.recording(model.optimizer) as update:
        graph = scratch.get_concrete_function(specs).graph
      self._check_skip(model, graph, update)
    else:
      scratch.get_concrete_function(specs)
      with tf2.init_scope():
        self._make_store(model)
    self._prepared = True

  def _check_skip(self, model, graph, update):
    """Sets what a skipped step puts back, after checking it can be skipped.

    Skipping needs the logged `monitor` value where the update is called:
    the step must be Keras's own (its "loss" is a metric the step updates
    before the optimizer's update, and the logs are the metrics' results);
    the update must be one call of the model's optimizer, and what else the
    step writes must be variables of the model, its optimizer or its
    metrics (module doc of `skip_update`).

    Raises:
      ValueError: The step cannot be undone by skipping its update.
    """

    def refuse(why):
      raise ValueError(
        "SnapshotCallback(in_step_undo='skip') cannot undo this train step "
        "by skipping its update: %s. Use in_step_undo='copy'." % why
      )

    own = [
      name
      for name in ("train_step", "compute_metrics", "get_metrics_result")
      if not _keras_method(model, name)
    ]
    if own:
      refuse(
        "%s has its own %s, so the logged %r is not known where the "
        "optimizer's update is called"
        % (type(model).__name__, " and ".join(own), self._monitor)
      )
    late = (
      "the train step updates %r after the optimizer's update (Keras "
      "updates the compiled metrics after it, the loss before it); monitor "
      "'loss'" % (self._monitor,)
    )
    metrics = [m for m in model.metrics if m.name == self._monitor]
    if len(metrics) != 1:
      held = [  # Keras 3 holds the compiled metrics in one container
        inner
        for m in model.metrics
        for inner in getattr(m, "metrics", None) or ()
        if inner.name == self._monitor
      ]
      if held:
        refuse(late)
      refuse(
        "the logged %r is no metric of the model, whose results Keras logs; "
        "monitor 'loss'" % (self._monitor,)
      )
    calls = update.calls(graph)
    if calls != 1:
      refuse(
        "the train step calls the optimizer's apply_gradients %d times, not "
        "once" % calls
      )
    writes = skip_update.outside_writes(
      graph, update, _default_variables(model)
    )
    if writes.unknown:
      refuse(
        "ops of the train step outside the optimizer's update may write "
        "resources that are no variables of the model, its optimizer or its "
        "metrics, which a skipped step would not put back (%s)"
        % ", ".join(sorted(set(writes.unknown))[:5])
      )
    if any(id(_inner(v)) in writes.after for v in metrics[0].variables):
      refuse(late)
    self._restored = writes.variables
    self._decider = metrics[0]

  def _make_store(self, model):
    """The store (made or reused), its slot pinned and written now."""
    followed = followed_state(self._followers)
    if self._store_arg is None:
      optimizer = model.optimizer
      covered = (
        frozenset(id(v) for v in self.store.variables.values())
        if (self.store is not None and self._built_for == (model, optimizer))
        else frozenset()
      )
      if not covered or any(
        id(v) not in covered
        for v in _default_variables(model) + list(followed.values())
      ):
        if self.store is not None:
          self.store.close()  # ours: its shadows are freed
        self.store = _default_store(model, followed, max_to_keep=1)
        self._built_for = (model, optimizer)
    elif self.store is None or self._built_for[0] is not model:
      store = self._store_arg
      if not isinstance(store, SnapshotStore):
        store = store(model)
        if not isinstance(store, SnapshotStore):
          raise TypeError(
            "The store function returned %r, not a SnapshotStore." % (store,)
          )
        _check_in_step_store(store)
        _check_covers(store, followed, self._followers)
      self.store = store
      self._built_for = (model, None)
    self._snap = self.store.slots.snapshot_in_step(0, self._tag)
    self._snap()  # the slot holds the start of this fit
    covered = frozenset(id(v) for v in self.store.variables.values())
    variables = list(self.store.variables.values())
    shadows = list(self.store.slots.shadows(0).values())
    self._from_slot = list(zip(variables, shadows))
    # Restored from the step's start: the store's variables, and the
    # metrics a store of your own leaves out (the logs' running means).
    self._restored = variables + [
      v for v in _metric_variables(model) if id(v) not in covered
    ]
    self._weights = _trainable_floats(model)

  def _check_made_before(self, model):
    """Under replicas: refuses a step that made state after the store.

    Raises:
      ValueError: The step made variables (tf-keras builds the compiled
        metrics in the first step) that the store, made at
        `on_train_begin`, neither covers nor can restore.
    """
    names = dict(
      (id(_inner(v)), "%s/%s" % (m.name, v.name.split(":")[0]))
      for m in model.metrics
      for v in m.variables
    )
    new = [
      names.get(id(v), v.name)
      for v in _default_variables(model)
      if id(v) not in self._made_with
    ]
    if new:
      raise ValueError(
        "SnapshotCallback(in_step=...) under %s with %d replicas makes its "
        "store at on_train_begin, but the first train step made more "
        "variables, which a rollback would not restore: %s (tf-keras makes "
        "a subclassed model's compiled metrics in the first step). Run one "
        "step first (e.g. "
        "model.train_on_batch or a 1-batch fit) so that they exist, or use "
        "every_n_batches=."
        % (
          type(model.distribute_strategy).__name__,
          self._replicas,
          ", ".join(sorted(new)),
        )
      )

  def guarded(self, step, data):
    """The step, undone in the step when its `monitor` value is not finite."""
    if self.undo == "skip":
      return self._skipping(step, data)
    return self._copying(step, data)

  def _skipping(self, step, data):
    """The step, its update applied only when the logged value is finite.

    What the rest of the step writes (`self._restored`, found by `prepare`)
    is read first, before anything writes it, and put back when the update
    was skipped; the decision is the `monitor` metric's result where the
    update is called, the value the logs then give.
    """
    reads = [(v, v.value()) for v in self._restored]
    metric = self._decider

    def decide():
      return tf2.reduce_all(tf2.math.is_finite(metric.result()))

    with skip_update.gated(self._model.optimizer, decide) as gate:
      logs = step(data)
    _check_logs(logs, self._monitor)
    if gate.condition is None:
      raise ValueError(
        "SnapshotCallback(in_step=...): the train step did not call the "
        "optimizer's apply_gradients this time, though its first trace did; "
        "pass in_step_undo='copy'."
      )
    counts = self._counts

    def kept():
      counts.assign(counts * tf2.constant([1, 0], tf2.int64), read_value=False)
      return tf2.constant(True)

    def skipped():
      for variable, read in reads:
        variable.assign(read, read_value=False)
      self._rolled_back(counts, lambda v: v)
      return tf2.constant(False)

    # A call, as the copy's rollback branch (`_copying`).
    keep_cond_as_call(tf2.cond(gate.condition, kept, skipped))
    return logs

  def _rolled_back(self, counts, local):
    """In a rollback branch: counts it, and cuts the learning rate."""
    counts.assign_add(tf2.constant([1, 1], tf2.int64), read_value=False)
    if self._rate is not None:
      rate = local(self._rate)
      rate.assign(
        rate * tf2.constant(self._backoff, rate.dtype), read_value=False
      )

  def _copying(self, step, data):
    """The step, copying its start into the slot or restoring it (doc).

    Under a strategy with replicas this runs in each replica: every write
    goes to that replica's own component (`distributed.local`), and the
    decision is on all replicas' values (one all-reduce), so that all undo
    the step together: the gradients were summed across them.
    """
    local = eager_distributed.local
    start = self._snap.begin()
    reads = []
    for variable in self._restored:  # one read each: begin()'s where it has one
      value = start.value_of(variable)
      reads.append(
        (variable, local(variable).value() if value is None else value)
      )
    logs = step(data)
    if self._replicas > 1:
      self._check_made_before(self._model)
    _check_logs(logs, self._monitor)
    value = tf2.convert_to_tensor(logs[self._monitor])
    finite = tf2.reduce_all(tf2.math.is_finite(value))
    if eager_distributed.in_replica_context():
      context = tf2.distribute.get_replica_context()
      finite = tf2.equal(
        context.all_reduce(
          tf2.distribute.ReduceOp.SUM, tf2.cast(finite, tf2.int32)
        ),
        context.num_replicas_in_sync,
      )
    counts = local(self._counts)

    def commit():
      start.commit()
      counts.assign(counts * tf2.constant([1, 0], tf2.int64), read_value=False)
      return tf2.constant(True)

    def from_slot():
      for variable, shadow in self._from_slot:
        local(variable).assign(local(shadow).read_value(), read_value=False)
      return tf2.constant(True)

    def roll_back():
      for variable, read in reads:
        local(variable).assign(read, read_value=False)
      # The start's weights are not finite (the update before this step
      # made them NaN while its own loss was finite): one step further back.
      checks = [tf2.reduce_all(tf2.math.is_finite(w)) for w in self._weights]
      if checks:
        tf2.cond(
          tf2.reduce_all(tf2.stack(checks)),
          lambda: tf2.constant(True),
          from_slot,
        )
      self._rolled_back(counts, local)
      return tf2.constant(False)

    decided = tf2.cond(finite, commit, roll_back)
    if self._replicas == 1:
      # Lowered, the rollback branch's nodes (about four per variable) pass
      # through the executor as dead ones at every step: 1-2% of the tests'
      # Dense-8 model's step, idle (bench/probe_in_step_cond.py).
      # Not under replicas, whose branches write components on several devices.
      keep_cond_as_call(decided)
    return logs


def _merges_updates(strategy):
  """Whether an optimizer's update under `strategy` runs a `merge_call` in
  replica context: under every strategy but `OneDeviceStrategy` and the
  default one (the one in effect outside any scope; TensorFlow has no
  public test for it, but `has_strategy()` is False in its scope only)."""
  if isinstance(strategy, tf2.distribute.OneDeviceStrategy):
    return False
  with strategy.scope():
    return tf2.distribute.has_strategy()


def _check_logs(logs, monitor):
  """Raises ValueError when the step's logs have no `monitor`."""
  if not isinstance(logs, dict) or monitor not in logs:
    raise ValueError(
      "The batch logs have no %r to check (they have %s); pass monitor= "
      "one of them."
      % (monitor, sorted(logs) if isinstance(logs, dict) else logs)
    )


def _keras_method(model, name):
  """Whether `model.<name>` is Keras's own (not a subclass's, not set on the
  instance, except by `_wrap_train_step`): Keras 3, tf-keras or Keras 2's."""
  if name in vars(model):
    wrapped = getattr(vars(model)[name], "snapstore_wrapped", None)
    if wrapped is None or wrapped[1]:  # set by the user
      return False
  method = getattr(type(model), name, None)
  module = getattr(method, "__module__", None) or ""
  return module.split(".")[0] in ("keras", "tf_keras")


_REMOTE_VALUE = getattr(
  getattr(tf2.distribute.experimental, "coordinator", None),
  "RemoteValue",
  (),
)


def uses_coordinator(model):
  """Whether `fit` schedules `model`'s steps on a `ClusterCoordinator`."""
  strategy = getattr(model, "distribute_strategy", None)
  return bool(getattr(strategy, "_should_use_with_coordinator", False))


def _coordinator(model):
  """The `ClusterCoordinator` `fit` schedules `model`'s steps on, or None."""
  if not uses_coordinator(model):
    return None
  # tf-keras's fit makes it (one per strategy) before on_train_begin.
  coordinator = getattr(model, "_cluster_coordinator", None)
  if coordinator is None:
    strategy = model.distribute_strategy
    coordinator = getattr(strategy, "_cluster_coordinator", None)
  return coordinator


def _wrap_train_step(model, keeper):
  """Replaces `model.train_step` on the instance; re-makes the train function.

  Keras calls `model.train_step` when it traces the train function, so the
  wrapper takes effect in the function made here (`fit` made its own before
  `on_train_begin`, and reads `model.train_function` at every batch).
  """
  _unwrap_train_step(model, remake=False)  # one left by a fit that raised
  step = original = model.train_step
  if not is_keras_3_object(model):
    # tf-keras traces its train function with AutoGraph, which converts the
    # step; the wrapper itself is not converted (AutoGraph takes a function
    # set on the instance for a method, and calls it with the model as
    # `data`), so the step is converted here, as it would have been.
    method = getattr(step, "__func__", None)  # to_graph unbinds methods
    if method is not None:
      step = functools.partial(tf2.autograph.to_graph(method), step.__self__)
    else:
      step = tf2.autograph.to_graph(step)

  @tf2.autograph.experimental.do_not_convert
  def train_step(data):
    try:
      keeper.prepare(model, step, data)
      return keeper.guarded(step, data)
    except Exception:
      # The trace runs in fit's first batch: leave the model as it was
      # (eagerly: tf-keras reads a variable to make its train function).
      with tf2.init_scope():
        _unwrap_train_step(model)
      raise

  train_step.snapstore_wrapped = (original, "train_step" in vars(model))
  model.train_step = train_step
  model.make_train_function(force=True)


def _unwrap_train_step(model, remake=True):
  """Puts back the `train_step` `_wrap_train_step` replaced, if it did."""
  wrapped = getattr(vars(model).get("train_step"), "snapstore_wrapped", None)
  if wrapped is None:
    return
  step, own = wrapped
  if own:  # the user's function on the instance
    model.train_step = step
  else:
    del model.train_step
  if remake:
    model.make_train_function(force=True)


def _build_compiled_metrics(model):
  """Makes tf-keras's compiled loss and metrics now, as its first step would.

  tf-keras builds them (and their variables) from the structure of the
  model's outputs in the first train step; Keras 3 has built them before
  `on_train_begin`. Each is built once, for outputs shaped as the model's.
  """
  if is_keras_3_object(model) or not getattr(model, "outputs", None):
    return
  outputs = model.outputs[0] if len(model.outputs) == 1 else model.outputs
  for container, args in (
    (getattr(model, "compiled_loss", None), (outputs,)),
    (getattr(model, "compiled_metrics", None), (outputs, outputs)),
  ):
    if container is not None and not getattr(container, "built", True):
      container.build(*args)


def _default_variables(model):
  """The variables `_default_store` would cover now, unwrapped."""
  return list(_default_var_list(model).values())


def _default_var_list(model):
  """{key: variable} of `_default_store`: the model's variables, those of
  every optimizer it holds (a GAN's own, set in its `compile`, once built:
  `_unbuilt_optimizers`), and the metrics' variables the model does not list
  (tf-keras lists them)."""
  optimizers = [
    o
    for o in eager_variables.held_optimizers(model)
    if o is model.optimizer or eager_variables.is_built(o)
  ]
  varset = eager_variables.variable_set(
    var_list=model, optimizer=optimizers or None
  )
  var_list = collections.OrderedDict((s.key, s.variable) for s in varset)
  covered = set(id(v) for v in var_list.values())
  for key, inner in eager_variables.metric_pairs(model):
    if id(inner) not in covered:
      var_list[eager_variables.unique_key(key, var_list)] = inner
  return var_list


def _held_name(model, optimizer):
  """The attribute of `model` holding `optimizer`, or its name."""
  for name, value in vars(model).items():
    if value is optimizer:
      return name
  return getattr(optimizer, "name", None) or "an optimizer"


def _unbuilt_optimizers(model):
  """Optimizers the model holds besides `model.optimizer` with no state yet
  (Keras makes it at their first `apply_gradients`, with the variables given
  there): a store made now could not cover it."""
  return [
    o
    for o in eager_variables.held_optimizers(model)
    if o is not model.optimizer and not eager_variables.is_built(o)
  ]


def _trainable_floats(model):
  return [
    v
    for v in (_inner(w) for w in model.trainable_variables)
    if v.dtype.is_floating
  ]


def _check_in_step_store(store):
  _check_eager_store(store)
  try:
    store.slots
  except errors.ModeError as e:
    raise ValueError(
      "SnapshotCallback(in_step=...) copies into a device slot in the train "
      "step, but store %r has none: %s" % (store.name, e)
    )


def _metric_variables(model):
  """The compiled metrics' variables, unwrapped, each once."""
  return [v for _, v in eager_variables.metric_pairs(model)]


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


def _all_finite(variables):
  checks = [tf2.reduce_all(tf2.math.is_finite(v)) for v in variables]
  return bool(tf2.reduce_all(tf2.stack(checks)).numpy()) if checks else True


def _default_store(model, followed=None, max_to_keep=2):
  """Device store of the model, its optimizers' state, the metrics made and
  `followed` ({key: variable}: the state of callbacks following rollbacks)."""
  var_list = _default_var_list(model)
  covered = set(id(v) for v in var_list.values())
  for key, variable in (followed or {}).items():
    if id(variable) not in covered:
      var_list[eager_variables.unique_key(key, var_list)] = variable
  return SnapshotStore(
    var_list=dict(var_list),
    mode="device",
    max_to_keep=max_to_keep,
    name="snapshot_callback",
  )


def _warm_up(store, model):
  """Runs each copy of a new default store once, at `on_train_begin`.

  The first call of a traced function instantiates it in TensorFlow's
  runtime (tens of milliseconds), which tf-keras would count against the
  batch hooks ("Callback method ... is slow"). Snapshots of the current
  values, restored into the variables: nothing changes. Also the eager ops
  of a rollback's finiteness check.
  """
  tags = ["snapshot_callback/warm_up_%d" % i for i in range(store.max_to_keep)]
  for tag in tags:
    store.snapshot(tag)
  for tag in tags:
    store.restore(tag)
    store.delete(tag)
  _all_finite([_inner(v) for v in model.trainable_variables[:1]])


def _check_eager_store(store):
  if store.graph is not None:
    raise ValueError(
      "SnapshotCallback's store %r was built in graph mode, but fit runs "
      "eagerly here. Build the store eagerly, next to the model (or pass "
      "store=None for the default store)." % store.name
    )


def _learning_rate(model, backoff):
  """The learning-rate `tf.Variable` that `backoff` multiplies, or None."""
  if backoff is None:
    return None
  # Under a LossScaleOptimizer (mixed precision), the optimizer it wraps
  # applies the rate (Keras 3's wrapper has a learning rate of its own, unused).
  chain = eager_variables.wrapped_chain(model.optimizer)
  optimizer = chain[-1] if chain else None
  # What the optimizer was given (a variable, or a schedule): tf-keras's
  # `learning_rate` with a schedule is a variable the schedule overwrites at
  # every step. Legacy optimizers have no `_learning_rate`.
  rate = getattr(optimizer, "_learning_rate", None)
  if rate is None:
    rate = getattr(optimizer, "learning_rate", None)
  inner = _inner(rate) if rate is not None else None
  if not isinstance(inner, tf2.Variable):
    raise ValueError(
      "backoff= multiplies the optimizer's learning rate at each rollback, "
      "but %s's learning rate is %r, not a variable (a schedule?). Pass a "
      "float learning rate to the optimizer, or cut it yourself in "
      "on_rollback=." % (type(optimizer).__name__, rate)
    )
  return inner


def _inner(variable):
  """The `tf.Variable` behind a Keras 3 variable (others as they are)."""
  if is_keras_3_object(variable):
    inner = keras_variable_value(variable)
    return inner if inner is not None else variable
  return variable
