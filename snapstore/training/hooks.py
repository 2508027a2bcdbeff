"""Snapshots and rollbacks for training loops you do not write yourself.

`SnapshotHook` is a `tf.train.SessionRunHook` for `MonitoredTrainingSession`
and Estimators; `SnapshotCallback` is a `tf.keras.callbacks.Callback` for
`model.fit` in TF1 Keras. Both take a snapshot of a store every N steps (or
seconds; or, for the hook, let the train op take one in every step, see
below) and, given a loss, roll the variables back when it comes out NaN or
infinite:

    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=2,
                                    optimizer=opt, include_global_step=True)
    hook = snapstore.SnapshotHook(store, every_n_steps=100, loss=loss)
    with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      while not sess.should_stop():
        sess.run(train_op)

    # An Estimator builds its graph in model_fn: give functions that find the
    # store's variables and the loss there (Estimator.train adds the
    # EstimatorSpec's loss to the LOSSES collection, last).
    hook = snapstore.SnapshotHook(
        lambda: snapstore.SnapshotStore(collection=tf.GraphKeys.GLOBAL_VARIABLES,
                                        max_to_keep=2),
        every_n_steps=100, loss=lambda: tf.get_collection(tf.GraphKeys.LOSSES)[-1])
    estimator.train(input_fn, hooks=[hook])

    model.fit(x, y, callbacks=[snapstore.SnapshotCallback(every_n_batches=50)])

`SnapshotCallback` also works in eager `fit` (Keras 3 with the TensorFlow
backend, tf-keras, TF 2.15's Keras 2): it takes the eager way when eager
execution is on at `on_train_begin`, with its own protocol (the snapshot
before a failing batch is restored, so that batch alone is undone); see
`snapstore/training/in_step_undo.py`. What follows is the graph-mode
protocol.

How a rollback works. A snapshot is taken before a step runs (the step's
parameters), and trusted once that step's loss, which is computed at those
parameters, is finite. When a loss is not finite, the variables are restored
from the newest trusted snapshot (a snapshot taken right before the failing
step is dropped) and training goes on with the next batch. So the store must
keep two snapshots (`max_to_keep >= 2`): the trusted one and the one being
checked. After `max_consecutive_rollbacks` rollbacks without a finite loss in
between, `NonFiniteError` is raised (with the variables restored).

Steps are counted per run of the session (per batch in Keras), from 0, so
they keep counting forward across rollbacks; the first step always takes a
snapshot. Like any hook, the snapshots go through the raw session and do not
count as steps.

A snapshot in every step, in the step's own run. `store.snapshot()` costs a
`session.run` of its own. A train op from `store.slots.snapshot_before(...,
if_finite=loss)` copies the variables into a device slot in its run when the
loss is finite (see `snapstore/engines/graph/in_step.py`), so the slot always holds
the parameters of the newest step whose loss was finite: exactly the trusted
snapshot. With `in_step=` the hook uses it and takes no snapshot and no
`session.run` of its own (a rollback is one run of the restore):

    grads = opt.compute_gradients(loss)
    snapstore.create_slots(opt, [v for g, v in grads if g is not None])
    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)  # 1 slot is enough
    train_op = store.slots.snapshot_before(
        lambda: opt.apply_gradients(grads, global_step=step), if_finite=loss)
    hook = snapstore.SnapshotHook(store, loss=loss, in_step="before_step")

The slot is trusted after the first step whose loss is finite; a NaN or
infinite loss before that raises `NonFiniteError`. That holds per session: a
new session (the one MonitoredTrainingSession's recovery starts) has a slot
of its own, holding what its initializer gave it, and trusts it only after
its own first finite step. Only runs that fetch the
train op count as steps (other runs write no slot) and have their loss
checked. In graph mode `SnapshotCallback` has no such mode: `model.fit` builds
its own train function from the optimizer's updates, and there is no train op
to hand it. In eager `fit` it has: `SnapshotCallback(in_step=True)` wraps the
model's `train_step` (see `snapstore/training/in_step_undo.py`).

Estimators: `Estimator.train` always adds its own `NanTensorHook`, which ends
training on a NaN loss. It runs after your hooks, so `SnapshotHook` has rolled
the variables back by then, but `train()` still stops with
`NanLossDuringTrainingError` (an infinite loss is rolled back and training
goes on).
"""

import numpy as np

from snapstore._tf import builds_eagerly
from snapstore._tf import keras_callback_base
from snapstore._tf import KERAS_3_FIX
from snapstore._tf import tf
from snapstore._tf import uses_keras_3
from snapstore.engines.graph import attached
from snapstore.core import checks
from snapstore.core import distributed
from snapstore import errors
from snapstore.store import SnapshotStore
from snapstore.engines.graph import in_step
from snapstore.training import in_step_undo


class _Keeper(object):
  """Periodic (or in-step) snapshots, trusted after a finite loss; rollback when not."""

  def __init__(
    self,
    store,
    timer,
    watching,
    max_consecutive_rollbacks,
    on_rollback,
    in_step=None,
  ):
    if (
      in_step is None
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
    self._timer = timer  # None with in_step
    self._in_step = in_step  # the tag the train op snapshots under, if finite
    self._watching = watching
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = on_rollback
    self.step = 0
    self.trusted = (
      None  # tag of the newest snapshot known to give a finite loss
    )
    self._checking = None  # tag of the snapshot taken before this step
    self._consecutive = 0
    self.snapshots = 0
    self.rollbacks = 0

  def distrust(self):
    """Forgets the trusted snapshot and the one being checked."""
    self.trusted = self._checking = None
    self._consecutive = 0

  def before_step(self, session):
    if self._in_step is not None:
      # The step's own run copies into the slot if its loss is finite.
      self._checking = self._in_step
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
    if self._checking is not None and self._in_step is None:
      # Its parameters gave this loss: never roll back to it.
      if self._checking in self.store:
        self.store.delete(self._checking)
      self._timer.reset()
    # (In-step, the run skipped its copy: the slot still holds what it held.)
    self._checking = None
    if self.trusted is None or self.trusted not in self.store:
      if self._in_step is not None:
        held = (
          "no step has had a finite loss yet, so %r holds no parameters "
          "known to give one" % (self._in_step,)
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


class _Protocol(object):
  """What SnapshotHook and SnapshotCallback share: options, and the keeper."""

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
      _timer_args(every_n_steps, every_n_secs, steps_name) if timed else None
    )
    if max_consecutive_rollbacks is not None:
      checks.integer(max_consecutive_rollbacks, "max_consecutive_rollbacks", 0)
    self._max_consecutive = max_consecutive_rollbacks
    self._on_rollback = checks.function(on_rollback, "on_rollback")
    self._keeper = None
    self._stores = attached.PerObject(
      "hook_store"
    )  # the store built on each graph

  def _store_for(self, store, graph, build):
    """`store` if a SnapshotStore, else the one `build()` made for `graph`."""
    if not isinstance(store, SnapshotStore):
      store = self._stores.get(graph)
      if (
        store is None
      ):  # built once per graph: a graph is often finalized later
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
      "%s's store" % type(self).__name__,
      than="the one being run",
      fix="With an Estimator (which builds a new graph for each train() call), "
      "pass a function that creates the store.",
    )
    return store

  def _start(self, store, watching, in_step=None):
    timer = (
      tf.train.SecondOrStepTimer(*self._timer_args)
      if self._timer_args is not None
      else None
    )
    self._keeper = _Keeper(
      store, timer, watching, self._max_consecutive, self._on_rollback, in_step
    )

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
    """Snapshots taken since training started (by the hook: 0 with in_step)."""
    return self._keeper.snapshots if self._keeper else 0

  @property
  def trusted(self):
    """Tag of the newest snapshot known to give a finite loss (or None)."""
    return self._keeper.trusted if self._keeper else None


class SnapshotHook(_Protocol, tf.train.SessionRunHook):
  """Snapshots every N steps or seconds, or in the step; rolls back on a non-finite loss.

  See the module docstring for the protocol.

  Args:
    store: A `SnapshotStore`, or a function of no arguments returning one,
      called in `begin()`, when the graph is complete but not finalized (how
      to use the hook with an Estimator, whose graph is built in `model_fn`).
      With a `loss` and no `in_step`, the store must keep 2 snapshots.
    every_n_steps: Snapshot every this many runs of the session.
    every_n_secs: Or: snapshot when this many seconds have passed.
    loss: The tensor to check after each run: a float `Tensor`, a tensor name
      ("loss:0"), or a function of no arguments returning the tensor (called
      in `begin()`). None: snapshots only, no rollback.
    max_consecutive_rollbacks: Raise `NonFiniteError` after this many
      rollbacks without a finite loss in between; None: never.
    on_rollback: A function called with the (raw) session after each rollback,
      e.g. to lower a learning rate.
    in_step: Instead of `every_n_steps`/`every_n_secs`: the tag of a train op
      from `store.slots.snapshot_before(update, tag=in_step, if_finite=loss)`, whose
      own run snapshots when its loss is finite. The hook takes no snapshot
      and checks only the runs that fetch that train op.

  Raises:
    ValueError: Both or neither of `every_n_steps` and `every_n_secs` (without
      `in_step`), or non-positive values; `in_step` without `loss`, or with
      `every_n_steps` or `every_n_secs`. In `begin()`: an `in_step` tag that
      no train op of the store snapshots under, one built without
      `if_finite`, or with another tensor than `loss`; a task that is not
      the chief of a `ParameterServerStrategy` v1 cluster (its snapshots
      would overwrite the chief's: give the hook to the chief only).
    TypeError: A store that is neither a `SnapshotStore` nor callable, a bad
      `loss`, `on_rollback` or `in_step` tag.
  """

  def __init__(
    self,
    store,
    every_n_steps=None,
    every_n_secs=None,
    loss=None,
    max_consecutive_rollbacks=3,
    on_rollback=None,
    in_step=None,
  ):
    if not (
      loss is None or isinstance(loss, (tf.Tensor, str)) or callable(loss)
    ):
      raise TypeError(
        "loss must be a tensor, a tensor name or a function "
        "returning a tensor, got %r." % (loss,)
      )
    if in_step is not None:
      in_step = checks.tag(in_step)
      if loss is None:
        raise ValueError(
          "SnapshotHook(in_step=%r) rolls back when a step's loss is not "
          "finite: pass loss=, the tensor given to snapshot_before(..., "
          "if_finite=)." % (in_step,)
        )
      if every_n_steps is not None or every_n_secs is not None:
        raise ValueError(
          "SnapshotHook(in_step=%r): the train op snapshots in its own run, "
          "so the hook takes no snapshots and every_n_steps/every_n_secs "
          "do not apply. Pass neither." % (in_step,)
        )
    self._configure(
      store,
      False,
      every_n_steps,
      every_n_secs,
      "every_n_steps",
      max_consecutive_rollbacks,
      on_rollback,
      timed=in_step is None,
    )
    self._store_arg = store
    self._loss_arg = loss
    self._loss = None
    self._in_step = in_step
    self._in_step_ops = None  # the train ops snapshotting under in_step
    self._checked = False  # whether this run is one the hook checks

  def begin(self):
    distributed.check_chief_of_ps("SnapshotHook")
    graph = tf.get_default_graph()
    store = self._store_for(self._store_arg, graph, self._store_arg)
    self._loss = _resolve_loss(self._loss_arg, graph)
    if self._in_step is not None:
      self._in_step_ops = _in_step_ops(store, self._in_step, self._loss)
    self._start(store, watching=self._loss is not None, in_step=self._in_step)

  def after_create_session(self, session, coord):
    del session, coord
    if self._in_step is not None:
      # A new session (MonitoredTrainingSession's recovery makes one) has a
      # slot of its own, holding what its initializer gave it: no step of
      # this session has vouched for it yet.
      self._keeper.distrust()

  def before_run(self, run_context):
    # In-step, a run without the train op wrote no slot: nothing to vouch for.
    self._checked = self._in_step_ops is None or bool(
      in_step.fetched(
        run_context.original_args.fetches,
        self._keeper.store.graph,
        self._in_step_ops,
      )
    )
    if not self._checked:
      return None
    self._keeper.before_step(run_context.session)
    if self._loss is None:
      return None
    return tf.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    if self._checked:
      self._keeper.after_step(run_context.session, run_values.results)


class SnapshotCallback(_Protocol, keras_callback_base()):
  """The `SnapshotHook` protocol for `model.fit`, in graph mode or eagerly.

  Snapshots every N batches (or seconds) and rolls back when the batch loss
  (`logs[monitor]`) is NaN or infinite. Which engine is decided at each
  `on_train_begin`: graph mode (TF1-style Keras: `tf.keras` on TF 1.15 and
  2.15, tf-keras on TF 2.16+ with TF_USE_LEGACY_KERAS=1, in a program that
  chose graph mode; the session is `tf.keras.backend.get_session()`) or eager
  `fit` (Keras 3 with the TensorFlow backend, tf-keras, TF 2.15's Keras 2; see
  `snapstore/training/in_step_undo.py`). Under Keras 3 the class is a Keras
  3 callback, and making one in graph mode raises a RuntimeError.

  Args:
    store: A `SnapshotStore`, a function `model -> SnapshotStore`, or None for
      a device store of the model's weights (trainable and not: batch-norm
      statistics too; eagerly also Keras 3 seed-generator states) and the
      optimizer's state (slots and `iterations`, not the learning rate),
      keeping 2 snapshots: an exact rollback. Eagerly, the callback also
      copies the compiled metrics (the logs' running means) with each
      snapshot, and covers the state of a Lookahead callback in the same
      `fit` (`lookahead.variables()`; a store of your own must). Built once
      per graph (eagerly: per model and optimizer), at the start of `fit`.
    every_n_batches: Snapshot every this many batches.
    every_n_secs: Or: snapshot when this many seconds have passed.
    monitor: The key of the value to check in the batch logs; None: snapshots
      only, no rollback.
    max_consecutive_rollbacks: Raise `NonFiniteError` after this many
      rollbacks without a finite loss in between; None: never.
    on_rollback: A function called after each rollback: with the session in
      graph mode, with no arguments eagerly.
    backoff: Eager `fit` only: multiply the optimizer's learning rate (a
      variable) by this factor, 0 < backoff, at each rollback. Checked at
      `on_train_begin`.
    in_step: Eager `fit` only, instead of `every_n_batches`/`every_n_secs`:
      True (or the tag to pin the slot under; True means "before_step") to
      copy the state into a device slot inside every train step and roll a
      step whose logs[monitor] is not finite back inside that step, so that
      no batch hook does any copy and `steps_per_execution > 1` stays exact
      (see "In-step mode" in `snapstore/training/in_step_undo.py`). With a
      store of your own, a device store (1 slot is enough).
    in_step_undo: With `in_step`, how a step is undone. "copy" (default):
      the whole state is read at each step's start, kept in the store's slot
      when the logged value is finite (the start of the newest such step)
      and written back when it is not; a step whose start has weights that
      are not finite (an update whose loss was finite made them so) goes
      one step further back, to the slot. "skip": nothing is copied; the
      optimizer's update is applied only when the logged value is finite,
      and what the rest of the step writes (batch-norm statistics, seed
      states, metrics) is read at its start and put back when it was not.
      It costs a few ops per step instead of a copy of the state, and has no
      older state to go back to (weights made non-finite by an update whose
      loss was finite raise `NonFiniteError` at the next rollback). A fit
      ends bit for bit as the same fit without the bad batches; against one
      without the callback, the gated update may round otherwise (TensorFlow's
      graph optimizer does not rewrite arithmetic across the gate). It needs
      Keras's own train step, a `monitor` that is one of its metrics
      ("loss"), no strategy but the default one or `OneDeviceStrategy`, and
      no store or tag of your own.

  Raises:
    ValueError: Both or neither of `every_n_batches` and `every_n_secs`
      (without `in_step`); a `backoff` that is not > 0; `in_step` with
      `every_n_batches`, `every_n_secs` or `monitor=None`; an
      `in_step_undo` that is not "copy" or "skip", or "skip" without
      `in_step=True` or with a store of your own.
    TypeError: A bad `store`, `on_rollback`, `backoff` or `in_step`.
    RuntimeError: Made in graph mode where `tf.keras` is Keras 3, which has
      no graph mode.
  """

  def __init__(
    self,
    store=None,
    every_n_batches=None,
    every_n_secs=None,
    monitor="loss",
    max_consecutive_rollbacks=3,
    on_rollback=None,
    backoff=None,
    in_step=False,
    in_step_undo="copy",
  ):
    if uses_keras_3() and not builds_eagerly():
      raise RuntimeError(
        "SnapshotCallback needs TF1-style Keras, but tf.keras is Keras 3 "
        "here, and the callback is being made in graph mode. Keras 3 trains "
        "eagerly: make the callback (and call fit) with eager execution on, "
        "TensorFlow 2's default. For graph mode, %s" % KERAS_3_FIX
      )
    super(SnapshotCallback, self).__init__()
    in_step_undo = _in_step_undo(in_step_undo, in_step, store)
    in_step = _in_step_tag(in_step, every_n_batches, every_n_secs, monitor)
    self._configure(
      store,
      True,
      every_n_batches,
      every_n_secs,
      "every_n_batches",
      max_consecutive_rollbacks,
      on_rollback,
      timed=in_step is None,
    )
    if backoff is not None and checks.number(backoff, "backoff") <= 0:
      raise ValueError("backoff must be > 0, got %r." % (backoff,))
    self._store_arg = store
    self._monitor = monitor
    self._backoff = backoff
    self._in_step = in_step  # the slot's tag, or None
    self._in_step_undo = in_step_undo
    self._eager = None  # the eager engine's keeper, kept across fits

  def set_model(self, model):
    super(SnapshotCallback, self).set_model(model)
    # tf-keras refuses batch hooks under ParameterServerStrategy (v2) unless
    # the callback takes the logs as they come, a RemoteValue: this one does
    # (snapstore/training/in_step_undo.py, "Parameter servers"). In-step,
    # it reads one value per batch: taking the logs as tensors spares tf-keras
    # converting each of them at every batch.
    self._supports_tf_logs = (
      self._in_step is not None or in_step_undo.uses_coordinator(model)
    )

  def on_train_begin(self, logs=None):
    if builds_eagerly():
      if self._eager is None and self._in_step is not None:
        self._eager = in_step_undo.InStepKeeper(
          self._store_arg,
          self._in_step,
          self._monitor,
          self._max_consecutive,
          self._on_rollback,
          self._backoff,
          self._in_step_undo,
        )
      elif self._eager is None:
        self._eager = in_step_undo.EagerKeeper(
          self._store_arg,
          self._timer_args,
          self._monitor,
          self._max_consecutive,
          self._on_rollback,
          self._backoff,
        )
      self._eager.start(self.model, self.params)
      self._keeper = self._eager
      return
    if self._in_step is not None:
      raise ValueError(
        "in_step= is for eager fit; in graph mode, build the train op with "
        "store.slots.snapshot_before(..., if_finite=loss) and train it under "
        "SnapshotHook(store, loss=loss, in_step=tag)."
      )
    if self._backoff is not None:
      raise ValueError(
        "backoff= is for eager fit; in graph mode, lower the learning rate "
        "in on_rollback=, which is called with the session."
      )
    graph = tf.keras.backend.get_session().graph
    factory = self._store_arg if self._store_arg is not None else _keras_store
    store = self._store_for(self._store_arg, graph, lambda: factory(self.model))
    self._start(store, watching=self._monitor is not None)

  @property
  def _eagerly(self):
    """Whether this fit runs on the eager engine."""
    return self._eager is not None and self._keeper is self._eager

  def on_epoch_begin(self, epoch, logs=None):
    if self._eagerly:
      self._eager.epoch(epoch)

  def on_epoch_end(self, epoch, logs=None):
    if self._eagerly:
      self._eager.end_epoch()

  def on_train_batch_begin(self, batch, logs=None):
    if self._eagerly:
      self._eager.before_batch()
      return
    self._keeper.before_step(tf.keras.backend.get_session())

  def on_train_end(self, logs=None):
    if self._eagerly and self._in_step is not None:
      self._eager.finish(self.model)

  def on_train_batch_end(self, batch, logs=None):
    if self._eagerly and self._in_step is not None:
      self._eager.after_batch(batch, logs)
      return
    if self._eagerly:
      self._eager.after_batch(logs)
      return
    value = in_step_undo.monitored_value(self._monitor, logs)
    self._keeper.after_step(tf.keras.backend.get_session(), value)


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


def _in_step_ops(store, tag, loss):
  """The train ops snapshotting under `tag` when `loss` is finite, checked."""
  try:
    slots = store.slots
  except errors.ModeError as e:
    raise ValueError(
      "SnapshotHook(in_step=%r) needs a train op that snapshots into a "
      "device slot in its run (store.slots.snapshot_before): %s" % (tag, e)
    )
  ops = slots.in_step_ops(tag)
  if not ops:
    raise ValueError(
      "SnapshotHook(in_step=%r): no train op of the store snapshots under "
      "that tag in its run (its pinned tags: %s). Build the train op with "
      "store.slots.snapshot_before(update, tag=%r, if_finite=loss)."
      % (tag, slots.pinned(), tag)
    )
  for op in ops:
    condition = slots.in_step_condition(op)
    if condition is None:
      raise ValueError(
        "SnapshotHook(in_step=%r): train op %s writes the slot in every run, "
        "also when the loss is not finite, so the slot could hold the "
        "parameters that gave it. Build the train op with "
        "store.slots.snapshot_before(..., if_finite=loss)." % (tag, op.name)
      )
    if condition.name != loss.name:
      raise ValueError(
        "SnapshotHook(in_step=%r): the hook checks the loss %s, but train op "
        "%s snapshots when %s is finite. Pass the same tensor as loss= and "
        "as if_finite=, so that the slot holds parameters whose checked loss "
        "was finite." % (tag, loss.name, op.name, condition.name)
      )
  return ops


_IN_STEP_UNDO = ("copy", "skip")


def _in_step_undo(undo, in_step, store):
  """SnapshotCallback's `in_step_undo`, checked against its other arguments."""
  if undo not in _IN_STEP_UNDO:
    raise ValueError(
      "Invalid in_step_undo %r; must be one of %s."
      % (undo, ", ".join(_IN_STEP_UNDO))
    )
  if undo == "skip" and (store is not None or in_step is not True):
    raise ValueError(
      "in_step_undo='skip' undoes a step by not applying its update and "
      "copies nothing, so it needs in_step=True, with no store and no tag "
      "of your own (got in_step=%r%s). For a slot you can restore, use "
      "in_step_undo='copy'."
      % (in_step, " and a store" if store is not None else "")
    )
  return undo


def _in_step_tag(in_step, every_n_batches, every_n_secs, monitor):
  """SnapshotCallback's `in_step`: the slot's tag, or None; checked."""
  if in_step is False or in_step is None:
    return None
  tag = "before_step" if in_step is True else checks.tag(in_step)
  if every_n_batches is not None or every_n_secs is not None:
    raise ValueError(
      "SnapshotCallback(in_step=%r): every train step copies into the slot, "
      "so every_n_batches/every_n_secs do not apply. Pass neither." % (in_step,)
    )
  if monitor is None:
    raise ValueError(
      "SnapshotCallback(in_step=%r) rolls back a step whose logs[monitor] is "
      "not finite: pass monitor= (e.g. 'loss'), or use every_n_batches= for "
      "snapshots without rollback." % (in_step,)
    )
  return tag


def _timer_args(every_n_steps, every_n_secs, steps_name):
  if (every_n_steps is None) == (every_n_secs is None):
    raise ValueError("Pass exactly one of %s and every_n_secs." % steps_name)
  if every_n_steps is not None:
    return None, checks.integer(every_n_steps, steps_name, 1)
  if checks.number(every_n_secs, "every_n_secs") <= 0:
    raise ValueError("every_n_secs must be > 0, got %r." % (every_n_secs,))
  return float(every_n_secs), None


def _resolve_loss(loss, graph):
  if loss is None:
    return None
  if isinstance(loss, str):
    try:
      loss = graph.get_tensor_by_name(loss)
    except (KeyError, ValueError) as e:
      raise ValueError(
        "loss=%r names no tensor of the graph (%s). Pass a name "
        "like 'loss:0', the tensor, or a function returning it." % (loss, e)
      )
  elif not isinstance(loss, tf.Tensor):
    loss = loss()
  if not isinstance(loss, tf.Tensor):
    raise TypeError("The loss function returned %r, not a tensor." % (loss,))
  checks.same_graph(
    loss, graph, "The loss %s" % loss.name, than="the one being run"
  )
  if not loss.dtype.is_floating:
    raise TypeError(
      "The loss %s has dtype %s; only float tensors can be NaN or "
      "infinite." % (loss.name, loss.dtype.name)
    )
  return loss
