"""`MultiWorkerMirroredStrategy`: each worker's store, and the coordinated restore.

Under `tf.distribute.MultiWorkerMirroredStrategy` every worker process runs
the same program; a mirrored variable has one component per local replica
device on each worker, and the strategy keeps all of them equal by
all-reducing every update across the workers. A store built in each worker's
program covers that worker's components only:

- **Device mode**: the shadows are made as TensorFlow makes optimizer slots
  (`snapstore/engines/eager/distributed.py`): in the strategy's scope, one component
  per local replica device. Making a variable in a multi-worker scope
  broadcasts its initial value from worker 0 (a collective keyed by the
  order of creation, with no timeout), so every worker must build its
  stores at the same point of its program, in the same order, as it builds
  its model. `check_build` makes sure of it first, as a restore is checked
  (below): a device store built on one worker alone is refused after the
  timeout instead of waiting forever. A snapshot and a restore copy each
  local component on its own device: no collective, nothing crosses the
  network.
- **Host and disk mode**: one copy of the mirrored value per worker (its
  first local component), written back into every local component; of a
  sync-on-read value, this worker's aggregate of its own components
  (`snapstore/engines/eager/distributed.py`), not TensorFlow's cross-worker read.

**Restore is coordinated** (`snapstore/core/coordination.py`): this engine
exchanges the workers' fingerprints through the strategy's coordination
service (its key-value store). Not through a collective (an all-gather
through the strategy, with `CommunicationOptions(timeout_seconds=)`): a
collective that times out aborts every collective of the process
("Collective ops is aborted by: ... Restart your program to reset"), so
refusing a lone worker's restore would end its training; a one-worker call
through the strategy's own all-reduce would also shift the instance keys
of every later collective against the other workers'. A key-value read that
times out changes nothing, and training goes on. Cost per restore: one key
written and one read per other worker, plus the wait for the slowest
worker (docs/design/multi_worker.md has the measured figures).

`evaluate_with` is not coordinated: it puts every variable back bit for bit
before it returns, so a worker evaluating alone leaves no trace (the
function it calls must not run collectives unless every worker calls it:
TensorFlow's rule for any collective).
"""

from snapstore._tf import tf
from snapstore._tf import eager_context
from snapstore.core import coordination
from snapstore.core.distributed import is_distributed
from snapstore import errors


def coordinator(varset, name):
  """A `Coordinator` for a store over `varset`, or None (not multi-worker)."""
  cluster = _cluster(varset)
  return (
    coordination.Coordinator(_Exchange(cluster, "restore", name))
    if cluster
    else None
  )


def check_build(varset, name):
  """Before a device store makes its shadows: every worker builds it now.

  Making a variable in a multi-worker scope receives its initial value from
  worker 0 by a collective with no timeout, matched by order of creation: a
  device store built on one worker alone would wait forever, and workers
  building different stores would pair the wrong shadows. Checked as a
  restore is (module doc), with the variables' keys, shapes and dtypes.

  Raises:
    CoordinationError: Another worker did not build the store within the
      timeout, or builds another one. Nothing was built.
  """
  cluster = _cluster(varset)
  if cluster is None:
    return
  mine = "|".join(
    "%s:%s:%s" % (s.key, s.shape, s.dtype.name) for s in varset.specs
  )
  exchange = _Exchange(cluster, "build", name)
  try:
    seen = exchange.agree(mine)
  except coordination.Late as late:
    raise errors.CoordinationError(
      "The device store %r was not built on worker %s: worker %s did not "
      "build it within %g s (%s). Under MultiWorkerMirroredStrategy each "
      "shadow takes its initial value from worker 0 by a collective, so "
      "every worker must build the same store at the same point of its "
      "program (in the same order as its other variables); built on one "
      "worker alone it would wait forever. Nothing was built."
      % (name, exchange.me, late.task, exchange.timeout, late.why)
    )
  if len(set(seen.values())) > 1:
    raise errors.CoordinationError(
      "The device store %r was not built: the workers build stores over "
      "different variables (%s). Build the same store on every worker, "
      "at the same point. Nothing was built."
      % (name, ", ".join(sorted(t for t in seen if seen[t] != mine)) or "?")
    )


class _Exchange(object):
  """Rounds in which every task publishes a value and reads all the others'.

  Keys are `snapstore/<what>/<name>#<index>/<round>/<task>`: `index` counts
  the exchanges of that name made in this process (the same on every worker,
  which builds its stores in the same order), `round` the rounds this one
  completed. A round that times out is not counted and withdraws this
  task's key, so the next call pairs with the other tasks' next one.
  """

  def __init__(self, cluster, what, name):
    strategy, resolver, self.tasks = cluster
    self.me = "%s:%d" % (resolver.task_type, resolver.task_id)
    self.timeout = coordination.timeout(strategy)
    self._prefix = "snapstore/%s/%s#%d" % (
      what,
      name,
      coordination.count(what, name),
    )
    self.round = 0

  def agree(self, mine):
    """{task: value} of every task for this round, `mine` included.

    Raises:
      Late: A task did not publish within the timeout.
    """
    ctx = eager_context()
    own_key = self._key(self.round, self.me)
    ctx.set_config_key_value(own_key, mine)
    seen = {self.me: mine}
    for task in self.tasks:
      if task == self.me:
        continue
      try:
        seen[task] = ctx.get_config_key_value(
          self._key(self.round, task), int(self.timeout * 1000)
        )
      except tf.errors.OpError as e:
        _withdraw(ctx, own_key)
        raise coordination.Late(task, "%s: %s" % (type(e).__name__, _first(e)))
    self.round += 1
    if self.round >= 2:  # every task has read the keys of round - 2
      _withdraw(ctx, self._key(self.round - 2, self.me))
    return seen

  def _key(self, round_, task):
    return "%s/%d/%s" % (self._prefix, round_, task)


def _cluster(varset):
  """(strategy, resolver, tasks) of a multi-worker strategy of `varset`'s
  variables, or None."""
  for spec in varset:
    if not is_distributed(spec.variable):
      continue
    strategy = spec.variable.distribute_strategy
    resolver = getattr(strategy, "cluster_resolver", None)
    tasks = _tasks(resolver)
    if len(tasks) > 1:
      return strategy, resolver, tasks
  return None


def _tasks(resolver):
  """ "job:index" of every chief and worker task, or [] without a cluster."""
  if resolver is None:
    return []
  try:
    spec = resolver.cluster_spec()
  except (ValueError, RuntimeError):
    return []
  return coordination.tasks_of(spec)


def _withdraw(ctx, key):
  try:
    ctx.delete_config_key_value(key)
  except tf.errors.OpError:
    pass  # best effort: a missing key, or the service is gone


def _first(error):
  return (error.message or str(error)).strip().splitlines()[0][:200]
