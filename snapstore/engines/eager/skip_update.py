"""Undoing a train step by not applying its update: the gate and its proof.

`SnapshotCallback(in_step=True)` undoes, inside the compiled step, a step
whose loss is not finite. Copying the whole state at every step and writing
it back (`in_step.py`) is exact but costs a read and an assign per variable
and a pass over the state per step (docs/design/callback.md has the
measured cost). Most of that
state (the weights, the optimizer's slots and `iterations`) is written by one
call only, the optimizer's update, which runs after the loss is known. So
the cheaper exact undo is to apply that update only when the loss is finite
(`gated`), and to read at the step's start, and put back when the update was
skipped, only what the rest of the step writes: batch-norm statistics, seed
states, the metrics (`outside_writes`). Nothing is copied per step.

Which variables the rest of the step writes is read off a trace of the step,
not assumed: `recording` notes which ops the update made, and
`outside_writes` lists every variable whose handle an op outside them takes,
unless the op only reads it (TensorFlow's own list of read-only resource
ops; an op passing the handle on is looked through). A function call, a
control-flow op or an op of a kind not known here counts as a write.
A handle that is no variable of the model (a lookup table, a variable
outside the model) written outside the update is reported, and the caller
falls back to copying.

    with skip_update.recording(optimizer) as update:   # a scratch trace
      graph = tf.function(step).get_concrete_function(specs).graph
    writes = skip_update.outside_writes(graph, update, variables)

    with skip_update.gated(optimizer, lambda: is_finite(loss)) as gate:
      logs = step(data)                                  # the real trace
    gate.applied                                         # a bool tensor

Under `MirroredStrategy` (with one replica too) the update aggregates the
gradients with a `merge_call`, which TensorFlow refuses inside control flow
in replica context: the gate is for the default strategy and
`OneDeviceStrategy`.
"""

import contextlib

from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core.distributed import components
from snapstore.core.writers import READ_ONLY_RESOURCE_OPS

# Ops that give out the handle they take (TF's Identity family); whoever
# takes it from them is checked instead.
_PASS_THROUGH = frozenset(["Identity", "IdentityN"])


class Update(object):
  """The optimizer's update calls seen while `recording`.

  Attributes:
    ranges: (graph, first op index, end op index) of each call's ops. (A
      `tf.function` may trace its Python function more than once, into
      different graphs: a trace that makes variables is traced again.)
  """

  def __init__(self):
    self.ranges = []

  def calls(self, graph):
    """How many times `apply_gradients` was called tracing `graph`."""
    return sum(1 for g, _, _ in self.ranges if g is graph)


@contextlib.contextmanager
def _replaced(optimizer, apply_gradients):
  """Sets `optimizer.apply_gradients` on the instance; puts back the old."""
  own = vars(optimizer).get("apply_gradients")
  optimizer.apply_gradients = apply_gradients
  try:
    yield
  finally:
    if own is not None:
      optimizer.apply_gradients = own
    else:
      del optimizer.apply_gradients


@contextlib.contextmanager
def recording(optimizer):
  """Notes the ops each `optimizer.apply_gradients` call makes (module doc).

  Keras 3's `train_step` calls `apply_gradients`; tf-keras's `minimize` calls
  it too, so one hook sees both.

  Yields:
    The `Update`, filled in as the step is traced.
  """
  update = Update()
  original = optimizer.apply_gradients

  def apply_gradients(*args, **kwargs):
    graph = tf.get_default_graph()
    start = len(graph.get_operations())
    try:
      return original(*args, **kwargs)
    finally:
      update.ranges.append((graph, start, len(graph.get_operations())))

  with _replaced(optimizer, apply_gradients):
    yield update


class Gate(object):
  """What `gated` made: `condition` and `applied` (None until the call)."""

  def __init__(self):
    self.condition = None
    self.applied = None


@contextlib.contextmanager
def gated(optimizer, decide):
  """Makes `optimizer.apply_gradients` apply only when `decide()` is true.

  Args:
    optimizer: A Keras 3 or tf-keras optimizer.
    decide: A function of no arguments returning a scalar bool tensor, called
      where the update is called (so after what it reads is written).

  Yields:
    The `Gate`: `condition` (what `decide` returned) and `applied` (a bool
    tensor, the `tf.cond`'s output), set by the step's one update call.

  Raises:
    ValueError: (from the step) `apply_gradients` called more than once.
  """
  gate = Gate()
  original = optimizer.apply_gradients

  def apply_gradients(grads_and_vars, *args, **kwargs):
    if gate.condition is not None:
      raise ValueError(
        "The train step called %s.apply_gradients more than once; the "
        "in-step undo by skipping the update covers one update per step."
        % type(optimizer).__name__
      )
    grads_and_vars = list(grads_and_vars)
    gate.condition = decide()

    def update():
      original(grads_and_vars, *args, **kwargs)
      return tf2.constant(True)

    # Lowered (TensorFlow's default), the update's ops run in the step's own
    # executor, as without the gate; only a skipped step sends its nodes
    # through as dead ones. (A call would cost a function call per step.)
    gate.applied = tf2.cond(gate.condition, update, lambda: tf2.constant(False))
    return optimizer.iterations  # what both Keras' apply_gradients return

  with _replaced(optimizer, apply_gradients):
    yield gate


class Writes(object):
  """What the ops of a traced step outside its update may write.

  Attributes:
    variables: The variables an op outside the update may write, in the
      order given to `outside_writes`.
    after: The ids of those an op made after the update may write.
    unknown: Names of ops outside the update that may write a resource
      that is none of the variables (empty when every write is accounted
      for).
  """

  def __init__(self, variables, after, unknown):
    self.variables = variables
    self.after = after
    self.unknown = unknown


def outside_writes(graph, update, variables):
  """What ops of `graph` outside the update may write (module doc).

  Args:
    graph: The traced step's graph (a `FuncGraph`).
    update: The `Update` recorded while tracing it.
    variables: The variables the step may touch (model, optimizer, metrics).

  Returns:
    A `Writes`.
  """
  by_handle = {}
  for variable in variables:
    for part in components(variable):
      by_handle[id(part.handle)] = variable
  captured = {}  # placeholder op -> variable (None: another resource)
  for external, internal in graph.captures:
    if internal.dtype == tf.resource:
      captured[internal.op] = by_handle.get(id(external))
  operations = graph.get_operations()
  inside, last = set(), 0
  for g, start, end in update.ranges:
    if g is graph:
      inside.update(operations[start:end])
      last = max(last, end)
  written, after, unknown = set(), set(), []
  for index, op in enumerate(operations):
    if (
      op in inside
      or op.type in READ_ONLY_RESOURCE_OPS
      or op.type in _PASS_THROUGH
    ):
      continue
    for t in op.inputs:
      if t.dtype != tf.resource:
        continue
      origin = _origin(t)
      if origin.type != "Placeholder":
        # A resource the step makes for itself (a TensorArray...) lives
        # for the call only; tf.function lifts a variable made in the step
        # out of it, so that one is captured. A handle op is neither.
        if origin.type in ("VarHandleOp", "VariableV2"):
          unknown.append(op.name)
        continue
      variable = captured.get(origin)  # None: an argument, or no variable
      if variable is None:
        unknown.append(op.name)
        continue
      written.add(id(variable))
      if index >= last:
        after.add(id(variable))
  return Writes([v for v in variables if id(v) in written], after, unknown)


def _origin(t):
  """The op a handle comes from, looking through `_PASS_THROUGH` ops."""
  while t.op.type in _PASS_THROUGH:
    t = t.op.inputs[t.value_index if t.op.type == "IdentityN" else 0]
  return t.op
