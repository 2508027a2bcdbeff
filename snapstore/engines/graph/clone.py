"""Cloning: copy the subgraph between inputs and outputs, with shared or new variables.

For the network whose building function is gone (a loaded graph, a model built
by someone else's code), `clone` copies the ops between given input tensors and
output tensors into a new scope:

    x = tf.placeholder(tf.float32, [None, 4])
    out = build_network(x)                            # variables under "net"
    c = snapstore.clone(out, inputs=[x], scope="copy")
    # c.inputs[x]: a new placeholder feeding the copy; c.outputs: the copy of out;
    # c.variables: {net/dense/kernel: copy/dense/kernel, ...}
    train_copy = opt.minimize(loss(c.outputs), var_list=list(c.variables.values()))
    sess.run(tf.global_variables_initializer())       # initializes the copies too

With `share_variables=True` the copy reads the originals' variables (what
`graph_editor.graph_replace` does); with the default `False` it gets variables
of its own. Those are genuine `tf.Variable` objects made by the `tf.Variable`
constructor (not ops rebuilt from a `VariableDef`): the originals' kind (ref or
resource), dtype, shape, constraint and collections, so they are in
`GLOBAL_VARIABLES` and, if the originals were, in `TRAINABLE_VARIABLES`;
`global_variables_initializer()` initializes them, a default `Saver` saves them
under their new names, any optimizer trains them, and after initialization
they are independent of the originals. Their initial value is
`initial_value="current"`: the original's value when the initializer runs (or
its initial value, if both are initialized in one run, so one
`global_variables_initializer()` gives both the same start), or
`"initializer"`: a copy of the original's initializer, run anew (on its first
run, a seeded random initializer gives the values the original started from;
an unseeded one draws new ones).

Names: an op `<src_scope>/<rest>` is copied to `<scope>/<rest>`; `src_scope`
defaults to the top-level scope all copied ops share (`net` above), so
`net/dense/kernel` becomes `copy/dense/kernel`, and a `tf.train.Saver` with a
`{key: variable}` map can move values between the two. `scope` is made unique
like a name scope.

What is copied: every op that depends on an input, a replaced tensor or (with
new variables) a variable, and that the outputs depend on, through data or
control edges. Everything else (other placeholders such as a `training` flag,
constants, the input pipeline) is shared with the original. The copies join no
collection; pass extra outputs to get copies of what you need (for example the
batch-norm update ops, which then update the copy's moving averages). Copied
ops keep the devices the originals asked for, merged into any `tf.device`
scope `clone` is called in (as `import_graph_def` does); reads of a new
variable are colocated with it. A `tf.while_loop` cannot be copied with its
`WhileContext` and is refused, naming the op.

The ops are copied by `snapstore.engines.graph.subgraph`, which says why not by
`graph_editor.copy_with_input_replacements` or `import_graph_def`.
"""

import collections
import contextlib

from snapstore._tf import save_slice_info
from snapstore._tf import creation_order
from snapstore._tf import deprecation
from snapstore._tf import reapply_device_functions
from snapstore._tf import set_save_slice_info
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import checks
from snapstore.core import writers
from snapstore.engines.graph import copies
from snapstore.engines.graph import shadows
from snapstore import errors
from snapstore.engines.graph import subgraph


class Clone(
  collections.namedtuple(
    "Clone", ["outputs", "inputs", "variables", "initializer", "scope"]
  )
):
  """What `clone` made.

  Attributes:
    outputs: The copies of the outputs, in the structure they were given in (an
      output that depends on nothing copied is itself).
    inputs: OrderedDict from each original input tensor to the tensor feeding
      the copy: a new placeholder, or its replacement.
    variables: OrderedDict from each original variable to its copy (empty when
      variables are shared), sorted by name.
    initializer: An op initializing the new variables (a no-op if none), e.g.
      to copy the originals' current values into them again.
    scope: The name scope of the copy (`scope`, made unique).

  Example:
    ```python
    copy = snapstore.clone(logits, inputs=[x], scope="copy")
    copy_logits = copy.outputs
    new_x = copy.inputs[x]  # the placeholder that feeds the copy
    sess.run(copy.initializer)  # the originals' current values, again
    ```
  """

  __slots__ = ()


INITIAL_VALUES = ("current", "initializer")

# Collections a copy of a variable joins when its original is in them.
_VARIABLE_COLLECTIONS = (
  tf.GraphKeys.GLOBAL_VARIABLES,
  tf.GraphKeys.LOCAL_VARIABLES,
  tf.GraphKeys.TRAINABLE_VARIABLES,
  tf.GraphKeys.MODEL_VARIABLES,
  tf.GraphKeys.MOVING_AVERAGE_VARIABLES,
)

_SHARED_SOURCE_TYPES = writers.VARIABLE_OP_TYPES | frozenset(
  ["Placeholder", "PlaceholderV2", "PlaceholderWithDefault"]
)


def clone(
  outputs,
  inputs=None,
  replacements=None,
  scope="clone",
  share_variables=False,
  initial_value="current",
  src_scope=None,
):
  """Copies the subgraph between `inputs` and `outputs` into a new scope.

  See the module docstring for what is copied, how variables and names are
  made, and what is shared.

  Args:
    outputs: A tensor or op, or a list, tuple or dict of them, to copy.
    inputs: Tensors where the copy starts. Each one not in `replacements` is
      replaced by a new placeholder of its dtype and shape.
    replacements: A dict from original tensors to the tensors the copy reads
      instead (same dtype, compatible shape). A key may also be a variable
      mapped to another variable of the same kind, dtype and shape, which the
      copy then uses instead of a copy of the original.
    scope: Name scope of the copy.
    share_variables: If True, the copy reads the originals' variables; if
      False, it gets new ones.
    initial_value: With new variables: "current" (the original's value when
      the initializer runs) or "initializer" (the original's initializer).
    src_scope: The part of the original names that `scope` replaces; default:
      the top-level scope every copied op is under, if any.

  Returns:
    A `Clone`.

  Raises:
    TypeError: Outputs that are not tensors or ops; inputs or replacements of
      the wrong types.
    ValueError: An empty output list, an input or replacement key the outputs
      do not depend on, a replacement of another dtype or shape, an unknown
      `initial_value`, an empty `scope`, or nothing to copy.
    GraphMismatchError: Tensors of several graphs.
    CloneError: An op or variable that cannot be copied faithfully (a
      `tf.while_loop`, a variable op with no `tf.Variable`, ...), named in the
      message; or a finalized graph. Nothing is built.

  Example:
    Graph mode: a target network with variables of its own.

    ```python
    target = snapstore.clone(q, inputs=[x], scope="target")
    q_target = target.outputs  # reads target/..., fed at target.inputs[0]
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())  # target's: the online values
    ```
  """
  if tf.executing_eagerly():
    raise errors.CloneError(
      "snapstore.clone copies a graph; eager execution has none. Copy the "
      "model instead: keras.models.clone_model(model) (or build a second "
      "tf.Module), then load a snapshot into it with a store over the copy "
      "(copy_store.load_arrays(store.arrays(tag)); copy_store.restore())."
    )
  leaves = tf.nest.flatten(outputs)
  graph = _check_outputs(leaves)
  if not isinstance(scope, str) or not scope.strip("/"):
    raise ValueError("scope must be a non-empty string, got %r." % (scope,))
  if initial_value not in INITIAL_VALUES:
    raise ValueError(
      "Invalid initial_value %r; must be one of %s."
      % (initial_value, ", ".join(INITIAL_VALUES))
    )
  inputs = _check_inputs(inputs, graph)
  replaced = _check_replacements(replacements, graph)
  stops = list(inputs) + list(replaced)
  output_ops = [x if isinstance(x, tf.Operation) else x.op for x in leaves]
  within = subgraph.backward_ops(output_ops, stop=stops)
  _check_feeding(stops, within, leaves)

  originals = []
  if not share_variables:
    originals = _variables_of(within, replaced, graph)
  sources = stops + [v.op.outputs[0] for v in originals]
  to_copy = subgraph.forward_ops(within, sources, [v.op for v in originals])
  # A ref variable's own `read` op is replaced by the copy's, not copied.
  to_copy -= set(v.value().op for v in originals if not copies.is_resource(v))
  _refuse(to_copy, within, originals, initial_value, leaves)
  if not to_copy and not originals and not inputs:
    raise ValueError(
      "Nothing to copy: the outputs depend on no input%s."
      % (" or replacement" if share_variables else ", replacement or variable")
    )
  if graph.finalized:
    raise errors.CloneError(
      "clone() must build ops, but the graph is finalized. Clone while "
      "building the graph (before graph.finalize() or a MonitoredSession)."
    )

  if src_scope is None:
    src_scope = _top_scope(
      [op.name for op in to_copy] + [v.op.name for v in originals]
    )
  src_scope = src_scope.strip("/")
  with graph.as_default(), graph.control_dependencies(None):
    new_scope = graph.unique_name(scope.strip("/"), mark_as_used=True)

    def new_name(name):
      if src_scope and name.startswith(src_scope + "/"):
        name = name[len(src_scope) + 1 :]
      return new_scope + "/" + name

    builder = _Builder(graph, new_name)
    tensor_map = dict(replaced)
    new_inputs = collections.OrderedDict()
    for t in inputs:
      new_inputs[t] = tensor_map[t] = (
        replaced[t] if t in replaced else builder.placeholder(t)
      )
    new_vars = collections.OrderedDict()
    for var in originals:
      new_vars[var] = builder.variable(var, initial_value)
    op_map = {}
    for var, new in new_vars.items():
      tensor_map[var.op.outputs[0]] = new.op.outputs[0]
      op_map[var.op] = new.op
      if not copies.is_resource(var):
        tensor_map[var.value()] = new.value()
    subgraph.copy_ops(
      subgraph.topological(to_copy),
      tensor_map,
      op_map,
      new_name,
      edit=builder.edit,
      after=builder.after,
    )
    with tf.name_scope(new_scope + "/"):
      initializer = (
        tf.variables_initializer(list(new_vars.values()))
        if new_vars
        else tf.no_op(name="init")
      )
  copied = [
    op_map.get(x, x) if isinstance(x, tf.Operation) else tensor_map.get(x, x)
    for x in leaves
  ]
  return Clone(
    tf.nest.pack_sequence_as(outputs, copied),
    new_inputs,
    new_vars,
    initializer,
    new_scope,
  )


class _Builder(object):
  """Makes the copy's placeholders and variables, and places its ops."""

  def __init__(self, graph, new_name):
    self._graph = graph
    self._new_name = new_name
    self._renamed_variables = {}  # original variable op name -> copy's name

  def placeholder(self, t):
    name = (
      t.op.name if t.value_index == 0 else "%s_%d" % (t.op.name, t.value_index)
    )
    directory, base = _split(self._new_name(name))
    with tf.name_scope(directory + "/" if directory else None):
      return tf.placeholder(t.dtype.base_dtype, t.shape, name=base)

  def variable(self, var, initial_value):
    """A new `tf.Variable` like `var`, named and placed for the copy."""
    directory, base = _split(self._new_name(var.op.name))
    members = [
      k
      for k in _VARIABLE_COLLECTIONS
      if any(v is var for v in self._graph.get_collection(k))
    ]
    trainable = tf.GraphKeys.TRAINABLE_VARIABLES in members
    self._renamed_variables[var.op.name] = self._new_name(var.op.name)
    if initial_value == "current":
      make_value = lambda: shadows.value_at_init(var)
    else:
      make_value = lambda: self._copied_initializer(var)
    # TF warns when an initial value reads another variable (it rewrites it
    # to use `initialized_value()`); reading the original is the point here.
    with tf.name_scope(directory + "/" if directory else None), _maybe_device(
      var.device
    ), deprecation.silence():
      new = tf.Variable(
        initial_value=make_value,
        trainable=trainable,
        collections=[
          k for k in members if k != tf.GraphKeys.TRAINABLE_VARIABLES
        ],
        validate_shape=var.shape.is_fully_defined(),
        name=base,
        dtype=var.dtype.base_dtype,
        constraint=getattr(var, "constraint", None),
        use_resource=copies.is_resource(var),
      )
    info = save_slice_info(var)
    if info is not None:  # a part of a partitioned variable
      set_save_slice_info(
        new,
        tf_variables.Variable.SaveSliceInfo(
          self._new_name(info.full_name),
          info.full_shape,
          info.var_offset,
          info.var_shape,
        ),
      )
    return new

  def _copied_initializer(self, var):
    """A copy of the ops computing `var.initial_value`, as they were built."""
    within = subgraph.backward_ops([var.initial_value.op])
    to_copy = set(op for op in within if op.type not in _SHARED_SOURCE_TYPES)
    tensor_map, op_map = {}, {}
    subgraph.copy_ops(
      subgraph.topological(to_copy),
      tensor_map,
      op_map,
      self._new_name,
      edit=self.edit,
      after=self.after,
    )
    return tensor_map.get(var.initial_value, var.initial_value)

  def edit(self, op, node_def, inputs):
    del op, inputs
    # Colocated with a new variable, not with its original.
    subgraph.rename_colocation(node_def, self._renamed_variables)
    if "_class" in node_def.attr:
      # Colocation decides where the op runs, as for `import_graph_def`; a
      # device the original had would contradict it when the copy is placed
      # elsewhere.
      node_def.device = ""

  def after(self, op, new):
    subgraph.copy_static_shapes(op, new)
    if new.colocation_groups() == [("loc:@" + new.name).encode()]:
      # Like `import_graph_def`: the original's device, inside whatever
      # `tf.device` scope clone() is called in. These are private, but they
      # are exactly what `import_graph_def` runs for each imported op.
      with _maybe_device(op.device):
        reapply_device_functions(self._graph, new)


def _maybe_device(device):
  return tf.device(device) if device else contextlib.ExitStack()


def _split(name):
  if "/" not in name:
    return "", name
  directory, base = name.rsplit("/", 1)
  return directory, base


def _top_scope(names):
  tops = set(name.split("/", 1)[0] if "/" in name else None for name in names)
  if len(tops) == 1:
    top = tops.pop()
    return top or ""
  return ""


# -- checks, all before anything is built ------------------------------------------


def _check_outputs(leaves):
  if not leaves:
    raise ValueError("clone() got no outputs.")
  graph = None
  for x in leaves:
    if not isinstance(x, (tf.Tensor, tf.Operation)):
      raise TypeError(
        "clone() outputs must be tensors or ops (or a list, tuple "
        "or dict of them), got %r." % (x,)
      )
    graph = _same_graph(graph, x)
  return graph


def _same_graph(graph, x):
  if graph is not None:
    checks.same_graph(
      x,
      graph,
      "clone()'s %s" % x.name,
      than="its first output",
      fix="A clone is made inside the outputs' graph.",
    )
  return x.graph


def _check_inputs(inputs, graph):
  if inputs is None:
    return []
  if isinstance(inputs, tf.Tensor):
    inputs = [inputs]
  if isinstance(inputs, (str, bytes, dict)) or not hasattr(inputs, "__iter__"):
    raise TypeError(
      "inputs must be a tensor or a list of tensors, got %r." % (inputs,)
    )
  out = []
  for t in inputs:
    if not isinstance(t, tf.Tensor):
      raise TypeError("inputs must be tensors, got %r." % (t,))
    _same_graph(graph, t)
    if t not in out:
      out.append(t)
  return out


def _check_replacements(replacements, graph):
  """Returns {original tensor: replacement tensor}."""
  if replacements is None:
    return {}
  if not isinstance(replacements, dict):
    raise TypeError(
      "replacements must be a dict from original tensors (or "
      "variables) to replacements, got %r." % (replacements,)
    )
  out = {}
  for key, value in replacements.items():
    if isinstance(key, tf_variables.Variable):
      if not isinstance(value, tf_variables.Variable):
        raise TypeError(
          "replacements[%s] must be a variable, got %r." % (key.name, value)
        )
      if copies.is_resource(key) != copies.is_resource(value):
        raise ValueError(
          "replacements[%s]: %s is a %s variable and %s is not; a variable is "
          "replaced by one of the same kind."
          % (
            key.name,
            key.name,
            "resource" if copies.is_resource(key) else "ref",
            value.name,
          )
        )
      key_t, value_t = key.op.outputs[0], value.op.outputs[0]
    elif isinstance(key, tf.Tensor):
      if not isinstance(value, tf.Tensor):
        raise TypeError(
          "replacements[%s] must be a tensor, got %r." % (key.name, value)
        )
      key_t, value_t = key, value
    else:
      raise TypeError(
        "replacements keys must be tensors or variables, got %r." % (key,)
      )
    _same_graph(graph, key_t)
    _same_graph(graph, value_t)
    if key_t.dtype.base_dtype != value_t.dtype.base_dtype:
      raise ValueError(
        "replacements[%s] has dtype %s; %s has dtype %s."
        % (
          key_t.name,
          value_t.dtype.base_dtype.name,
          key_t.name,
          key_t.dtype.base_dtype.name,
        )
      )
    if not key_t.shape.is_compatible_with(value_t.shape):
      raise ValueError(
        "replacements[%s] has shape %s, incompatible with %s's "
        "shape %s." % (key_t.name, value_t.shape, key_t.name, key_t.shape)
      )
    out[key_t] = value_t
  return out


def _check_feeding(stops, within, leaves):
  for t in stops:
    if t not in leaves and not any(c in within for c in t.consumers()):
      raise ValueError(
        "%s is given as an input or replacement, but the outputs do not "
        "depend on it. Pass the tensors the outputs are computed from." % t.name
      )


def _variables_of(within, replaced, graph):
  """The `tf.Variable`s whose ops are in `within` and are not replaced."""
  known = {}
  for key in graph.get_all_collection_keys():
    for v in graph.get_collection(key):
      if isinstance(v, tf_variables.Variable):
        known.setdefault(v.op, v)
  known_keys = set(writers.resource_key(op) for op in known)
  found = []
  for op in sorted(within, key=lambda o: o.name):
    if op.type not in writers.VARIABLE_OP_TYPES or op.outputs[0] in replaced:
      continue
    if op not in known and writers.resource_key(op) in known_keys:
      continue  # another op for a known variable: `_refuse` says so
    if op not in known:
      raise errors.CloneError(
        "clone() cannot give variable op '%s' a copy: no tf.Variable in the "
        "graph's collections owns it, so its kind and initial value are "
        "unknown. Add it to a collection, map it in replacements, or pass "
        "share_variables=True. Nothing was built." % op.name
      )
    found.append(known[op])
  return found


def _refuse(to_copy, within, originals, initial_value, outputs):
  copied_keys = dict((writers.resource_key(v.op), v) for v in originals)
  for op in sorted(within, key=creation_order):
    alias = subgraph.aliased(op, copied_keys)
    if alias:
      _fail(op, outputs, alias + ", so the copy would still read the original")
    why = subgraph.uncopyable_control_flow(op) if op in to_copy else None
    if why:
      _fail(
        op,
        outputs,
        why + ". Pass its outputs as inputs or replacements to "
        "copy what follows it",
      )
  if initial_value == "initializer":
    for var in originals:
      if getattr(var, "initial_value", None) is None:
        raise errors.CloneError(
          "clone(initial_value='initializer') cannot copy the initializer of "
          "%s: it has none (it was rebuilt from a VariableDef). Use "
          "initial_value='current'. Nothing was built." % var.name
        )


def _fail(op, outputs, why):
  raise errors.CloneError(
    subgraph.refusal("clone() cannot copy", op, outputs, why)
  )
