"""Train ops that snapshot the parameters a step starts from, in the step's run.

A snapshot before every step (to undo a step that made the loss diverge) costs
a `session.run` of its own when taken with `store.snapshot()`. Put in the step
instead, it is one more group of copies in the run the step makes anyway:

    grads = opt.compute_gradients(loss)                  # outside: in parallel
    snapstore.create_slots(opt, [v for g, v in grads if g is not None])
    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)
    train_op = store.snapshot_before(                    # with the copy
        lambda: opt.apply_gradients(grads, global_step=step), tag="before_step")
    ...
    sess.run(train_op, feed)             # copy into slot 0, then the update
    store.restore("before_step")         # undoes the last step, bit for bit

A store with `optimizer=` needs the optimizer's slots to exist when it is
built, and the train op is built after the store: `create_slots(opt,
var_list)` makes them first, as `apply_gradients` would.

The rule: the update is built by a function called under
`tf.control_dependencies([store.snapshot_op(slot)])`, so every op it creates
waits until every copy into the slot is done; then the finished train op is
checked: every op it runs that writes a variable of the store must come after
the snapshot (by data or control edges). An op built before the call (a train
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
"""
from snapstore._tf import create_slots as _create_slots
from snapstore._tf import creation_order
from snapstore._tf import is_ref_dtype
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore import errors
from snapstore.graph import subgraph

# Ops that pass a variable's reference or handle on unchanged.
_PASS_THROUGH = frozenset(["Identity", "RefIdentity", "Switch", "RefSwitch",
                           "Enter", "RefEnter", "Merge", "RefMerge"])


def create_slots(optimizer, var_list):
  """Creates `optimizer`'s state for `var_list` now, as `apply_gradients` would.

  So that a `SnapshotStore(optimizer=optimizer)` covering that state can be
  built before the train op (for `store.snapshot_before`). Every optimizer in
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
  """
  if not isinstance(optimizer, tf.train.Optimizer):
    raise TypeError("create_slots() takes a tf.train.Optimizer, got %r. A Keras "
                    "optimizer creates its state with its first update." % (
                        optimizer,))
  var_list = list(var_list)
  if not var_list:
    raise ValueError("create_slots() needs the variables the optimizer will "
                     "update, got none.")
  bad = [v for v in var_list if not isinstance(v, tf_variables.Variable)]
  if bad:
    raise TypeError("create_slots() takes variables, got %r." % (bad[0],))
  with var_list[0].graph.as_default():
    with ops.init_scope():
      _create_slots(optimizer, var_list)
    return optimizer.variables()


def build(update, snapshot_op, variables, name):
  """The train op running `snapshot_op`, then what `update()` builds.

  Args:
    update: A function of no arguments that builds the update and returns the
      op(s) or tensor(s) to run.
    snapshot_op: The store's grouped copy into the slot.
    variables: The store's variables, which the update may write only after
      the copy.
    name: The name of the returned op.

  Returns:
    A grouped op.

  Raises:
    TypeError: `update` is an op or tensor (already built) or not callable.
    ValueError: `update()` returned nothing, or the train op runs an op that
      writes one of `variables` without waiting for the snapshot.
  """
  if isinstance(update, (tf.Operation, tf.Tensor, list, tuple)):
    raise TypeError(
        "snapshot_before() takes a function that builds the update, got the "
        "already built %r. An op cannot be made to wait for the snapshot after "
        "it is built; pass e.g. `lambda: opt.apply_gradients(grads, "
        "global_step=step)` (compute the gradients before the call)."
        % (_describe(update),))
  if not callable(update):
    raise TypeError("snapshot_before() takes a function of no arguments that "
                    "builds the update, got %r." % (update,))
  with snapshot_op.graph.as_default():
    with tf.control_dependencies([snapshot_op]):
      result = update()
      flat = [x for x in tf.nest.flatten(result) if x is not None]
      if not flat:
        raise ValueError("The update function returned %r: return the op(s) "
                         "the train step runs (what apply_gradients returns)."
                         % (result,))
      train_op = tf.group(*flat, name=name)
  check_ordered(train_op, snapshot_op, variables)
  replace_train_op(flat, train_op)
  return train_op


def check_ordered(train_op, snapshot_op, variables):
  """Raises ValueError if `train_op` writes one of `variables` before `snapshot_op`.

  "Before" means not after: an op that runs with the train op and does not
  depend, by data or control, on the snapshot may run before or during it.
  """
  ran = subgraph.backward_ops([train_op])
  after = subgraph.forward_ops(ran, (), [snapshot_op])
  covered = dict((subgraph.resource_key(v.op), v) for v in variables)
  early = []
  for op in sorted(ran - after, key=creation_order):
    if not subgraph.writes_variable(op):
      continue
    for target in _written(op):
      variable = covered.get(subgraph.resource_key(target)) if target else None
      if target is None or variable is not None:  # else: not the store's
        early.append("'%s' (type %s) writes %s" % (
            op.name, op.type, variable.op.name if variable is not None
            else "a variable snapstore cannot trace"))
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
        % errors.names(early, limit=5))


def _written(op):
  """The variable ops whose reference or handle `op` takes (None if untraced)."""
  found = []
  for t in op.inputs:
    if not (is_ref_dtype(t.dtype) or t.dtype == tf.resource):
      continue
    while t.op.type in _PASS_THROUGH and t.op.inputs:
      t = t.op.inputs[0]
    found.append(t.op if t.op.type in subgraph.VARIABLE_OP_TYPES else None)
  return found or [None]


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


def _describe(value):
  name = getattr(value, "name", None)
  return name if name else value
