"""Snapshots held as numpy arrays: the bookkeeping both engines' host modes share.

A host mode keeps each snapshot as a tuple of read-only arrays in key order,
owned by the store. Arrays given to `put` are copied into new 64-byte aligned
arrays, so a caller's array never becomes part of a snapshot. How the values
get there from TensorFlow (a `session.run`, a traced read) is the mode's.
"""

from snapstore.core import buffers
from snapstore.modes import base


class HostBook(base.CopyMode):
  """A copy mode whose snapshots are numpy arrays in this process."""

  default_max_to_keep = 5
  allows_unbounded = True
  data_needs_session = False

  def _start_book(self):
    self._snapshots = {}

  def tags(self):
    return list(self._snapshots)

  @property
  def nbytes(self):
    return sum(a.nbytes for arrays in self._snapshots.values() for a in arrays)

  def put(self, tag, arrays, session, victim=None):
    del session  # Nothing runs in TF.
    copies = [
      buffers.aligned_copy(a, spec.dtype)  # always a new array
      for a, spec in zip(arrays, self._varset.specs)
    ]
    self._keep(tag, copies, victim)

  def arrays(self, tag, session):
    del session
    return list(self._snapshots[tag])

  def delete(self, tag):
    del self._snapshots[tag]

  def _keep(self, tag, arrays, victim):
    for a in arrays:
      a.setflags(write=False)
    if victim is not None and victim != tag:
      self._snapshots.pop(victim, None)
    self._snapshots[tag] = tuple(arrays)
