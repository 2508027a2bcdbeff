"""Units of a device store: a variable's own shadow, or small ones packed together.

A store pays per shadow variable: ops to build (most of a device store's
construction time), nodes for every run to execute, and a first run that
grows with them. A model of a few hundred layers with an optimizer's slots is
thousands of variables, most of them small (biases, norms, scalars). Packed
(`pack=True`), such variables share one flat buffer per slot for each
(device, dtype, kind) group, and the copies work on whole groups.

Device mode sees only units: each unit has one shadow per slot and answers
the same questions, whether it stands for one variable (`Loose`) or a packed
group (`Group`):

    units = plan(primaries, "snapstore", pack=True)   # the store's name scope
    value = unit.pack(reads)        # what the unit's shadow holds, built once
    parts = unit.unpack(buffer)     # one tensor per member, in its shape
    unit.indices                    # the members' positions in `primaries`

A snapshot is one concatenation per group (shared by every slot) and one
assign per group and slot; a restore one split per group and slot and an
assign per variable, as before. This is the fusion Horovod applies to
all-reduce tensors. Variables larger than the limit keep shadows of their own:
their copies already run at memory bandwidth, and packing them would add a
copy of their bytes without saving anything that matters.

A group holds variables with the same device string, so its buffer,
colocated with the group's first variable, is on the device the others are
placed on (a variable's reshape is colocated with the variable).
"""

import collections

import numpy as np

from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.engines.graph import copies

# Variables of at most this many bytes are packed.
PACK_LIMIT_BYTES = 1 << 20

# Dtypes packed: those whose concatenation and split have kernels on CPUs and
# GPUs alike (TF_CALL_GPU_NUMBER_TYPES), so that a buffer on a GPU never needs
# soft placement. Other variables (an int64 global step, bools) keep shadows
# of their own.
PACKED_DTYPES = frozenset([tf.float16, tf.float32, tf.float64])


def plan(primaries, scope, pack, limit=PACK_LIMIT_BYTES):
  """The units shadowing `primaries`: each variable alone, or small ones packed.

  Args:
    primaries: The store's variables.
    scope: The store's name scope; group `n`'s buffers are under
      `<scope>/packed_<n>/`.
    pack: Whether to pack small variables; if False every unit is `Loose`.
    limit: Pack only variables of at most this many bytes (with a fully
      defined shape, of one of `PACKED_DTYPES`).

  Returns:
    A list of units: a `Loose` per variable not packed, in the order of
    `primaries`, then a `Group` per packed group (of two or more).
  """
  if not pack:
    return [Loose(p, i) for i, p in enumerate(primaries)]
  members = collections.OrderedDict()  # key -> indices
  loose = []
  for i, p in enumerate(primaries):
    if (
      p.dtype.base_dtype not in PACKED_DTYPES
      or not p.shape.is_fully_defined()
      or _nbytes(p) > limit
    ):
      loose.append(i)
      continue
    key = (p.device, p.dtype.base_dtype, copies.is_resource(p))
    members.setdefault(key, []).append(i)
  groups = []
  for indices in members.values():
    if len(indices) < 2:  # nothing to share
      loose.extend(indices)
    else:
      groups.append(Group(len(groups), primaries, indices, scope))
  return [Loose(primaries[i], i) for i in sorted(loose)] + groups


def _nbytes(variable):
  return variable.shape.num_elements() * variable.dtype.base_dtype.size


class Loose(object):
  """A variable with a shadow of its own, as a unit (see module doc).

  Args:
    variable: The variable.
    index: Its position in the store's variables.
  """

  packed = False

  def __init__(self, variable, index):
    self.members = [variable]
    self.indices = [index]
    self.anchor = variable
    self.dtype = variable.dtype.base_dtype
    self.is_resource = copies.is_resource(variable)
    self.shape = variable.shape

  def shadow_name(self, name):
    """(scope, name) of the unit's shadow called `name`: under the variable."""
    return self.anchor.op.name + "/", name

  def pack(self, values):
    """The variable's value from `values` (a function of it, or a 1-list)."""
    return values[0] if isinstance(values, list) else values(self.anchor)

  def unpack(self, value):
    """`value` itself: the variable's value, in its shape."""
    return [value]


class Group(object):
  """Variables on one device, of one dtype and kind, sharing a flat buffer (a unit).

  Args:
    number: The group's number in its store, for op names.
    primaries: All of the store's variables.
    indices: The positions of this group's variables in `primaries`.
    scope: The store's name scope.
  """

  def __init__(self, number, primaries, indices, scope):
    self.number = number
    self.scope = "%s/packed_%d/" % (scope.rstrip("/"), number)
    self.indices = list(indices)
    self.members = [primaries[i] for i in self.indices]
    first = self.members[0]
    self.anchor = first  # the buffer is colocated with it
    self.dtype = first.dtype.base_dtype
    self.is_resource = copies.is_resource(first)
    self._sizes = [m.shape.num_elements() for m in self.members]
    self.size = int(np.sum(self._sizes, dtype=np.int64))
    self.shape = tf.TensorShape([self.size])
    self._consts = None
    self._packed = {}  # id(reads) -> (reads, flat tensor)

  packed = True

  def shadow_name(self, name):
    """(scope, name) of the group's buffer called `name` ("<store>/slot_0"):
    the last part of `name`, under the group's scope."""
    return self.scope, name.split("/")[-1]

  def pack(self, values):
    """The members' values, flattened and concatenated; built once per source.

    Args:
      values: A function from a member to the tensor to pack (a
        `copies.SharedReads`, `shadows.value_at_init`), or a list of tensors.

    Returns:
      A 1-D tensor of `self.size` elements, on the buffer's device.
    """
    key = id(values)
    if key in self._packed:
      return self._packed[key][1]
    consts = self._constants()
    flat = []
    for i, m in enumerate(self.members):
      value = values[i] if isinstance(values, list) else values(m)
      with ops.colocate_with(m), tf.name_scope(self.scope):
        flat.append(tf.reshape(value, consts.flat, name="flat"))
    with ops.colocate_with(self.anchor), tf.name_scope(self.scope):
      packed = tf.concat(flat, consts.axis, name="pack")
    self._packed[key] = (values, packed)
    return packed

  def unpack(self, flat):
    """The members' values out of the 1-D tensor `flat`: a split and reshapes.

    Returns:
      One tensor per member, in its shape, each on the member's device.
    """
    consts = self._constants()
    with ops.colocate_with(self.anchor), tf.name_scope(self.scope):
      parts = tf.split(
        flat,
        consts.sizes,
        num=len(self.members),
        axis=consts.axis,
        name="unpack",
      )
    values = []
    for m, part in zip(self.members, parts):
      with ops.colocate_with(m), tf.name_scope(self.scope):
        values.append(
          tf.reshape(
            part, consts.shapes[tuple(m.shape.as_list())], name="unflat"
          )
        )
    return values

  def _constants(self):
    """Shared constants: the split sizes, the axis, `[-1]` and each shape once."""
    if self._consts is None:
      with ops.colocate_with(self.anchor), tf.name_scope(self.scope):
        shapes = {}
        for m in self.members:
          key = tuple(m.shape.as_list())
          if key not in shapes:
            shapes[key] = tf.constant(
              list(key), tf.int32, shape=[len(key)], name="shape"
            )
        self._consts = _Constants(
          sizes=tf.constant(self._sizes, tf.int64, name="sizes"),
          axis=tf.constant(0, tf.int32, name="axis"),
          flat=tf.constant([-1], tf.int32, name="flat"),
          shapes=shapes,
        )
    return self._consts


_Constants = collections.namedtuple("_Constants", "sizes axis flat shapes")
