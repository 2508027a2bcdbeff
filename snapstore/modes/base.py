"""The interface every copy mode implements, and what they share.

A copy mode decides where snapshot data lives (device shadow variables, numpy
arrays, an HDF5 file) and how it moves. The `SnapshotStore` facade owns
everything else: tags and their order, eviction, sessions, validation, locking
and error reporting. A mode holds snapshot data by tag and never decides which
tag to drop.

Every method that moves data takes the raw `tf.Session` the store resolved
(None on the eager engine). What a mode runs in TensorFlow (graph ops, traced
functions) is built in `__init__` (or on first use), never per call. Each
engine implements the modes (`engines/graph/`, `engines/eager/`); this module,
`slot_book.py`, `host_book.py`, `tiers.py` and `disk.py` are what they share.
"""

import abc


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
  def store_name(self):
    """The name of the store the mode was built for."""
    return self._name

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

  def replicas(self, tag, session):
    """What snapshot `tag` holds of replicas that differ, besides its
    `arrays`: `{index: (array, ...)}` (see `kept_replicas`), for
    `array_writer`'s function, or None when they were equal or the store
    has no variable whose replicas may differ."""
    del tag, session
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

  @abc.abstractmethod
  def array_writer(self, name):
    """A function `(arrays, session, replicas=None)` writing arrays into the
    variables, and `replicas` (what `replicas(tag)` gave) into theirs.

    For snapshots held outside the mode (a spill file's). Whatever it builds
    is built now: call it when the store is built.
    """


# -- replicas that differ (see `snapstore.core.distributed`) -----------------
#
# A snapshot of mirrored variables whose replicas may differ, or of
# sync-on-read ones, keeps besides one array per variable (the first
# replica's, or the aggregate) the components' own values: of a mirrored
# variable whose replicas differed, one array per component after the first;
# of a sync-on-read one, always, one per component
# (`distributed.kept_components`). `{index: (array, ...)}`, by the variable's
# index in key order; None when nothing is kept (no sync-on-read variable and
# all replicas equal, the usual case). `layout` is
# `distributed.replica_layout(variables)`.


def kept_replicas(layout, flags, values, to_array):
  """The replicas a snapshot keeps, from what it read.

  Args:
    layout: `distributed.replica_layout` of the store's variables.
    flags: One bool per entry of `layout`: whether its replicas differed.
    values: The other components' values of those variables, flattened in
      `layout` order (`distributed.replica_reads`); those of a variable
      whose flag is False are not looked at.
    to_array: Makes a store-owned numpy array of one of `values`.

  Returns:
    `{index: (array, ...)}`, or None when no replicas differed.
  """
  kept = {}
  start = 0
  for (index, count), flag in zip(layout, flags):
    if flag:
      kept[index] = tuple(to_array(v) for v in values[start : start + count])
    start += count
  return kept or None


def replica_values(layout, arrays, replicas):
  """What a restore writes into each kept component of the variables in
  `layout` (flattened, `distributed.kept_components`): the kept value, or
  the snapshot's own array where none is kept (only mirrored variables'
  replicas that were equal: a sync-on-read variable's are always kept)."""
  out = []
  for index, count in layout:
    kept = replicas.get(index)
    out.extend(kept if kept is not None else [arrays[index]] * count)
  return out


def replicas_nbytes(replicas):
  """Bytes of a snapshot's kept replicas (None for none)."""
  if not replicas:
    return 0
  return sum(a.nbytes for kept in replicas.values() for a in kept)
