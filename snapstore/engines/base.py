"""The engine interface: what graph mode and eager execution each do their own way.

A store runs on one engine, chosen once when it is built
(`snapstore.engines.choice.new_engine`): graph mode (a TF1-style graph whose calls run
in a `tf.Session`, `engines/graph/`) or eager execution (TensorFlow 2.x, no
sessions, `engines/eager/`). The store, its parts (`store.slots`,
`store.files`) and the training helpers ask the engine, through
`store.engine`, for everything that differs; none of them branches on which
engine it is.

An engine is made for one store: `bind` gives it the store's variables, and
from then on it answers for that store (its sessions, its parameter-server
strategies, its multi-worker coordinator).

What an engine does:

- **Building a store**: `check_building`, `check_chief_only`, `mode_class`
  (its own implementation of each copy mode, by name), `variable_set`
  (a `var_list`, scope, collection, model or optimizer resolved into a
  `core.varset.VariableSet`), `build` (the copy mode), `bind`, `places`,
  `coordinator`.
- **Running a call**: `session` (the session a call runs in, or None),
  `check_not_traced`, `check_run` and `run` (what `evaluate_with`
  evaluates), `at_snapshot` (a value computed at a snapshot), `lost` (a
  failure that lost the variables for good), `traced_calls`.
- **Slots**: `check_graph_call`, `in_step_snapshot`, `snapshot_before`,
  `past` and `rewired` (the calls only one engine has refuse, naming the
  other's way).
- **For training helpers**: `name`, `functions_in_flight`, `join`,
  `check_no_functions_in_flight` (parameter-server training, v2).
"""

import abc

from snapstore.modes import table


class Engine(abc.ABC):
  """One engine, made for one store (see module doc)."""

  # "graph" or "eager"; a training helper picks its per-engine part by it.
  name = None
  # {mode name: copy mode class}: the engine's implementation of each mode.
  modes = None

  def __init__(self):
    self.varset = None
    self.store_name = None

  # -- building a store -------------------------------------------------------------

  @abc.abstractmethod
  def check_building(self):
    """Refuses building a store where the engine cannot (eagerly: in a trace)."""

  def check_chief_only(self, chief_only):
    """Checks the store's `chief_only` argument.

    Raises:
      TypeError: Not a bool.
    """
    if not isinstance(chief_only, bool):
      raise TypeError(
        "chief_only must be True or False, got %r." % (chief_only,)
      )

  def mode_class(self, name):
    """The engine's copy mode class registered under `name`.

    Raises:
      ValueError: No mode has that name; the message lists the valid ones.
    """
    return table.get(self.modes, name)

  @abc.abstractmethod
  def variable_set(
    self, var_list, scope, collection, optimizer, include_global_step
  ):
    """The `VariableSet` a store over these arguments covers."""

  @abc.abstractmethod
  def build(self, mode_cls, varset, max_to_keep, name, mode_options):
    """(the copy mode, the store's name): the mode built for a store."""

  def bind(self, varset, name, chief_only):
    """Makes this engine the one of the store over `varset` named `name`."""
    self.varset = varset
    self.store_name = name
    self.chief_only = chief_only

  @abc.abstractmethod
  def places(self):
    """The store's `core.places.Places` ledger."""

  @abc.abstractmethod
  def coordinator(self):
    """The store's multi-worker `core.coordination.Coordinator`, or None."""

  # -- running a call ---------------------------------------------------------------

  @abc.abstractmethod
  def session(self, session, what, required=True, writes=False):
    """The raw session call `what` runs in; None if not `required` and
    none is given, and always None on an engine without sessions.

    Args:
      session: What the call was given.
      what: The call, for messages.
      required: Whether the call needs a session (graph mode: data calls of
        host and disk stores do not).
      writes: Whether the call writes snapshots or variables (graph mode:
        refused on a worker that is not the chief, see `chief_only`).
    """

  def check_not_traced(self, what, fix):
    """Refuses call `what` while a `tf.function` is traced (eagerly)."""

  @abc.abstractmethod
  def check_run(self, fetches, feed_dict, what):
    """Refuses what `run` could not run, before anything moves."""

  @abc.abstractmethod
  def run(self, fetches, feed_dict, session):
    """Runs what `evaluate_with` evaluates."""

  def at_snapshot(self, value):
    """`value`, computed with a snapshot's values in place, as returned."""
    return value

  def lost(self, error):
    """What the store says when `error` (an OpError) tells that tasks
    holding the variables lost them for good (a parameter server
    restarted): an object with `note(tag)` and `error(what, tag, device,
    others, wrote)` (`engines/eager/restarts.py`); else None."""
    del error
    return None

  # Whether values a failed put-back left can be written back only in a
  # session (graph mode: the next call that has one).
  pending_needs_session = False

  def traced_calls(self, holdings):
    """The store's calls traced into a `tf.function`, or None."""
    del holdings
    return None

  # -- slots ------------------------------------------------------------------------

  @abc.abstractmethod
  def check_graph_call(self, what):
    """Refuses `store.slots.<what>`, a graph-only call, on an eager store."""

  @abc.abstractmethod
  def in_step_snapshot(self, variables, shadows, tag):
    """The eager in-step snapshot into `shadows` (`snapshot_in_step`)."""

  @abc.abstractmethod
  def snapshot_before(self, update, slot_set, slot, name, if_finite):
    """Graph mode's in-step snapshot: the train op (`snapshot_before`)."""

  @abc.abstractmethod
  def past(self, outputs, slot, slot_set):
    """`store.slots.past(outputs, slot)`: what computes `outputs` from slot
    `slot` of `slot_set` instead of the variables (graph mode: rewired
    tensors; eagerly: a function, `outputs` being one)."""

  @abc.abstractmethod
  def arrays_from(self, source, session, what):
    """`{key: numpy array}` of a second model's variables, paired with the
    store's (`store.load_arrays(model)`)."""

  @abc.abstractmethod
  def trackable(self, shadows):
    """A trackable object of a slot's `shadows`, for a checkpoint
    (`store.slots.trackable`)."""

  def rewired(self, fetches, feed_dict, slot):
    """(fetches, feed_dict) reading slot `slot`, built beforehand by `past`,
    for `evaluate_with`; None to swap the snapshot in instead."""
    del fetches, feed_dict, slot
    return None

  # -- for training helpers ---------------------------------------------------------

  def functions_in_flight(self):
    """True while functions scheduled on a `ClusterCoordinator` of the
    store's variables may run (parameter-server training, v2)."""
    return False

  def join(self):
    """Waits for the functions scheduled on the store's `ClusterCoordinator`."""

  def check_no_functions_in_flight(self, what):
    """Refuses call `what` while scheduled functions may write the variables."""
