"""Packing: small variables share one shadow buffer per device and dtype.

A store pays per shadow variable: ops to build (most of a device store's
construction time), nodes for every run to execute, and a first run that
grows with them. A model of a few hundred layers with an optimizer's slots is
thousands of variables, most of them small (biases, norms, scalars). Packed,
such variables share one flat buffer per slot for each (device, dtype, kind)
group, and the copies work on whole groups:

    groups, loose = plan(primaries, "snapstore")   # the store's name scope
    flat = group.pack(reads)         # concat of the flattened reads, built once
    parts = group.unpack(buffer)     # split and reshape: one tensor per member

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
from snapstore.core import copies

# Variables of at most this many bytes are packed.
PACK_LIMIT_BYTES = 1 << 20

# Dtypes packed: those whose concatenation and split have kernels on CPUs and
# GPUs alike (TF_CALL_GPU_NUMBER_TYPES), so that a buffer on a GPU never needs
# soft placement. Other variables (an int64 global step, bools) keep shadows
# of their own.
PACKED_DTYPES = frozenset([tf.float16, tf.float32, tf.float64])


def plan(primaries, scope, limit=PACK_LIMIT_BYTES):
  """Splits `primaries` into groups to pack and variables left on their own.

  Args:
    primaries: The store's variables.
    scope: The store's name scope; group `n`'s buffers are under
      `<scope>/packed_<n>/`.
    limit: Pack only variables of at most this many bytes (with a fully
      defined shape, of one of `PACKED_DTYPES`).

  Returns:
    `(groups, loose)`: a list of `Group`s (with two or more variables each),
    and the indices into `primaries` of the variables not packed, ascending.
  """
  members = collections.OrderedDict()  # key -> indices
  loose = []
  for i, p in enumerate(primaries):
    if (p.dtype.base_dtype not in PACKED_DTYPES
        or not p.shape.is_fully_defined() or _nbytes(p) > limit):
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
  return groups, sorted(loose)


def _nbytes(variable):
  return variable.shape.num_elements() * variable.dtype.base_dtype.size


class Group(object):
  """Variables on one device, of one dtype and kind, sharing a flat buffer.

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
      parts = tf.split(flat, consts.sizes, num=len(self.members),
                       axis=consts.axis, name="unpack")
    values = []
    for m, part in zip(self.members, parts):
      with ops.colocate_with(m), tf.name_scope(self.scope):
        values.append(tf.reshape(part, consts.shapes[tuple(m.shape.as_list())],
                                 name="unflat"))
    return values

  def _constants(self):
    """Shared constants: the split sizes, the axis, `[-1]` and each shape once."""
    if self._consts is None:
      with ops.colocate_with(self.anchor), tf.name_scope(self.scope):
        shapes = {}
        for m in self.members:
          key = tuple(m.shape.as_list())
          if key not in shapes:
            shapes[key] = tf.constant(list(key), tf.int32, shape=[len(key)],
                                      name="shape")
        self._consts = _Constants(
            sizes=tf.constant(self._sizes, tf.int64, name="sizes"),
            axis=tf.constant(0, tf.int32, name="axis"),
            flat=tf.constant([-1], tf.int32, name="flat"),
            shapes=shapes)
    return self._consts


_Constants = collections.namedtuple("_Constants", "sizes axis flat shapes")
