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
so a rollback undoes the whole execution.
"""

import collections

import numpy as np

from snapstore._tf import is_keras_3_object
from snapstore._tf import keras_variable_value
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.eager import variables as eager_variables
from snapstore import errors
from snapstore.store import SnapshotStore


class EagerKeeper(object):
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
    self._store_arg = store_arg
    self._timer_args = timer_args
    self._monitor = monitor
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = on_rollback
    self._backoff = backoff
    self.store = None
    self._built_for = None  # (model, optimizer) the store was made for
    self._model = None
    self._rate = None  # the learning-rate variable `backoff` multiplies
    self._fits = 0
    self._period = None  # (fit, epoch): metrics are reset at each epoch
    self._tags = []  # (tag, period) of our snapshots, oldest first
    self._first_batch = False
    self._covered = frozenset()  # ids of the store's variables
    self._metric_vars = []  # metric variables the store does not cover
    self._metric_copies = {}  # tag -> [(variable, numpy value)]
    self._timer = None
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

  def start(self, model):
    """`on_train_begin`: checks, then the store (built or reused), traced now.

    Raises:
      ValueError: `backoff` with a learning rate that is not a variable; a
        store built in graph mode; the default store's own checks.
      TypeError: A store function that returns no `SnapshotStore`.
    """
    rate = _learning_rate(model, self._backoff)
    if self._default:
      optimizer = model.optimizer
      if self.store is None or self._built_for != (model, optimizer):
        self._set_store(_default_store(model), (model, optimizer))
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
    self._set_store(_default_store(model), (model, model.optimizer))
    _warm_up(self.store, model)
    self._metric_vars = self._uncovered_metrics()
    # The state now is what the next batch starts from: its snapshot.
    self._take()

  def before_batch(self):
    """`on_train_batch_begin`: a snapshot when the timer says so."""
    if self._timer.should_trigger_for_step(self.step):
      self._take()

  def _take(self):
    """A snapshot for the batch at `self.step`."""
    tag = self.store.snapshot()
    self._timer.update_last_triggered_step(self.step)
    self.snapshots += 1
    self._tags = [(t, p) for t, p in self._tags if t != tag]
    self._tags.append((tag, self._period))
    self._copy_metrics(tag)

  def after_batch(self, logs):
    """`on_train_batch_end`: rolls back when the monitored value is not finite.

    Raises:
      ValueError: The logs have no `monitor`.
      NonFiniteError: Nothing to roll back to, or too many rollbacks in a row.
    """
    value = None
    if self._monitor is not None:
      if not logs or self._monitor not in logs:
        raise ValueError(
          "The batch logs have no %r to check (they have %s); "
          "pass monitor= one of them, or None."
          % (self._monitor, sorted(logs or ()))
        )
      value = np.asarray(logs[self._monitor])
    step, self.step = self.step, self.step + 1
    if self._first_batch:
      # Keras made its compiled metrics in this step: copy them from now on.
      self._first_batch = False
      self._metric_vars = self._uncovered_metrics()
    if value is None or np.all(np.isfinite(value)):
      self._consecutive = 0
      return
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
    held = set(t for t, _ in self._held())
    for old in [t for t in self._metric_copies if t not in held]:
      del self._metric_copies[old]
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


def _metric_variables(model):
  """The compiled metrics' variables, unwrapped, each once."""
  out, seen = [], set()
  for metric in model.metrics:
    for v in metric.variables:
      inner = _inner(v)
      if id(inner) not in seen:
        seen.add(id(inner))
        out.append(inner)
  return out


def _all_finite(variables):
  checks = [tf2.reduce_all(tf2.math.is_finite(v)) for v in variables]
  return bool(tf2.reduce_all(tf2.stack(checks)).numpy()) if checks else True


def _default_store(model):
  """Device store of the model, its optimizer's state and the metrics made."""
  varset = eager_variables.variable_set(
    var_list=model, optimizer=model.optimizer
  )
  var_list = collections.OrderedDict((s.key, s.variable) for s in varset)
  for metric in model.metrics:
    for v in metric.variables:
      inner = _inner(v)
      # Keras 3: the path ("loss/total"); tf-keras names every Mean's
      # variables "total:0" and "count:0".
      name = getattr(v, "path", None) if is_keras_3_object(v) else None
      key = "metrics/" + (name or "%s/%s" % (metric.name, v.name.split(":")[0]))
      while key in var_list:
        key += "_"
      var_list[key] = inner
  return SnapshotStore(
    var_list=dict(var_list),
    mode="device",
    max_to_keep=2,
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
  optimizer = model.optimizer
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
