"""Between-graph replication: only the chief writes what the workers share.

In a between-graph replicated job (one graph per worker, the variables on
the ps tasks) every worker runs the same program and builds the same store,
whose device shadows are ps variables too (README, "Parameter servers and
between-graph replication"). A store call that writes on any worker writes
what every worker shares: its device snapshot replaces the chief's in the
same slot, and its restore (or `evaluate_with`'s swap) rewrites the
variables every worker trains, with what that worker's store holds. So only
the chief may make such calls; the others read the chief's snapshots
(`store.slots.past`, `store.slots.shadows`). `check` refuses them on any
other task, before anything runs:

- **This task**: the task of the first device the session's
  `list_devices()` lists. A cluster session's master lists its own task's
  devices first (`GrpcSession::ListDevices`, TF 1.15 to 2.x); the listing is
  made once per session and shared with `engines/graph/places.py`.
- **Shared variables**: the store's variables live on another task than
  this one (a ps task). Graph-mode `MultiWorkerMirroredStrategy` keeps each
  worker's replicas on its own task: nothing shared, nothing checked; a
  local session shares nothing.
- **The chief**: task 0 of the cluster's "chief" job, else of its "master"
  job (an Estimator's older name), else worker task 0: TensorFlow's rule
  (`multi_worker_util.is_chief`), and the one of programs that pass
  `MonitoredTrainingSession(is_chief=task_index == 0)`.

A store built with `chief_only=False` is not checked: a task made the
writer by the user's own rule, or a single client driving in-graph
replication from a task that is not the chief.

    check(raw_session, varset, "snapshot")   # NotChiefError on a non-chief
"""

from snapstore._tf import session_under
from snapstore.engines.graph import attached
from snapstore.engines.graph import places
from snapstore import errors

# Jobs whose task 0 is the chief, by precedence.
_CHIEF_JOBS = ("chief", "master", "worker")


def check_argument(chief_only, eager):
  """Checks the store's `chief_only` argument.

  Raises:
    TypeError: Not a bool.
    ValueError: `chief_only=False` on an eager store, which no task shares.
  """
  if not isinstance(chief_only, bool):
    raise TypeError("chief_only must be True or False, got %r." % (chief_only,))
  if eager and not chief_only:
    raise ValueError(
      "chief_only=False is for graph mode's between-graph replication, "
      "where every worker's store shares the shadows on the ps tasks. An "
      "eager store has no such sharing (under ParameterServerStrategy one "
      "program, the coordinator, runs the store; under "
      "MultiWorkerMirroredStrategy each worker keeps its own copies). Leave "
      "chief_only out."
    )


def check(session, varset, what):
  """Refuses call `what`, which writes, on a task that is not the chief.

  Args:
    session: The call's raw session.
    varset: The store's `VariableSet`.
    what: The call's name, for the message.

  Raises:
    NotChiefError: `session` runs on a task of a cluster that is not its
      chief, and the store's variables live on other tasks.
    NoSessionError: The cluster's devices cannot be listed.
  """
  base = session_under(session)
  roles = _ROLES.get(base)
  if roles is None:
    cluster = places.cluster_devices(
      base, "to tell whether this task is the chief"
    )
    roles = _roles(cluster[1]) if cluster is not None else ()
    _ROLES.set(base, roles)
  if not roles:
    return
  me, chief = roles
  if me == chief:
    return
  shared = sorted(
    set(
      places.task_of(spec.variable.device)
      for spec in varset
      if places.task_of(spec.variable.device)[0] is not None
    )
    - {me}
  )
  if not shared:
    return
  raise errors.NotChiefError(
    "%s() runs on %s, which is not the chief of its cluster (%s): the "
    "store's variables live on %s, shared by every worker, and so do its "
    "device shadows. Every worker runs the same program, but a store call "
    "that writes on this one would write what all share: its device "
    "snapshots replace the chief's in the shared slots, its restores and "
    "evaluate_with's swaps rewrite the variables every worker trains. "
    "Nothing was run. Call %s() on the chief only (e.g. under `if "
    "is_chief:`); other workers may read the chief's snapshots with "
    "store.slots.past() and store.slots.shadows(). To let this task write "
    "anyway (the writer by a rule of your own, or one client driving "
    "in-graph replication), build its store with SnapshotStore(..., "
    "chief_only=False)."
    % (what, _name(me), _name(chief), ", ".join(_name(t) for t in shared), what)
  )


def _roles(devices):
  """(this task, the chief), each (job, index), from a cluster session's
  devices (this task's first); () when they tell no chief."""
  if not devices:
    return ()
  tasks = set(places.task_of(name) for name, _ in devices)
  me = places.task_of(devices[0][0])
  for job in _CHIEF_JOBS:
    if (job, 0) in tasks:
      return me, (job, 0)
  return ()


def _name(task):
  return "/job:%s/task:%d" % task


_ROLES = attached.PerObject("roles")  # on each cluster session
