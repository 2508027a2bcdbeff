"""Copies between eager variables, as traced functions built once.

Every copy the eager engine runs is one `tf.function` traced when the store
is built (`get_concrete_function`), never per call: a snapshot or restore is
one dispatch that never retraces, with no Python loop over the variables.
Tracing at build also keeps TensorFlow's retracing detector quiet (it counts
traced calls per Python function) and moves the trace's cost out of the
training loop.

Each assign is placed on its target's device and reads its source there or
on the source's device; shadows live next to their variables, so nothing
crosses devices. A resource assign shares the source's buffer until either
is written next (copy on write): the memory copy of a snapshot is paid by
the next update of the variable, not by the snapshot call.
"""

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
