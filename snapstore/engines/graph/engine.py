"""The graph engine: a store over a TF1-style graph, whose calls run in sessions.

Its copy modes build their ops when the store is built, under the store's name
scope and outside the control dependencies of the block the store is built
in; every call afterwards runs them in the session it is given (or the
default session). See `engines/base.py` for the interface.
"""

from snapstore._tf import tf
from snapstore.core import checks
from snapstore.core import distributed
from snapstore.core import places as ledger
from snapstore import errors
from snapstore.engines import base
from snapstore.engines.graph import between_graph
from snapstore.engines.graph import device
from snapstore.engines.graph import host
from snapstore.engines.graph import in_step
from snapstore.engines.graph import multi_worker
from snapstore.engines.graph import places
from snapstore.engines.graph import rewire
from snapstore.engines.graph import sessions
from snapstore.engines.graph import variables
from snapstore.modes import table


class GraphEngine(base.Engine):
  """Graph mode (see module doc)."""

  name = "graph"
  modes = {
    device.DeviceMode.name: device.DeviceMode,
    host.GraphDiskMode.name: host.GraphDiskMode,
    host.HostMode.name: host.HostMode,
  }
  pending_needs_session = True

  def __init__(self):
    super(GraphEngine, self).__init__()
    self._rewirer = None  # made by the first store.slots.past() call

  def check_building(self):
    pass

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
    # The store's ops run on their own: they must not inherit the control
    # dependencies (a train op) of the block the store is built in.
    with varset.graph.as_default(), tf.control_dependencies(
      None
    ), tf.name_scope(name) as scope_name:
      scope_name = scope_name.rstrip("/")
      built = table.build(
        mode_cls, varset, max_to_keep, scope_name, mode_options
      )
    return built, scope_name

  def places(self):
    varset = self.varset
    return ledger.Places(lambda session: places.Place.of(session, varset))

  def coordinator(self):
    return multi_worker.coordinator(self.varset, self.store_name)

  # -- running a call ---------------------------------------------------------------

  def session(self, session, what, required=True, writes=False):
    if not required and session is None and tf.get_default_session() is None:
      return None
    raw = sessions.resolve(session, self.varset.graph, what)
    if writes and self.chief_only:
      between_graph.check(raw, self.varset, what)
    return raw

  def check_run(self, fetches, feed_dict, what):
    pass

  def run(self, fetches, feed_dict, session):
    return session.run(fetches, feed_dict=feed_dict)

  # -- slots ------------------------------------------------------------------------

  def check_graph_call(self, what):
    pass

  def in_step_snapshot(self, variables_, shadows, tag):
    raise errors.ModeError(
      "snapshot_in_step() is the eager engine's in-step snapshot; in graph "
      "mode use store.slots.snapshot_before(update, slot, tag)."
    )

  def snapshot_before(self, update, slot_set, slot, name, if_finite):
    # A distributed variable is written through its components: those are
    # what the update must leave alone until the copy has run.
    parts = [
      p for v in self.varset.variables for p in distributed.components(v)
    ]
    return in_step.build(update, slot_set, slot, parts, name, if_finite)

  def past(self, outputs, slot, slot_set):
    """Tensors computing `outputs` from slot `slot` (`rewire.Rewirer.past`)."""
    if callable(outputs) and not isinstance(outputs, (tf.Tensor, list, dict)):
      raise TypeError(
        "store.slots.past() in graph mode takes the tensors to compute from "
        "the slot (e.g. q = model(x); store.slots.past(q, slot)), and "
        "returns their rewired copies; got the function %r. (A function "
        "is what past() takes on an eager store.)" % (outputs,)
      )
    if self._rewirer is None:
      # A distributed variable is read through its components (each
      # replica its own, a cross-replica read the primary or all of them):
      # each component maps to its own shadow, so every copied read reads
      # the shadow of the component its original read.
      self._rewirer = rewire.Rewirer(
        self.store_name,
        [p for v in self.varset.variables for p in distributed.components(v)],
        [
          [
            shadow
            for parts in slot_set.component_shadows(k, "past")
            for shadow in parts
          ]
          for k in range(slot_set.num_slots)
        ],
      )
    return self._rewirer.past(outputs, slot)

  def arrays_from(self, source, session, what):
    """`{key: numpy array}` of `source`, a list of variables of the store's
    graph in the order of the store's keys, read in `session`.

    Raises:
      TypeError: Not a list of variables.
      IncompatibleSnapshotError: A count that differs from the store's.
      NoSessionError: No session to read them in.
    """
    if not isinstance(source, (list, tuple)):
      raise TypeError(
        "%s() takes a dict {key: numpy array} (store.arrays() gives one), "
        "or a list of variables in the order of store.keys; got %r. (Keys "
        "are names relative to the store's scope, so a store over another "
        "scope's model of the same structure has the same keys: "
        "load_arrays(other_store.arrays()).)" % (what, source)
      )
    others = variables.variable_set(var_list=list(source))
    checks.same_count(what, len(others), self.store_name, len(self.varset))
    values = self.session(session, what).run(list(others.variables))
    return dict(zip(self.varset.keys, values))

  def trackable(self, shadows):
    raise errors.ModeError(
      "store.slots.trackable() is for eager stores (object-based "
      "checkpoints). In graph mode, build the store with saveable=True "
      "(the shadows join GLOBAL_VARIABLES, so tf.train.Saver() saves "
      "them), or add list(store.slots.shadows(slot).values()) to your "
      "Saver's var_list."
    )

  def rewired(self, fetches, feed_dict, slot):
    if self._rewirer is None:
      return None
    return self._rewirer.lookup(fetches, feed_dict, slot)
