"""A parameter server that restarted under the eager engine, told by its error.

Under `ParameterServerStrategy` (v2) a variable lives on a parameter server,
and so does each device shadow of it (`snapstore/engines/eager/distributed.py`): a
device snapshot is a set of variables on the servers. A server that restarts
comes back empty, and without this program's eager context: every op the
program sends there fails with TensorFlow's `AbortedError` "Unable to find a
context_id matching the specified one ... Perhaps the worker was restarted",
naming the server ("remote target /job:ps/replica:0/task:0"). TensorFlow's
own parameter-server fault tolerance (`ClusterCoordinator`) tells a
restarted server by that error, by "expects a different device incarnation"
(an `AbortedError` too), and by an `InvalidArgumentError` with "unknown
device" or "Unable to find the relevant tensor remote_handle" (the server
restarted between two calls of the same channel); so does `restarted`.

Such an error means the variables the program made on that server are gone,
the store's copies among them, for good: a restore cannot "be called again".
The store then drops its device snapshots (each has a copy of every
variable, so one on that server) and raises `SessionMismatchError` saying
why; later calls refuse them before anything runs, as graph mode refuses the
snapshots of a cluster whose tasks restarted (`snapstore/engines/graph/places.py`).
An `UnavailableError` (the server cannot be reached) is not taken for a
restart: the server may come back with its state after a network fault, and
the call may be retried.

Why not check before each call: the eager context learns of a restart only
when an op reaches the server, and asking each server for its incarnation (a
graph session's `list_devices()` per server) costs a round trip per server
per call. So this costs nothing until a call fails.

    tasks, words = restarted(error, varset.variables)
    if tasks:
      ...  # drop the device snapshots; raise lost_error(...)
"""

import re

from snapstore._tf import tf
from snapstore import errors

# (error class, TensorFlow's words): the errors of a server that restarted.
_SIGNS = (
  (tf.errors.AbortedError, "Unable to find a context_id"),
  (tf.errors.AbortedError, "expects a different device incarnation"),
  (tf.errors.InvalidArgumentError, "unknown device"),
  (
    tf.errors.InvalidArgumentError,
    "Unable to find the relevant tensor remote_handle",
  ),
)
_TASK = re.compile(r"/job:([^/\s]+)/replica:(\d+)/task:(\d+)")


def restarted(error, variables):
  """The tasks holding `variables` that `error` says restarted, and its words.

  Args:
    error: A `tf.errors.OpError` a store call got.
    variables: The store's variables.

  Returns:
    `(tasks, words)`: the sorted names ("/job:ps/replica:0/task:0") of the
    tasks that hold any of `variables` and that the error names as
    restarted, and TensorFlow's words that say so; `((), None)` if it says
    no such thing.
  """
  text = getattr(error, "message", None) or str(error)
  words = next(
    (
      w
      for kind, w in _SIGNS
      if isinstance(error, kind) and w.lower() in text.lower()
    ),
    None,
  )
  if words is None:
    return (), None
  named = set("/job:%s/replica:%s/task:%s" % m for m in _TASK.findall(text))
  held = set(_task(v.device) for v in variables)
  tasks = tuple(sorted(named & held))
  return (tasks, words) if tasks else ((), None)


class Restart(object):
  """Parameter servers `tasks` restarted, as TensorFlow's error said (`words`).

  What the store says of it: `note(tag)` for each device snapshot it drops,
  `error(...)` for the call that found it (`lost_note`, `lost_error`).
  """

  def __init__(self, tasks, words):
    self.tasks = tasks
    self.words = words

  def note(self, tag):
    return lost_note(tag, self.tasks, self.words)

  def error(self, what, tag, device, others, wrote):
    return lost_error(what, tag, self.tasks, self.words, device, others, wrote)


def lost_note(tag, tasks, words):
  """Why device snapshot `tag` was dropped: its server(s) `tasks` restarted."""
  return (
    "Snapshot %r was a device snapshot, its copies on the parameter "
    "servers of its variables, and %s restarted since (TensorFlow: %r): "
    "the variables this program made there are gone, the snapshot's copies "
    "among them, so the store dropped it. The variables on %s are gone too: "
    "restart training from a checkpoint, as after any parameter server "
    "failure under ParameterServerStrategy. To keep snapshots through a "
    "server restart, use host or disk mode, or save_npz() or spill() them."
    % (tag, _servers(tasks), words, _them(tasks))
  )


def lost_error(what, tag, tasks, words, device, others, wrote):
  """The error `what` (a store call) raises when `tasks` restarted.

  Args:
    what: "restore", "evaluate_with" or "arrays" (and others that read).
    tag: The snapshot the call was about.
    tasks, words: From `restarted`.
    device: Whether `tag` was a device snapshot (dropped now).
    others: The other device snapshots dropped with it.
    wrote: Whether the failed step wrote variables (on the other servers
      it may have).
  """
  if wrote:
    wrote = (
      " This %s may have written the variables on the other servers." % what
    )
  else:
    wrote = " Nothing was changed."
  if device:
    also = (
      " It dropped its other device snapshots too: %s."
      % ", ".join(repr(t) for t in others)
      if others
      else ""
    )
    return errors.SessionMismatchError(
      lost_note(tag, tasks, words) + also + wrote
    )
  error = errors.RestoreError if what == "restore" else errors.SnapshotError
  return error(
    "%s of snapshot %r failed: %s restarted (TensorFlow: %r), so the "
    "variables this program made there are gone and nothing can be "
    "written into them or read from them. Snapshot %r is intact, in host "
    "memory or its file: after restarting training from a checkpoint, "
    "carry it over with new_store.load_arrays(store.arrays(%r)).%s"
    % (what, tag, _servers(tasks), words, tag, tag, wrote)
  )


def _servers(tasks):
  if len(tasks) == 1:
    return "the parameter server %s has" % tasks[0]
  return "the parameter servers %s have" % ", ".join(tasks)


def _them(tasks):
  return "that server" if len(tasks) == 1 else "those servers"


def _task(device):
  spec = tf.DeviceSpec.from_string(device or "")
  if spec.job is None or spec.task is None:
    return None
  return "/job:%s/replica:%d/task:%d" % (spec.job, spec.replica or 0, spec.task)
