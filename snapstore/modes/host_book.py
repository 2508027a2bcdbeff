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

import sys

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
    """Keeps copies of `arrays`: in the arrays of the snapshot replaced (same
    tag, or the victim) when nobody else holds them, so that replacing one
    needs no second snapshot's memory; arrays read from a file for the store
    alone (`buffers.Owned`) are kept as they are."""
    del session  # Nothing runs in TF.
    owned = isinstance(arrays, buffers.Owned)
    into = self.reusable(tag, victim)
    copies = []
    for i, (a, spec) in enumerate(zip(arrays, self._varset.specs)):
      if owned and buffers.adoptable(a, spec.dtype):
        copies.append(a)
        continue
      if into is None:
        copies.append(buffers.aligned_copy(a, spec.dtype))  # a new array
        continue
      out = into[i]
      out.setflags(write=True)
      out[...] = a  # cast by value, as aligned_copy does
      copies.append(out)
    # One value per variable: every replica gets it (no replicas kept).
    self._keep(tag, copies, victim)

  def reusable(self, tag, victim, numpy_writes=True):
    """The arrays of the snapshot `tag` replaces (`tag` itself, else
    `victim`) if only the store refers to them, else None.

    Args:
      tag: The tag being snapshotted.
      victim: The tag it evicts, or None.
      numpy_writes: Whether numpy writes them (then memory numpy may not
        write is never reused) or TensorFlow does (graph mode's in-place
        snapshot: read-only is numpy's flag, for the caller).
    """
    old = self._snapshots.get(tag)
    if old is None and victim is not None:
      old = self._snapshots.get(victim)
    if old is None:
      return None
    for array in old:
      # The tuple holding it, this loop's name and getrefcount's argument: 3.
      # A caller's reference (store.arrays, a view of it) adds more.
      if sys.getrefcount(array) > 3:
        return None
    if numpy_writes:
      for array in old:
        # An array over memory numpy may not write (a graph-mode fetch's,
        # TensorFlow's) is never written by numpy.
        if not _may_write(array):
          return None
    return old

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


def _may_write(array):
  """Whether numpy lets `array` (read-only, the store's) be made writable."""
  try:
    array.setflags(write=True)
  except ValueError:
    return False
  array.setflags(write=False)
  return True
