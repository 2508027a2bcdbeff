"""`MultiWorkerMirroredStrategy` in graph mode: the coordinated restore.

Graph mode (TF 1.15, and TF 2.x through `tf.compat.v1`) runs the strategy
with one `tf.train.Server` per worker and each worker's session on its own
server. A store built in each worker's graph covers that worker's local
components as under a single-machine `MirroredStrategy`
(`snapstore/core/distributed.py`): device mode one plain shadow per local
component, colocated with it (not made through the strategy, so nothing is
broadcast and no collective runs when it is built or initialized), host and
disk mode one value per worker. A snapshot and a restore are local copies.

A restore is checked first, as the eager engine checks it
(`snapstore/core/coordination.py`: same rounds, fingerprints, messages and
`TIMEOUT`): every worker must restore the same snapshot at the same point,
or the replicas differ and the model diverges silently. The eager engine
exchanges the fingerprints through the coordination service, which graph
mode does not have (TF 1.15 has none; TF 2.x starts it for eager programs
only), and a collective cannot be used (TF 1.15's take no timeout: a worker
restoring alone would wait forever; TF 2.x's abort every later collective
of the worker once one times out). So the workers exchange them through
variables on the first worker (the chief, or worker 0), as between-graph
replication shares variables on a ps task: each worker writes its own row
variable there, `snapstore_coordination/<store>_<index>/<job>_<task>`, a
string pair, and reads the others' until they hold this round's value or
the timeout passes. A row is written by its worker alone (its first write
creates it), so no worker's write overwrites another's, and there is no
initializer to race on.

A row holds two slots, for even and odd rounds, each "<round>|<value>":
a worker cannot be more than one round ahead of another (it cannot finish
round r + 1 before the other writes it), so the slot of round r's parity
holds round r or an older round, never a newer one. A round that times out
is not counted and clears this worker's slot, so a later coordinated
restore pairs the workers' calls correctly (the eager engine's one race
remains: a worker arriving as another gives up may see its value).

Why variables in a graph and session of their own, connected to the first
worker's server: the strategy's session config (`update_config_proto`)
filters each worker's session to its own task's devices, so ops placed on
another task cannot run in the user's session; and the store must not add
ops to the user's graph at restore time (it may be finalized). The private
session is made at the first restore, so the servers need not be up when
the store is built. Cost per restore: one write and one read per other
worker, round trips to the first worker's server, plus the wait for the
slowest worker (docs/design/multi_worker.md has the measured figures); a
worker waiting for another polls every 1 ms at first, backing off to 50 ms.
"""

import time

from snapstore._tf import strategy_task
from snapstore._tf import distribute_strategy_of
from snapstore._tf import ops
from snapstore._tf import state_ops
from snapstore._tf import tf
from snapstore.core import distributed
from snapstore.core import coordination

_SCOPE = "snapstore_coordination"
_POLL = (0.001, 0.05)  # first and longest pause between reads, seconds


def coordinator(varset, name):
  """A `Coordinator` for a graph-mode store over `varset`, or None (not a
  multi-worker strategy's variables)."""
  cluster = _cluster(varset)
  if cluster is None:
    return None
  return coordination.Coordinator(_VariableExchange(cluster, name))


def _cluster(varset):
  """(strategy, ClusterSpec, this task "job:index", every task) of a
  multi-worker strategy of `varset`'s variables, or None."""
  for spec in varset:
    variable = spec.variable
    if distributed.workers(variable) <= 1:
      continue
    strategy = distribute_strategy_of(variable)
    # The strategy's own record of its cluster (TF 1.15 and 2.x alike).
    cluster_spec, task_type, task_id = strategy_task(strategy.extended)
    me = "%s:%d" % (task_type, task_id)
    tasks = coordination.tasks_of(cluster_spec)
    if len(tasks) > 1 and me in tasks:
      return strategy, cluster_spec, me, tasks
  return None


class _VariableExchange(object):
  """`multi_worker._Exchange`'s rounds through row variables (module doc).

  Args:
    cluster: From `_cluster`.
    name: The store's name.
  """

  def __init__(self, cluster, name):
    strategy, self._spec, self.me, self.tasks = cluster
    self.timeout = coordination.timeout(strategy)
    self._prefix = "%s/%s_%d" % (
      _SCOPE,
      name.strip("/").replace("/", "_") or "store",
      coordination.count("graph_restore", name),
    )
    self.round = 0
    self._row = ["", ""]  # what this worker's row holds
    self._session = None
    self._graph = None
    self._reads = {}  # task -> its row's value
    self._write = None  # (placeholder, assign op) of this worker's row

  def agree(self, mine):
    """{task: value} of every task for this round, `mine` included.

    Raises:
      coordination.Late: A task did not publish within the timeout, or the
        first worker's server could not be reached.
    """
    deadline = time.time() + self.timeout
    slot = self.round % 2
    try:
      self._connect()
      self._row[slot] = "%d|%s" % (self.round, mine)
      self._put(deadline)
    except tf.errors.OpError as e:
      raise coordination.Late(self.tasks[0], _why(e))
    seen = {self.me: mine}
    waiting = [task for task in self.tasks if task != self.me]
    pause = _POLL[0]
    while waiting:
      task = waiting[0]
      try:
        value = self._get(task, slot, deadline)
      except tf.errors.OpError as e:
        self._withdraw(slot)
        raise coordination.Late(task, _why(e))
      if value is not None:
        seen[task] = value
        waiting.pop(0)
        continue
      if time.time() >= deadline:
        self._withdraw(slot)
        raise coordination.Late(task, "no value of round %d" % self.round)
      time.sleep(min(pause, max(0.0, deadline - time.time())))
      pause = min(pause * 2, _POLL[1])
    self.round += 1
    return seen

  def _get(self, task, slot, deadline):
    """`task`'s value of this round, or None if it has not written it."""
    try:
      row = self._session.run(self._reads[task], options=_options(deadline))
    except tf.errors.FailedPreconditionError:
      return None  # its row does not exist yet: it never wrote
    except tf.errors.DeadlineExceededError:
      return None  # the deadline passed during the read: `agree` says so
    text = row[slot].decode("utf-8")
    round_, _, value = text.partition("|")
    if round_ != str(self.round):
      return None  # an older round's (or a cleared slot)
    return value

  def _put(self, deadline):
    placeholder, write = self._write
    self._session.run(
      write, {placeholder: self._row}, options=_options(deadline)
    )

  def _withdraw(self, slot):
    """Clears this round's slot (best effort: the server may be gone)."""
    self._row[slot] = ""
    try:
      self._put(time.time() + min(self.timeout, 5.0))
    except tf.errors.OpError:
      pass

  def _connect(self):
    """Builds the rows' graph and the session on the first worker, once."""
    if self._session is not None:
      return
    first = self.tasks[0]
    job, index = first.split(":")
    device = "/job:%s/replica:0/task:%s/device:CPU:0" % (job, index)
    graph = tf.Graph()
    with graph.as_default(), ops.device(device):
      for task in self.tasks:
        # A plain variable op: no initializer, no variable creator (a
        # strategy's scope is per graph, and this graph has none).
        row = state_ops.variable_op_v2(
          [2], tf.string, name="%s/%s" % (self._prefix, task.replace(":", "_"))
        )
        if task == self.me:
          placeholder = tf.placeholder(tf.string, [2])
          self._write = (placeholder, tf.assign(row, placeholder).op)
        else:
          self._reads[task] = tf.identity(row)
    graph.finalize()
    config = tf.ConfigProto(
      device_filters=["/job:%s/task:%s" % (job, index)],
      # Bounds the session's creation on the first worker's master too
      # (RunOptions bound the runs only): an unreachable server is refused.
      operation_timeout_in_ms=max(1, int(self.timeout * 1000)),
    )
    target = "grpc://" + self._spec.task_address(job, int(index))
    self._graph = graph
    self._session = tf.Session(target, graph=graph, config=config)


def _options(deadline):
  left = max(1, int((deadline - time.time()) * 1000))
  return tf.RunOptions(timeout_in_ms=left)


def _why(error):
  text = (error.message or str(error)).strip().splitlines()
  return "%s: %s" % (type(error).__name__, (text[0] if text else "")[:200])
