"""`SnapshotCallback` in a `fit` under `ParameterServerStrategy` (v2).

tf-keras's and TF 2.15's Keras 2's `fit` schedules each step on a worker
through a `ClusterCoordinator` and hands the batch hooks its logs as a
`RemoteValue`; it refuses batch hooks of a callback that does not take the
logs so, which `SnapshotCallback` does under that strategy. A snapshot or a
restore while scheduled steps run would copy a mix of states, so the
callback waits for them (`coordinator.join()`) before each snapshot and
rollback, and fetches the logs it checks, which waits for that step (see
docs/design/callback.md, "Parameter servers").

    coordinator = fit_coordinator.of(model)      # None without one
    logs = fit_coordinator.fetched(logs)         # a RemoteValue's value
"""

from snapstore._keras import keras_fit_coordinator
from snapstore._keras import schedules_on_coordinator
from snapstore._tf import tf2

_REMOTE_VALUE = getattr(
  getattr(tf2.distribute.experimental, "coordinator", None),
  "RemoteValue",
  (),
)


def uses_coordinator(model):
  """Whether `fit` schedules `model`'s steps on a `ClusterCoordinator`."""
  strategy = getattr(model, "distribute_strategy", None)
  return schedules_on_coordinator(strategy)


def of(model):
  """The `ClusterCoordinator` `fit` schedules `model`'s steps on, or None."""
  if not uses_coordinator(model):
    return None
  return keras_fit_coordinator(model)


def fetched(logs):
  """`logs`, fetched when they are a scheduled step's `RemoteValue` (which
  waits for that step)."""
  if isinstance(logs, _REMOTE_VALUE):
    return logs.fetch()
  return logs
