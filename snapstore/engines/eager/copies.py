"""Copies between eager variables, as traced functions built once.

Every copy the eager engine runs is one `tf.function` traced when the store
is built (`get_concrete_function`), never per call: a snapshot or restore is
one dispatch that never retraces, with no Python loop over the variables
(except a host restore, one dispatch per run of at most `STAGING` bytes:
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
from snapstore.core.distributed import replica_reads
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
    n = np.dtype(spec.dtype).itemsize * int(np.prod(spec.shape, dtype=np.int64))
    if run and size + n > limit:
      out.append(run)
      run, size = [], 0
    run.append(i)
    size += n
  if run:
    out.append(run)
  return out


class GroupedAssigner(object):
  """`assigner` over runs of the variables (`groups`), one call per run.

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
    self._runs = groups(specs)
    self._fns = []
    for k, run in enumerate(self._runs):
      chosen = [variables[i] for i in run]
      if components:
        fn = assigner([], [], "%s_%d" % (name, k), chosen)
      else:
        fn = assigner(chosen, [specs[i] for i in run], "%s_%d" % (name, k))
      self._fns.append(fn)

  def __call__(self, *values):
    for run, fn in zip(self._runs, self._fns):
      fn(*[values[i] for i in run])


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
