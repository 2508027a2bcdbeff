"""`SnapshotHook`: snapshots and rollbacks for `MonitoredTrainingSession`.

A `tf.train.SessionRunHook` for `MonitoredTrainingSession` and Estimators
(graph mode). It takes a snapshot of a store every N steps (or seconds; or
lets the train op take one in every step, see below) and, given a loss,
rolls the variables back when it comes out NaN or infinite:

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

`snapstore.SnapshotCallback` (`training/keras_callback.py`) follows the same
protocol in a graph-mode `model.fit`, counting batches for steps.

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
loss is finite (see `snapstore/engines/graph/in_step.py`), so the slot always
holds the parameters of the newest step whose loss was finite: exactly the
trusted snapshot. With `in_step_tag=` the hook uses it and takes no snapshot
and no `session.run` of its own (a rollback is one run of the restore):

    grads = opt.compute_gradients(loss)
    snapstore.create_optimizer_slots(opt, [v for g, v in grads if g is not None])
    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)  # 1 slot is enough
    train_op = store.slots.snapshot_before(
        lambda: opt.apply_gradients(grads, global_step=step), if_finite=loss)
    hook = snapstore.SnapshotHook(store, loss=loss, in_step_tag="before_step")

The slot is trusted after the first step whose loss is finite; a NaN or
infinite loss before that raises `NonFiniteError`. That holds per session: a
new session (the one MonitoredTrainingSession's recovery starts) has a slot
of its own, holding what its initializer gave it, and trusts it only after
its own first finite step. Only runs that fetch the train op count as steps
(other runs write no slot) and have their loss checked.

Estimators: `Estimator.train` always adds its own `NanTensorHook`, which ends
training on a NaN loss. It runs after your hooks, so `SnapshotHook` has rolled
the variables back by then, but `train()` still stops with
`NanLossDuringTrainingError` (an infinite loss is rolled back and training
goes on).
"""

import warnings

from snapstore._tf import tf
from snapstore.core import checks
from snapstore.core import distributed
from snapstore.engines.graph import in_step
from snapstore import errors
from snapstore.training import protocol
from snapstore.training import step_keeper


class SnapshotHook(protocol.Protocol, tf.train.SessionRunHook):
  """Snapshots every N steps or seconds, or in the step; rolls back on a non-finite loss.

  See the module docstring for the protocol.

  Args:
    store: A `SnapshotStore`, or a function of no arguments returning one,
      called in `begin()`, when the graph is complete but not finalized (how
      to use the hook with an Estimator, whose graph is built in `model_fn`).
      With a `loss` and no `in_step_tag`, the store must keep 2 snapshots.
    every_n_steps: Snapshot every this many runs of the session.
    every_n_secs: Or: snapshot when this many seconds have passed.
    loss: The tensor to check after each run: a float `Tensor`, a tensor name
      ("loss:0"), or a function of no arguments returning the tensor (called
      in `begin()`). None: snapshots only, no rollback.
    max_consecutive_rollbacks: Raise `NonFiniteError` after this many
      rollbacks without a finite loss in between; None: never.
    on_rollback: A function called with the (raw) session after each rollback,
      e.g. to lower a learning rate.
    in_step_tag: Instead of `every_n_steps`/`every_n_secs`: the tag of a train
      op from `store.slots.snapshot_before(update, tag=in_step_tag,
      if_finite=loss)`, whose own run snapshots when its loss is finite. The
      hook takes no snapshot and checks only the runs that fetch that train
      op.
    in_step: Deprecated spelling of `in_step_tag` (a `DeprecationWarning`);
      removed in the next release.

  Raises:
    ValueError: Both or neither of `every_n_steps` and `every_n_secs` (without
      `in_step_tag`), or non-positive values; `in_step_tag` without `loss`,
      or with `every_n_steps` or `every_n_secs`. In `begin()`: an
      `in_step_tag` that no train op of the store snapshots under, one built
      without `if_finite`, or with another tensor than `loss`; a task that
      is not the chief of a `ParameterServerStrategy` v1 cluster (its
      snapshots would overwrite the chief's: give the hook to the chief only).
    TypeError: A store that is neither a `SnapshotStore` nor callable, a bad
      `loss`, `on_rollback` or `in_step_tag`; both `in_step_tag` and
      `in_step`.

  Example:
    ```python
    store = snapstore.SnapshotStore(
      scope="net", optimizer=opt, include_global_step=True, max_to_keep=2
    )
    hook = snapstore.SnapshotHook(store, every_n_steps=100, loss=loss)
    with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
      while not sess.should_stop():
        sess.run(train_op)  # a NaN loss: back to the last good snapshot
    ```
  """

  def __init__(
    self,
    store,
    every_n_steps=None,
    every_n_secs=None,
    loss=None,
    max_consecutive_rollbacks=3,
    on_rollback=None,
    in_step_tag=None,
    *,
    in_step=None,
  ):
    in_step_tag = _renamed_in_step(in_step, in_step_tag)
    if not (
      loss is None or isinstance(loss, (tf.Tensor, str)) or callable(loss)
    ):
      raise TypeError(
        "loss must be a tensor, a tensor name or a function "
        "returning a tensor, got %r." % (loss,)
      )
    if in_step_tag is not None:
      in_step_tag = checks.tag(in_step_tag)
      if loss is None:
        raise ValueError(
          "SnapshotHook(in_step_tag=%r) rolls back when a step's loss is not "
          "finite: pass loss=, the tensor given to snapshot_before(..., "
          "if_finite=)." % (in_step_tag,)
        )
      if every_n_steps is not None or every_n_secs is not None:
        raise ValueError(
          "SnapshotHook(in_step_tag=%r): the train op snapshots in its own "
          "run, so the hook takes no snapshots and every_n_steps/every_n_secs "
          "do not apply. Pass neither." % (in_step_tag,)
        )
    self._configure(
      store,
      False,
      every_n_steps,
      every_n_secs,
      "every_n_steps",
      max_consecutive_rollbacks,
      on_rollback,
      timed=in_step_tag is None,
    )
    self._stores = step_keeper.StorePerGraph("SnapshotHook")
    self._store_arg = store
    self._loss_arg = loss
    self._loss = None
    self._in_step_tag = in_step_tag
    self._in_step_ops = None  # the train ops snapshotting under the tag
    self._checked = False  # whether this run is one the hook checks

  def begin(self):
    distributed.check_chief_of_ps("SnapshotHook")
    graph = tf.get_default_graph()
    store = self._stores.get(self._store_arg, graph, self._store_arg)
    self._loss = _resolve_loss(self._loss_arg, graph)
    if self._in_step_tag is not None:
      self._in_step_ops = _in_step_ops(store, self._in_step_tag, self._loss)
    timer = (
      tf.train.SecondOrStepTimer(*self._timer_args)
      if self._timer_args is not None
      else None
    )
    self._keeper = step_keeper.StepKeeper(
      store,
      timer,
      self._loss is not None,
      self._max_consecutive,
      self._on_rollback,
      self._in_step_tag,
    )

  def after_create_session(self, session, coord):
    del session, coord
    if self._in_step_tag is not None:
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


def _renamed_in_step(in_step, in_step_tag):
  """`in_step_tag`, or the deprecated `in_step` given for it (warned).

  Raises:
    TypeError: Both given.
  """
  if in_step is None:
    return in_step_tag
  if in_step_tag is not None:
    raise TypeError(
      "SnapshotHook got in_step_tag=%r and in_step=%r; in_step is the old "
      "name of in_step_tag: pass in_step_tag only." % (in_step_tag, in_step)
    )
  warnings.warn(
    "SnapshotHook(in_step=%r) is deprecated; pass in_step_tag=%r (the tag "
    "the train op from store.slots.snapshot_before snapshots under). "
    "in_step= will be removed in the next release." % (in_step, in_step),
    DeprecationWarning,
    stacklevel=3,
  )
  return in_step


def _in_step_ops(store, tag, loss):
  """The train ops snapshotting under `tag` when `loss` is finite, checked."""
  try:
    slots = store.slots
  except errors.ModeError as e:
    raise ValueError(
      "SnapshotHook(in_step_tag=%r) needs a train op that snapshots into a "
      "device slot in its run (store.slots.snapshot_before): %s" % (tag, e)
    )
  ops = slots.in_step_ops(tag)
  if not ops:
    raise ValueError(
      "SnapshotHook(in_step_tag=%r): no train op of the store snapshots "
      "under that tag in its run (its pinned tags: %s). Build the train op "
      "with store.slots.snapshot_before(update, tag=%r, if_finite=loss)."
      % (tag, slots.pinned(), tag)
    )
  for op in ops:
    condition = slots.in_step_condition(op)
    if condition is None:
      raise ValueError(
        "SnapshotHook(in_step_tag=%r): train op %s writes the slot in every "
        "run, also when the loss is not finite, so the slot could hold the "
        "parameters that gave it. Build the train op with "
        "store.slots.snapshot_before(..., if_finite=loss)." % (tag, op.name)
      )
    if condition.name != loss.name:
      raise ValueError(
        "SnapshotHook(in_step_tag=%r): the hook checks the loss %s, but train "
        "op %s snapshots when %s is finite. Pass the same tensor as loss= and "
        "as if_finite=, so that the slot holds parameters whose checked loss "
        "was finite." % (tag, loss.name, op.name, condition.name)
      )
  return ops


def _resolve_loss(loss, graph):
  """The loss tensor `loss` names or returns, checked against `graph`.

  Raises:
    ValueError: A name of no tensor of the graph.
    TypeError: A function that returns no tensor, or a tensor that is not
      float.
    GraphMismatchError: A tensor of another graph.
  """
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
