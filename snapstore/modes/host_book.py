"""Snapshots held as numpy arrays: the bookkeeping both engines' host modes share.

A host mode keeps each snapshot as a tuple of read-only arrays in key order,
owned by the store. Arrays given to `put` are copied into new 64-byte aligned
arrays, so a caller's array never becomes part of a snapshot. How the values
get there from TensorFlow (a `session.run`, a traced read) is the mode's.

Beside a snapshot, a mode keeps the other replicas' values of mirrored
variables whose replicas differed when it was taken, and every component
of sync-on-read variables (`replicas(tag)`, laid out as `base.kept_replicas`
says; see `snapstore.core.distributed`, "Replicas that differ"): only
those, so ordinary variables and equal mirrored replicas cost nothing. A
restore writes the snapshot's arrays, then each kept array into its own
component.
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
    self._replicas = {}  # tag -> kept replicas, see module doc
    self._layout = distributed.replica_layout(self._varset.variables)

  def tags(self):
    return list(self._snapshots)

  @property
  def nbytes(self):
    return sum(
      a.nbytes for arrays in self._snapshots.values() for a in arrays
    ) + sum(base.replicas_nbytes(r) for r in self._replicas.values())

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

  def replicas(self, tag, session):
    del session
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
