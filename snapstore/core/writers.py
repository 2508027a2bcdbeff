"""Which ops may write a variable, through its reference or its handle.

`snapshot_before` must find every op of a train step that can write a variable
of the store. Listing writer types is not enough: a `tf.function` call
(`StatefulPartitionedCall`) or a v2 `tf.cond`, `tf.while_loop` or
`tf.switch_case` (`If`, `While`, `Case`) takes the variable's handle and
writes it inside its function bodies. So the rule is the other way round:
an op that takes a variable's handle may write it unless it is proven to
only read it:

- it is a read TF itself lists as read-only (`READ_ONLY_RESOURCE_OPS`);
- it passes the handle on (Identity, Switch...; whoever takes it next is
  checked in turn);
- it runs functions (a call, functional control flow, any op with a
  function-valued attribute) whose bodies, analysed the same way down
  through nested calls and control flow, use the arguments that carry the
  handle only in those ways.

Anything else that takes the handle may write it: an assign, scatter or
apply op (a known writer), an op type snapstore does not know, a function
that is not in the graph's library. A ref variable's reference is written
only by ops whose input argument is a reference (`Assign`, `ScatterUpdate`,
`ApplyGradientDescent`...); other ops read what they are given. A function
body cannot take a reference: TF captures a ref variable's value.

Function bodies are read from their `FunctionDef` (the graph's function
library), the same format on every TensorFlow version: a node's input is
`arg` for an argument of the function and `node:output_arg:index` for an
output of another node.
"""

from snapstore._tf import function_def
from snapstore._tf import is_ref_dtype
from snapstore._tf import tf

# Ops that own a variable's buffer (ref variables) or resource (ResourceVariable).
VARIABLE_OP_TYPES = frozenset(["VariableV2", "Variable", "VarHandleOp"])

# Resource ops that write the resource they are given (a known writer).
RESOURCE_WRITER_TYPES = frozenset(
  [
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
    "ResourceStridedSliceAssign",
    "DestroyResourceOp",
    "ResourceCountUpTo",
  ]
)
RESOURCE_WRITER_PREFIXES = (
  "ResourceApply",
  "ResourceSparseApply",
  "ResourceScatter",
)

# Ops that only read the resource they take. The list is TF's own (TF 2.x's
# resource_variable_ops.py declares these with
# auto_control_deps_utils.register_read_only_resource_op), plus
# VarIsInitializedOp, whose kernel only looks the resource up.
READ_ONLY_RESOURCE_OPS = frozenset(
  [
    "ReadVariableOp",
    "_ReadVariablesOp",
    "ResourceGather",
    "ResourceGatherNd",
    "VariableShape",
    "VarIsInitializedOp",
  ]
)


def _same_index(name, k):
  return ("%s:output:%d" % (name, k),)


def _first(name, k):
  return ("%s:output:0" % name,)


# Ops that give out a handle they take, unchanged: op type -> function of
# (op name, input index) giving the outputs that carry it, named as in a
# FunctionDef. None: only the data input (0) is passed on.
_PASS_THROUGH = {
  "Identity": None,
  "IdentityN": _same_index,
  "Switch": lambda name, k: (
    "%s:output_false:0" % name,
    "%s:output_true:0" % name,
  ),
  "Merge": _first,
  "Enter": None,
  "Exit": None,
  "NextIteration": None,
}
# The same for references; they take a reference only to pass it on.
_REF_PASS_THROUGH = frozenset(
  [
    "RefIdentity",
    "RefSwitch",
    "RefMerge",
    "RefEnter",
    "RefExit",
    "RefNextIteration",
    "RefSelect",
  ]
)
# Takes a reference only to read it.
_REF_READERS = frozenset(["IsVariableInitialized"])

# Functional ops: how their inputs map to their functions' arguments.
_IF = frozenset(["If", "StatelessIf"])  # cond, then the branch args
_CASE = frozenset(["Case", "StatelessCase"])  # branch_index, then the args
_WHILE = frozenset(["While", "StatelessWhile"])  # the loop vars
_CALL = frozenset(["PartitionedCall", "StatefulPartitionedCall"])  # the args

_DT_RESOURCE = 20  # types_pb2.DT_RESOURCE, in a FunctionDef's signature
_MISSING = (
  "is not in the graph's function library, so snapstore cannot tell "
  "what it does"
)


class Write(object):
  """Why an op may write a variable: what runs on the handle, and how sure.

  Attributes:
    certain: True if the op that takes the handle is a known writer (an
      assign, scatter or apply op); False if it is only not known to read.
    steps: (function, op name, op type) from the outermost function body in,
      down to the op that takes the handle (empty: the op itself does).
    end: None, or (function, why): the innermost function, whose use of the
      handle could not be told, and why (it is missing...).
  """

  def __init__(self, certain, steps=(), end=None):
    self.certain = certain
    self.steps = tuple(steps)
    self.end = end

  def inside(self, function, name, op_type):
    """This write, seen from the body of `function`, where op `name` runs it."""
    return Write(
      self.certain, ((function, name, op_type),) + self.steps, self.end
    )

  def describe(self, op, variable):
    """`'op' (type T) writes V (how)`, for the refusal naming `op`."""
    head = "'%s' (type %s) %s %s" % (
      op.name,
      op.type,
      "writes" if self.certain else "may write",
      variable,
    )
    if not self.steps and self.end is None:
      if self.certain:
        return head
      return head + (
        " (it takes the variable's handle and is not known to only read it)"
      )
    parts = []
    for function, name, op_type in self.steps:
      parts.append(
        "%s function %s runs '%s' (type %s)"
        % ("whose" if parts else "its", function, name, op_type)
      )
    if self.end is not None:
      parts.append(
        "%s function %s %s"
        % ("whose" if parts else "its", self.end[0], self.end[1])
      )
      return "%s (%s)" % (head, ", ".join(parts))
    return "%s (%s%s)" % (
      head,
      ", ".join(parts),
      (
        " on it"
        if self.certain
        else ", which takes the handle and is not known to only read it"
      ),
    )


def _undecided(function, why):
  return Write(False, end=(function, why))


class WriteFinder(object):
  """Finds what ops may write some variables; caches what it reads.

  One per check: its traces and function analyses are of the graph as it is.
  """

  def __init__(self, variables):
    """Args: variables: The variables to look for (all of one graph)."""
    self._covered = dict((resource_key(v.op), v) for v in variables)
    self._origins = {}  # tensor -> the variable ops it may come from
    self._variables = {}  # variable op -> the variable of the set, or None
    self._bodies = _Bodies()

  def writes(self, op):
    """[(variable or None, Write)]: the variables of the set `op` may write.

    None stands for a handle or reference that snapstore cannot trace to a
    variable op (a fed one, one a function returns), which may be any; it
    comes last.
    """
    by_target = {}
    for i, t in enumerate(op.inputs):
      if not _is_handle(t.dtype):
        continue
      for origin in self._origins_of(t):
        variable = None if origin is None else self._variable(origin)
        if origin is None or variable is not None:
          by_target.setdefault(variable, []).append(i)
    found = []
    for variable, indices in sorted(
      by_target.items(), key=lambda item: item[0] is None
    ):
      write = self._op_writes(op, indices)
      if write is not None:
        found.append((variable, write))
    return found

  def _variable(self, variable_op):
    """The variable of the set that `variable_op` owns the buffer of, or None."""
    if variable_op not in self._variables:
      self._variables[variable_op] = self._covered.get(
        resource_key(variable_op)
      )
    return self._variables[variable_op]

  def _origins_of(self, t):
    """The variable ops `t` may be the reference or handle of (None: unknown).

    Walks back through every op that takes a reference or handle, the ones
    that pass it on and any other (its output may be made from it). An op
    taking none made the resource: a variable op, or one of another kind (a
    TensorArray, a queue, a table), which is no variable. A placeholder may
    be fed any handle, and a function may return one it made.
    """
    if t not in self._origins:
      origins = set()
      seen = set()
      todo = [t.op]
      while todo:
        op = todo.pop()
        if op in seen:
          continue
        seen.add(op)
        if op.type in VARIABLE_OP_TYPES:
          origins.add(op)
          continue
        if op.type in ("Placeholder", "PlaceholderWithDefault") or (
          self._bodies.is_function_op(op)
        ):
          origins.add(None)
        todo.extend(x.op for x in op.inputs if _is_handle(x.dtype))
      self._origins[t] = frozenset(origins)
    return self._origins[t]

  def _op_writes(self, op, indices):
    """The Write if `op` may write what its inputs `indices` hold, else None."""
    refs = [i for i in indices if is_ref_dtype(op.inputs[i].dtype)]
    if (
      refs and op.type not in _REF_PASS_THROUGH and op.type not in _REF_READERS
    ):
      is_ref = _ref_args(op)
      if any(is_ref[i] for i in refs):
        return Write(True)
    handles = [i for i in indices if op.inputs[i].dtype == tf.resource]
    if not handles:
      return None
    if op.type in READ_ONLY_RESOURCE_OPS or op.type in _PASS_THROUGH:
      return None  # whoever takes what it passes on is checked in turn
    if _known_writer(op.type):
      return Write(True)
    if not self._bodies.is_function_op(op):
      return Write(False)
    # What its outputs carry does not matter here: whoever takes them traces
    # them back to this op's inputs, and is checked in turn.
    write, _ = self._bodies.call(
      op.type, _function_attrs(op.node_def), handles, op.graph
    )
    return write


def written_handles(handles):
  """The positions in `handles` whose resource an op of their graph may write.

  The forward counterpart of `WriteFinder`, for handles that do not come
  from a variable op of the graph: a function graph's placeholders for the
  variable handles it captures (what a `tf.function` body reads its
  variables through). Each handle is followed to every op that takes it,
  by the same rule: a read-only op ends the walk, an op that passes the
  handle on is followed through the outputs that carry it, a function call
  or functional control flow is looked into, and any other op may write.

  Args:
    handles: Resource tensors of one graph.

  Returns:
    A set of indices into `handles`.
  """
  bodies = _Bodies()
  found = set()
  for k, handle in enumerate(handles):
    todo, seen = [handle], set()
    while todo and k not in found:
      tensor = todo.pop()
      if id(tensor) in seen:
        continue
      seen.add(id(tensor))
      for op in tensor.consumers():
        indices = [i for i, x in enumerate(op.inputs) if x is tensor]
        writes, passed = _forward(op, indices, bodies)
        if writes:
          found.add(k)
          break
        todo.extend(passed)
  return found


def _forward(op, indices, bodies):
  """(may write, the outputs that carry the handle) for `op` taking it at
  its inputs `indices` (see `written_handles`)."""
  if op.type in READ_ONLY_RESOURCE_OPS:
    return False, []
  if op.type in _PASS_THROUGH:
    if op.type == "IdentityN":
      return False, [op.outputs[i] for i in indices]
    if op.type == "Switch":
      return False, (list(op.outputs) if 0 in indices else [])
    if op.type == "Merge":
      return False, [op.outputs[0]]
    return False, ([op.outputs[0]] if 0 in indices else [])
  if _known_writer(op.type) or not bodies.is_function_op(op):
    return True, []
  write, returned = bodies.call(
    op.type, _function_attrs(op.node_def), indices, op.graph
  )
  if write is not None or returned is None:
    return True, []
  return False, [op.outputs[j] for j in sorted(returned)]


class _Bodies(object):
  """Function bodies of a graph's library, and what each does with its args."""

  def __init__(self):
    self._called = {}
    self._library = {}  # graph -> {name: FunctionDef} from its GraphDef
    self._results = {}
    self._running = set()

  def is_function_op(self, op):
    """True for an op that runs functions: a call, functional control flow."""
    return (
      bool(_function_attrs(op.node_def))
      or self.called(op.graph, op.type) is not None
    )

  def called(self, graph, op_type):
    """The FunctionDef an op of type `op_type` calls directly, or None.

    TF builds such an op (its type is the function's name) only once the
    function is in the graph (`Graph._is_function`), so no fallback.
    """
    key = (graph, op_type)
    if key not in self._called:
      self._called[key] = function_def(graph, op_type)
    return self._called[key]

  def definition(self, graph, name):
    """The FunctionDef of function `name`, which an op names; None if missing.

    From the function TF keeps for it (`function_def`), else from the graph's
    serialized library (read once).
    """
    found = self.called(graph, name)
    if found is None:
      if graph not in self._library:
        self._library[graph] = dict(
          (f.signature.name, f) for f in graph.as_graph_def().library.function
        )
      found = self._library[graph].get(name)
    return found

  def call(self, op_type, attrs, indices, graph):
    """What a functional op does with the handle at its inputs `indices`.

    Args:
      op_type: The op's type (or a function's name: a direct call).
      attrs: Its function-valued attributes, name -> [function names].
      indices: The inputs that carry the handle.
      graph: The graph whose library holds the functions.

    Returns:
      (Write or None, the indices of the op's outputs that carry the handle;
      None if they cannot be told).
    """
    indices = frozenset(indices)
    if op_type in _IF or op_type in _CASE:
      args = frozenset(i - 1 for i in indices if i >= 1)
      names = (
        attrs.get("then_branch", []) + attrs.get("else_branch", [])
        if op_type in _IF
        else attrs.get("branches", [])
      )
      return self._branches(names, args, graph)
    if op_type in _WHILE:
      return self._loop(
        attrs.get("cond", []), attrs.get("body", []), indices, graph
      )
    if op_type in _CALL:
      return self._branches(attrs.get("f", []), indices, graph)
    if not attrs:  # a direct call: the op's type is the function's name
      return self._branches([op_type], indices, graph)
    # Another op running functions (For, a dataset's map...): how its inputs
    # reach its functions' arguments is not known here, so every resource
    # argument of every function it runs must be read-only.
    returns = False
    for names in attrs.values():
      for name in names:
        fdef = self.definition(graph, name)
        if fdef is None:
          return _undecided(name, _MISSING), None
        args = frozenset(
          i
          for i, a in enumerate(fdef.signature.input_arg)
          if a.type in (_DT_RESOURCE, 0)
        )  # 0: a type an attribute sets
        write, returned = self.body(name, args, graph)
        if write is not None:
          return write, None
        returns = returns or bool(returned)
    return None, (None if returns else frozenset())

  def _branches(self, names, args, graph):
    """Functions run on the same arguments; their results are the op's."""
    if not names:
      return Write(False), None
    carried = set()
    for name in names:
      write, returned = self.body(name, args, graph)
      if write is not None:
        return write, None
      carried |= returned
    return None, frozenset(carried)

  def _loop(self, conds, bodies, indices, graph):
    """A while loop: the body's result `j` is loop var `j` of the next round,
    so a body that returns the handle at `j` puts it there."""
    if len(conds) != 1 or len(bodies) != 1:
      return Write(False), None
    carried = frozenset(indices)
    while True:
      write, returned = self.body(bodies[0], carried, graph)
      if write is not None:
        return write, None
      if returned <= carried:
        break
      carried |= returned
    write, _ = self.body(conds[0], carried, graph)
    return write, (None if write is not None else carried)

  def body(self, name, args, graph):
    """What function `name` does with its arguments `args` (indices).

    Returns:
      (Write or None, the indices of its results that are one of them).
    """
    key = (graph, name, frozenset(args))
    if key in self._results:
      return self._results[key]
    if key in self._running:  # a function calling itself, which TF does not run
      return _undecided(name, "calls itself"), frozenset()
    fdef = self.definition(graph, name)
    if fdef is None:
      return _undecided(name, _MISSING), frozenset()
    self._running.add(key)
    try:
      result = self._analyse(name, fdef, args, graph)
    finally:
      self._running.discard(key)
    self._results[key] = result
    return result

  def _analyse(self, name, fdef, args, graph):
    arg_names = [a.name for a in fdef.signature.input_arg]
    if any(i >= len(arg_names) for i in args):
      return _undecided(
        name, "has fewer arguments than the op has inputs"
      ), frozenset()
    consumers = {}
    for node in fdef.node_def:
      for k, inp in enumerate(node.input):
        if not inp.startswith("^"):
          consumers.setdefault(_canonical(inp, arg_names), []).append((node, k))
    carried = set(arg_names[i] for i in args)
    todo = list(carried)
    while todo:
      tensor = todo.pop()
      for node, k in consumers.get(tensor, ()):
        write, passed = self._node(node, k, graph)
        if write is not None:
          return write.inside(name, node.name, node.op), frozenset()
        for out in passed:
          if out not in carried:
            carried.add(out)
            todo.append(out)
    returned = frozenset(
      j
      for j, out in enumerate(fdef.signature.output_arg)
      if _canonical(fdef.ret.get(out.name, ""), arg_names) in carried
    )
    return None, returned

  def _node(self, node, k, graph):
    """What body op `node` does with the handle at its input `k`.

    Returns:
      (Write or None, the names of its outputs that carry the handle).
    """
    if node.op in READ_ONLY_RESOURCE_OPS:
      return None, ()
    if node.op in _PASS_THROUGH:
      outputs = _PASS_THROUGH[node.op]
      if outputs is None:
        return None, (("%s:output:0" % node.name,) if k == 0 else ())
      return None, outputs(node.name, k)
    if _known_writer(node.op):
      return Write(True), ()
    attrs = _function_attrs(node)
    fdef = None if attrs else self.called(graph, node.op)
    if not attrs and fdef is None:
      return Write(False), ()
    write, returned = self.call(node.op, attrs, [k], graph)
    if write is not None:
      return write, ()
    if returned is None:  # which of its outputs carry the handle is unknown
      functions = ", ".join(n for names in attrs.values() for n in names)
      return _undecided(
        functions,
        "returns the handle, which snapstore cannot "
        "follow out of a %s op" % node.op,
      ), ()
    if fdef is not None:  # a direct call: its outputs are the function's
      return None, tuple(
        "%s:%s:0" % (node.name, fdef.signature.output_arg[j].name)
        for j in sorted(returned)
      )
    return None, tuple(
      "%s:output:%d" % (node.name, j) for j in sorted(returned)
    )


def _known_writer(op_type):
  return op_type in RESOURCE_WRITER_TYPES or op_type.startswith(
    RESOURCE_WRITER_PREFIXES
  )


def _canonical(inp, arg_names):
  """A FunctionDef input as the body names the tensor: `arg` or `node:out:i`."""
  parts = inp.split(":")
  if len(parts) == 2 and parts[1] == "0" and parts[0] in arg_names:
    return parts[0]
  return inp


def _function_attrs(node_def):
  """{attr name: [function names]} of a NodeDef's function-valued attributes."""
  found = {}
  for key, value in node_def.attr.items():
    names = []
    if value.HasField("func"):
      names.append(value.func.name)
    names.extend(f.name for f in value.list.func)
    if names:
      found[key] = names
  return found


def _ref_args(op):
  """For each input of `op`, whether its input argument is a reference."""
  flags = []
  for arg in op.op_def.input_arg:
    if arg.number_attr:
      n = op.get_attr(arg.number_attr)
    elif arg.type_list_attr:
      n = len(op.get_attr(arg.type_list_attr))
    else:
      n = 1
    flags.extend([arg.is_ref] * n)
  # Inputs the arguments do not account for (there should be none) count as
  # references: a possible writer.
  flags.extend([True] * (len(op.inputs) - len(flags)))
  return flags


def _is_handle(dtype):
  return dtype == tf.resource or is_ref_dtype(dtype)


def resource_key(op):
  """What identifies the buffer or resource a variable op owns.

  Two variable ops with the same key are one variable (for example a
  `VarHandleOp` rebuilt with the `shared_name` of another).
  """
  # Like TF, an empty shared_name means the op's own name.
  return (
    op.type == "VarHandleOp",
    _str_attr(op, "container"),
    _str_attr(op, "shared_name") or op.name,
  )


def _str_attr(op, name):
  try:
    return tf.compat.as_str(op.get_attr(name))
  except ValueError:
    return ""
