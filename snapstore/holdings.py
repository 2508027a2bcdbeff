"""What a store holds and where: the state its facade and its parts share.

`SnapshotStore` is a small facade over three parts: the snapshot lifecycle
(`store.py`), the calls of device slots (`store.slots`, `slots.py`) and the
files (`store.files`, `file_io.py`). Each of them acts through the store's
`Holdings`: its engine, its variables, its copy mode, the catalog of its
tags, where each device snapshot lives (`core/places.py`), and the lock that
serializes every call. The steps every call shares are written here
once: resolving the session, checking the store is open and writing back
what a failed `evaluate_with` left, finding a held tag usable from a session,
storing arrays as a snapshot, and recording a new one.

The mode declares what it can do, and only through two attributes: `slot_set`
(device slots, or None) and `tiers` (a spill file, or None); see
`modes/base.py`. What differs between graph mode and eager execution (the
session a call runs in, what `evaluate_with` runs, restarts, traced calls)
the engine answers (`engines/base.py`).
"""

import collections.abc
import threading
import time

import numpy as np

from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import catalog
from snapstore.core import failures
from snapstore import errors

_NOTHING = object()


class Holdings(object):
  """A store's engine, variables, mode, tags and owners, and the steps calls share.

  Args:
    engine: The store's engine (`engines/base.py`), bound to its variables.
    mode: The store's `CopyMode`.
  """

  def __init__(self, engine, mode):
    self.engine = engine
    self.varset = engine.varset
    self.mode = mode
    self.name = engine.store_name
    self.lock = threading.RLock()
    self.catalog = catalog.Catalog(mode.capacity)
    for tag, when in mode.adopted():  # snapshots in an existing spill file
      self.catalog.adopt(tag, when)
    self.places = engine.places()  # where device snapshots live
    # Under MultiWorkerMirroredStrategy: the check every restore makes that
    # all workers restore the same snapshot (core/coordination.py).
    self.coordinator = engine.coordinator()
    self.closed = False
    self._pending = _NOTHING  # current values a failed put-back left
    self._pending_depth = 0  # how many swaps deep it was set aside
    self._swaps = 0  # evaluate_with swaps in progress, one inside another

  @property
  def graph(self):
    return self.varset.graph

  # -- sessions and the state of the store ------------------------------------

  def session(self, session, what, required=True, writes=False):
    """The raw session for call `what`; None if not `required` and none given.

    None on an engine without sessions, which refuses one. A call that
    `writes` (snapshots or variables) is refused on a task of a
    between-graph cluster that is not the chief (graph mode, `chief_only`).
    """
    return self.engine.session(session, what, required, writes)

  def check_not_traced(self, what, fix=None):
    """Refuses call `what` while a `tf.function` is traced (eagerly).

    Raises:
      TracedCallError: Naming `fix`, or by default the call made outside
        the function.
    """
    self.engine.check_not_traced(what, fix)

  def data_session(self, session, what, writes=False):
    """The session for a call that only moves data: none in host and disk mode."""
    return self.session(
      session, what, required=self.mode.data_needs_session, writes=writes
    )

  def check_open(self):
    if self.closed:
      raise errors.StoreClosedError("The store %r is closed." % self.name)
    self.mode.check()  # a failed background write (spill file), once
    self.drop_gone()

  def prepare(self, sess):
    """Checks the store is open and writes back pending current values."""
    self.check_open()
    if self._pending is _NOTHING or (
      sess is None and self.engine.pending_needs_session
    ):
      return
    with failures.translated("pending"):
      self.mode.unstash(self._pending, sess)
    self._pending = _NOTHING

  def put_back(self, token, sess, lost=None):
    """Writes back values `mode.stash` set aside; kept for later if it fails
    (unless `lost`, as for `failures.translated`, says they are gone).

    Swaps nest (an `evaluate_with` inside the evaluated function): a put-back
    that succeeds leaves the variables as they were before its own swap, so
    a put-back still pending from a swap nested in it is obsolete: dropped.
    """
    depth = self._swaps
    self._swaps -= 1

    def keep():  # written back by the next call's prepare, or recover()
      self._pending = token
      self._pending_depth = depth
      return ""

    with failures.translated("put_back", note=keep, lost=lost):
      self.mode.unstash(token, sess)
    if self._pending is not _NOTHING and self._pending_depth > depth:
      self._pending = _NOTHING

  def swapped(self, fetches, feed_dict, tag, sess):
    """`evaluate_with`'s swap: runs `fetches` with snapshot `tag` loaded into
    the variables, then puts the current values back (also when the run
    raises). Eagerly, the result takes no gradient, as a separate target
    network's output would take none to the current variables."""
    with failures.translated("set_aside", lost=self.lost(tag, "evaluate_with")):
      token = self.mode.stash(sess)
    self._swaps += 1
    wrote = self.lost(tag, "evaluate_with", wrote=True)
    try:
      with failures.translated(
        "load", tag, self.mode.uninitialized, lost=wrote
      ):
        self.mode.restore(tag, sess)
      value = self.run(fetches, feed_dict, sess, "evaluate_with")
    finally:
      self.put_back(token, sess, wrote)
    return self.engine.at_snapshot(value)

  def tags_to_evaluate(self, tags):
    """`evaluate_each`'s `tags`: a list of them, by default every one held.

    Raises:
      UnknownTagError: No snapshots are held.
      TypeError: Not a list (or other iterable) of tags.
    """
    if tags is None:
      tags = self.catalog.tags()
      if not tags:
        self.catalog.existing(None)  # the "no snapshots yet" error
      return tags
    if isinstance(tags, (str, bytes)) or not isinstance(
      tags, collections.abc.Iterable
    ):
      raise TypeError(
        "evaluate_each() takes a list of tags, got tags=%r. For one "
        "snapshot pass tags=[%r], or call evaluate_with(..., tag=%r)."
        % (tags, tags, tags)
      )
    return list(tags)

  def run(self, fetches, feed_dict, sess, what):
    """Runs what `evaluate_with` evaluates: `sess.run`, or eagerly a call."""
    self.check_run(fetches, feed_dict, what)
    return self.engine.run(fetches, feed_dict, sess)

  def check_run(self, fetches, feed_dict, what):
    """Refuses what `run` could not run, before anything moves."""
    self.engine.check_run(fetches, feed_dict, what)

  # -- tags ----------------------------------------------------------------------

  def existing(self, tag, sess, what, allow_default=True):
    """`tag` (None: the newest) if held, and usable from `sess` (None: no data use).

    Raises:
      UnknownTagError: As `Catalog.existing`.
      SessionMismatchError: A device snapshot held elsewhere, or dropped
        because its session or cluster lost it.
    """
    self.drop_gone()
    if tag not in self.catalog and (tag is not None or not len(self.catalog)):
      note = self.places.dropped_note(tag)
      if note:
        raise errors.SessionMismatchError(
          note if tag is not None else "The store holds no snapshots. " + note
        )
    tag = self.catalog.existing(tag, allow_default)
    if what == "restore" and self.coordinator is not None:
      self.coordinator.check(tag)  # before anything is written
    place = self.place(sess)
    if place is not None and self.mode.tier(tag) == "device":
      lost = self.places.check(tag, place, what)
      if lost:
        self.forget(tag, lost)
        raise errors.SessionMismatchError(lost)
    return tag

  def victim(self, tag):
    # With a spill file, spilled snapshots may not count (see modes/tiers.py).
    return self.catalog.victim(tag, self.mode.counts_toward_capacity)

  def record(self, tag, victim, place):
    """Records snapshot `tag`, just written at `place` (None: no session)."""
    self.catalog.record(tag, victim, time.time())
    if self.coordinator is not None:
      self.coordinator.recorded(tag)
    self.mode.settle(self.catalog.infos())
    self.places.keep_only(set(self.catalog.tags()))
    if (
      place is not None
      and self.mode.tier(tag) == "device"
      and tag not in self.catalog.pinned()
    ):
      self.places.bind(tag, place)
    else:
      self.places.unbind(tag)
    return tag

  def lost_note(self):
    """After a failed write into the mode: drops the tags it lost, and says so."""
    return catalog.lost_note(self.catalog.keep_only(set(self.mode.tags())))

  def put(self, values, tag, session, what):
    """Stores `values` (checked arrays in key order) as snapshot `tag`."""
    sess = self.data_session(session, what, writes=True)
    with self.lock:
      self.prepare(sess)
      tag = self.catalog.new_tag(tag)
      victim = self.victim(tag)
      place = self.place(sess)
      with failures.translated("store", tag, note=self.lost_note):
        self.mode.put(tag, values, sess, victim)
      return self.record(tag, victim, place)

  def put_mapping(self, arrays, tag, session, what):
    """Stores `arrays`, a mapping `{key: numpy array}` (`load_arrays`), as
    snapshot `tag`: checked in full first, keys, shapes and dtypes."""
    declared = _declared(arrays, what + "()")
    self.varset.check_declared(
      declared,
      "The dict of arrays",
      hint="A dict keys each array by its variable's key (store.arrays() "
      "gives one); to store another model's values, pass the model itself: "
      "store.%s(model) pairs its variables with the store's." % what,
    )
    values = [np.asarray(arrays[k]) for k in self.varset.keys]
    return self.put(values, tag, session, what)

  def read(self, tag, sess, what):
    """Snapshot `tag` as arrays in key order (`arrays`, `save_npz`)."""
    with failures.translated(
      "read", tag, self.mode.uninitialized, what, lost=self.lost(tag, what)
    ):
      return self.mode.arrays(tag, sess)

  def lost(self, tag, what, wrote=False):
    """For `failures.translated` in call `what` of held snapshot `tag`: a
    function from an OpError to the error to raise instead (None: none)
    when it says parameter servers of the variables restarted
    (`engines/eager/restarts.py`), which first drops the device snapshots.
    Graph mode finds restarts before anything runs (`existing`).
    `wrote`: whether the step writes variables."""

    def check(error):
      restart = self.engine.lost(error)
      if restart is None:
        return None
      device = self.mode.tier(tag) == "device"
      pinned = self.catalog.pinned()
      dropped = [
        t
        for t in self.catalog.tags()
        if self.mode.tier(t) == "device" and t not in pinned
      ]
      for t in dropped:
        self.forget(t, restart.note(t))
      others = [t for t in dropped if t != tag]
      return restart.error(what, tag, device, others, wrote)

    return check

  # -- where device snapshots live (engines/graph/places.py) ------------------------------

  def place(self, sess):
    """Where `sess` keeps variables, if the store can hold device snapshots."""
    if sess is None or self.mode.slot_set is None:
      return None
    return self.places.of(sess)

  def drop_gone(self):
    """Drops the device snapshots of local sessions that are closed or gone."""
    for tag, why in self.places.gone():
      self.forget(tag, why)

  def forget(self, tag, why):
    if tag in self.catalog and self.mode.tier(tag) == "device":
      self.mode.delete(tag)
      self.catalog.drop(tag)
      self.places.drop(tag, why)
    else:
      self.places.unbind(tag)


def check_not_values(source, what):
  """Refuses a list of arrays where a mapping (or a list of variables) is
  due: the positions would be guessed.

  Raises:
    TypeError: `source` is a list or tuple holding numpy arrays or numbers.
  """
  if isinstance(source, (list, tuple)) and any(
    isinstance(x, (np.ndarray, np.generic, int, float)) for x in source
  ):
    raise TypeError(
      "%s takes a dict {key: numpy array}, got %s of arrays. For values in "
      "the order of store.keys (a list var_list's order, a model's "
      "get_weights() order), pass dict(zip(store.keys, values)); for a "
      "second model's values, pass the model (or its variables) itself."
      % (what, type(source).__name__)
    )


def _declared(arrays, what):
  """`{key: (shape, dtype)}` of `arrays`, a mapping of numeric arrays.

  Args:
    arrays: The mapping the caller passed (`load_arrays`).
    what: The call, for messages ("load_arrays()").

  Raises:
    TypeError: A value that is a tensor, a variable, an op or not a numeric
      array.
  """
  declared = {}
  for key, value in arrays.items():
    kind = (
      "a variable"
      if isinstance(value, tf_variables.Variable)
      else "a tensor"
      if isinstance(value, tf.Tensor)
      else "an op"
      if isinstance(value, tf.Operation)
      else None
    )
    if kind:
      raise TypeError(
        "%s takes numpy arrays; %r is %s (%s). Evaluate it first "
        "(session.run), or take a snapshot of the variables with snapshot()."
        % (what, key, kind, value.name)
      )
    value = np.asarray(value)
    if value.dtype.hasobject:
      raise TypeError(
        "%s takes numeric arrays; %r holds Python "
        "objects (%s)." % (what, key, type(arrays[key]).__name__)
      )
    declared[key] = (value.shape, value.dtype)
  return declared
