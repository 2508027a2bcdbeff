"""Disk mode: host snapshots under a memory budget, the oldest spilled to HDF5.

Snapshots land in host memory first, exactly as in host mode (one
`session.run`; `snapshot()` returns after that copy). After each new snapshot,
while the host tier holds more than `memory_budget` bytes, its oldest snapshot
is handed to the background writer, which writes it to the spill file (see
`snapstore.spill.file`); it leaves memory once the write is committed. Host memory
holds at most `memory_budget` bytes in the host tier plus the snapshots on
their way to the file: at most `max_pending` queued (a snapshot that needs
another one queued waits for the writer: back-pressure) and those whose write
failed (kept, reported by the next call, written again with the next spill).

A failed write (a full disk) keeps its snapshot in host memory, over the
budget: the `SpillError` of the next call says by how much. `close()` writes
every snapshot still in memory to the file first, so a store reopened on the
file lists them all; if it cannot, it raises and stays open (see
`TieredMode.close`). At interpreter exit, what it cannot write is lost with the
process and named on stderr (see `TieredMode.close_at_exit`).

`max_to_keep` bounds the snapshots of all tiers together (default: no bound);
when it is reached the oldest snapshot is deleted, from the file if it is
there. `spill(tag)` writes a snapshot before the budget asks for it.

    store = snapstore.SnapshotStore(scope="net", mode="disk",
                                    spill_path="/data/run7.h5",
                                    memory_budget=2 << 30)
    store.snapshot(session=sess)   # host copy; older ones go to the file
    store.restore(3, session=sess) # from memory or the file, bit-exact
    store.close()                  # finishes the queued writes
"""

from snapstore.core import checks
from snapstore.modes import tiers


class DiskMode(tiers.TieredMode):
  """Host snapshots under a byte budget over an HDF5 spill file (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: The most snapshots kept in all tiers, or None for no bound.
    name: The store's name.
    spill_path: The spill file (required); see `TieredMode`.
    memory_budget: Bytes of snapshots the host tier may hold (required, >= 0;
      0 writes every snapshot to the file at once).
    compression, compression_opts, max_pending, durable: As for
      `TieredMode`.

  Raises:
    ValueError: A missing `spill_path` or `memory_budget`, or a bad option.
    SnapshotFileError, IncompatibleSnapshotError: As for `TieredMode`.
  """

  name = "disk"
  # The host tier's mode class, each engine's own host mode: set by the
  # engine's disk mode (`engines/graph/host.py`, `engines/eager/host.py`).
  fast_tier = None
  default_max_to_keep = None
  allows_unbounded = True
  data_needs_session = False

  def __init__(
    self,
    varset,
    max_to_keep,
    name,
    spill_path=None,
    memory_budget=None,
    compression=None,
    compression_opts=None,
    max_pending=2,
    durable=False,
  ):
    if spill_path is None:
      raise ValueError(
        "mode='disk' needs spill_path=, the HDF5 file to spill snapshots to."
      )
    if memory_budget is None:
      raise ValueError(
        "mode='disk' needs memory_budget=, the bytes of snapshots to keep in "
        "host memory (an int >= 0; one snapshot is %d bytes)." % varset.nbytes
      )
    self._budget = checks.integer(
      memory_budget,
      "memory_budget",
      0,
      hint="bytes of snapshots kept in host memory; one snapshot is %d bytes"
      % varset.nbytes,
    )
    super(DiskMode, self).__init__(
      self.fast_tier(varset, None, name),
      varset,
      spill_path,
      compression=compression,
      compression_opts=compression_opts,
      max_pending=max_pending,
      durable=durable,
    )
    self._max_to_keep = max_to_keep  # all tiers together, not the host tier's
    self._order = []  # the store's SnapshotInfos at the last settle

  @property
  def capacity(self):
    return self._max_to_keep

  def counts_toward_capacity(self, tag):
    return True

  def settle(self, order):
    """Spills the oldest host snapshots (by the store's `order`) over budget."""
    self._order = list(order)
    self._collect()
    self._retry_failed()
    self._spill_over(self._budget)

  def _spill_over(self, budget):
    """Hands the oldest host snapshots to the writer until `budget` is met."""
    over = self._inner.nbytes - budget
    in_memory = set(self._inner.tags())
    for info in self._order:
      if over <= 0:
        break
      if info.tag in in_memory:
        over -= self._move_to_file(info.tag, info, None)

  def _before_close(self):
    # A disk store's snapshots outlive it: what is in memory goes to the file.
    self._collect()
    self._spill_over(0)

  def _memory_note(self):
    held = self.nbytes
    if held <= self._budget:
      return " (%d bytes, within memory_budget=%d)" % (held, self._budget)
    return (
      " (host memory now holds %d bytes of snapshots, %d over "
      "memory_budget=%d)" % (held, held - self._budget, self._budget)
    )
