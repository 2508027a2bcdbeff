"""The interface every copy mode implements, and what they share.

A copy mode decides where snapshot data lives (device shadow variables, numpy
arrays, an HDF5 file) and how it moves. The `SnapshotStore` facade owns
everything else: tags and their order, eviction, sessions, validation, locking
and error reporting. A mode holds snapshot data by tag and never decides which
tag to drop.

Every method that moves data takes the raw `tf.Session` the store resolved.
Graph ops are built in `__init__` only; methods run them.
"""

import abc

from snapstore.core import copies
from snapstore.core import sessions


class CopyMode(abc.ABC):
  """Where and how a store keeps its snapshots.

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: How many snapshots the mode must be able to hold, already
      validated by the store; None for no bound.
    name: The store's name, unique in its graph; shadow variables and ops are
      named after it.
  """

  name = None
  # max_to_keep when the user gives none, and whether the mode can hold an
  # unbounded number of snapshots (max_to_keep=0).
  default_max_to_keep = 1
  allows_unbounded = False
  # Whether `arrays` and `put` run in TensorFlow (and so need a session).
  data_needs_session = True

  # What the mode can do beyond the interface below, declared here and read
  # nowhere else: the parts it has, or None. `slot_set`: device slots (see
  # `DeviceMode`; the store's `store.slots` stands on it). `tiers`: a spill
  # file under the mode (see `TieredMode`; `store.files.spill`, `flush`).
  slot_set = None
  tiers = None

  def __init__(self, varset, max_to_keep, name):
    self._varset = varset
    self._max_to_keep = max_to_keep
    self._name = name

  @property
  def initializer(self):
    """An op initializing what the mode keeps in the graph (may be a no-op)."""
    return self._initializer

  @property
  def capacity(self):
    """The most snapshots the mode holds at once, or None for no bound."""
    return self._max_to_keep

  @abc.abstractmethod
  def tags(self):
    """The tags the mode holds, in no particular order."""

  @property
  @abc.abstractmethod
  def nbytes(self):
    """Bytes the mode holds for snapshots, in its own memory (device or host)."""

  @abc.abstractmethod
  def take(self, tag, session, victim=None):
    """Stores the variables' current values under `tag`.

    Args:
      tag: The tag to store under; replaced if the mode holds it.
      session: A raw `tf.Session`.
      victim: When the mode is full, a held tag whose storage may be reused. It
        is dropped once the new snapshot is stored.

    Raises:
      tf.errors.OpError: The copy failed. The variables are unchanged; any tag
        whose storage was being overwritten is dropped (`tags()` tells).
    """

  @abc.abstractmethod
  def put(self, tag, arrays, session, victim=None):
    """Like `take`, but stores `arrays` (validated numpy arrays in spec order)."""

  @abc.abstractmethod
  def restore(self, tag, session):
    """Writes the snapshot `tag` into the variables. Idempotent."""

  @abc.abstractmethod
  def arrays(self, tag, session):
    """The snapshot `tag` as numpy arrays in spec order (never to be written)."""

  def replicas(self, tag):
    """What snapshot `tag` keeps of replicas that differ, besides its
    `arrays` (see `snapstore.modes.host_book`), for `array_writer`'s
    function; None when nothing (always, in modes that copy every replica
    as it is)."""
    del tag
    return None

  @abc.abstractmethod
  def delete(self, tag):
    """Drops the snapshot `tag`."""

  @abc.abstractmethod
  def stash(self, session):
    """Sets the variables' current values aside; returns a token for `unstash`."""

  @abc.abstractmethod
  def unstash(self, token, session):
    """Writes values set aside by `stash` back into the variables. Idempotent."""

  closed = False

  def close(self):
    """Releases what the mode holds outside the graph. Safe to call twice.

    Sets `closed`; a mode that must not drop what it holds (a spill file that
    cannot be written) raises instead and stays open.
    """
    self.closed = True

  # -- tiers (see modes/tiers.py); a mode without a spill file has one -------

  def tier(self, tag):
    """Where snapshot `tag` is: "device", "host" or "file"."""
    del tag
    return self.name

  def counts_toward_capacity(self, tag):
    """Whether snapshot `tag` counts toward `capacity` (and can be evicted)."""
    del tag
    return True

  def adopted(self):
    """[(tag, time)] of snapshots the mode found when it was built, oldest first."""
    return []

  def settle(self, order):
    """Called after each new snapshot with the store's `SnapshotInfo`s, oldest first."""

  def check(self):
    """Raises what went wrong in the background since the last call."""

  def uninitialized(self, error):
    """The device slot whose uninitialized variables `error` is about, or None."""
    del error
    return None

  def flush(self):
    """Waits for background work; raises as `check`."""

  def array_writer(self, name):
    """A function `(arrays, session, replicas=None)` writing arrays into the
    variables, and `replicas` (what `replicas(tag)` gave) into theirs.

    For snapshots held outside the mode (a spill file's). Its ops are built
    now: call it when the store is built.
    """
    feeder = copies.Feeder(self._varset.specs, name + "_feed")
    op = feeder.assign_to(self._varset.variables, name)

    def run(arrays, session, replicas=None):
      del replicas  # this mode keeps none (see `replicas`)
      self._feed(session, op, feeder, arrays)

    return run

  def _run(self, session, fetches):
    return sessions.run_cached(session, fetches)

  def _feed(self, session, op, feeder, arrays):
    """Runs `op`, which consumes `feeder`'s placeholders, fed with `arrays`."""
    return sessions.run_cached(
      session, op, feeder.placeholders, feeder.values(arrays)
    )
