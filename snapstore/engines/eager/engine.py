"""The eager engine: a store over TensorFlow 2.x variables, no sessions.

Its copy modes run traced functions built once, when the store is built;
`evaluate_with` calls a Python function with a snapshot's values in place,
and calls traced into the user's `tf.function` look their snapshot up when
it runs (`engines/eager/traced.py`). See `engines/base.py` for the
interface.
"""

from snapstore.core import checks
from snapstore.core import places as ledger
from snapstore import errors
from snapstore.engines import base
from snapstore.engines.eager import device
from snapstore.engines.eager import distributed
from snapstore.engines.eager import host
from snapstore.engines.eager import in_step
from snapstore.engines.eager import multi_worker
from snapstore.engines.eager import restarts
from snapstore.engines.eager import traced
from snapstore.engines.eager import variables
from snapstore.modes import table

# What an eager store offers instead of each graph-only call of its slots.
_EAGER_WAY = {
  "initializer": "eager shadows are initialized when the store makes them",
  "snapshot_op": "call store.snapshot() (one traced function), or "
  "store.slots.snapshot_in_step() inside your tf.function",
  "restore_op": "call store.restore() (one traced function)",
  "past": "use store.evaluate_with(fn, tag=...), which calls fn with the "
  "snapshot's values in place, or build a second model (e.g. "
  "keras.models.clone_model) and load store.arrays(tag) into it",
  "snapshot_before": "use store.slots.snapshot_in_step() inside your "
  "tf.function",
}


class EagerEngine(base.Engine):
  """Eager execution (see module doc)."""

  name = "eager"
  modes = {
    device.EagerDeviceMode.name: device.EagerDeviceMode,
    host.EagerDiskMode.name: host.EagerDiskMode,
    host.EagerHostMode.name: host.EagerHostMode,
  }

  def __init__(self):
    super(EagerEngine, self).__init__()
    # Parameter-server strategies (v2) whose ClusterCoordinator may be
    # writing the variables: every call checks nothing is in flight (and
    # guards wait for what their block scheduled).
    self.ps_strategies = []

  def check_building(self):
    device.check_not_traced("A SnapshotStore")

  def check_chief_only(self, chief_only):
    super(EagerEngine, self).check_chief_only(chief_only)
    if not chief_only:
      raise ValueError(
        "chief_only=False is for graph mode's between-graph replication, "
        "where every worker's store shares the shadows on the ps tasks. An "
        "eager store has no such sharing (under ParameterServerStrategy one "
        "program, the coordinator, runs the store; under "
        "MultiWorkerMirroredStrategy each worker keeps its own copies). "
        "Leave chief_only out."
      )

  def variable_set(
    self, var_list, scope, collection, optimizer, include_global_step
  ):
    return variables.variable_set(
      var_list=var_list,
      scope=scope,
      collection=collection,
      optimizer=optimizer,
      include_global_step=include_global_step,
    )

  def build(self, mode_cls, varset, max_to_keep, name, mode_options):
    name = checks.name(name)
    return table.build(mode_cls, varset, max_to_keep, name, mode_options), name

  def bind(self, varset, name, chief_only):
    super(EagerEngine, self).bind(varset, name, chief_only)
    self.ps_strategies = distributed.coordinated_strategies(
      s.variable for s in varset
    )

  def places(self):
    return ledger.Places()  # no sessions: nothing is bound to a place

  def coordinator(self):
    return multi_worker.coordinator(self.varset, self.store_name)

  # -- running a call ---------------------------------------------------------------

  def session(self, session, what, required=True, writes=False):
    del required, writes
    self.check_not_traced(what, None)
    if session is not None:
      raise TypeError(
        "%s() got session=%r, but this store runs eagerly (it was built "
        "with eager execution on), without sessions. Call it without "
        "session=." % (what, session)
      )
    self.check_no_functions_in_flight(what)
    return None

  def check_not_traced(self, what, fix):
    if traced.is_traced():
      raise traced.refuse(
        self.store_name,
        what,
        fix
        or "call %s outside the tf.function (eagerly, e.g. between steps)"
        % _CALLS.get(what, "store.%s()" % what),
      )

  def check_run(self, fetches, feed_dict, what):
    if not callable(fetches):
      raise TypeError(
        "%s() on an eager store takes a Python callable (e.g. lambda: "
        "model(x), or a tf.function) and calls it with the snapshot's values "
        "in place; got %r. Graph tensors and feed dicts are for graph mode."
        % (what, fetches)
      )
    if feed_dict is not None:
      raise TypeError(
        "%s() on an eager store takes no feed_dict: pass the inputs in the "
        "callable (lambda: model(x))." % what
      )

  def run(self, fetches, feed_dict, session):
    del feed_dict, session
    return fetches()

  def at_snapshot(self, value):
    # A value at a snapshot takes no gradient, as a separate target
    # network's output would take none to the current variables.
    return traced.no_gradient(value)

  def lost(self, error):
    tasks, words = restarts.restarted(error, self.varset.variables)
    return restarts.Restart(tasks, words) if tasks else None

  def traced_calls(self, holdings):
    return traced.TracedCalls(holdings)

  # -- slots ------------------------------------------------------------------------

  def check_graph_call(self, what):
    raise errors.ModeError(
      "store.slots.%s is for graph mode; this store runs eagerly. Instead, "
      "%s." % (what, _EAGER_WAY[what])
    )

  def in_step_snapshot(self, variables_, shadows, tag):
    return in_step.InStepSnapshot(variables_, shadows, tag)

  def snapshot_before(self, update, slot_set, slot, name, if_finite):
    self.check_graph_call("snapshot_before")

  def rewirer(self, primaries, shadows):
    self.check_graph_call("past")

  # -- for training helpers ---------------------------------------------------------

  def functions_in_flight(self):
    return distributed.functions_in_flight(self.ps_strategies)

  def join(self):
    distributed.join(self.ps_strategies)

  def check_no_functions_in_flight(self, what):
    distributed.check_no_functions_in_flight(self.ps_strategies, what)


# How a refusal names a call that is not written store.<what>().
_CALLS = {"__len__": "len(store)", "__contains__": "`tag in store`"}
