"""`SnapshotCallback`: snapshots and rollbacks for Keras `model.fit`.

A Keras callback that takes a snapshot every N batches (or seconds), or lets
each train step take its own (`in_step=True`, eager `fit`), and rolls the
model back when the batch's `logs[monitor]` is NaN or infinite, so that
training goes on as if the bad batch had not been there:

    model.fit(x, y, callbacks=[snapstore.SnapshotCallback(every_n_batches=50)])
    model.fit(x, y, callbacks=[snapstore.SnapshotCallback(in_step=True)])

The callback is a facade. At each `on_train_begin` it picks the keeper that
does the work (`fit_keeper.FitKeeper`) from `_KEEPERS`, by the engine `fit`
runs on (`engines.choice`: graph mode in TF1-style Keras, `graph_fit.py`;
eager `fit` in Keras 3, tf-keras or TF 2.15's Keras 2) and by `in_step`
(eagerly: `batch_keeper.py` or `in_step_keeper.py`), keeps it across fits,
and hands it every callback method. The protocol is `SnapshotHook`'s
(`training/hooks.py`); what differs eagerly, and why:
docs/design/callback.md.
"""

import warnings

from snapstore._keras import keras_callback_base
from snapstore._keras import take_tensor_logs
from snapstore.core import checks
from snapstore.engines import choice
from snapstore.training import batch_keeper
from snapstore.training import fit_coordinator
from snapstore.training import fit_keeper
from snapstore.training import graph_fit
from snapstore.training import in_step_keeper
from snapstore.training import in_step_undo
from snapstore.training import protocol

# The keeper of a fit, by the engine it runs on and `in_step`.
_KEEPERS = {
  ("graph", False): graph_fit.GraphFitKeeper,
  ("graph", True): graph_fit.GraphFitKeeper,  # refuses in_step, naming the way
  ("eager", False): batch_keeper.BatchKeeper,
  ("eager", True): in_step_keeper.InStepKeeper,
}

# The tag of the in-step slot unless `in_step_tag` names one.
_IN_STEP_TAG = "before_step"


class SnapshotCallback(protocol.Protocol, keras_callback_base()):
  """The `SnapshotHook` protocol for `model.fit`, in graph mode or eagerly.

  Snapshots every N batches (or seconds) and rolls back when the batch loss
  (`logs[monitor]`) is NaN or infinite. Which engine is decided at each
  `on_train_begin`: graph mode (TF1-style Keras: `tf.keras` on TF 1.15 and
  2.15, tf-keras on TF 2.16+ with TF_USE_LEGACY_KERAS=1, in a program that
  chose graph mode; the session is `tf.keras.backend.get_session()`) or eager
  `fit` (Keras 3 with the TensorFlow backend, tf-keras, TF 2.15's Keras 2).
  Under Keras 3 the class is a Keras 3 callback, and making one in graph
  mode raises a RuntimeError.

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
      True to copy the state into a device slot inside every train step and
      roll a step whose logs[monitor] is not finite back inside that step,
      so that no batch hook does any copy and `steps_per_execution > 1`
      stays exact (see docs/design/callback.md, "In-step mode"). With a
      store of your own, a device store (1 slot is enough). A tag here is
      the deprecated spelling of `in_step=True, in_step_tag=<tag>` (a
      `DeprecationWarning`; removed in the next release).
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
    in_step_tag: With `in_step=True`: the tag the slot is pinned under
      (default "before_step"), as `SnapshotHook(in_step_tag=)` names the
      train op's.

  Raises:
    ValueError: Both or neither of `every_n_batches` and `every_n_secs`
      (without `in_step`); a `backoff` that is not > 0; `in_step` with
      `every_n_batches`, `every_n_secs` or `monitor=None`; `in_step_tag`
      without `in_step=True`; an `in_step_undo` that is not "copy" or
      "skip", or "skip" without `in_step=True`, or with a store or an
      `in_step_tag` of your own.
    TypeError: A bad `store`, `on_rollback`, `backoff`, `in_step` or
      `in_step_tag`; both `in_step_tag` and a tag as `in_step`.
    RuntimeError: Made in graph mode where `tf.keras` is Keras 3, which has
      no graph mode.

  Example:
    Undo exactly the batches whose loss is not finite:

    ```python
    rollback = snapstore.SnapshotCallback(every_n_batches=1)
    model.fit(x, y, callbacks=[rollback])
    # Or inside the compiled step, skipping a bad step's update:
    model.fit(x, y, callbacks=[snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")])
    ```
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
    in_step_tag=None,
  ):
    in_step, in_step_tag = _renamed_in_step(in_step, in_step_tag)
    _KEEPERS[(choice.new_engine().name, in_step)].check_made()
    super(SnapshotCallback, self).__init__()
    in_step_undo = _in_step_undo(in_step_undo, in_step, in_step_tag, store)
    in_step_tag = _in_step_tag(
      in_step, in_step_tag, every_n_batches, every_n_secs, monitor
    )
    self._configure(
      store,
      True,
      every_n_batches,
      every_n_secs,
      "every_n_batches",
      max_consecutive_rollbacks,
      on_rollback,
      timed=not in_step,
    )
    if backoff is not None and checks.number(backoff, "backoff") <= 0:
      raise ValueError("backoff must be > 0, got %r." % (backoff,))
    self._options = fit_keeper.FitOptions(
      store=store,
      timer_args=self._timer_args,
      monitor=monitor,
      max_consecutive_rollbacks=self._max_consecutive,
      on_rollback=self._on_rollback,
      backoff=backoff,
      in_step=in_step,
      in_step_tag=in_step_tag,
      in_step_undo=in_step_undo,
    )
    self._keepers = {}  # engine name -> its keeper, kept across fits

  def set_model(self, model):
    super(SnapshotCallback, self).set_model(model)
    # tf-keras refuses batch hooks under ParameterServerStrategy (v2) unless
    # the callback takes the logs as they come, a RemoteValue: this one does
    # (fit_coordinator.py). In-step, it reads one value per batch: taking
    # the logs as tensors spares tf-keras converting each of them at every
    # batch.
    take_tensor_logs(
      self,
      self._options.in_step or fit_coordinator.uses_coordinator(model),
    )

  def on_train_begin(self, logs=None):
    engine = choice.new_engine().name  # graph mode or eager execution, now
    keeper = self._keepers.get(engine)
    if keeper is None:
      keeper = _KEEPERS[(engine, self._options.in_step)](self._options)
      self._keepers[engine] = keeper
    keeper.start(self.model, self.params)
    self._keeper = keeper

  def on_epoch_begin(self, epoch, logs=None):
    self._keeper.begin_epoch(epoch)

  def on_epoch_end(self, epoch, logs=None):
    self._keeper.end_epoch()

  def on_train_batch_begin(self, batch, logs=None):
    self._keeper.before_batch()

  def on_train_end(self, logs=None):
    self._keeper.finish()

  def on_train_batch_end(self, batch, logs=None):
    self._keeper.after_batch(batch, logs)


def _renamed_in_step(in_step, in_step_tag):
  """(in_step, in_step_tag), the deprecated tag as `in_step` moved (warned).

  Raises:
    TypeError: A tag as `in_step` and `in_step_tag` too; a bad tag.
  """
  if in_step is None or isinstance(in_step, bool):
    return bool(in_step), in_step_tag
  tag = checks.tag(in_step)
  if in_step_tag is not None:
    raise TypeError(
      "SnapshotCallback got in_step=%r and in_step_tag=%r: a tag as in_step "
      "is the old spelling of in_step=True, in_step_tag=<tag>. Pass "
      "in_step=True, in_step_tag=%r." % (in_step, in_step_tag, in_step_tag)
    )
  warnings.warn(
    "SnapshotCallback(in_step=%r) is deprecated: in_step is True or False; "
    "pass in_step=True, in_step_tag=%r. A tag as in_step will be refused "
    "in the next release." % (tag, tag),
    DeprecationWarning,
    stacklevel=3,
  )
  return True, tag


def _in_step_undo(undo, in_step, in_step_tag, store):
  """SnapshotCallback's `in_step_undo`, checked against its other arguments."""
  if undo not in in_step_undo.WAYS:
    raise ValueError(
      "Invalid in_step_undo %r; must be one of %s."
      % (undo, ", ".join(sorted(in_step_undo.WAYS)))
    )
  if undo == "skip" and (
    store is not None or not in_step or in_step_tag is not None
  ):
    got = ["in_step=%r" % (in_step,)]
    if in_step_tag is not None:
      got.append("in_step_tag=%r" % (in_step_tag,))
    if store is not None:
      got.append("a store")
    raise ValueError(
      "in_step_undo='skip' undoes a step by not applying its update and "
      "copies nothing, so it needs in_step=True, with no store and no tag "
      "of your own (got %s). For a slot you can restore, use "
      "in_step_undo='copy'." % " and ".join(got)
    )
  return undo


def _in_step_tag(in_step, tag, every_n_batches, every_n_secs, monitor):
  """The in-step slot's tag (None without `in_step`), checked with the
  options it excludes and needs."""
  if not in_step:
    if tag is not None:
      raise ValueError(
        "SnapshotCallback(in_step_tag=%r) names the slot of in-step "
        "snapshots: pass in_step=True too, or leave in_step_tag out." % (tag,)
      )
    return None
  tag = _IN_STEP_TAG if tag is None else checks.tag(tag)
  if every_n_batches is not None or every_n_secs is not None:
    raise ValueError(
      "SnapshotCallback(in_step=True): every train step copies into the "
      "slot, so every_n_batches/every_n_secs do not apply. Pass neither."
    )
  if monitor is None:
    raise ValueError(
      "SnapshotCallback(in_step=True) rolls back a step whose logs[monitor] "
      "is not finite: pass monitor= (e.g. 'loss'), or use every_n_batches= "
      "for snapshots without rollback."
    )
  return tag
