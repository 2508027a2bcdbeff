"""Snapshots held as numpy arrays: the bookkeeping both engines' host modes share.

A host mode keeps each snapshot as a tuple of read-only arrays in key order,
owned by the store. Arrays given to `put` are copied into new 64-byte aligned
arrays, so a caller's array never becomes part of a snapshot. How the values
get there from TensorFlow (a `session.run`, a traced read) is the mode's.

Beside a snapshot, a mode keeps the other replicas' values of mirrored
variables whose replicas differed when it was taken (`replicas(tag)`; see
`snapstore.core.distributed`, "Replicas that differ"): `{index: (array, ...)}`,
by the variable's index in key order, one array per component after the
first. Only the variables whose replicas differed are there, and a snapshot
whose replicas were all equal has none (None), so ordinary variables and
equal replicas cost nothing. A restore writes the snapshot's arrays, then
each kept array into its own component.
"""

from snapstore.core import buffers
from snapstore.core import distributed
from snapstore.modes import base


class HostBook(base.CopyMode):
  """A copy mode whose snapshots are numpy arrays in this process."""

  default_max_to_keep = 5
  allows_unbounded = True
  data_needs_session = False

  def _start_book(self):
    self._snapshots = {}
    self._replicas = {}  # tag -> {index: (array, ...)}, see module doc
    # (index, components after the first) of each variable whose replicas
    # may differ, in key order.
    self._may_differ = [
      (i, len(distributed.components(v)) - 1)
      for i, v in enumerate(self._varset.variables)
      if distributed.may_differ(v)
    ]

  def tags(self):
    return list(self._snapshots)

  @property
  def nbytes(self):
    return sum(
      a.nbytes for arrays in self._snapshots.values() for a in arrays
    ) + sum(replicas_nbytes(r) for r in self._replicas.values())

  def put(self, tag, arrays, session, victim=None):
    del session  # Nothing runs in TF.
    copies = [
      buffers.aligned_copy(a, spec.dtype)  # always a new array
      for a, spec in zip(arrays, self._varset.specs)
    ]
    # One value per variable: every replica gets it (no replicas kept).
    self._keep(tag, copies, victim)

  def arrays(self, tag, session):
    del session
    return list(self._snapshots[tag])

  def replicas(self, tag):
    return self._replicas.get(tag)

  def delete(self, tag):
    del self._snapshots[tag]
    self._replicas.pop(tag, None)

  def _keep(self, tag, arrays, victim, replicas=None):
    for a in arrays:
      a.setflags(write=False)
    if victim is not None and victim != tag:
      self._snapshots.pop(victim, None)
      self._replicas.pop(victim, None)
    self._snapshots[tag] = tuple(arrays)
    if replicas:
      for kept in replicas.values():
        for a in kept:
          a.setflags(write=False)
      self._replicas[tag] = replicas
    else:
      self._replicas.pop(tag, None)

  def _kept_replicas(self, flags, values, to_array):
    """The replicas a snapshot keeps (module doc), from what it read.

    Args:
      flags: One bool per variable whose replicas may differ (in
        `_may_differ` order): whether they differed.
      values: The other components' values of those variables, in the same
        order (`distributed.replica_reads`), flattened; those of a variable
        whose flag is False are not looked at.
      to_array: Makes a store-owned numpy array of one of `values`.

    Returns:
      `{index: (array, ...)}`, or None when no replicas differed.
    """
    kept = {}
    start = 0
    for (index, count), flag in zip(self._may_differ, flags):
      if flag:
        kept[index] = tuple(to_array(v) for v in values[start : start + count])
      start += count
    return kept or None

  def _replica_values(self, arrays, replicas):
    """What a restore writes into each other component of the variables
    whose replicas may differ (flattened, `_may_differ` order): the kept
    value, or the snapshot's own array where none is kept."""
    out = []
    for index, count in self._may_differ:
      kept = replicas.get(index)
      out.extend(kept if kept is not None else [arrays[index]] * count)
    return out


def replicas_nbytes(replicas):
  """Bytes of a snapshot's kept replicas (None for none)."""
  if not replicas:
    return 0
  return sum(a.nbytes for kept in replicas.values() for a in kept)
