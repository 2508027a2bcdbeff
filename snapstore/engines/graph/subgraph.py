"""Copies a subgraph inside its own graph, with some of its inputs replaced.

This is the engine under `store.slots.past` (rewiring to a slot's shadows)
and `snapstore.clone`. It selects the ops between some source tensors and some
outputs, says which of them cannot be copied faithfully, and copies the rest in
dependency order:

    within = backward_ops(output_ops, stop=cut_tensors)
    to_copy = forward_ops(within, sources, source_ops)
    refuse(to_copy)                            # the caller's policy
    copy_ops(topological(to_copy), tensor_map, op_map, new_name)

Why not `tf.contrib.graph_editor.copy_with_input_replacements`: it orders the
ops by creation id, which is not a dependency order for `tf.cond` (a branch's
input `Switch` is created after the op that consumes it), so each cond leaves
dangling `geph_tmp` placeholders in the graph; it keeps every NodeDef attribute,
so colocation with a replaced variable and gradient overrides cannot be
rewritten; and it is deprecated in TF 1.15 and gone in TF 2. Why not
`import_graph_def(input_map=...)`: it rejects colocation with ops outside the
imported GraphDef ("Specified colocation to an op that does not exist during
import"), which every variable read has. Both copy an op the same way this
module does, from a NodeDef (`tf.Operation(node_def, graph, inputs, ...)` on TF 1.15,
`Operation.from_node_def` on TF 2.x; see `snapstore._tf.new_operation`).

Control flow: a copied `tf.cond` runs as the original does (its Switch and
Merge ops carry the semantics), and the copies get a `CondContext` rebuilt from
the original's, which TF's cond gradients consult. A `tf.while_loop` would need
its frame renamed, its `WhileContext` rebuilt in full and its TensorArrays
copied along; `uncopyable_control_flow` reports loop ops and the callers
refuse them.
"""

import heapq

from snapstore._tf import control_flow_context
from snapstore._tf import control_flow_ops
from snapstore._tf import control_flow_util
from snapstore._tf import creation_order
from snapstore._tf import new_operation
from snapstore._tf import tf
from snapstore.core.writers import RESOURCE_WRITER_PREFIXES
from snapstore.core.writers import RESOURCE_WRITER_TYPES
from snapstore.core.writers import resource_key
from snapstore.core.writers import VARIABLE_OP_TYPES

_LOOP_OP_TYPES = frozenset(
  [
    "Enter",
    "RefEnter",
    "Exit",
    "RefExit",
    "NextIteration",
    "RefNextIteration",
    "LoopCond",
  ]
)

# Ops that take a ref input only to read it or pass it on.
_REF_READERS = frozenset(
  ["IsVariableInitialized", "RefIdentity", "RefSwitch", "RefMerge", "RefSelect"]
)

# Stateful ops whose copy only reads state or draws its own random numbers, so
# that running a copy next to the original changes nothing the original sees.
SAFE_STATEFUL_TYPES = frozenset(
  [
    "ReadVariableOp",
    "ResourceGather",
    "ResourceGatherNd",
    "VarIsInitializedOp",
    "VariableShape",
    "IsVariableInitialized",
    "RandomUniform",
    "RandomUniformInt",
    "RandomStandardNormal",
    "TruncatedNormal",
    "ParameterizedTruncatedNormal",
    "RandomGamma",
    "RandomPoisson",
    "RandomPoissonV2",
    "RandomShuffle",
    "Multinomial",
    "Print",
    "PrintV2",
    "Assert",
  ]
)


# -- what an op is ---------------------------------------------------------------


def uncopyable_control_flow(op):
  """Why `op`'s control flow cannot be copied, or None if it can.

  Ops outside control flow and in (nested) `tf.cond` branches can; ops of a
  v1 `tf.while_loop` or of another context (XLA) cannot.
  """
  if op.type in _LOOP_OP_TYPES or control_flow_util.IsInWhileLoop(op):
    return (
      "it is part of a tf.while_loop, and a copy of a loop loses its "
      "WhileContext (frame and gradients)"
    )
  ctx = control_flow_context(op)
  while ctx is not None:
    if not isinstance(ctx, control_flow_ops.CondContext):
      return (
        "it runs in control-flow context %s, which snapstore does not "
        "copy" % type(ctx).__name__
      )
    ctx = ctx.outer_context
  return None


def writes_variable(op):
  """True if `op` writes a variable: assigns, scatters, optimizer updates."""
  if op.type in RESOURCE_WRITER_TYPES or op.type.startswith(
    RESOURCE_WRITER_PREFIXES
  ):
    return True
  if op.type in _REF_READERS:
    return False
  return any(arg.is_ref for arg in op.op_def.input_arg)


def unsafe_stateful(op):
  """True if `op` has state that a copy would touch or duplicate.

  Writers of variables, queues, iterators, summary writers, stateful function
  calls and the like; not random-number generators, variable reads, Print or
  Assert (see `SAFE_STATEFUL_TYPES`).
  """
  if writes_variable(op):
    return True
  return op.op_def.is_stateful and op.type not in SAFE_STATEFUL_TYPES


def aliased(op, variables):
  """Why `op` is one of `variables` under another op, or None.

  A variable op that owns the buffer or resource of one of `variables` (the
  same `resource_key`) without being its op reads or writes that variable
  behind any copy's back: rewiring and cloning both refuse it.

  Args:
    op: An op on the way to the outputs.
    variables: The variables being replaced, keyed by `resource_key` of their op.
  """
  if op.type not in VARIABLE_OP_TYPES:
    return None
  variable = variables.get(resource_key(op))
  if variable is None or op is variable.op:
    return None
  return (
    "it is the variable %s under another op (same shared_name)" % variable.name
  )


def refusal(what, op, outputs, why):
  """The message refusing to copy `outputs` because of `op`, and why.

  Args:
    what: What could not be done, e.g. "store.slots.past() cannot rewire".
    op: The op met on the way.
    outputs: The tensors or ops asked for; the message names those that need
      `op` (all of them if none does).
    why: Why `op` cannot be copied.
  """
  needed_by = [
    x.name
    for x in outputs
    if op in backward_ops([x if isinstance(x, tf.Operation) else x.op])
  ]
  return (
    "%s %s: on the way it meets op '%s' (type %s); %s. Nothing was built."
    % (
      what,
      ", ".join(needed_by or [x.name for x in outputs]),
      op.name,
      op.type,
      why,
    )
  )


# -- selecting ops ------------------------------------------------------------------


def backward_ops(seed_ops, stop=(), done=()):
  """Ops the seeds depend on, through data and control inputs.

  Args:
    seed_ops: Ops to start from (included).
    stop: Tensors not to walk through: their producers are not included
      unless reached another way.
    done: Ops neither included nor walked through.

  Returns:
    A set of ops.
  """
  stop = set(stop)
  done = set(done)
  seen = set()
  todo = [op for op in seed_ops if op not in done]
  while todo:
    op = todo.pop()
    if op in seen:
      continue
    seen.add(op)
    for t in op.inputs:
      if t not in stop and t.op not in done and t.op not in seen:
        todo.append(t.op)
    for c in op.control_inputs:
      if c not in done and c not in seen:
        todo.append(c)
  return seen


def forward_ops(within, sources, source_ops=()):
  """Ops of `within` that depend, by data or control, on `sources`.

  Args:
    within: A set of ops, closed under inputs (from `backward_ops`).
    sources: Tensors whose consumers depend on them.
    source_ops: Ops whose control dependents depend on them.

  Returns:
    A set of ops, a subset of `within`.
  """
  sources = set(sources)
  source_ops = set(source_ops)
  reached = set()
  todo = [
    op
    for op in within
    if any(t in sources for t in op.inputs)
    or any(c in source_ops for c in op.control_inputs)
  ]
  dependents = _dependents(within)
  while todo:
    op = todo.pop()
    if op in reached:
      continue
    reached.add(op)
    todo.extend(d for d in dependents.get(op, ()) if d not in reached)
  return reached


def topological(op_set):
  """The ops of `op_set` in an order where each comes after its inputs in it.

  Ties are broken by creation order, so the copy is deterministic.

  Raises:
    ValueError: The ops form a cycle (only a while loop can).
  """
  pending = dict((op, len(set(_inputs_in(op, op_set)))) for op in op_set)
  dependents = _dependents(op_set)
  ready = [
    (creation_order(op), op) for op, n in pending.items() if n == 0
  ]  # unique
  heapq.heapify(ready)
  order = []
  while ready:
    _, op = heapq.heappop(ready)
    order.append(op)
    for d in dependents.get(op, ()):
      pending[d] -= 1
      if pending[d] == 0:
        heapq.heappush(ready, (creation_order(d), d))
  if len(order) != len(op_set):
    stuck = sorted(op.name for op, n in pending.items() if n > 0)
    raise ValueError(
      "The ops to copy form a cycle (a while loop?): %s" % ", ".join(stuck[:5])
    )
  return order


def _inputs_in(op, op_set):
  return [t.op for t in op.inputs if t.op in op_set] + [
    c for c in op.control_inputs if c in op_set
  ]


def _dependents(op_set):
  """op -> set of ops in `op_set` that take its outputs or depend on it."""
  out = {}
  for op in op_set:
    for src in _inputs_in(op, op_set):
      out.setdefault(src, set()).add(op)
  return out


# -- copying ----------------------------------------------------------------------


def copy_ops(
  ordered, tensor_map, op_map, new_name, edit=None, after=None, contexts=None
):
  """Copies `ordered` ops, in that order, into their graph.

  Each copy reads `tensor_map[t]` for each input `t` found there (the copies
  made so far, and the replaced tensors) and the original tensor otherwise;
  control inputs go through `op_map` the same way. A `loc:@name` colocation
  with an op in `op_map` becomes one with its copy. Copies of ops inside a
  `tf.cond` branch get a `CondContext` of their own (see `_copy_contexts`).

  Args:
    ordered: Ops in topological order (see `topological`).
    tensor_map: Original tensor -> tensor to use instead; the copies' outputs
      are added to it.
    op_map: Original op -> op to use instead; the copies are added to it.
    new_name: Function from an original op name to the wanted name of its copy
      (made unique in the graph).
    edit: Optional `edit(op, node_def, inputs)` changing the copy's NodeDef.
    after: Optional `after(op, copy)`, called once each copy exists.
    contexts: Original cond context -> context of the copies, kept across
      calls that copy more of the same conds; updated.
  """
  if not ordered:
    return
  graph = ordered[0].graph
  with graph.as_default(), graph.name_scope(
    None
  ):  # `new_name` gives full names
    # Names are fixed before any op is made so that a copy can be colocated
    # with the copy of an op made after it.
    names = dict(
      (op, graph.unique_name(new_name(op.name), mark_as_used=True))
      for op in ordered
    )
  renamed = dict((op.name, new.name) for op, new in op_map.items())
  renamed.update((op.name, names[op]) for op in ordered)
  made = []
  # Copies are made outside any control-flow context or control_dependencies
  # block the caller may be in: they mirror the originals, nothing else.
  with graph.as_default(), graph.control_dependencies(None), graph.name_scope(
    None
  ):
    for op in ordered:
      inputs = [tensor_map.get(t, t) for t in op.inputs]
      controls = [op_map.get(c, c) for c in op.control_inputs]
      node_def = tf.NodeDef()
      node_def.CopyFrom(op.node_def)
      node_def.name = names[op]
      del node_def.input[:]
      rename_colocation(node_def, renamed)
      if edit is not None:
        edit(op, node_def, inputs)
      new = new_operation(
        node_def,
        graph,
        inputs=inputs,
        control_inputs=controls,
        op_def=op.op_def,
      )
      op_map[op] = new
      for t, new_t in zip(op.outputs, new.outputs):
        tensor_map[t] = new_t
      made.append((op, new))
      if after is not None:
        after(op, new)
    _copy_contexts(
      made, tensor_map, {} if contexts is None else contexts, new_name
    )


def _copy_contexts(made, tensor_map, contexts, new_name):
  """Gives the copies of ops in `tf.cond` branches a `CondContext`.

  TF runs a copied Switch or Merge correctly without one, but its gradient
  code asks the op's context for the cond's predicate: without one it builds
  `zeros_like` of a Switch on a resource handle, which has no kernel and then
  breaks every later `session.run`. Each context is rebuilt the way
  `import_meta_graph` does (`CondContext(context_def=...)`), from the
  original's proto with every name mapped to the copy's, and holding only the
  copies, so that the originals keep their own context.
  """
  graph = made[0][0].graph
  by_context = {}
  for op, new in made:
    ctx = control_flow_context(op)
    if ctx is not None:
      by_context.setdefault(ctx, []).append(new)

  def rename(name):
    t = graph.as_graph_element(name)
    return tensor_map.get(t, t).name

  for ctx in sorted(by_context, key=_depth):
    if not isinstance(ctx, control_flow_ops.CondContext):
      raise ValueError("Cannot copy ops of control-flow context %s." % ctx.name)
    proto = ctx.to_proto()
    del proto.nested_contexts[:]  # nesting is rebuilt from the outer contexts
    proto.context_name = graph.unique_name(
      new_name(ctx.name), mark_as_used=True
    )
    proto.pred_name = rename(proto.pred_name)
    proto.pivot_name = rename(proto.pivot_name)
    external = dict(proto.values_def.external_values)
    proto.values_def.Clear()
    for key, value in external.items():
      proto.values_def.values.append(rename(key))
      proto.values_def.external_values[rename(key)] = rename(value)
    proto.values_def.values.extend(
      t.name for new in by_context[ctx] for t in new.outputs
    )
    outer = ctx.outer_context
    outer = contexts.get(outer, outer)
    if outer is not None:
      outer.Enter()
    try:
      copied = control_flow_ops.CondContext(context_def=proto)
    finally:
      if outer is not None:
        outer.Exit()
    contexts.setdefault(ctx, copied)
    if outer is None:
      graph.add_to_collection(tf.GraphKeys.COND_CONTEXT, copied)


def _depth(ctx):
  depth = 0
  while ctx.outer_context is not None:
    ctx = ctx.outer_context
    depth += 1
  return depth


def rename_colocation(node_def, renamed):
  """Rewrites `loc:@name` colocation attributes of `node_def` by `renamed`."""
  if "_class" not in node_def.attr:
    return
  values = node_def.attr["_class"].list.s
  for i, value in enumerate(values):
    value = tf.compat.as_str(value)
    if value.startswith("loc:@") and value[5:] in renamed:
      values[i] = tf.compat.as_bytes("loc:@" + renamed[value[5:]])


def copy_static_shapes(op, new):
  """Gives `new`'s outputs the static shapes of `op`'s, if its inputs match.

  A copy's shapes come from TF's shape inference, which does not know what
  the model's Python code added with `set_shape` (a `tf.cond` output, for
  example, loses its shape). When the copy's inputs have the original inputs'
  static shapes, the same op gives outputs of the same shapes.
  """
  if any(
    _static_shape(t) != _static_shape(new_t)
    for t, new_t in zip(op.inputs, new.inputs)
  ):
    return
  for t, new_t in zip(op.outputs, new.outputs):
    if new_t.shape.is_compatible_with(t.shape):
      new_t.set_shape(t.shape)


def _static_shape(t):
  return None if t.shape.dims is None else tuple(t.shape.as_list())
