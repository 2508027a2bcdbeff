"""Shadow variables, made the way `slot_creator` makes optimizer slots.

A shadow is named under its primary, not trainable, and created inside
`colocate_with(primary)`. As TF's `moving_averages` puts it, "to lower
communication bandwidth across devices we keep the moving averages on the
same device as the variables"; a snapshot or restore of a device shadow never
crosses devices.

    slots = make_slots(primaries, [("snapstore/slot_0", collections),
                                   ("snapstore/slot_1", collections)])
    scratch = make_scratch(primaries, "snapstore/scratch", collections, reads)

A store makes `max_to_keep + 1` shadows of every variable, so each costs as
few ops as a variable can: its own (a `VarHandleOp` or `VariableV2`), a read,
and an initializer. Nothing else is built per shadow: the value a slot is
initialized with is built once per primary (`value_at_init`), and whether a
store's shadows still need initializing is decided once per device (`_gate`).

Shadows are made for units (`snapstore.engines.graph.packing`): a unit is one
variable, or a group of small variables that share one flat buffer, named
`<store>/packed_<n>/<slot>` and colocated with the group's first variable,
initialized with the members' `value_at_init`s packed.
"""

import functools

from snapstore._tf import control_flow_ops
from snapstore._tf import deprecation
from snapstore._tf import ops
from snapstore._tf import resource_variable_ops
from snapstore._tf import state_ops
from snapstore._tf import tf
from snapstore._tf import variable_handle_from_shape_and_dtype
from snapstore._tf import variable_pb2
from snapstore.engines.graph import copies


def make_slots(units, slots):
  """Shadow variables of `units`, one set per slot, initialized once.

  Shadow `k` of a primary is named `<primary>/<slots[k][0]>`, not trainable,
  colocated with the primary, and initialized to the primary's value
  (`value_at_init`): its current value when it is initialized, else its own
  initial value, so that running the global and local initializers in one
  `session.run` gives every shadow exactly the value the primary got.

  The slots are initialized once: run again, their initializers leave them
  as they are. A shadow holds a snapshot the store lists under a tag, or the
  state of in-graph ops (an average, Lookahead's slow weights); running the
  local initializer again to reset `tf.metrics`, or a non-chief worker's
  `local_init_op` against shadows on a parameter server, must not replace it.
  Whether the slots still need initializing is decided per device (a
  parameter server restarted alone loses only its own shadows), by the first
  shadow made on that device: each initializer assigns an Identity of the
  primary's `value_at_init` whose control input is dead when that shadow is
  initialized, so it does not run (see `_gate`). Feeding that Identity still
  writes a shadow, which is what `Variable.load` does.

  Args:
    units: The `packing` units to shadow: one shadow each per slot.
    slots: `(name, collections)` pairs, one per slot: the name of the
      shadows (e.g. "snapstore/slot_0", under each variable; see
      `shadow_name` of the units) and the graph collections to add that
      slot's shadows to (not GLOBAL_VARIABLES unless a default Saver should
      save them).

  Returns:
    One list per slot of `tf.Variable`s (ResourceVariables for resource
    primaries), in the order of `units`.
  """
  values = [u.pack([value_at_init(m) for m in u.members]) for u in units]
  gates = {}  # unit's device -> the op gating the initializers there
  gated = {}  # unit's index -> the value every slot's initializer assigns

  def initial(variable, index):
    if index not in gated:
      device = units[index].anchor.device
      if device not in gates:
        gates[device] = _gate(variable)
      with ops.control_dependencies([gates[device]]):
        gated[index] = tf.identity(values[index], name="value_at_init")
    return gated[index]

  return [
    [
      _shadow(u, name, collections, functools.partial(initial, index=i))
      for i, u in enumerate(units)
    ]
    for name, collections in slots
  ]


def make_scratch(units, name, collections, reads):
  """Shadows whose initializer copies the primary's current value.

  Setting the variables aside is running these initializers (there is
  nothing to initialize once: a scratch shadow is written whole before it is
  read), so they cost no ops beyond the shadow's own.

  Args:
    units: The `packing` units to shadow (see `make_slots`).
    name: The shadows' name (e.g. "snapstore/scratch").
    collections: The graph collections to add the shadows to.
    reads: How a variable is read (`copies.SharedReads`).

  Returns:
    A list of `tf.Variable`s, in the order of `units`.
  """
  return [_shadow(u, name, collections, u.pack(reads)) for u in units]


def _shadow(unit, name, collections, initial):
  """The shadow of `unit` called `name`, from ops built here.

  The variable constructors would also build an initializer that is replaced
  here, and rewrite the initial value with
  `_try_guard_against_uninitialized_dependencies` (one more `tf.cond` per
  variable read): most of their ops, and most of their time, would be wasted.
  The variable is made from its `VariableDef`, as `import_meta_graph` makes
  variables.

  Args:
    unit: The `packing` unit to shadow.
    name: The shadow's name (placed by `unit.shadow_name`).
    collections: The graph collections to add the shadow to.
    initial: The tensor its initializer assigns, or a function from the new
      variable's ref tensor or handle to that tensor.
  """
  dtype, resource = unit.dtype, unit.is_resource
  under, name = unit.shadow_name(name)
  # The deprecation warning TF prints when a ResourceVariable is made is about
  # its own constructor's arguments, not the user's code.
  with ops.colocate_with(unit.anchor), ops.name_scope(
    under
  ), deprecation.silence(), ops.name_scope(name) as scope:
    if resource:
      # As the constructor: the handle's shared name is its op name, so that
      # every session on the cluster finds the same variable.
      variable = variable_handle_from_shape_and_dtype(
        unit.shape,
        dtype,
        shared_name=ops.name_from_scope_name(scope),
        name=scope,
        graph_mode=True,
      )
    else:
      variable = state_ops.variable_op_v2(unit.shape, dtype, name=scope)
    with ops.name_scope(scope):
      if callable(initial):
        initial = initial(variable)
      initializer = _assign(variable, initial)
      if resource:
        with ops.name_scope("Read"):
          value = resource_variable_ops.read_variable_op(variable, dtype)
      else:
        with ops.colocate_with(variable.op):
          value = tf.identity(variable, name="read")
    variable_def = variable_pb2.VariableDef(
      variable_name=variable.name,
      initializer_name=initializer.name,
      snapshot_name=value.name,
      initial_value_name=initial.name,
      trainable=False,
      is_resource=resource,
    )
    if resource:
      shadow = resource_variable_ops.ResourceVariable(variable_def=variable_def)
    else:
      shadow = tf.Variable(use_resource=False, variable_def=variable_def)
  ops.add_to_collections(collections, shadow)
  return shadow


def _assign(variable, value):
  """An op writing `value` into a ref tensor or resource handle made here."""
  if variable.dtype == tf.resource:
    return resource_variable_ops.assign_variable_op(variable, value)
  return state_ops.assign(variable, value, validate_shape=True).op


def _gate(variable):
  """An op that is dead when `variable` is initialized, for a control input.

  An op with a dead control input does not run, which is how a `tf.cond`
  branch with no data inputs is skipped; Switch outputs are dead or alive, so
  the gate is an Identity of the one taken when `variable` is uninitialized.
  """
  with ops.name_scope("once"):
    if variable.dtype == tf.resource:
      initialized = resource_variable_ops.var_is_initialized_op(variable)
    else:
      initialized = state_ops.is_variable_initialized(variable)
    return tf.identity(control_flow_ops.switch(initialized, initialized)[0]).op


def value_at_init(primary):
  """A tensor with `primary`'s value when evaluated by an initializer.

  It reads the primary when the primary is initialized, and evaluates the
  primary's own initial value when not, so that running the global and local
  initializers in one `session.run` gives the result exactly the value the
  primary got (a random initializer is evaluated once per run). The read is
  colocated with the primary (a resource can only be read on its device).

  Built from Switch and Merge directly rather than `tf.cond` (what `tf.cond`
  builds, at a fraction of its construction time and ops, which a store pays
  per variable): the untaken branch's tensor is dead, so an uninitialized
  variable is never read.
  """
  init = getattr(primary, "initial_value", None)
  with ops.colocate_with(primary):
    if init is None:  # e.g. rebuilt from an old VariableDef
      return primary.read_value()
    with ops.name_scope(primary.op.name + "/value_at_init/"):
      if copies.is_resource(primary):
        handle = primary.handle
        initialized = resource_variable_ops.var_is_initialized_op(handle)
        current = resource_variable_ops.read_variable_op(
          control_flow_ops.switch(handle, initialized)[1],
          primary.dtype.base_dtype,
        )
      else:
        ref = primary.op.outputs[0]
        initialized = state_ops.is_variable_initialized(ref)
        current = control_flow_ops.ref_switch(ref, initialized)[1]
      fresh = control_flow_ops.switch(init, initialized)[0]
      return control_flow_ops.merge([fresh, current])[0]
