"""The eager engine: a store over TensorFlow 2.x variables, no sessions.

Its copy modes run traced functions built once, when the store is built;
`evaluate_with` calls a Python function with a snapshot's values in place,
and calls traced into the user's `tf.function` look their snapshot up when
it runs (`engines/eager/traced.py`). See `engines/base.py` for the
interface.
"""

from snapstore import _tf
from snapstore.core import checks
from snapstore.core import places as ledger
from snapstore import errors
from snapstore.engines import base
from snapstore.engines.eager import device
from snapstore.engines.eager import distributed
from snapstore.engines.eager import host
from snapstore.engines.eager import in_step
from snapstore.engines.eager import multi_worker
from snapstore.engines.eager import past
from snapstore.engines.eager import restarts
from snapstore.engines.eager import structure
from snapstore.engines.eager import traced
from snapstore.engines.eager import variables
from snapstore.modes import table

# What an eager store offers instead of each graph-only call of its slots.
_EAGER_WAY = {
  "initializer": "eager shadows are initialized when the store makes them",
  "snapshot_op": "call store.snapshot() (one traced function), or "
  "store.slots.snapshot_in_step() inside your tf.function",
  "restore_op": "call store.restore() (one traced function)",
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
    # What the store was built over, for where each variable sits in it
    # (`structure`), found on first use.
    self._root = self._optimizer = self._paths = None
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
    found = variables.variable_set(
      var_list=var_list,
      scope=scope,
      collection=collection,
      optimizer=optimizer,
      include_global_step=include_global_step,
    )
    self._root, self._optimizer = var_list, optimizer
    return found

  def structure(self):
    """`{key: path}`: where each variable sits in what the store was built
    over (`engines/eager/structure.py`)."""
    if self._paths is None:
      self._paths = structure.structure_paths(
        self._root, self._optimizer, self.varset
      )
    return self._paths

  def arrays_from(self, source, session, what):
    """`{key: numpy array}` of the variables of `source`, a second model of
    the store's structure: a model, a layer or a `tf.Module` (matched by
    where each variable sits in it, see `structure`), or a list of
    variables (by position, in the store's order).

    Raises:
      TypeError: Neither; or a model when the store was built over a list.
      IncompatibleSnapshotError: The variables do not pair up (a variable
        with no place, or a count that differs), all named.
    """
    del session
    if structure.has_structure(source):
      if not structure.has_structure(self._root):
        raise TypeError(
          "%s() got %s, but store %r was built over a %s, which has no "
          "structure to match a model's variables by. Pass a list of its "
          "variables in the order of store.keys (e.g. model.weights, if the "
          "store's var_list was another model's weights)."
          % (
            what,
            _described(source),
            self.store_name,
            type(self._root).__name__,
          )
        )
      other = variables.variable_set(var_list=source)
      pairs, problems = structure.matched(
        self.structure(), structure.structure_paths(source, None, other)
      )
      if problems:
        raise errors.IncompatibleSnapshotError(
          "%s(): %s does not have the structure of store %r's variables: "
          "%s. Pass a model built by the same code as the store's."
          % (what, _described(source), self.store_name, "; ".join(problems))
        )
      found = [(key, other[pairs[key]].variable) for key in self.varset.keys]
    elif isinstance(source, (list, tuple)):
      other = variables.variable_set(var_list=list(source))
      checks.same_count(what, len(other), self.store_name, len(self.varset))
      found = list(zip(self.varset.keys, other.variables))
    else:
      raise TypeError(
        "%s() takes a dict {key: numpy array} (store.arrays() gives one), "
        "or a second model of the store's structure: a Keras model or "
        "tf.Module (matched by where each variable sits in it), or a list "
        "of variables in the order of store.keys; got %s."
        % (what, _described(source))
      )
    return dict((key, distributed.read(v).numpy()) for key, v in found)

  def trackable(self, shadows):
    """A trackable object holding a slot's `shadows` along the structure of
    what the store was built over (`structure.trackable`)."""
    return structure.trackable(
      self.structure(), self.varset.keys, shadows, _tf.auto_trackable
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

  def past(self, outputs, slot, slot_set):
    if not callable(outputs):
      raise TypeError(
        "store.slots.past() on an eager store takes a function of the "
        "model (e.g. lambda x: model(x)) and returns one that computes it "
        "from the slot's values; got %r. (Tensors to rewire are what it "
        "takes in graph mode.)" % (outputs,)
      )
    return past.PastFunction(
      outputs, self.varset.specs, slot_set.shadows(slot), self.store_name, slot
    )

  # -- for training helpers ---------------------------------------------------------

  def functions_in_flight(self):
    return distributed.functions_in_flight(self.ps_strategies)

  def join(self):
    distributed.join(self.ps_strategies)

  def check_no_functions_in_flight(self, what):
    distributed.check_no_functions_in_flight(self.ps_strategies, what)


# How a refusal names a call that is not written store.<what>().
_CALLS = {"__len__": "len(store)", "__contains__": "`tag in store`"}


def _described(obj):
  name = getattr(obj, "name", None)
  return "%s %r" % (type(obj).__name__, name) if name else repr(obj)
