"""Shadow variables, made the way `slot_creator` makes optimizer slots.

A shadow is named under its primary, not trainable, and created inside
`colocate_with(primary)`. As TF's `moving_averages` puts it, "to lower
communication bandwidth across devices we keep the moving averages on the
same device as the variables"; a snapshot or restore of a device shadow never
crosses devices.

    slot_0, slot_1 = make_shadows(var, [("snapstore/slot_0", collections),
                                        ("snapstore/slot_1", collections)])
"""
from snapstore._tf import control_flow_ops
from snapstore._tf import deprecation
from snapstore._tf import ops
from snapstore._tf import resource_variable_ops
from snapstore._tf import state_ops
from snapstore._tf import tf
from snapstore._tf import variable_handle_from_shape_and_dtype
from snapstore._tf import variable_pb2
from snapstore.core import copies


def make_shadows(primary, shadows):
  """Variables shadowing `primary`: same shape, dtype and variable kind.

  Each is named `<primary>/<name>`, not trainable, colocated with `primary`,
  and initialized to the primary's value (`value_at_init`): its current value
  when it is initialized, else its own initial value, so that running the
  global and local initializers in one `session.run` gives every shadow
  exactly the value the primary got.

  That value is built once per primary and shared by its shadows: a `tf.cond`
  costs milliseconds to build, and a store makes `max_to_keep + 1` shadows of
  every variable. Ref shadows are made from their `VariableDef` (as
  `import_meta_graph` makes variables), because the RefVariable constructor
  would rewrite the shared value with one more `tf.cond` per variable read
  (`_try_guard_against_uninitialized_dependencies`), which `value_at_init`
  already guards against; that rewrite dominated the store's construction
  time.

  Its initializer initializes it once: run again, it leaves the shadow as it
  is. A shadow holds a snapshot the store lists under a tag, or the state of
  in-graph ops (an average, Lookahead's slow weights); running the local
  initializer again to reset `tf.metrics`, or a non-chief worker's
  `local_init_op` against shadows on a parameter server, must not replace it.

  Args:
    primary: The variable to shadow.
    shadows: `(name, collections)` pairs: the name under the primary (e.g.
      "snapstore/slot_0") and the graph collections to add that shadow to (not
      GLOBAL_VARIABLES unless a default Saver should save it).

  Returns:
    A list of `tf.Variable`s (ResourceVariables if the primary is one).
  """
  value = value_at_init(primary)
  make = _resource_shadow if copies.is_resource(primary) else _ref_shadow
  # The deprecation warning TF prints when a ResourceVariable is made is about
  # its own constructor's arguments, not the user's code.
  with ops.colocate_with(primary), ops.name_scope(primary.op.name + "/"), \
      deprecation.silence():
    return [make(primary, name, value, collections) for name, collections in shadows]


def _resource_shadow(primary, name, value, collections):
  """A ResourceVariable from ops built here: the ops its constructor would build.

  The constructor would also build an initializer that is replaced here, and
  rewrite `value` with `_try_guard_against_uninitialized_dependencies` (see
  `make_shadows`): half of its ops, and most of its time, would be wasted.
  """
  dtype = primary.dtype.base_dtype
  with ops.name_scope(name) as scope:
    # As the constructor: the handle's shared name is its op name, so that
    # every session on the cluster finds the same variable.
    handle = variable_handle_from_shape_and_dtype(
        primary.shape, dtype, shared_name=ops.name_from_scope_name(scope),
        name=scope, graph_mode=True)
    with ops.name_scope(scope):
      once = _once(handle, dtype, value)
      initializer = resource_variable_ops.assign_variable_op(
          handle, once, name="InitializeOnce")
      with ops.name_scope("Read"):
        snapshot = resource_variable_ops.read_variable_op(handle, dtype)
  shadow = resource_variable_ops.ResourceVariable(
      variable_def=variable_pb2.VariableDef(
          variable_name=handle.name, initializer_name=initializer.name,
          snapshot_name=snapshot.name, initial_value_name=value.name,
          trainable=False, is_resource=True))
  ops.add_to_collections(collections, shadow)
  return shadow


def _ref_shadow(primary, name, value, collections):
  """A RefVariable from ops built here: the ops its constructor would build."""
  with ops.name_scope(name) as scope:
    variable = state_ops.variable_op_v2(primary.shape, primary.dtype.base_dtype,
                                        name=scope)
    with ops.name_scope(scope):
      once = _once(variable, variable.dtype.base_dtype, value)
      initializer = state_ops.assign(variable, once, validate_shape=True).op
      with ops.colocate_with(variable.op):
        snapshot = tf.identity(variable, name="read")
  shadow = tf.Variable(use_resource=False, variable_def=variable_pb2.VariableDef(
      variable_name=variable.name, initializer_name=initializer.name,
      snapshot_name=snapshot.name, initial_value_name=value.name,
      trainable=False, is_resource=False))
  ops.add_to_collections(collections, shadow)
  return shadow


def _once(variable, dtype, initial):
  """The value an initializer that initializes `variable` once assigns.

  `variable`'s own value when it is initialized, else `initial`. Built from
  Switch and Merge directly rather than `tf.cond` (what `tf.cond` builds, at
  less construction time and fewer ops, which a store pays per shadow): the
  untaken branch's tensor is dead, so an uninitialized variable is never read.
  The assign that takes this value is still what `Variable.load` feeds.

  Args:
    variable: A ref variable's ref tensor, or a resource variable's handle.
    dtype: The variable's dtype.
    initial: Its initial value.
  """
  with ops.name_scope("once"):
    if variable.dtype == tf.resource:
      initialized = resource_variable_ops.var_is_initialized_op(variable)
      current = resource_variable_ops.read_variable_op(
          control_flow_ops.switch(variable, initialized)[1], dtype)
    else:
      initialized = state_ops.is_variable_initialized(variable)
      current = control_flow_ops.ref_switch(variable, initialized)[1]
    fresh = control_flow_ops.switch(initial, initialized)[0]
    return control_flow_ops.merge([fresh, current])[0]


def value_at_init(primary):
  """A tensor with `primary`'s value when evaluated by an initializer.

  It reads the primary when the primary is initialized, and evaluates the
  primary's own initial value when not, so that running the global and local
  initializers in one `session.run` gives the result exactly the value the
  primary got (a random initializer is evaluated once per run). The read is
  colocated with the primary (a resource can only be read on its device).
  """
  init = getattr(primary, "initial_value", None)
  with ops.colocate_with(primary):
    if init is None:  # e.g. rebuilt from an old VariableDef
      return primary.read_value()
    return tf.cond(tf.is_variable_initialized(primary), primary.read_value,
                   lambda: tf.identity(init))
