"""Copies between eager variables, as traced functions built once.

Every copy the eager engine runs is one `tf.function` traced when the store
is built (`get_concrete_function`), never per call: a snapshot or restore is
one dispatch that never retraces, with no Python loop over the variables
(except a host restore, one dispatch per run of at most `STAGING` bytes, or
one `AssignVariableOp` per variable of at least `DIRECT` bytes:
`GroupedAssigner`).
Tracing at build also keeps TensorFlow's retracing detector quiet (it counts
traced calls per Python function) and moves the trace's cost out of the
training loop.

Each assign is placed on its target's device and reads its source there or
on the source's device; shadows live next to their variables, so nothing
crosses devices. A resource assign shares the source's buffer until either
is written next (copy on write): the memory copy of a snapshot is paid by
the next update of the variable, not by the snapshot call.
"""

import numpy as np

from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core import buffers
from snapstore.core.distributed import replica_reads
from snapstore.core.distributed import spreads_as_is
from snapstore.engines.eager import distributed


def traced(body, name, signature=None):
  """`body` as a concrete function, traced now (autograph off)."""
  fn = tf2.function(body, autograph=False, input_signature=signature)
  fn.__name__ = name  # shown in traces and profiles
  return fn.get_concrete_function()


def copier(sources, targets, name):
  """A function copying each of `sources` into the variable in `targets`.

  A distributed variable and its shadow are copied component by component,
  each on its own device (see `distributed`).
  """
  pairs = [
    pair
    for source, target in zip(sources, targets)
    for pair in zip(
      distributed.components(source), distributed.components(target)
    )
  ]

  def copy():
    for source, target in pairs:
      with tf.device(target.device):
        target.assign(source.value(), read_value=False)

  return traced(copy, name)


def reader(variables, name, replicas=()):
  """A function returning the values of `variables` (tensors on their devices;
  one value per distributed variable, see `distributed.read`).

  With `replicas` (variables whose replicas may differ), after those values
  it returns one flag per variable of `replicas`, then the values of their
  other components where the flag is set (`core.distributed.replica_reads`).
  """
  variables = list(variables)
  replicas = list(replicas)

  def read():
    flags, parts = [], []
    for v in replicas:
      flag, values = replica_reads(v)
      flags.append(flag)
      parts.extend(values)
    return [distributed.read(v) for v in variables] + flags + parts

  return traced(read, name)


def assigner(variables, specs, name, parts=()):
  """A function assigning one value per variable, `fn(*values)`.

  The input signature is each variable's shape and dtype, so the function
  never retraces. It casts values of another dtype silently, so callers pass
  arrays checked against `specs` (`VariableSet.check_declared`).

  With `parts` (component variables), it takes one more value for each and
  writes it into that component, on its device, after the variables'.
  """
  variables = list(variables)
  parts = list(parts)
  signature = [tf2.TensorSpec(s.shape, s.dtype) for s in specs] + [
    tf2.TensorSpec(p.shape, p.dtype) for p in parts
  ]

  def assign(*values):
    for var, value in zip(variables, values):
      distributed.write(var, value)
    # After the writes above, which wrote these components too: a traced
    # function runs the writes of one variable in program order.
    for part, value in zip(parts, values[len(variables) :]):
      with tf.device(part.device):
        part.assign(value, read_value=False)

  return traced(assign, name, signature)


# The most bytes one call of a `GroupedAssigner` converts from numpy at
# once (a variable larger than this is a group of its own).
STAGING = 16 << 20


def groups(specs, limit=STAGING):
  """Indices of `specs` in order, cut into runs of at most `limit` bytes (a
  larger variable alone)."""
  out, run, size = [], [], 0
  for i, spec in enumerate(specs):
    n = _nbytes(spec)
    if run and size + n > limit:
      out.append(run)
      run, size = [], 0
    run.append(i)
    size += n
  if run:
    out.append(run)
  return out


# A variable of at least this many bytes is restored by one eager
# `AssignVariableOp` fed the numpy array itself, not by a traced function
# (`adopts_converted_arrays`); smaller ones, whose cost is the call, by the
# traced functions of `GroupedAssigner`.
DIRECT = 1 << 20

_adopts = []  # the probe's answer, once per process


def adopts_converted_arrays():
  """Whether an `AssignVariableOp` fed a numpy array is safe and cheap.

  Fed the array as the op's own input, TensorFlow wraps an aligned array's
  memory without a copy (an unaligned one it copies into a tensor only the
  op holds), and the variable takes that buffer: no copy at the restore,
  where a traced function (which converts its arguments before its body
  runs) or `assign` (which holds the converted value while the op runs)
  make two. TensorFlow never writes in place into memory it does not own,
  so the variable's next write copies first (copy on write, as a device
  snapshot's), and the snapshot's array, which TensorFlow holds a
  reference to (so `host_book.reusable` leaves it alone), is never
  written. Checked once per process, on a scratch resource (raw ops: no
  variable is made, so no strategy or variable creator scope sees it) fed
  an aligned, read-only array as the host modes hold them, then updated in
  place: False (the array changed) sends every variable through the traced
  assigns.
  """
  if not _adopts:
    probe = buffers.aligned_copy(np.arange(16, dtype=np.float32))
    probe.flags.writeable = False
    with tf.init_scope(), tf.device("/cpu:0"):
      handle = tf.raw_ops.VarHandleOp(
        dtype=tf.float32,
        shape=[16],
        shared_name="snapstore_adopt_probe_%d" % id(probe),
      )
      try:
        tf.raw_ops.AssignVariableOp(resource=handle, value=probe)
        tf.raw_ops.AssignAddVariableOp(resource=handle, value=probe)
        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
        _adopts.append(
          bool((probe == np.arange(16, dtype=np.float32)).all())
          and bool((read.numpy() == 2 * probe).all())
        )
      finally:
        tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
  return _adopts[0]


# Writes a numpy array into a variable, its memory taken as it is (a name of
# its own here, so that tests can watch which variables take this way).
assign_array = distributed.write_array


class GroupedAssigner(object):
  """Writes host arrays into variables: the large ones directly, the rest
  by `assigner` over runs of them (`groups`), one call per run.

  A variable of `DIRECT` bytes or more takes its array without a copy, by
  one `AssignVariableOp` (`assign_array`, where `adopts_converted_arrays`).
  A traced function converts every numpy argument to a tensor (a copy)
  before its body runs: one function over the whole model would hold a
  second model's worth of tensors at once. One per run holds a run's
  (issue 38). Called with one value per variable, like `assigner`; with
  `components`, `variables` are components written on their own devices
  (`assigner`'s `parts`).

  Args:
    variables: The variables (or components) written, in order.
    specs: Their shapes and dtypes (`.shape`, `.dtype`).
    name: Names the traced functions ("name_0", ...).
    components: Whether `variables` are components (see above).
  """

  def __init__(self, variables, specs, name, components=False):
    variables, specs = list(variables), list(specs)
    direct = adopts_converted_arrays()
    self._direct = [
      (i, variables[i])
      for i, spec in enumerate(specs)
      if direct and _nbytes(spec) >= DIRECT and spreads_as_is(variables[i])
    ]
    taken = set(i for i, _ in self._direct)
    rest = [i for i in range(len(specs)) if i not in taken]
    self._runs = [
      [rest[j] for j in run] for run in groups([specs[i] for i in rest])
    ]
    self._fns = []
    for k, run in enumerate(self._runs):
      chosen = [variables[i] for i in run]
      if components:
        fn = assigner([], [], "%s_%d" % (name, k), chosen)
      else:
        fn = assigner(chosen, [specs[i] for i in run], "%s_%d" % (name, k))
      self._fns.append(fn)

  def __call__(self, *values):
    # Distinct variables: the order of the writes does not matter.
    for i, variable in self._direct:
      assign_array(variable, values[i])
    for run, fn in zip(self._runs, self._fns):
      fn(*[values[i] for i in run])


def _nbytes(spec):
  return np.dtype(spec.dtype).itemsize * int(
    np.prod(spec.shape, dtype=np.int64)
  )


def component_reader(variables, name):
  """A function returning the value of every component of `variables` (each
  read on its device): what `evaluate_with` sets aside, so that components
  that differ (sync-on-read ones) come back as they were."""
  parts = [c for v in variables for c in distributed.components(v)]

  def read():
    out = []
    for part in parts:
      with tf.device(part.device):
        out.append(part.value())
    return out

  return traced(read, name)


def component_assigner(variables, name):
  """A function writing what `component_reader` returned back, component by
  component on each one's device."""
  parts = [c for v in variables for c in distributed.components(v)]
  signature = [tf2.TensorSpec(p.shape, p.dtype) for p in parts]

  def assign(*values):
    for part, value in zip(parts, values):
      with tf.device(part.device):
        part.assign(value, read_value=False)

  return traced(assign, name, signature)


class Lazy(object):
  """A traced function built on first use (for calls most stores never make).

  Args:
    build: Makes the concrete function.
  """

  def __init__(self, build):
    self._build = build
    self._fn = None

  def __call__(self, *args):
    if self._fn is None:
      self._fn = self._build()
    return self._fn(*args)
