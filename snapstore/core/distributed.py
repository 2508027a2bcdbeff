"""Distributed variables (`tf.distribute`) in graph-mode copies.

A variable made in a `MirroredStrategy`'s scope is a `DistributedVariable`:
one component variable per replica device (`v.values`, in the strategy's
device order), a `MirroredVariable` (every update written to all of them) or
a `SyncOnReadVariable` (each replica updates its own; a read in
cross-replica context aggregates them: batch-norm statistics, metrics). The
graph engine gives them the eager engine's semantics
(`snapstore/engines/eager/distributed.py`):

- **Device mode** works on the components: one shadow per component,
  colocated with it, and copies per (component, shadow) pair, each on its
  component's device. Every replica keeps its own bits (components made to
  differ stay so), nothing crosses devices, and replicas that were identical
  stay so. The shadows are plain variables made as every other shadow
  (`snapstore.engines.graph.shadows`), not a distributed variable: a graph-mode shadow
  is built from its `VariableDef` with an initializer that runs once and
  copies its own component's value; the strategy's variable creator would
  initialize every replica's shadow from the first replica's (wrong for
  components that differ) and rebuild what is replaced here.
- **Host reads** (a host snapshot, `arrays()` of any mode) give one value per
  variable: a mirrored variable's first component (the strategy writes every
  update to all of them, so the replicas are equal; device mode does not need
  to assume it), a sync-on-read one's aggregate computed as TensorFlow reads
  it in cross-replica context (`AddN` of the components for SUM, divided by
  their number for MEAN; the first component for ONLY_FIRST_REPLICA and
  NONE). That is what `arrays()`, `save_npz` and spill files hold: the value
  a TF checkpoint saves of a mirrored variable (its primary), and of a
  sync-on-read one.
- **Replicas that differ.** A host value is not always every replica's.
  A sync-on-read variable's replicas each hold their own value (tf-keras and
  Keras 2 batch-norm statistics, MEAN, each replica's from its own part of
  the batch; metrics' totals, SUM), and its host value, their aggregate, is
  none of them. And one kind of mirrored variable is not kept equal: a
  non-trainable one of aggregation NONE, which each replica may write with
  its own value (`may_differ`: Keras 3 batch-norm statistics). A host
  snapshot keeps their components' own values beside it (`keeps_replicas`,
  `replica_reads`), read in the same run as the rest, each on its own
  device: every component of a sync-on-read variable of more than one, at
  every snapshot (statistics and metrics: small, and comparing them would
  not save the aggregate); the components after the first of a `may_differ`
  one, compared with the first on their devices and read and kept only when
  their bits differ (nothing is read or kept when they are equal, the usual
  case). A restore writes the host value as below, then each kept component
  its own value, so every replica ends exactly as it was.
  They are kept in memory only: beside host mode's arrays (disk mode's host
  tier), and beside a snapshot spilled to a spill file (from disk mode, or
  from a device slot, which reads them from its component shadows the same
  way): statistics vectors, small, so that a restore from the file is exact
  too while the store lives. The file itself holds the host value, and
  arrays given to `load_arrays` (or read from a file by another store) are
  written as a host write writes them (below).
- **Host writes** put a mirrored value into every component (then a kept
  replica's own value into its component, as above), and a sync-on-read one
  so that the aggregate read back is the same bits: for SUM the value into
  the first component and zeros (-0.0 for floats, the one zero that leaves
  every value unchanged when added) into the others; otherwise the value
  into every component (a mean of equal values is that value exactly when
  the replica count is a power of two); then, for a snapshot that kept
  them, each component its own value.

    parts = components(v)                  # [v] for an ordinary variable
    value = aggregate(v, [read(c) for c in parts])
    for part, x in zip(parts, spread(v, value)): assign(part, x)
"""

import numpy as np

from snapstore._tf import strategy_workers
from snapstore._tf import strategy_task_id
from snapstore._tf import distribute_strategy_of
from snapstore._tf import distribute_values
from snapstore._tf import parameter_server_strategy
from snapstore._tf import ops
from snapstore._tf import tf


def is_distributed(variable):
  """True for a `tf.distribute` variable (one component per replica)."""
  return isinstance(variable, distribute_values.DistributedValues)


def components(variable):
  """The component variables of `variable`: itself unless distributed."""
  if is_distributed(variable):
    return list(variable.values)
  return [variable]


def replica_tensors(value):
  """The tensors of a `PerReplica` (or `Mirrored`) of tensors, or None.

  What `strategy.run` (TF 1.15: `experimental_run_v2`) returns from a
  replica function: one tensor per replica, in the strategy's device order.
  None for anything else, a distributed variable included (its values are
  variables).
  """
  if not is_distributed(value):
    return None
  values = list(value.values)
  if not values or not all(isinstance(v, tf.Tensor) for v in values):
    return None
  return values


def like(value, tensors):
  """A `PerReplica` (or `Mirrored`) like `value`, holding `tensors`.

  Args:
    value: What `replica_tensors` accepts.
    tensors: One tensor per replica, in the order of `value.values`.
  """
  if hasattr(value, "device_map"):  # TF 1.15: values keyed by a DeviceMap
    return type(value)(value.device_map, tensors, value.logical_device)
  return type(value)(tensors)


def check_chief_of_ps(what):
  """Refuses `what` on a task of a `ParameterServerStrategy` v1 cluster that
  is not the chief, when it runs in that strategy's scope (an Estimator
  runs its hooks' `begin()` there).

  Every task builds the same graph, so every task's store keeps its
  shadows in the same variables on the ps tasks (between-graph replication,
  README "Parameter servers and between-graph replication"): a snapshot
  taken on another task overwrites the chief's, and a rollback there
  rewrites the variables every task trains.

  Raises:
    ValueError: On a task that is not the chief.
  """
  if not tf.distribute.has_strategy():
    return
  extended = tf.distribute.get_strategy().extended
  if not isinstance(
    extended, parameter_server_strategy.ParameterServerStrategyExtended
  ):
    return
  if extended.should_checkpoint:  # the chief, or one machine
    return
  raise ValueError(
    "%s runs on task %s:%s of a ParameterServerStrategy cluster, which is "
    "not the chief. Only the chief may take snapshots and roll back: every "
    "task's store keeps its shadows in the same variables on the ps tasks, "
    "so this task's snapshots would overwrite the chief's and its rollbacks "
    "would rewrite the variables every worker trains. Give the hook to the "
    "chief only: return it from model_fn in "
    "EstimatorSpec(training_chief_hooks=[hook]), or pass it in the chief's "
    "hooks alone." % ((what,) + strategy_task_id(extended))
  )


def workers(variable):
  """How many worker processes hold replicas of `variable`: more than 1
  for a `MultiWorkerMirroredStrategy`'s on a cluster, else 1."""
  if not is_distributed(variable):
    return 1
  extended = getattr(distribute_strategy_of(variable), "extended", None)
  return strategy_workers(extended)


def anchor(variable):
  """The variable ops about `variable` are colocated with: its first part.

  A distributed variable itself cannot be colocated with outside a replica
  context (TF 2.x: "handle is not available outside the replica context";
  TF 1.15 colocates with one component and fails to place the others).
  """
  return components(variable)[0]


def aggregate(variable, values):
  """The value a host read of `variable` gives (module doc).

  Args:
    variable: The variable.
    values: One tensor per component (`components(variable)`), in order.

  Returns:
    A tensor, on the first component's device.
  """
  if not is_distributed(variable) or not _sync_on_read(variable):
    return values[0]
  how = variable.aggregation
  if how not in (
    tf.VariableAggregation.SUM,
    tf.VariableAggregation.MEAN,
  ):
    return values[0]
  with ops.colocate_with(anchor(variable)), tf.name_scope("aggregate"):
    # As TF's ReductionToOneDevice: AddN, then `/ n` for MEAN.
    total = tf.add_n(values)
    if how == tf.VariableAggregation.MEAN:
      total = total / len(values)
    return total


def spreads_as_is(variable):
  """Whether `spread` gives every component of `variable` the value itself:
  all but a sync-on-read SUM variable, whose other components get zeros."""
  return not (
    is_distributed(variable)
    and _sync_on_read(variable)
    and variable.aggregation == tf.VariableAggregation.SUM
  )


def spread(variable, value):
  """What a host write puts into each component of `variable` (module doc).

  Args:
    variable: The variable.
    value: The tensor to write (the variable's host value).

  Returns:
    One tensor per component, in order.
  """
  parts = components(variable)
  if spreads_as_is(variable):
    return [value] * len(parts)
  values = [value]
  for part in parts[1:]:
    with ops.colocate_with(part):
      zero = tf.zeros(value.shape, value.dtype)  # no edge from `value`
      if value.dtype.is_floating or value.dtype.is_complex:
        zero = -zero  # x + (-0.0) is x for every x, -0.0 included
      values.append(zero)
  return values


def component_array(variable, index, array, kept=None):
  """The value a host restore writes into component `index` of `variable`,
  as a numpy array: from the snapshot's `array` and what it `kept` of the
  variable's replicas (`kept_components`' values, or None), as `spread`
  and a restore's kept replicas lay them out."""
  parts = components(variable)
  if kept is not None:
    first_kept = len(parts) - len(kept)  # 1 for mirrored, 0 for sync-on-read
    return kept[index - first_kept] if index >= first_kept else array
  if (
    index > 0
    and is_distributed(variable)
    and _sync_on_read(variable)
    and variable.aggregation == tf.VariableAggregation.SUM
  ):
    zero = np.zeros_like(array)
    if zero.dtype.kind in "fc":
      zero = -zero  # as spread: x + (-0.0) is x for every x
    return zero
  return array


def may_differ(variable):
  """True for a mirrored variable whose replicas may hold different values.

  TensorFlow 2.4 on lets a replica write a mirrored variable of aggregation
  NONE in replica context, and then writes that replica's component alone:
  Keras 3's batch-norm statistics (each replica's from its own part of the
  batch) and seed states. Such variables are non-trainable; trainable ones
  are written by the optimizer's cross-replica update, which writes every
  component alike (a host read assumes so).
  """
  return (
    is_distributed(variable)
    and not _sync_on_read(variable)
    and not variable.trainable
    and variable.aggregation == tf.VariableAggregation.NONE
    and len(components(variable)) > 1
  )


def keeps_replicas(variable):
  """True for a variable whose snapshots in host memory keep its components
  besides its value (module doc, "Replicas that differ"): a mirrored one
  whose replicas may differ (`may_differ`), and a sync-on-read one of more
  than one component, whose host value (its aggregate) is none of them."""
  return may_differ(variable) or (
    is_distributed(variable)
    and _sync_on_read(variable)
    and len(components(variable)) > 1
  )


def kept_components(variable):
  """The components whose own values a host snapshot of `variable` keeps
  (`keeps_replicas`): a mirrored variable's after the first (the first's
  value is the snapshot's array), a sync-on-read one's all of them."""
  parts = components(variable)
  return parts if _sync_on_read(variable) else parts[1:]


def replica_layout(variables):
  """`[(index, count)]`: for each of `variables` whose components a host
  snapshot keeps (`keeps_replicas`), its position and its number of kept
  components (`kept_components`), in order: what a snapshot's kept
  replicas are laid out by (`snapstore.modes.base.kept_replicas`)."""
  return [
    (i, len(kept_components(v)))
    for i, v in enumerate(variables)
    if keeps_replicas(v)
  ]


def differs(variable, values=None):
  """A bool tensor: whether a component's bits differ from the first's
  (each compared on its own device).

  Args:
    variable: A distributed variable.
    values: One tensor per component, on its device, to compare instead of
      the components' own values (reads of their shadows), or None.
  """
  parts = components(variable)
  if values is None:
    values = [part.value() for part in parts]
  first = _bits(values[0])
  flags = []
  for part, value in zip(parts[1:], values[1:]):
    with ops.colocate_with(part):
      flags.append(tf.reduce_any(tf.not_equal(_bits(value), first)))
  return tf.reduce_any(tf.stack(flags))


def replica_reads(variable, values=None):
  """What a host snapshot reads of a `keeps_replicas` variable besides its
  value (module doc, "Replicas that differ").

  Args:
    variable: A variable for which `keeps_replicas` is True.
    values: As for `differs`: the values to read instead of the
      components' (a device slot's shadows), or None.

  Returns:
    `(flag, values)`: a bool tensor, whether the values are kept, and one
    tensor per kept component (`kept_components`), on that component's
    device. A sync-on-read variable's are always kept (its components need
    not be equal, and its host value is their aggregate): the flag is True
    and the values are every component's. A mirrored one's flag is
    `differs(variable, values)`, and its values are those of the components
    after the first where the flag is set, else empty vectors, so that equal
    replicas (the usual case) cost a comparison on each device and no
    transfer.
  """
  parts = components(variable)
  if _sync_on_read(variable):
    if values is None:
      values = [part.value() for part in parts]
    out = []
    for part, value in zip(parts, values):
      with ops.colocate_with(part):
        out.append(tf.identity(value))
    with ops.colocate_with(anchor(variable)):
      return tf.constant(True), out
  flag = differs(variable, values)
  if values is None:
    values = [part.value for part in parts]  # read in the branch
  else:
    values = [lambda value=value: tf.identity(value) for value in values]
  out = []
  for part, read in zip(parts[1:], values[1:]):
    with ops.colocate_with(part):
      out.append(
        tf.cond(
          flag,
          read,
          lambda dtype=part.dtype.base_dtype: tf.zeros([0], dtype),
        )
      )
  return flag, out


def _bits(value):
  """`value` as integers of its width, so that equal means equal bits (NaN
  equals NaN, -0.0 differs from 0.0)."""
  if not value.dtype.is_floating:
    return value
  width = {2: tf.int16, 4: tf.int32, 8: tf.int64}[value.dtype.size]
  return tf.bitcast(value, width)


def _sync_on_read(variable):
  return variable.synchronization == tf.VariableSynchronization.ON_READ


def in_replica_context():
  """True inside `strategy.run` of a real strategy (not the default one)."""
  return tf.distribute.has_strategy() and not (
    tf.distribute.in_cross_replica_context()
  )
