"""Host and disk mode on the eager engine: snapshots as numpy arrays.

The eager counterpart of `host.py`. A snapshot is one traced read of every
variable (traced when the store is built), then a copy of each value into a
new 64-byte aligned, read-only array the store owns: the arrays never share
memory with TensorFlow, so training cannot change them and they stay valid on
any device. A restore is one traced assign of every variable, fed the arrays
(its input signature is the variables' shapes and dtypes, so it never
retraces; the arrays are checked before they reach it, because it would cast
another dtype silently). Disk mode is this mode under a spill file's budget
(`EagerDiskMode`).
"""

import sys

import numpy as np

from snapstore.core import buffers
from snapstore.core import distributed
from snapstore.eager import copies
from snapstore.modes import host_book
from snapstore.modes import disk


class EagerHostMode(host_book.HostBook):
  """Snapshots held as read-only numpy arrays (see module doc).

  Args:
    varset: The store's `VariableSet` (eager variables).
    max_to_keep: The most snapshots kept, or None for no bound.
    name: The store's name.
  """

  name = "host"

  def __init__(self, varset, max_to_keep, name):
    super(EagerHostMode, self).__init__(varset, max_to_keep, name)
    self._read = copies.reader(varset.variables, "read")
    # Mirrored variables whose replicas may differ (each replica writes its
    # own): checked before each snapshot, which keeps one value for all.
    self._checked = [
      (key, v)
      for key, v in zip(varset.keys, varset.variables)
      if distributed.may_differ(v)
    ]
    self._differ = (
      copies.traced(
        lambda: [distributed.differs(v) for _, v in self._checked],
        "check_replicas",
      )
      if self._checked
      else None
    )
    self._read()  # its first run optimizes it: at build, not in the loop
    self._write = copies.assigner(varset.variables, varset.specs, "restore")
    # evaluate_with sets the current values aside as tensors, component by
    # component (a read keeps its value while the variables change: copy on
    # write), and writes them back the same way: no host round trip, and
    # replicas that differ come back as they were.
    v = varset.variables
    self._set_aside = copies.Lazy(lambda: copies.component_reader(v, "stash"))
    self._put_back = copies.Lazy(
      lambda: copies.component_assigner(v, "unstash")
    )
    self._initializer = None
    self._start_book()

  def take(self, tag, session, victim=None):
    del session
    # The arrays of the snapshot this one replaces (same tag, or the victim)
    # are reused when nobody else holds them: a copy into warm memory costs
    # about a memcpy, one into new arrays also pays their page faults.
    old = self._snapshots.get(tag)
    if old is None and victim is not None:
      old = self._snapshots.get(victim)
    self._keep(tag, self._fetch(_unshared(old)), victim)

  def restore(self, tag, session):
    del session
    self._write(*self._snapshots[tag])

  def stash(self, session):
    del session
    return self._set_aside()

  def unstash(self, token, session):
    del session
    self._put_back(*token)

  def array_writer(self, name):
    del name

    def run(arrays, session):
      del session
      self._write(*arrays)

    return run

  def _fetch(self, into=None):
    """Copies of the variables' values, in store-owned aligned arrays (`into`,
    arrays of a dropped snapshot, or new ones)."""
    out = []
    self._check_replicas()
    values = self._read()  # first: a failed read leaves `into` as it was
    for i, (value, spec) in enumerate(zip(values, self._varset.specs)):
      if into is not None:
        array = into[i]
        array.setflags(write=True)
      else:
        array = buffers.aligned_empty(spec.shape, spec.dtype)
      # A zero-copy view of TF's buffer, copied once into the store's array.
      np.copyto(array, np.asarray(memoryview(value)))
      out.append(array)
    return out

  def _check_replicas(self):
    """Refuses a snapshot of replicas that hold different values.

    Raises:
      ValueError: A mirrored variable's replicas differ.
    """
    if self._differ is not None:
      distributed.check_replicas_equal(
        [key for key, _ in self._checked], self._differ()
      )


def _unshared(arrays):
  """`arrays` if only the store refers to them (and so they may be reused)."""
  if arrays is None:
    return None
  for array in arrays:
    # The tuple holding it, this loop's name and getrefcount's argument: 3.
    # A caller's reference (store.arrays, a view of it) adds more.
    if sys.getrefcount(array) > 3:
      return None
  return arrays


class EagerDiskMode(disk.DiskMode):
  """Disk mode over eager host snapshots (see `disk.DiskMode`)."""

  fast_tier = EagerHostMode
