"""Where a device snapshot lives: the session, or the cluster, that holds it.

A device snapshot is the value of shadow variables, and a variable's value
lives in the resources of whatever runs the graph, not in the graph:

- A local `tf.Session` (any target but `grpc://`) owns its variables. They
  die when it is closed, and another session on the same graph has its own,
  fresh copies: uninitialized, or holding what its initializer put there (the
  variable's value at that time), never the first session's snapshot.
- A `grpc://` target keeps the variables on the cluster's tasks (the
  parameter servers), shared by every session on that target and outliving
  them, until a task restarts.

So the store records where each device snapshot was written, as a `Place`: for
a local session, the `tf.Session` object itself (by weak reference: the store
must not keep a session alive); for a cluster, the target and the incarnation
of every device of the tasks holding the store's variables (a task gets new
incarnations when it restarts). A call from another place is refused; the
snapshots of a local session that is closed or gone are dropped. Sessions
under wrappers (`MonitoredSession`, tfdbg, a test's counting wrapper) are
told apart by the `tf.Session` under them.

Why not a marker in the graph (a per-store "generation" variable, written
with each snapshot and read before each use)? It costs a `session.run` per
check, has to be written in the same run as every copy (each mode's ops, and
users' own `snapshot_op` runs), and one marker on one task cannot vouch for
shadows on the other parameter servers. A place costs no run for a local
session and one `Session.list_devices()` per cluster session, and it does
not depend on how a mode stores its shadows.

What it cannot see: `tf.Session.reset(target)` clearing a live cluster's
containers (no incarnation changes), and users' own runs of `snapshot_op`,
`restore_op` and `past()` tensors, which run in whatever session the user
picks.

    places = core.places.Places(lambda sess: Place.of(sess, varset))
    places.bind(tag, places.of(sess))                 # after a device snapshot
    places.check(tag, places.of(other), "restore")    # SessionMismatchError
"""

import weakref

from snapstore._tf import session_closed
from snapstore._tf import session_under
from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore import errors


class Place(object):
  """Where a session keeps its variables: the session itself, or a cluster.

  Make with `Place.of(session, varset)`.
  """

  def __init__(self, session, cluster=None):
    try:
      self._ref = weakref.ref(session)
    except TypeError:  # a wrapper without weak references: keep it alive
      self._ref = lambda: session
    self._cluster = cluster  # (target, ((device, incarnation), ...)) or None

  @classmethod
  def of(cls, session, varset):
    """The place of `session` (resolved by `sessions.resolve`) for `varset`."""
    base = session_under(session)
    cluster = cluster_devices(
      base, "to tell which tasks hold the store's device snapshots"
    )
    if cluster is None:
      return cls(base)
    target, devices = cluster
    tasks = set(task_of(spec.variable.device) for spec in varset)
    held = tuple(
      sorted(d for d in devices if any(_holds(task, d[0]) for task in tasks))
    )
    return cls(base, (target, held))

  def same(self, other):
    if self._cluster is not None or other._cluster is not None:  # pylint: disable=protected-access
      return self._cluster == other._cluster  # pylint: disable=protected-access
    return self._ref() is other._ref()  # pylint: disable=protected-access

  @property
  def gone(self):
    """Whether the place's variables are gone: a local session closed or collected."""
    if self._cluster is not None:
      return False  # seen only from a later session (`restarted`)
    session = self._ref()
    return session is None or session_closed(session)

  def restarted(self, other):
    """Whether `other` sees this place's cluster with restarted tasks."""
    mine, theirs = self._cluster, other._cluster  # pylint: disable=protected-access
    return (
      mine is not None
      and theirs is not None
      and mine[0] == theirs[0]
      and mine[1] != theirs[1]
    )

  def describe(self):
    if self._cluster is not None:
      return "the cluster at %s" % self._cluster[0]
    session = self._ref()
    if session is None:
      return "a session that no longer exists"
    return "%s (%s)" % (
      _name(session),
      "closed" if session_closed(session) else "still open",
    )


def cluster_devices(base, why):
  """(target, ((device name, incarnation), ...)) of a cluster session, or
  None for a local one.

  Asked once per session, and kept on it: the master lists every task's
  devices, its own task's first (`GrpcSession::ListDevices`, TF 1.15 to
  2.x), which `snapstore/engines/graph/between_graph.py` relies on.

  Args:
    base: A raw `tf.Session` (`session_under`).
    why: What the listing is for, for the message when it fails.

  Raises:
    NoSessionError: The devices cannot be listed.
  """
  target = getattr(base, "sess_str", "")
  if isinstance(target, bytes):  # what tf.train.Server.target gives on TF 1.15
    target = target.decode("utf-8", "replace")
  if not (isinstance(target, str) and target.startswith("grpc://")):
    return None
  devices = _DEVICES.get(base)
  if devices is None:
    try:
      devices = tuple((d.name, d.incarnation) for d in base.list_devices())
    except tf.errors.OpError as e:
      raise errors.NoSessionError(
        "Cannot list the devices of the cluster at %s, %s: %s. Nothing was "
        "run." % (target, why, errors.first_line(e))
      ) from e
    _DEVICES.set(base, devices)
  return target, devices


def task_of(device):
  """(job, task) of a device string; None for the job means unplaced."""
  spec = tf.DeviceSpec.from_string(device or "")
  return spec.job, spec.task


def _holds(task, device_name):
  """Whether the device named `device_name` is on `task` ((job, task))."""
  job, index = task
  if job is None:
    return True  # unplaced variables: any task of the cluster may hold them
  spec = tf.DeviceSpec.from_string(device_name)
  return spec.job == job and (index is None or spec.task == index)


def _name(session):
  return "%s at 0x%x" % (type(session).__name__, id(session))


_DEVICES = attached.PerObject("devices")  # on each cluster session
