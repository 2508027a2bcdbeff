"""Graph pieces the copy modes are made of, all built once at construction.

Shadow variables are made the way `slot_creator` makes optimizer slots: named
under their primary, non-trainable, and created inside `colocate_with(primary)`.
As TF's `moving_averages` puts it, "to lower communication bandwidth across
devices we keep the moving averages on the same device as the variables"; a
snapshot or restore of a device shadow never crosses devices.

Every copy is one grouped op (`tf.group(*assigns, name=...)`), so a snapshot of
N variables is one `session.run` and one graph op to depend on.
"""
from snapstore._tf import tf
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import state_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import variables as tf_variables  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import deprecation  # pylint: disable=g-direct-tensorflow-import


def is_resource(var):
  return resource_variable_ops.is_resource_variable(var)


def assign(var, value):
  """An op writing `value` into `var`, placed with `var`.

  `use_locking=True` keeps a concurrent writer (an asynchronous training op on
  a ref variable) from interleaving with the copy.
  """
  with ops.colocate_with(var):
    if is_resource(var):
      return var.assign(value, use_locking=True, read_value=False)
    return state_ops.assign(var, value, use_locking=True).op


def read(var):
  """A tensor with the value of `var`, read on `var`'s device.

  Fetching it copies into a fresh numpy array: TF 1.15's `Session.run` never
  returns arrays that alias a variable's buffer (checked by the tests).
  """
  with ops.colocate_with(var):
    return var.read_value()


def copy(sources, targets, name):
  """One op assigning each of `sources` to the matching variable in `targets`.

  Args:
    sources: Variables (or tensors) to read.
    targets: Variables to write, in the same order.
    name: Name of the returned group op.

  Returns:
    A grouped op; `tf.no_op` for empty lists.
  """
  # A variable is read on its own device, whatever device scope surrounds the
  # store's construction, so that a copy between colocated variables never
  # leaves the device.
  assigns = [assign(t, read(s) if isinstance(s, tf_variables.Variable) else s)
             for s, t in zip(sources, targets)]
  if not assigns:
    return tf.no_op(name=name)
  return tf.group(*assigns, name=name)


def make_shadow(primary, name, collections):
  """A variable shadowing `primary`: same shape, dtype and variable kind.

  Named `<primary>/<name>`, not trainable, colocated with `primary`, and
  initialized to the primary's value. Its initial value reads the primary when
  the primary is initialized, and the primary's own initial value when not, so
  that running the global and local initializers in one `session.run` gives
  the shadow exactly the value the primary got (a random initializer is
  evaluated once per run).

  Its initializer initializes it once: run again, it leaves the shadow as it
  is. A shadow holds a snapshot the store lists under a tag, or the state of
  in-graph ops (an average, Lookahead's slow weights); running the local
  initializer again to reset `tf.metrics`, or a non-chief worker's
  `local_init_op` against shadows on a parameter server, must not replace it.

  Args:
    primary: The variable to shadow.
    name: Name under the primary, e.g. "snapstore/slot_0".
    collections: Graph collections to add the shadow to. Not
      GLOBAL_VARIABLES unless the caller wants it saved by a default Saver.

  Returns:
    A `tf.Variable` (a ResourceVariable if the primary is one).
  """
  # For ref variables TF rewrites an initial value that reads other variables
  # to use their `initialized_value()`, and warns that this is deprecated; the
  # warning is about TF's own rewrite, not the user's code.
  with ops.colocate_with(primary), ops.name_scope(primary.op.name + "/"), \
      deprecation.silence():
    shadow = tf_variables.VariableV1(
        initial_value=lambda: value_at_init(primary),
        trainable=False,
        collections=collections,
        name=name,
        dtype=primary.dtype.base_dtype,
        use_resource=is_resource(primary))
  _initialize_once(shadow)
  return shadow


def _initialize_once(var):
  """Makes `var.initializer` write nothing when `var` is already initialized.

  The new initializer is an assign of `var`'s own value when initialized and
  of its initial value when not, so `Variable.load` (which feeds the
  initializer's value input) still works.
  """
  initial = var.initializer.inputs[1]  # with TF's guard against uninitialized reads
  with ops.colocate_with(var), ops.name_scope(var.op.name + "/InitializeOnce"):
    value = tf.cond(tf.is_variable_initialized(var), var.read_value,
                    lambda: tf.identity(initial))
    var._initializer_op = assign(var, value)  # pylint: disable=protected-access


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


class Feeder(object):
  """Placeholders for one value per variable, and assign ops that consume them.

  Used to write numpy arrays (a host snapshot, a loaded `.npz`) into variables
  with one `session.run` and no new ops per call.

  Args:
    specs: The `VariableSpec`s whose values will be fed, in order.
    name: Name scope for the placeholders.
  """

  def __init__(self, specs, name):
    with tf.name_scope(name):
      self._placeholders = [
          tf.placeholder(spec.variable.dtype.base_dtype, spec.shape,
                         name="value_%d" % i) for i, spec in enumerate(specs)]

  @property
  def placeholders(self):
    return list(self._placeholders)

  def assign_to(self, targets, name):
    """A grouped op writing the fed values into `targets` (one per spec)."""
    return copy(self._placeholders, targets, name)
