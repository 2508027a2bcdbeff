"""Distributed variables (`tf.distribute`) in the eager engine's copies.

A variable made in a strategy's scope (`MirroredStrategy`, and the others
that mirror variables) is a `DistributedVariable`: one component variable per
replica device (`v.values`). The eager engine treats it so:

- **Shadows** are made as TensorFlow makes optimizer slots
  (`slot_creator`): in the strategy's scope under
  `strategy.extended.colocate_vars_with(v)`, with the variable's
  synchronization and aggregation, so a shadow has one component on each of
  the variable's devices.
- **Device copies** (snapshot, restore, the scratch swap) pair the shadow's
  components with the variable's by position (`values`, in the strategy's
  device order) and copy each on its own device: every replica keeps its own
  bits, nothing crosses devices, and replicas that were identical stay so.
- **Host snapshots** read a mirrored variable's first component (the
  replicas are equal: the strategy writes every update to all of them, which
  device mode does not need to assume; a non-trainable one of aggregation
  NONE, which replicas may write each their own, is compared at every
  snapshot and its other components kept too where they differ, each
  restored into its own: `core.distributed`, "Replicas that differ") and a
  sync-on-read one as TensorFlow reads it in cross-replica context (its
  aggregate: the sum of a counter's components, ...), and keep every
  component of it too, each restored into its own (`core.distributed`,
  "Replicas that differ"); under a multi-worker strategy, this worker's
  aggregate of its own components (`snapstore/engines/eager/multi_worker.py`). A
  **host write** (a restore's first step; all of it for arrays without kept
  components: `load_arrays`, a file another store wrote) puts a mirrored
  value into every component; a sync-on-read value so that the aggregate
  read back is the same bits: for SUM the value into the first component and
  zeros (-0.0 for floats, the one zero that leaves every value unchanged
  when added) into the others; for MEAN, ONLY_FIRST_REPLICA and NONE the
  value into every component (a mean of equal values is that value exactly
  when the replica count is a power of two; device mode copies components
  and needs no such rule).
- **In-step copies** inside `strategy.run` (replica context) read and write
  the local component only (`local`): each replica snapshots its own.
"""

from snapstore._tf import distribute_strategy_of
from snapstore._tf import cluster_coordinator
from snapstore._tf import local_component
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core.distributed import aggregate
from snapstore.core.distributed import components
from snapstore.core.distributed import in_replica_context
from snapstore.core.distributed import is_distributed
from snapstore.core.distributed import spread
from snapstore.core.distributed import workers


def make_shadow(variable, name):
  """A non-trainable shadow of `variable`, eager, made as a slot is."""
  with tf2.init_scope():
    if not is_distributed(variable):
      with tf.device(variable.device):
        return tf2.Variable(
          variable.value(),
          trainable=False,
          name=name,
          dtype=variable.dtype,
          shape=variable.shape,
        )
    strategy = variable.distribute_strategy
    first = variable.values[0]
    with strategy.scope(), strategy.extended.colocate_vars_with(variable):
      return tf2.Variable(
        lambda: tf.identity(first.value()),
        trainable=False,
        name=name,
        dtype=variable.dtype,
        shape=variable.shape,
        synchronization=variable.synchronization,
        aggregation=variable.aggregation,
      )


def make_marker(variable, value, name):
  """An int64 scalar variable beside `variable`, eager, made as a shadow is.

  For a device slot's marker (`snapstore/engines/eager/traced.py`): where the
  slot's shadows are, so that a function reading it runs where they do (a
  parameter server's, every replica's own component under a mirrored
  strategy, written to all of them from cross-replica context).
  """
  initial = lambda: tf.constant(value, tf.int64)  # noqa: E731
  with tf2.init_scope():
    if not is_distributed(variable):
      with tf.device(variable.device):
        return tf2.Variable(
          initial(), trainable=False, name=name, dtype=tf.int64, shape=[]
        )
    strategy = variable.distribute_strategy
    with strategy.scope(), strategy.extended.colocate_vars_with(variable):
      return tf2.Variable(
        initial,
        trainable=False,
        name=name,
        dtype=tf.int64,
        shape=[],
        synchronization=tf2.VariableSynchronization.ON_WRITE,
        aggregation=tf2.VariableAggregation.ONLY_FIRST_REPLICA,
      )


def read(variable):
  """The value a host snapshot keeps (module doc), as a tensor."""
  if not is_distributed(variable):
    return variable.value()
  if _sync_on_read(variable):
    if workers(variable) > 1:
      # This worker's aggregate: TF's read all-reduces across the workers
      # (a collective in every snapshot), and `write` puts a value back
      # into this worker's components only (the others' would count twice).
      return aggregate(variable, [c.value() for c in variable.values])
    return variable.read_value()  # the aggregate, as TF reads it
  first = variable.values[0]
  with tf.device(first.device):
    return first.value()


def write(variable, value):
  """Writes a host snapshot's `value` into `variable` (module doc): each
  component gets what `core.distributed.spread` says, on its own device."""
  for part, part_value in _placed(variable, value):
    part.assign(part_value, read_value=False)


def write_array(variable, value):
  """`write` of a numpy array by one `AssignVariableOp` per component, fed
  the array itself, so that each component takes the array's memory as it
  is (`copies.adopts_converted_arrays`). For variables whose components
  all take the value itself (`core.distributed.spreads_as_is`)."""
  for part, part_value in _placed(variable, value):
    tf.raw_ops.AssignVariableOp(resource=part.handle, value=part_value)


def _placed(variable, value):
  """(component, its value) pairs, each yielded under its device."""
  for part, part_value in zip(components(variable), spread(variable, value)):
    with tf.device(part.device):
      yield part, part_value


def local(variable):
  """In replica context, the component of `variable` this replica owns (what
  `variable.value()` reads there; TensorFlow's `_get_on_device_or_primary`).
  A write to it is this replica's alone, whatever the variable's
  aggregation: no `merge_call`, so it may run inside a `tf.cond` branch.
  Other variables as they are."""
  if not is_distributed(variable):
    return variable
  return local_component(variable)


def _sync_on_read(variable):
  return variable.synchronization == tf2.VariableSynchronization.ON_READ


def check_cross_replica(call):
  """Refuses `call` (e.g. "ema.update()") inside `strategy.run`.

  Such calls run one traced function that updates every replica's component
  itself; called in replica context, each replica would run it.

  Raises:
    ValueError: Called in replica context.
  """
  if in_replica_context():
    raise ValueError(
      "%s was called inside strategy.run (replica context): it updates "
      "every replica's component itself, so each replica would run it "
      "again. Call it after strategy.run returns, in the step's "
      "cross-replica part." % call
    )


def coordinated_strategies(variables):
  """The parameter-server strategies (v2) `variables` were made under: those
  a `ClusterCoordinator` may schedule functions of, which write the
  variables from the workers while the coordinator goes on."""
  out = []
  for variable in variables:
    strategy = distribute_strategy_of(variable)
    if hasattr(strategy, "_cluster_coordinator") and not any(
      s is strategy for s in out
    ):
      out.append(strategy)
  return out


def check_no_functions_in_flight_eagerly(strategies, call):
  """`check_no_functions_in_flight` for a call run eagerly, not traced.

  An update called inside the user's own `tf.function` is ordered by that
  function (and is traced, perhaps while earlier functions run); only an
  eager call runs at once, between the workers' writes.
  """
  if strategies and tf2.executing_eagerly():
    check_no_functions_in_flight(strategies, call)


def _coordinators(strategies):
  """The `ClusterCoordinator`s made for `strategies` (at most one each)."""
  found = [cluster_coordinator(s) for s in strategies]
  return [c for c in found if c is not None]


def functions_in_flight(strategies):
  """True while functions scheduled on a coordinator of `strategies` are
  queued or running (`ClusterCoordinator.done()` is False).

  Raises:
    Exception: The error of a scheduled function that failed, as
      `ClusterCoordinator.done()` raises it.
  """
  return any(not c.done() for c in _coordinators(strategies))


def join(strategies):
  """Waits until no function scheduled on a coordinator of `strategies` runs
  (`ClusterCoordinator.join()`), every coordinator's, even when one raises.

  Raises:
    Exception: The first error of a scheduled function, as `join()` raises
      it; TensorFlow has then cancelled that coordinator's other functions,
      so none is left running.
  """
  error = None
  for coordinator in _coordinators(strategies):
    try:
      coordinator.join()
    except Exception as e:  # pylint: disable=broad-except
      error = error or e
  if error is not None:
    raise error


# What `ClusterCoordinator.schedule` returns (TF 2.x; none in TF 1.15).
_REMOTE_VALUE = getattr(
  getattr(tf2.distribute.experimental, "coordinator", None),
  "RemoteValue",
  (),
)


def fetched(value):
  """`value`, or what it holds if it is a `RemoteValue` (the result of a
  function scheduled on a `ClusterCoordinator`), fetched: waits for that
  function, and raises its error if it failed."""
  if isinstance(value, _REMOTE_VALUE):
    return value.fetch()
  return value


def check_no_functions_in_flight(strategies, call):
  """Refuses `call` while functions scheduled on a coordinator may run.

  A snapshot or restore taken then would interleave with the workers'
  writes: neither the state before nor after them.

  Raises:
    ValueError: A coordinator of `strategies` has functions queued or
      running (`ClusterCoordinator.done()` is False).
  """
  if functions_in_flight(strategies):
    raise ValueError(
      "%s() while functions scheduled on the ClusterCoordinator may still "
      "be running on the workers and writing the variables: the store "
      "would copy (or write) a mix of states. Call coordinator.join() "
      "first, then %s()." % (call, call)
    )
