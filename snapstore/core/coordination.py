"""The check that every worker restores the same snapshot (multi-worker).

Under `MultiWorkerMirroredStrategy` a worker that restores alone, or workers
that restore different snapshots, leave the replicas different: the next
all-reduce adds gradients computed at different parameters, and the model
diverges silently. So a restore first checks, before writing any variable,
that every worker restores the same snapshot at the same point: each worker
publishes a fingerprint of (tag, the snapshot's sequence number in its
store) and reads every other worker's, in rounds; the restore goes on only
if all are equal, else `CoordinationError` and nothing is written.

Both engines check a restore with this `Coordinator` (rounds, messages,
timeout); each exchanges the values its own way: the eager engine through
the strategy's coordination service (`engines/eager/multi_worker.py`),
graph mode through variables on the first worker
(`engines/graph/multi_worker.py`). The wait is bounded by `TIMEOUT`
(seconds; set it before building the store), and by half the strategy's
`CommunicationOptions(timeout_seconds=)` when that is set: while a lone
worker waits here, the others wait in their next collective for it, which
must not time out first (that would abort their collectives).
"""

import itertools
import threading

from snapstore._tf import communication_timeout
from snapstore import errors

TIMEOUT = 60.0  # the longest wait for the other workers (module doc)

_JOBS = ("chief", "worker")
_counts = {}  # (what, store name) -> how many this process has made
_counts_lock = threading.Lock()


class Coordinator(object):
  """Checks that every worker restores the same snapshot (module doc).

  Args:
    exchange: Rounds of values between the workers: `_Exchange` here (the
      coordination service), or graph mode's through variables on the
      first worker (`snapstore/engines/graph/multi_worker.py`); its `agree` raises
      `Late` when a worker does not publish in time.
  """

  def __init__(self, exchange):
    self._exchange = exchange
    self._serial = itertools.count()
    self._serials = {}  # tag -> sequence number of its snapshot

  @property
  def timeout(self):
    return self._exchange.timeout

  def recorded(self, tag):
    """Notes that snapshot `tag` was just taken (its sequence number)."""
    self._serials[tag] = next(self._serial)

  def check(self, tag):
    """Returns when every worker restores `tag`'s snapshot now.

    Raises:
      CoordinationError: Another worker did not call restore within the
        timeout, or restores another snapshot. Nothing was written.
    """
    me = self._exchange.me
    try:
      seen = self._exchange.agree("%r#%s" % (tag, self._serials.get(tag, "?")))
    except Late as late:
      raise errors.CoordinationError(
        "restore(%r) was refused on worker %s: worker %s did not restore "
        "within %g s (%s). Nothing was written. Under "
        "MultiWorkerMirroredStrategy a restore on one worker alone would "
        "leave the replicas different and the model would diverge; call "
        "restore on every worker, with the same tag, at the same point of "
        "training." % (tag, me, late.task, self.timeout, late.why)
      )
    if len(set(seen.values())) > 1:
      raise errors.CoordinationError(
        "restore(%r) was refused: the workers restore different snapshots "
        "(tag#sequence number per worker: %s). Nothing was written on any "
        "worker. Call restore on every worker with the same tag; the workers "
        "must have taken the same snapshots in the same order."
        % (tag, ", ".join("%s %s" % kv for kv in sorted(seen.items())))
      )


class Late(Exception):
  """A task did not publish its value in time."""

  def __init__(self, task, why):
    super(Late, self).__init__(task, why)
    self.task = task
    self.why = why


def timeout(strategy):
  """The longest wait for the other workers under `strategy` (module doc)."""
  collective = communication_timeout(strategy)
  return min(TIMEOUT, collective / 2.0) if collective else TIMEOUT


def count(what, name):
  """How many exchanges `what` of store `name` this process made before:
  the same on every worker, which builds its stores in the same order."""
  with _counts_lock:
    index = _counts.get((what, name), 0)
    _counts[(what, name)] = index + 1
  return index


def tasks_of(spec):
  """ "job:index" of every chief and worker task of a `ClusterSpec` (or
  None), the chief first."""
  jobs = spec.jobs if spec else []
  return [
    "%s:%d" % (job, index)
    for job in _JOBS
    if job in jobs
    for index in range(spec.num_tasks(job))
  ]
