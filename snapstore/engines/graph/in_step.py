"""Train ops that snapshot the parameters a step starts from, in the step's run.

A snapshot before every step (to undo a step that made the loss diverge) costs
a `session.run` of its own when taken with `store.snapshot()`. Put in the step
instead, it is one more group of copies in the run the step makes anyway:

    grads = opt.compute_gradients(loss)                  # outside: in parallel
    snapstore.create_optimizer_slots(opt, [v for g, v in grads if g is not None])
    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)
    train_op = store.slots.snapshot_before(                    # with the copy
        lambda: opt.apply_gradients(grads, global_step=step), tag="before_step")
    ...
    sess.run(train_op, feed)             # copy into slot 0, then the update
    store.restore("before_step")         # undoes the last step, bit for bit

A store with `optimizer=` needs the optimizer's slots to exist when it is
built, and the train op is built after the store:
`create_optimizer_slots(opt, var_list)` makes them first, as
`apply_gradients` would.

The rule: the update is built by a function called under
`tf.control_dependencies([store.slots.snapshot_op(slot)])`, so every op it creates
waits until every copy into the slot is done; then the finished train op is
checked: every op it runs that writes a variable of the store must come after
the snapshot (by data or control edges). "Writes" means may write: an op that
takes the variable's reference or handle is a writer unless it is proven to
only read it, function bodies (a tf.function, a v2 tf.cond or while loop)
included (`snapstore.core.writers`). An op built before the call (a train
op built beforehand, batch norm's `UPDATE_OPS` passed in as control
dependencies, an op built under `control_dependencies(None)`) cannot be ordered
afterwards, as TensorFlow cannot add a control input to an op once it is built,
so it is refused with its name. Ops that only read (the gradients) are not
ordered: computing the gradients outside the function lets them run in
parallel with the copy.

With resource variables the copy may share the variable's buffer until the
update writes it (copy on write); the update then writes a new buffer and the
slot keeps the old one. With ref variables the copy is made at once. Either
way the slot holds the values the step started from.

A copy only when the loss is finite. With `if_finite=loss` the slot holds the
parameters of the newest step whose loss was finite, a rollback point for
every step at the cost of the copy alone:

    train_op = store.slots.snapshot_before(
        lambda: opt.apply_gradients(grads, global_step=step), if_finite=loss)
    _, value = sess.run([train_op, loss], feed)
    if not np.isfinite(value):               # the copy was skipped
      store.restore("before_step")           # the last finite-loss step's start

(`SnapshotHook(store, loss=loss, in_step="before_step")` does the checking.)
The graph, built from Switch and Merge rather than `tf.cond` (which would
rebuild the copy's per-variable ops in a cond context):

    finite = reduce_all(is_finite(loss))
    not_finite, is_finite = Switch(finite, finite)
    copy     <- control input: Identity(is_finite)   dead, so skipped, if not finite
    copied   =  Identity(is_finite), after the copy
    gate     =  Merge([Identity(not_finite), copied])  alive either way
    update   <- control input: gate

An op with a dead control input does not run and its outputs are dead; a Merge
is alive when one input is. So the update always runs, after the copy when the
loss is finite and after the loss when it is not, and the ordering check above
is made against the gate. The update waits for `loss`, so the loss (and a loss
fetched in the same run) is computed from the values the step started from.
The copy is the device mode's `build_snapshot_op(slot, name)`, a new grouped
copy made under the gate's control input.
"""

import collections
import warnings

import numpy as np

from snapstore._tf import control_flow_context
from snapstore._tf import control_flow_ops
from snapstore._tf import create_slots as _create_slots
from snapstore._tf import creation_order
from snapstore._tf import ops
from snapstore._tf import resource_variable_ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import checks
from snapstore.engines.graph import copies
from snapstore.engines.graph import shadows
from snapstore.engines.graph.variables import SHADOW_VARIABLES
from snapstore import errors
from snapstore.engines.graph import subgraph
from snapstore.core import writers


def create_optimizer_slots(optimizer, var_list):
  """Creates `optimizer`'s state for `var_list` now, as `apply_gradients` would.

  So that a `SnapshotStore(optimizer=optimizer)` covering that state can be
  built before the train op (for `store.slots.snapshot_before`). Every optimizer in
  `tf.train` creates its slots and non-slot variables (Adam's beta powers)
  this way; building the train op later reuses them.

  Args:
    optimizer: A `tf.train.Optimizer`.
    var_list: The variables it will update (those with a gradient).

  Returns:
    The optimizer's variables (`optimizer.variables()`) in the variables' graph.

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer`, or `var_list` holds
      something other than variables.
    ValueError: An empty `var_list`.

  Example:
    Graph mode: the optimizer's state first, then the store, then the train op.

    ```python
    grads = opt.compute_gradients(loss)
    snapstore.create_optimizer_slots(opt, [v for g, v in grads if g is not None])
    store = snapstore.SnapshotStore(scope="net", optimizer=opt, include_global_step=True)
    train_op = store.slots.snapshot_before(
      lambda: opt.apply_gradients(grads, global_step=step)
    )
    ```
  """
  if not isinstance(optimizer, tf.train.Optimizer):
    raise TypeError(
      "create_optimizer_slots() takes a tf.train.Optimizer, got %r. A Keras "
      "optimizer creates its state with its first update." % (optimizer,)
    )
  var_list = list(var_list)
  if not var_list:
    raise ValueError(
      "create_optimizer_slots() needs the variables the optimizer will "
      "update, got none."
    )
  bad = [v for v in var_list if not isinstance(v, tf_variables.Variable)]
  if bad:
    raise TypeError(
      "create_optimizer_slots() takes variables, got %r." % (bad[0],)
    )
  with var_list[0].graph.as_default():
    with ops.init_scope():
      _create_slots(optimizer, var_list)
    return optimizer.variables()


def create_slots(optimizer, var_list):
  """Deprecated: `create_optimizer_slots` (removed in the next release).

  Renamed because a store's slots (`store.slots`) hold snapshots; these are
  the optimizer's own state. Warns with a `DeprecationWarning` at the
  caller's line, then does what `create_optimizer_slots` does.

  Args:
    optimizer: As for `create_optimizer_slots`.
    var_list: As for `create_optimizer_slots`.

  Returns:
    As `create_optimizer_slots`: the optimizer's variables.

  Raises:
    TypeError: As for `create_optimizer_slots`.
    ValueError: As for `create_optimizer_slots`.

  Example:
    ```python
    snapstore.create_optimizer_slots(opt, var_list)  # the new name
    ```
  """
  warnings.warn(
    "snapstore.create_slots is deprecated and will be removed in the next "
    "release: use snapstore.create_optimizer_slots(optimizer, var_list), "
    "which it calls (store.slots are snapshot slots; this makes the "
    "optimizer's).",
    DeprecationWarning,
    stacklevel=2,
  )
  return create_optimizer_slots(optimizer, var_list)


# A train op built by `build`, and what a guard needs to trust its slot.
InStep = collections.namedtuple(
  "InStep", "train_op slot condition count counted"
)
InStep.__doc__ = """A train op that snapshots into a device slot in its own run.

Attributes:
  train_op: The grouped op the user runs.
  slot: The device slot it copies into.
  condition: The `if_finite` tensor, or None if it copies in every run.
  count: (Copying in every run only; else None.) A tensor with how many runs
    of the train op have copied into the slot (0 before the first). A guard
    reads it to know whether the slot was written behind its back.
  counted: The count after the copy, for fetching with the train op.
"""


def build(update, device, slot, variables, name, if_finite=None):
  """The train op copying the variables into `slot`, then running what `update()` builds.

  Args:
    update: A function of no arguments that builds the update and returns the
      op(s) or tensor(s) to run.
    device: The store's `DeviceMode`.
    slot: The slot to copy into.
    variables: The store's variables, which the update may write only after
      the copy.
    name: The name of the returned op.
    if_finite: None, or a float tensor of the variables' graph: the copy runs
      only when all of it is finite (see `_copy_if_finite`).

  Returns:
    An `InStep`.

  Raises:
    TypeError: `update` is an op or tensor (already built) or not callable;
      `if_finite` is not a float tensor.
    GraphMismatchError: `if_finite` is of another graph.
    ValueError: Called inside a `tf.distribute` strategy's scope;
      `if_finite` is computed inside a `tf.cond` or `tf.while_loop`;
      `update()` returned nothing; or the train op runs an op that writes
      one of `variables` without waiting for the snapshot.
  """
  _check_update(update)
  if tf.distribute.has_strategy():
    # Its run counter would be made a distributed variable, which this
    # module's plain reads and writes of it cannot take.
    raise ValueError(
      "snapshot_before() was called inside the scope of a tf.distribute "
      "strategy (%s). Call it outside `strategy.scope()`, and enter the "
      "scope in the update function: snapshot_before(lambda: ...) with "
      "`with strategy.scope():` inside."
      % type(tf.distribute.get_strategy()).__name__
    )
  graph = device.snapshot_op(slot).graph
  if if_finite is not None:
    check_if_finite(if_finite, graph)
  with graph.as_default():
    count = counted = None
    if if_finite is None:
      after = device.snapshot_op(slot)
      count, counted, counting = _count_copies(
        after, variables[0], name + "_copies"
      )
    else:
      # A copy that may be skipped must be an op of its own: the cached
      # snapshot_op(slot) has no control inputs and cannot gain any.
      after = _copy_if_finite(
        if_finite,
        lambda: device.build_snapshot_op(slot, "snapshot"),
        name + "_if_finite",
      )
      counting = None
    with tf.control_dependencies([after]):
      result = update()
      flat = [x for x in tf.nest.flatten(result) if x is not None]
      if not flat:
        raise ValueError(
          "The update function returned %r: return the op(s) "
          "the train step runs (what apply_gradients returns)." % (result,)
        )
      train_op = tf.group(*(flat + ([counting] if counting else [])), name=name)
  check_ordered(train_op, after, variables)
  replace_train_op(flat, train_op)
  return InStep(train_op, slot, if_finite, count, counted)


def _count_copies(copy, anchor, name):
  """A count of the runs of `copy`, bumped after each: (count, counted, op).

  A guard whose tag is the slot's can see the train op only in its own
  `guard.run`; the count tells it whether the train op ran elsewhere (a
  plain `session.run`) and wrote the slot it would roll back to. The count
  is a variable of its own (in LOCAL_VARIABLES, so a default Saver never
  sees it), colocated with `anchor`.

  The bump is in every run of the train op, so it is one in-place add
  rather than a read, an add and an assign, which cost a small model's step
  measurably more (bench/README.md, "Training-loop overhead").
  The train op must also run where the local initializer never ran (as the
  copy does: it writes the slot whole), and an add needs an initialized
  variable, so the bump is switched on `VarIsInitializedOp`: the add if
  initialized, else an assign of 1 (the first run counts 1, as from 0).
  Whichever branch is dead, the ControlTrigger that ends the bump is alive
  (the one op whose output is alive even when its inputs are dead), so the
  train op, and ops waiting for it, are never dead. The count's reads are
  the guard's, not the step's: `count` through `value_at_init` (0 where not
  initialized), `counted` after the bump.

  Returns:
    `count`, the number of copies so far; `counted`, that number after the
    bump of the run that fetches it (with the train op); and the bump op.
  """
  with ops.init_scope(), ops.colocate_with(anchor), tf.name_scope(name):
    counter = tf.Variable(
      np.int64(0),
      trainable=False,
      use_resource=True,
      collections=[tf.GraphKeys.LOCAL_VARIABLES, SHADOW_VARIABLES],
      name="count",
    )
    initialized = resource_variable_ops.var_is_initialized_op(counter.handle)
    fresh, live = control_flow_ops.switch(counter.handle, initialized)
    one = tf.constant(np.int64(1), name="one")
    with tf.control_dependencies([copy]):
      add = resource_variable_ops.assign_add_variable_op(live, one, name="add")
      first = resource_variable_ops.assign_variable_op(fresh, one, name="first")
    with tf.control_dependencies([add, first]):
      bump = control_flow_ops.control_trigger(name="bump")
    count = shadows.value_at_init(counter)
    with tf.control_dependencies([bump]), tf.name_scope("counted"):
      counted = copies.read(counter)
  return count, counted, bump


def _check_update(update):
  if isinstance(update, (tf.Operation, tf.Tensor, list, tuple)):
    raise TypeError(
      "snapshot_before() takes a function that builds the update, got the "
      "already built %r. An op cannot be made to wait for the snapshot after "
      "it is built; pass e.g. `lambda: opt.apply_gradients(grads, "
      "global_step=step)` (compute the gradients before the call)."
      % (_describe(update),)
    )
  if not callable(update):
    raise TypeError(
      "snapshot_before() takes a function of no arguments that "
      "builds the update, got %r." % (update,)
    )


def check_if_finite(loss, graph):
  """Checks `loss` can gate an in-step copy (`snapshot_before(if_finite=loss)`).

  Args:
    loss: The argument.
    graph: The store's graph.

  Raises:
    TypeError: Not a float tensor.
    GraphMismatchError: A tensor of another graph.
    ValueError: A tensor computed inside a `tf.cond` or `tf.while_loop`,
      which the copy outside it cannot be conditioned on.
  """
  if not isinstance(loss, tf.Tensor):
    raise TypeError(
      "if_finite takes a float tensor of the model (the loss the "
      "step minimizes), got %r." % (_describe(loss),)
    )
  checks.same_graph(
    loss,
    graph,
    "if_finite %s" % loss.name,
    fix="Pass the loss of the model the store covers.",
  )
  if not loss.dtype.is_floating:
    raise TypeError(
      "if_finite %s has dtype %s; only float tensors can be NaN "
      "or infinite. Pass the (float) loss." % (loss.name, loss.dtype.name)
    )
  if control_flow_context(loss.op) is not None:
    raise ValueError(
      "if_finite %s is computed inside a tf.cond or tf.while_loop, so it has "
      "no value when the branch or loop does not produce one. Pass a tensor "
      "computed outside (the cond's or loop's output)." % loss.name
    )


def _copy_if_finite(loss, build_copy, scope):
  """Runs the copy `build_copy()` builds only if `loss` is finite; an op after it.

  Built from Switch and Merge directly, not `tf.cond`, which would rebuild
  the copy's per-variable ops inside a cond context. An op with a dead
  control input does not run and its outputs are dead (how an untaken
  `tf.cond` branch is skipped); Switch outputs are dead or alive, so the copy
  waits for an Identity of the "finite" output. The returned Merge is alive
  either way (one of its inputs is), so an update waiting for it always runs:
  after the copy when the copy runs, after the loss when it does not.

  Args:
    loss: A float tensor (`check_if_finite`).
    build_copy: A function of no arguments building the grouped copy; called
      under a control dependency that makes the copy skippable.
    scope: The name scope of the ops built.

  Returns:
    The Merge op.
  """
  with tf.name_scope(scope):
    finite = tf.reduce_all(tf.is_finite(loss), name="finite")
    not_finite, is_finite = control_flow_ops.switch(finite, finite)
    with tf.control_dependencies([tf.identity(is_finite, name="take").op]):
      copy = build_copy()  # dead, so skipped, when the loss is not finite
    with tf.control_dependencies([copy]):
      copied = tf.identity(is_finite, name="copied")
    skipped = tf.identity(not_finite, name="skipped")
    return control_flow_ops.merge([skipped, copied], name="copied_or_skipped")[
      0
    ].op


def check_ordered(train_op, snapshot_op, variables):
  """Raises ValueError if `train_op` writes one of `variables` before `snapshot_op`.

  "Before" means not after: an op that runs with the train op and does not
  depend, by data or control, on the snapshot may run before or during it.
  "Writes" means may write: an op that takes a variable's reference or handle
  writes it unless it is proven to only read it, function bodies included
  (a tf.function, a v2 tf.cond or while loop; see `writers.py`).
  """
  ran = subgraph.backward_ops([train_op])
  after = subgraph.forward_ops(ran, (), [snapshot_op])
  finder = writers.WriteFinder(variables)
  early = []
  for op in sorted(ran - after, key=creation_order):
    for variable, write in finder.writes(op):
      early.append(
        write.describe(
          op,
          variable.op.name
          if variable is not None
          else "a variable snapstore cannot trace",
        )
      )
      break
  if early:
    raise ValueError(
      "snapshot_before(): %s but does not wait for the snapshot, so the "
      "snapshot could read what it writes. Such an op was built before "
      "snapshot_before() was called (a train op built beforehand, batch "
      "norm's UPDATE_OPS passed in as control dependencies) or under "
      "control_dependencies(None), and TensorFlow cannot make a built op "
      "wait. Build it inside the update function, or leave the variable out "
      "of the store. Nothing was pinned; the ops built are unused."
      % errors.names(early, limit=5)
    )


def replace_train_op(inner, train_op, always=False):
  """Lists `train_op` in the graph's TRAIN_OP collection instead of `inner`.

  `tf.train.Optimizer.apply_gradients` lists its op there; wrapped in a bigger
  step (a snapshot before it, a wrapper optimizer's work around it), it is not
  the step the user runs.

  Args:
    inner: The ops or tensors `train_op` wraps.
    train_op: The op to list.
    always: List `train_op` even if none of `inner` was listed.
  """
  listed = train_op.graph.get_collection_ref(tf.GraphKeys.TRAIN_OP)
  replaced = False
  for x in inner:
    op = x.op if isinstance(x, tf.Tensor) else x
    if op in listed:
      listed.remove(op)
      replaced = True
  if replaced or always:
    listed.append(train_op)


def fetched(fetches, graph, train_ops):
  """The ones of `train_ops` that a run of `fetches` (as `Session.run` takes them) runs.

  Only ops fetched themselves, or by name, count; not ops that a fetched one
  happens to depend on.
  """
  found = []
  for f in tf.nest.flatten(fetches):
    if isinstance(f, str):
      f = graph.as_graph_element(f)
    if isinstance(f, tf.Tensor):
      f = f.op
    if f in train_ops and f not in found:
      found.append(f)
  return found


def _describe(value):
  name = getattr(value, "name", None)
  return name if name else value
