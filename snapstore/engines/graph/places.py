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

    places = Places(varset)
    places.bind(tag, Place.of(sess, varset))        # after a device snapshot
    places.check(tag, Place.of(other, varset), "restore")   # SessionMismatchError
"""

import collections
import weakref

from snapstore._tf import session_closed
from snapstore._tf import session_under
from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore import errors

# How many dropped tags keep the reason they were dropped, for messages.
_REMEMBERED = 64


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


class Places(object):
  """The place of each device snapshot of one store, and why some were dropped.

  Args:
    varset: The store's `VariableSet`; its variables' tasks decide which
      devices of a cluster matter.
  """

  def __init__(self, varset):
    self._varset = varset
    self._where = {}  # tag -> Place
    self._dropped = collections.OrderedDict()  # tag -> message, newest last

  def of(self, session):
    """The `Place` of `session` (a resolved session)."""
    return Place.of(session, self._varset)

  def bind(self, tag, place):
    """Records that device snapshot `tag` was just written at `place`."""
    self._where[tag] = place
    self._dropped.pop(tag, None)

  def unbind(self, tag):
    """Forgets `tag`'s place: it is not held, or not tied to one (a pinned slot)."""
    self._where.pop(tag, None)

  def gone(self):
    """[(tag, why)] of bound tags whose place is gone: a local session closed or collected."""
    return [
      (
        tag,
        lost_message(
          tag,
          "was a device snapshot of %s: its values went "
          "with that session's resources" % place.describe(),
        ),
      )
      for tag, place in self._where.items()
      if place.gone
    ]

  def keep_only(self, tags):
    """Forgets the places of tags not in `tags` (deleted or evicted meanwhile)."""
    for tag in [t for t in self._where if t not in tags]:
      del self._where[tag]

  def drop(self, tag, why):
    """Forgets `tag`, remembering `why` it was dropped (for `check`)."""
    self._where.pop(tag, None)
    self._dropped[tag] = why
    while len(self._dropped) > _REMEMBERED:
      self._dropped.popitem(last=False)

  def dropped_note(self, tag):
    """Why `tag` (None: any) was dropped, or "" if it was not."""
    if tag is None:
      return " ".join(self._dropped.values())
    return self._dropped.get(tag, "")

  def check(self, tag, place, what):
    """Checks that device snapshot `tag` is held at `place`.

    Returns:
      None, or a message saying the snapshot is lost for good (its cluster's
      tasks restarted): the caller drops it and raises.

    Raises:
      SessionMismatchError: `tag` was written at another place, which still
        holds it.
    """
    home = self._where.get(tag)
    if home is None or home.same(place):
      return None
    if home.restarted(place):
      return lost_message(
        tag,
        "was held on %s, whose tasks have restarted since "
        "(their devices have new incarnations): their "
        "variables, its shadows among them, were lost" % home.describe(),
      )
    raise errors.SessionMismatchError(
      "Snapshot %r is a device snapshot held by %s, not by %s()'s session "
      "(%s): device snapshots are variables of the session (or cluster) "
      "that took them, and this session's shadows do not hold it. Call "
      "%s() with the session that took it, or carry it over: "
      "store.load_arrays(store.arrays(%r, session=old), tag=%r, "
      "session=new)."
      % (tag, home.describe(), what, place.describe(), what, tag, tag)
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


def lost_message(tag, why):
  """The message for device snapshot `tag`, dropped because it `why`."""
  return (
    "Snapshot %r %s, so the store dropped it. Take a new snapshot; to keep "
    "a device snapshot beyond its session, save_npz() or spill() it first."
    % (tag, why)
  )


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
