"""Copies between variables, built once: reads, assigns, grouped copies, feeds.

Every copy is one grouped op (`tf.group(*assigns, name=...)`), so a snapshot of
N variables is one `session.run` and one graph op to depend on. Each variable
is read and written on its own device (`colocate_with`), so a copy between a
variable and its shadow never leaves the device.

    reads = SharedReads()
    snapshot = copy(primaries, shadows, "snapshot", reads)   # one op
    feeder = Feeder(specs, "feed")
    load = feeder.assign_to(primaries, "load")               # fed with arrays
    into = WriteInto(primaries, [reads(v) for v in primaries], "into")
    into(held_arrays, session, sessions.run_cached)          # copies in place
"""

import re

import numpy as np

from snapstore._tf import graph_element
from snapstore._tf import ops
from snapstore._tf import resource_variable_ops
from snapstore._tf import state_ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import buffers
from snapstore.core import distributed
from snapstore.engines.graph import attached


def is_resource(var):
  return resource_variable_ops.is_resource_variable(var)


def assign(var, value):
  """An op writing `value` into `var`, placed with `var`.

  `use_locking=True` keeps a concurrent writer (an asynchronous training op on
  a ref variable) from interleaving with the copy. A distributed variable is
  written as a host write (`distributed.spread`): one assign per component,
  each on its component's device.
  """
  if distributed.is_distributed(var):
    parts = distributed.components(var)
    return tf.group(
      *[assign(p, x) for p, x in zip(parts, distributed.spread(var, value))]
    )
  with ops.colocate_with(var):
    if is_resource(var):
      return var.assign(value, use_locking=True, read_value=False)
    return state_ops.assign(var, value, use_locking=True).op


def assign_add(var, delta):
  """An op adding `delta` to `var`, placed with `var`; locking as `assign`."""
  with ops.colocate_with(var):
    if is_resource(var):
      return var.assign_add(delta, use_locking=True, read_value=False)
    return state_ops.assign_add(var, delta, use_locking=True).op


def assign_sub(var, delta):
  """An op subtracting `delta` from `var`, placed with `var`; locking as `assign`."""
  with ops.colocate_with(var):
    if is_resource(var):
      return var.assign_sub(delta, use_locking=True, read_value=False)
    return state_ops.assign_sub(var, delta, use_locking=True).op


def read(var):
  """A tensor with the value of `var`, read on `var`'s device.

  Fetching it copies into a fresh numpy array: TF 1.15's `Session.run` never
  returns arrays that alias a variable's buffer (checked by the tests). A
  distributed variable is read as a host read (`distributed.aggregate`).
  """
  if distributed.is_distributed(var):
    return distributed.aggregate(
      var, [read(p) for p in distributed.components(var)]
    )
  with ops.colocate_with(var):
    if is_resource(var):  # one op: read_value() adds an Identity
      return resource_variable_ops.read_variable_op(
        var.handle, var.dtype.base_dtype
      )
    return var.read_value()


def copy(sources, targets, name, reads=read, after=None):
  """One op assigning each of `sources` to the matching variable in `targets`.

  Args:
    sources: Variables (or tensors) to read.
    targets: Variables to write, in the same order.
    name: Name of the returned group op.
    reads: How a source variable is read: `read` (a new read op), or a
      `SharedReads` whose reads several copies share.
    after: None, or a function from a target to an op its assign waits for
      (a check that must pass before anything is written), or to None.

  Returns:
    A grouped op; `tf.no_op` for empty lists.
  """
  # A variable is read on its own device, whatever device scope surrounds the
  # store's construction, so that a copy between colocated variables never
  # leaves the device.
  assigns = []
  for s, t in zip(sources, targets):
    value = reads(s) if isinstance(s, tf_variables.Variable) else s
    wait = after(t) if after is not None else None
    with tf.control_dependencies([wait] if wait is not None else []):
      assigns.append(assign(t, value))
  if not assigns:
    return tf.no_op(name=name)
  return tf.group(*assigns, name=name)


class SharedReads(object):
  """One read per variable, shared by every copy that only copies it.

  A store's snapshot, restore, stash and fetch ops read each variable once in
  the graph (each run executes the read afresh) instead of once per op: with K
  slots that is about 3K fewer ops per variable, which a store pays for in
  construction time and every run in executor work. A ref variable's own
  colocated `read` (its `value()`) is reused and costs no op at all. Only for
  reads that feed a copy: a read inside control flow, or ordered against a
  write in the same run, needs its own op. A resource variable's read is the
  one it was built with (`graph_element`) when that read is colocated with it
  (a shadow's own read); a constructor's read is placed by device only, not
  colocated, so a primary gets a read of its own.
  """

  def __init__(self):
    self._reads = {}  # id(var) -> (var, read); holding var keeps its id

  def __call__(self, var):
    entry = self._reads.get(id(var))
    if entry is None:
      if distributed.is_distributed(var):
        value = distributed.aggregate(
          var, [self(p) for p in distributed.components(var)]
        )
      elif is_resource(var):
        value = _colocated_read(var)
      else:
        value = var.value()
      entry = self._reads[id(var)] = (var, value)
    return entry[1]


def _colocated_read(var):
  element = graph_element(var)
  if (
    element is not None
    and element.op.colocation_groups() == var.op.colocation_groups()
  ):
    return element
  return read(var)


class Feeder(object):
  """Placeholders for one value per variable, and assign ops that consume them.

  Used to write numpy arrays (a host snapshot, a loaded `.npz`) into variables
  with one `session.run` and no new ops per call.

  Args:
    specs: The `VariableSpec`s whose values will be fed, in order.
    name: Name scope for the placeholders.
    targets: Tensors to feed instead of new placeholders, one per spec, with
      its shape and dtype: the reads that a copy consumes, so that the copy
      writes the fed values (no ops at all).
  """

  def __init__(self, specs, name, targets=None):
    self._dtypes = [spec.dtype for spec in specs]
    if targets is not None:
      self._placeholders = tuple(targets)
      return
    with tf.name_scope(name):
      # One tuple for the store's lifetime: runs are cached by its identity.
      self._placeholders = tuple(
        tf.placeholder(
          spec.variable.dtype.base_dtype, spec.shape, name="value_%d" % i
        )
        for i, spec in enumerate(specs)
      )

  @property
  def placeholders(self):
    return self._placeholders

  def values(self, arrays):
    """`arrays` as C-contiguous arrays of the placeholders' exact dtypes.

    A callable, unlike `Session.run`, does not convert what it is fed. Arrays
    that already fit are passed as they are, so an aligned one is fed in place.
    Others are converted by value (a non-native byte order becomes the native
    one) keeping their shape: `np.ascontiguousarray` would make a 0-d array
    1-d.
    """
    return [
      a
      if a.dtype == dtype and a.flags.c_contiguous
      else np.asarray(a, dtype=dtype, order="C")
      for a, dtype in zip(arrays, self._dtypes)
    ]

  def assign_to(self, targets, name):
    """A grouped op writing the fed values into `targets` (one per spec)."""
    return copy(self._placeholders, targets, name)


# How TensorFlow's error messages name the node that failed.
_FAILED_NODE = re.compile(r"\{\{node ([^}]+)\}\}")


class WriteInto(object):
  """Copies the variables into arrays the caller holds: one run, no new memory.

  Each array is fed to an `InplaceUpdate` (built once, colocated with its
  variable) that writes the variable's value into the fed buffer. A session
  in this process feeds an aligned, C-contiguous array of the placeholder's
  dtype without a copy, so the value lands in the array itself: a host
  snapshot over one the store drops anyway costs a copy into memory already
  resident, not a model's worth of new buffers (and their page faults).
  Every write waits for every read, so a run that fails in a read (an
  uninitialized variable) has written nothing (`wrote_before`).

  Whether a session feeds in place is probed once per session (`usable`):
  one small `InplaceUpdate` per device and dtype, built now, writing a
  known value into a fed array. Where it does not (a remote session), the
  caller fetches new arrays instead.

  Args:
    variables: The variables (none distributed).
    reads: One read per variable (`SharedReads`).
    name: Name scope of the ops.
  """

  def __init__(self, variables, reads, name):
    self._dtypes = [
      np.dtype(v.dtype.base_dtype.as_numpy_dtype) for v in variables
    ]
    placeholders, writes, probes = [], [], {}
    with tf.name_scope(name):
      for i, var in enumerate(variables):
        with ops.colocate_with(var):
          placeholders.append(
            tf.placeholder(var.dtype.base_dtype, [1, None], name="into_%d" % i)
          )
          key = (var.device, var.dtype.base_dtype)
          if key not in probes:
            probe = tf.placeholder(key[1], [1, 1], name="probe_%d" % i)
            probes[key] = (
              probe,
              tf.raw_ops.InplaceUpdate(
                x=probe, i=[0], v=tf.ones([1, 1], key[1])
              ).op,
            )
      for var, value, into in zip(variables, reads, placeholders):
        with ops.colocate_with(var), tf.control_dependencies(reads):
          writes.append(
            tf.raw_ops.InplaceUpdate(
              x=into, i=[0], v=tf.reshape(value, [1, -1])
            ).op
          )
      self._op = tf.group(*writes, name="write_into")
    self._writes = frozenset(op.name for op in writes) | {self._op.name}
    self._placeholders = tuple(placeholders)
    self._probes = [
      (probe, op, np.dtype(dtype.as_numpy_dtype))
      for (_, dtype), (probe, op) in sorted(
        probes.items(), key=lambda item: item[1][0].name
      )
    ]
    self._usable = attached.PerObject("write_into_usable")

  def usable(self, session, run):
    """Whether `session` feeds in place (probed once per session).

    Args:
      session: The session.
      run: `sessions.run_cached`.
    """
    known = self._usable.get(session)
    if known is not None:
      return known
    ok = True
    for probe, op, dtype in self._probes:
      array = buffers.aligned_empty((1, 1), dtype)
      array[...] = 0
      try:
        run(session, op, (probe,), [array])
      except tf.errors.OpError:
        ok = False
      if not ok or not array[0, 0]:
        ok = False
        break
    self._usable.set(session, ok)
    return ok

  def fits(self, arrays):
    """Whether `arrays` (one per variable) can be fed in place."""
    for a, dtype in zip(arrays, self._dtypes):
      if not isinstance(a, np.ndarray):
        return False
      if a.dtype != dtype or not a.flags.c_contiguous:
        return False
      if a.nbytes and a.ctypes.data % buffers.ALIGNMENT:
        return False
    return len(arrays) == len(self._dtypes)

  def __call__(self, arrays, session, run):
    """Writes the variables' values into `arrays` (`fits` them)."""
    run(
      session,
      self._op,
      self._placeholders,
      [a.reshape(1, -1) for a in arrays],
    )

  def wrote_before(self, error):
    """Whether a run that raised `error` may have written some arrays: not
    if the failing nodes it names (a callable's errors name no `op`) are
    none of the writes, which wait for every read."""
    op = getattr(error, "op", None)
    names = [op.name] if op is not None else []
    names += _FAILED_NODE.findall(getattr(error, "message", "") or "")
    return not names or any(name in self._writes for name in names)
