"""Rewiring: a model's outputs computed from a device slot's shadows.

`store.slots.past(outputs, slot)` returns tensors that compute `outputs` with
the parameters held in device slot `slot` instead of the live variables, so
that past and current parameters are evaluated in one `session.run` with no
parameter copy:

    q = network_b(x)                                 # variables under "network_B"
    store = snapstore.SnapshotStore(scope="network_B", mode="device")
    q_past = store.slots.past(q, slot=0)                   # built once, cached
    train = opt.minimize(loss(q, q_past), var_list=tf.trainable_variables("network_B"))
    ...
    sess.run(store.slots.snapshot_op(0))                   # refresh the past
    current, past = sess.run([q, q_past], feed)

How: every op between a covered variable and the outputs is copied (see
`snapstore.engines.graph.subgraph`), and each copy that consumed a primary's ref tensor or
resource handle consumes the shadow's instead. That covers reads (`read`,
`ReadVariableOp`), ops that take the variable itself (`Gather` on a ref,
`ResourceGather`), `tf.cond` (dropout and batch norm driven by a fed `training`
flag), `tf.layers` and `tf.keras` layers. Copies are named
`<store name>/past_<slot>/<original name>`, placed and colocated like the
originals, and join no collection (a past loss is not in `LOSSES`).

A `tf.distribute` variable (graph-mode `MirroredStrategy`) is covered as its
components, each mapped to its own shadow: TF reads it through one of them
(a replica function its replica's; a cross-replica read the primary, or a
sync-on-read variable's every component for the aggregate), so each copy
reads the shadow of the component its original read, and a replica's past
outputs are computed from that replica's snapshot. A `PerReplica` of
outputs gives a `PerReplica` of past tensors.

Rules:
- Built once. Results are cached per slot at op granularity: asking again for
  the same outputs, or for any tensor inside an earlier copy, returns the same
  tensors; asking for new outputs copies only the ops not copied yet. Ops are
  built at graph-construction time only.
- Nothing is written. A copy never writes a variable: an op on the way that
  assigns (batch-norm moving-average updates run as a control dependency of
  the outputs, `tf.assign`, optimizer updates) is refused, and so is any
  stateful op not known to be safe to run twice (queues, iterators, stateful
  function calls). Random ops (dropout) are copied with their seed
  attributes and draw from generators of their own: with a fixed seed, the
  n-th run of a copy draws what the n-th run of its original drew.
- No gradient into the shadows. Every copy that reads a shadow carries a
  gradient override that gives the shadow no gradient; gradients to other
  inputs (the fed `x`, an upstream network) are TF's own.
- Correct or refused. A `tf.while_loop` cannot be copied with its
  `WhileContext`, so outputs that depend on a loop that reads the variables
  are refused, as are ops in other non-cond control-flow contexts (XLA) and a
  variable read through another op aliasing a covered variable (same
  `shared_name`). The error names the op. Outputs that do not depend on the
  covered variables are returned unchanged.

`evaluate_with(past=True)` runs the rewired tensors when every fetch has one
for the tag's slot (it never builds any), also mapping fed tensors to their
copies; otherwise it uses the swap.
"""

from snapstore._tf import creation_order
from snapstore._tf import is_ref_dtype
from snapstore._tf import registered_gradient
from snapstore._tf import tf
from snapstore.core import checks
from snapstore.core import distributed
from snapstore.engines.graph import variables
from snapstore import errors
from snapstore.engines.graph import subgraph
from snapstore.core import writers

_GRADIENT_OVERRIDE = "SnapstoreShadowInput"
_ORIGINAL_GRADIENT = "_snapstore_gradient_op_type"
_SWAP_NOTE = (
  "evaluate_with(past=True) evaluates such fetches by swapping the "
  "parameters instead, which is exact."
)


@tf.RegisterGradient(_GRADIENT_OVERRIDE)
def _no_gradient_into_shadows(op, *grads):
  """Gradient of a copy reading a shadow: none for the shadow, TF's for the rest."""
  shadows = set(
    v.op for v in op.graph.get_collection(variables.SHADOW_VARIABLES)
  )
  blocked = [t.op in shadows for t in op.inputs]
  if not any(_differentiable(t) for t, b in zip(op.inputs, blocked) if not b):
    # Nothing else to differentiate (a read, a gather by integer ids, a cond
    # switch on the shadow): skip TF's gradient, which would build ops for the
    # shadow's resource handle.
    return [None] * len(op.inputs)
  try:
    op_type = tf.compat.as_str(op.get_attr(_ORIGINAL_GRADIENT))
  except ValueError:
    op_type = op.type
  # The registry is private, but it is the only way to reach the gradient
  # the override hides; `ops.get_gradient_function` would return this one.
  grad_fn = registered_gradient(op_type)
  in_grads = (
    list(grad_fn(op, *grads)) if grad_fn is not None else [None] * len(blocked)
  )
  return [None if b else g for b, g in zip(blocked, in_grads)]


def _differentiable(t):
  dtype = t.dtype.base_dtype
  return dtype.is_floating or dtype.is_complex


class Rewirer(object):
  """Copies of a model's ops that read a store's device slots (see module doc).

  Args:
    name: The store's name; copies are named `<name>/past_<slot>/...`.
    primaries: The covered variables (a distributed variable's components,
      see module doc).
    slots: Per slot, the shadow of each primary, in the same order.
  """

  def __init__(self, name, primaries, slots):
    self._name = name
    self._graph = primaries[0].graph
    self._primary_ops = set(p.op for p in primaries)
    self._shadow_ops = set(s.op for slot in slots for s in slot)
    self._primary_keys = dict(
      (writers.resource_key(p.op), p) for p in primaries
    )
    # Per slot: original tensor/op -> the one reading the slot. They start with
    # each primary's ref tensor or handle (and op) mapped to the shadow's.
    self._tensors = []
    self._ops = []
    # Per slot: outputs asked for that do not depend on the variables.
    self._unchanged = []
    # Per slot: original cond context -> the context of its copies.
    self._contexts = []
    for slot in slots:
      self._tensors.append(
        dict(
          (p.op.outputs[0], s.op.outputs[0]) for p, s in zip(primaries, slot)
        )
      )
      self._ops.append(dict((p.op, s.op) for p, s in zip(primaries, slot)))
      self._unchanged.append(set())
      self._contexts.append({})

  def past(self, outputs, slot):
    """`outputs` computed from slot `slot` (see `store.slots.past`).

    A `PerReplica` of tensors (what `strategy.run` returns) is one leaf to
    `tf.nest` (a composite tensor, not expanded): its tensors are rewired
    one by one, each replica's copy reading its own components' shadows,
    and returned as a `PerReplica` again.
    """
    structure = tf.nest.flatten(outputs)
    groups = [distributed.replica_tensors(leaf) for leaf in structure]
    leaves = []
    for leaf, group in zip(structure, groups):
      leaves.extend([leaf] if group is None else group)
    self._check_outputs(leaves)
    tensor_map = self._tensors[slot]
    missing = [
      t
      for t in leaves
      if t not in tensor_map and t not in self._unchanged[slot]
    ]
    if missing:
      self._copy(missing, slot)
    for t in missing:
      if t not in tensor_map:
        self._unchanged[slot].add(t)
    rewired = iter([tensor_map.get(t, t) for t in leaves])
    result = []
    for leaf, group in zip(structure, groups):
      if group is None:
        result.append(next(rewired))
      else:
        result.append(distributed.like(leaf, [next(rewired) for _ in group]))
    return tf.nest.pack_sequence_as(outputs, result)

  def lookup(self, fetches, feed_dict, slot):
    """Rewired `(fetches, feed_dict)` for slot `slot`, or None if not all are.

    Builds nothing. Fed tensors that have a copy are fed to the copy too, so a
    fed intermediate tensor means the same in the past graph.
    """
    tensor_map = self._tensors[slot]
    unchanged = self._unchanged[slot]
    rewired = []
    for leaf in tf.nest.flatten(fetches):
      t = self._as_tensor(leaf)
      if t is not None and t in unchanged:
        rewired.append(t)
      elif t is not None and t in tensor_map and t.op not in self._primary_ops:
        rewired.append(tensor_map[t])
      else:
        return None
    feeds = None
    if feed_dict:
      feeds = dict(feed_dict)
      for key, value in feed_dict.items():
        t = self._as_tensor(key)
        if t is None:
          return None  # a SparseTensor or other key: leave it to the swap
        if t in tensor_map:
          feeds[tensor_map[t]] = value
    return tf.nest.pack_sequence_as(fetches, rewired), feeds

  # -- internals -------------------------------------------------------------------

  def _as_tensor(self, x):
    if isinstance(x, tf.Tensor):
      return x if x.graph is self._graph else None
    if isinstance(x, str):
      try:
        x = self._graph.as_graph_element(
          x, allow_tensor=True, allow_operation=False
        )
      except (KeyError, ValueError, TypeError):
        return None
      return x
    return None

  def _check_outputs(self, leaves):
    if not leaves:
      raise ValueError("store.slots.past() got no tensors.")
    for t in leaves:
      if isinstance(t, tf.Operation) or not isinstance(t, tf.Tensor):
        raise TypeError(
          "store.slots.past() takes tensors (or a list, tuple or dict of them), got "
          "%r. For a variable, pass var.value(); ops have no past value (run "
          "them with evaluate_with, which swaps)." % (t,)
        )
      checks.same_graph(
        t, self._graph, "store.slots.past()'s output %s" % t.name
      )
      if is_ref_dtype(t.dtype) or t.dtype.base_dtype == tf.resource:
        raise ValueError(
          "store.slots.past() got %s, a variable's %s; pass the value "
          "(var.value()) instead: a past reference could be written through."
          % (t.name, "reference" if is_ref_dtype(t.dtype) else "handle")
        )

  def _copy(self, missing, slot):
    tensor_map, op_map = self._tensors[slot], self._ops[slot]
    within = subgraph.backward_ops([t.op for t in missing], done=op_map)
    to_copy = subgraph.forward_ops(within, tensor_map, op_map)
    self._refuse(within, to_copy, missing)
    if not to_copy:
      return
    if self._graph.finalized:
      raise errors.RewireError(
        "store.slots.past() must build the ops computing %s from slot %d, but the "
        "graph is finalized. Call store.slots.past() while building the graph "
        "(before graph.finalize() or a MonitoredSession); its results are "
        "cached and can be fetched afterwards." % (missing[0].name, slot)
      )
    prefix = "%s/past_%d/" % (self._name, slot)
    subgraph.copy_ops(
      subgraph.topological(to_copy),
      tensor_map,
      op_map,
      lambda n: prefix + n,
      edit=self._edit,
      after=subgraph.copy_static_shapes,
      contexts=self._contexts[slot],
    )

  def _refuse(self, within, to_copy, outputs):
    """Raises RewireError for the first op that cannot be rewired faithfully."""
    # What may write a covered variable, function bodies included: its copy
    # would write the slot it reads (writers.py; a stateless function op built
    # by hand is known to write only by its body).
    finder = writers.WriteFinder(list(self._primary_keys.values()))
    # In creation order, so the op named is the first one the model built.
    for op in sorted(within, key=creation_order):
      alias = subgraph.aliased(op, self._primary_keys)
      if alias and op not in self._shadow_ops:
        self._fail(
          op, outputs, alias + ", which rewiring cannot map to a shadow"
        )
      if op not in to_copy:
        continue
      why = subgraph.uncopyable_control_flow(op)
      if why:
        self._fail(op, outputs, why)
      if subgraph.writes_variable(op):
        self._fail(
          op,
          outputs,
          "it writes a variable, and a past evaluation must "
          "write neither the snapshot nor the current parameters. If it "
          "runs as a control dependency of the outputs (batch-norm "
          "updates, tf.assign), fetch it separately from the outputs",
        )
      for variable, write in finder.writes(op):
        self._fail(
          op,
          outputs,
          "%s, and a past evaluation must write neither the snapshot nor "
          "the current parameters"
          % write.describe(
            op,
            variable.op.name
            if variable is not None
            else "a variable snapstore cannot trace",
          ),
        )
      if subgraph.unsafe_stateful(op):
        self._fail(
          op,
          outputs,
          "it is stateful, and snapstore does not know that "
          "running a copy of it next to the original is harmless (it "
          "copies random ops, variable reads, Print and Assert)",
        )

  def _fail(self, op, outputs, why):
    raise errors.RewireError(
      "%s %s"
      % (
        subgraph.refusal("store.slots.past() cannot rewire", op, outputs, why),
        _SWAP_NOTE,
      )
    )

  def _edit(self, op, node_def, inputs):
    del op
    if not any(t.op in self._shadow_ops for t in inputs):
      return
    if "_gradient_op_type" in node_def.attr:
      node_def.attr[_ORIGINAL_GRADIENT].CopyFrom(
        node_def.attr["_gradient_op_type"]
      )
    node_def.attr["_gradient_op_type"].s = tf.compat.as_bytes(
      _GRADIENT_OVERRIDE
    )
