"""Host and disk mode on the eager engine: snapshots as numpy arrays.

The eager counterpart of `host.py`. A snapshot is one traced read of every
variable (traced when the store is built), then a copy of each value into a
new 64-byte aligned, read-only array the store owns: the arrays never share
memory with TensorFlow, so training cannot change them and they stay valid on
any device. A restore (`copies.GroupedAssigner`) gives each variable of 1
MiB or more its array by one `AssignVariableOp`: TensorFlow takes the
aligned array's memory without a copy and copies it at the variable's next
write, never writing into it; smaller variables go by a traced assign per
run of at most 16 MiB (TensorFlow copies each argument into a tensor first,
so that a run, never the model, is copied at once), fed the arrays (its
input signature is the variables' shapes and dtypes, so it never retraces;
the arrays are checked before they reach it, because it would cast another
dtype silently). The replicas of a mirrored variable that each
replica writes alone are compared in the same read; where they differ, their
other components are copied too, as is every component of a sync-on-read
variable, and a restore writes each its own (`host_book`). Disk mode is this mode under a spill file's budget
(`EagerDiskMode`).
"""

import numpy as np

from snapstore.core import buffers
from snapstore.core import distributed
from snapstore.engines.eager import copies
from snapstore.modes import base
from snapstore.modes import disk
from snapstore.modes import host_book


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
    self._start_book()
    # Mirrored variables whose replicas may differ (each replica writes its
    # own): each snapshot's read also says whether they differ and, where
    # they do, gives their other components; sync-on-read ones' components
    # are always given (host_book's module doc).
    replicas = [varset.variables[i] for i, _ in self._layout]
    self._read = copies.reader(varset.variables, "read", replicas)
    self._read()  # its first run optimizes it: at build, not in the loop
    # Large variables take their arrays as they are; the others are
    # written a group of at most `copies.STAGING` bytes at a time, so that
    # what is converted at once is a group, never the model (issue 38).
    self._write = copies.GroupedAssigner(
      varset.variables, varset.specs, "restore"
    )
    # A restore with kept replicas: the snapshot's values, then each kept
    # replica into its own component (built on first use: most stores never
    # see replicas that differ).
    parts = [p for v in replicas for p in distributed.kept_components(v)]
    self._write_parts = copies.Lazy(
      lambda: copies.GroupedAssigner(
        parts, [_PartSpec(p) for p in parts], "restore_replicas"
      )
    )
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

  def take(self, tag, session, victim=None):
    del session
    # The arrays of the snapshot this one replaces (same tag, or the victim)
    # are reused when nobody else holds them: a copy into warm memory costs
    # about a memcpy, one into new arrays also pays their page faults.
    arrays, replicas = self._fetch(self.reusable(tag, victim))
    self._keep(tag, arrays, victim, replicas)

  def restore(self, tag, session):
    self._load(self._snapshots[tag], session, self._replicas.get(tag))

  def stash(self, session):
    del session
    return self._set_aside()

  def unstash(self, token, session):
    del session
    self._put_back(*token)

  def array_writer(self, name):
    del name
    return self._load

  def write_values(self, values):
    """Writes one value per variable, then (for variables whose replicas a
    snapshot may keep) one per kept component as `base.replica_values`
    lays them out: tensors, e.g. fetched when a traced function runs."""
    n = len(self._varset.specs)
    self._write(*values[:n])
    if self._layout:
      self._write_parts(*values[n:])

  def _load(self, arrays, session, replicas=None):
    del session
    self._write(*arrays)
    if replicas:
      # After every variable's write, which wrote these components too.
      self._write_parts(*base.replica_values(self._layout, arrays, replicas))

  def _fetch(self, into=None):
    """Copies of the variables' values, in store-owned aligned arrays (`into`,
    arrays of a dropped snapshot, or new ones), and the replicas to keep
    (host_book's module doc; None for none)."""
    out = []
    values = self._read()  # first: a failed read leaves `into` as it was
    specs = self._varset.specs
    n, k = len(specs), len(self._layout)
    replicas = None
    if k:
      replicas = base.kept_replicas(
        self._layout,
        [bool(flag) for flag in values[n : n + k]],
        values[n + k :],
        lambda value: buffers.aligned_copy(np.asarray(memoryview(value))),
      )
    for i, (value, spec) in enumerate(zip(values[:n], specs)):
      if into is not None:
        array = into[i]
        array.setflags(write=True)
      else:
        array = buffers.aligned_empty(spec.shape, spec.dtype)
      # A zero-copy view of TF's buffer, copied once into the store's array.
      np.copyto(array, np.asarray(memoryview(value)))
      out.append(array)
    return out, replicas


class _PartSpec(object):
  """The shape and dtype of a component variable, as `assigner` takes them."""

  def __init__(self, part):
    self.shape = part.shape
    self.dtype = np.dtype(part.dtype.as_numpy_dtype)


class EagerDiskMode(disk.DiskMode):
  """Disk mode over eager host snapshots (see `disk.DiskMode`)."""

  fast_tier = EagerHostMode
