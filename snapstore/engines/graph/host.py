"""Host mode: snapshots as numpy arrays in this process's memory.

A snapshot is one `session.run` of a read of every variable, each colocated with
its variable, so on a GPU or a parameter server every variable is sent once and
in parallel. A fetched array never aliases a variable's buffer; the store keeps
the arrays and marks them read-only, so neither training nor the caller can
change a snapshot.

How the values reach numpy depends on where the variables are. A fetch from a
GPU or another process arrives in a fresh buffer that TF hands to numpy. A
fetch of an in-process CPU variable's read would make TF copy the variable's
buffer into a new, unaligned numpy array; so on a local CPU-only session the
store fetches a `Snapshot` of each read instead: TF makes the copy (into its
64-byte aligned memory) and hands that buffer to numpy. The snapshot is faster
and its arrays can later be fed without another copy (`snapstore.core.buffers`).
Elsewhere a `Snapshot` would only cost device memory, so plain reads are used.

A snapshot over one that only the store holds (the next one of a full
`max_to_keep` ring, a tag taken again) writes the variables into that
snapshot's arrays instead, in one run of `copies.WriteInto` (an in-place
update fed each array) where the session feeds arrays in place: no new
buffers, nor their page faults. A snapshot of distributed variables always
fetches new arrays.

A restore feeds the arrays into placeholders built once and runs one grouped
assign. A `tf.distribute` variable is read and written as
`snapstore.core.distributed` says: one array per variable (a mirrored one's
first component, a sync-on-read one's aggregate), written back to every
component; every component of a sync-on-read variable is fetched too, and
the replicas of a mirrored variable that each replica writes alone are
compared in the same run and fetched when they differ; a restore writes
each of those components its own value (`host_book`).
Host memory holds `len(store) * store.param_nbytes` bytes, plus those
replicas; the device holds nothing extra.
"""

import numpy as np

from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore.engines.graph import copies
from snapstore.engines.graph import sessions
from snapstore.core import buffers
from snapstore.core import distributed
from snapstore.modes import base
from snapstore.modes import disk
from snapstore.engines.graph import mode
from snapstore.modes import host_book


class HostMode(mode.GraphMode, host_book.HostBook):
  """Snapshots held as read-only numpy arrays (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: The most snapshots kept, or None for no bound.
    name: The store's name.
  """

  name = "host"

  def __init__(self, varset, max_to_keep, name):
    super(HostMode, self).__init__(varset, max_to_keep, name)
    self._start_book()
    reads = copies.SharedReads()
    self._reads = [reads(v) for v in varset.variables]
    self._copies = []
    for var, value in zip(varset.variables, self._reads):
      # A distributed variable's host read is on its first component's
      # device (see `snapstore.core.distributed`).
      with ops.colocate_with(distributed.anchor(var)):
        self._copies.append(tf.raw_ops.Snapshot(input=value))
    # Mirrored variables whose replicas may differ (each replica writes its
    # own): each snapshot also fetches whether they differ and, where they
    # do, their other components; sync-on-read ones: all their components
    # (host_book's module doc), in the same run.
    flags, values = [], []
    for index, _ in self._layout:
      flag, reads_of_parts = distributed.replica_reads(varset.variables[index])
      flags.append(flag)
      values.extend(reads_of_parts)
    self._reads += flags + values
    self._copies += flags + values
    self._fetches = attached.PerObject(
      "host_fetches"
    )  # per session: which of the two
    # Writes a snapshot's arrays, and its kept replicas each into its own
    # component.
    self._load = mode.ArrayWriter(varset, "feed", "restore")
    # What `stash` sets aside: the variables, or with distributed ones every
    # component, so that `unstash` gives each replica back its own bits (a
    # host value written back would make a sync-on-read variable's
    # components the aggregate and zeros).
    self._parts = None
    if any(distributed.is_distributed(v) for v in varset.variables):
      parts = [p for v in varset.variables for p in distributed.components(v)]
      self._parts = (
        [reads(p) for p in parts],
        copies.Feeder(mode.component_specs(parts), "stash_feed"),
      )
      self._parts += (self._parts[1].assign_to(parts, "unstash"),)
    # A snapshot over one only the store holds copies into its arrays
    # (`copies.WriteInto`); not with distributed variables (their replicas).
    self._into = None
    if not self._parts:
      self._into = copies.WriteInto(
        varset.variables, self._reads[: len(varset.variables)], "into"
      )
    self._initializer = tf.no_op(name="initializer")

  def take(self, tag, session, victim=None):
    into = self._writable(tag, victim, session)
    if into is not None:
      try:
        self._into(into, session, sessions.run_cached)
      except tf.errors.OpError as e:
        if self._into.wrote_before(e):
          # Partly overwritten: the snapshot it held is gone (the store
          # reports the tag lost).
          self.delete(victim if tag not in self._snapshots else tag)
        raise
      self._keep(tag, into, victim)
      return
    arrays, replicas = self._fetch(session)
    self._keep(tag, arrays, victim, replicas)

  def restore(self, tag, session):
    self._load(self._snapshots[tag], session, self._replicas.get(tag))

  def stash(self, session):
    if self._parts is not None:
      return self._run(session, self._parts[0])
    return self._fetch(session)[0]  # no replicas: nothing is distributed

  def unstash(self, token, session):
    if self._parts is not None:
      _, feeder, op = self._parts
      self._feed(session, op, feeder, token)
      return
    self._load(token, session)

  def array_writer(self, name):
    # The restore's own feeds and ops serve a spill file's snapshots too.
    del name
    return self._load

  def _writable(self, tag, victim, session):
    """The arrays a snapshot over `tag` (or `victim`) may be copied into in
    place, or None: the store's alone, fed in place by this session."""
    if self._into is None or not _local_cpu_only(session):
      return None
    into = self.reusable(tag, victim, numpy_writes=False)
    if into is None or not self._into.fits(into):
      return None
    if not self._into.usable(session, sessions.run_cached):
      return None
    return list(into)

  def _fetch(self, session):
    """The variables' host values, and the replicas to keep (host_book)."""
    fetches = self._fetches.get(session)
    if fetches is None:
      fetches = self._copies if _local_cpu_only(session) else self._reads
      self._fetches.set(session, fetches)
    values = self._run(session, fetches)
    n, k = len(self._varset.variables), len(self._layout)
    # TF 1.15 fetches a scalar as a numpy scalar: kept as an aligned 0-d
    # array, which a later snapshot can be written into (`WriteInto`).
    values[:n] = [
      v if isinstance(v, np.ndarray) else buffers.aligned_copy(v)
      for v in values[:n]
    ]
    if not k:
      return values, None
    # The arrays a run fetches are new (module doc): kept as they are.
    replicas = base.kept_replicas(
      self._layout, values[n : n + k], values[n + k :], lambda array: array
    )
    return values[:n], replicas


def _local_cpu_only(session):
  """True if `session` runs in this process with CPU devices only."""
  if getattr(session, "sess_str", None) not in ("", b""):
    return False  # a remote master, or a wrapper that does not say
  try:
    devices = session.list_devices()
  except (AttributeError, tf.errors.OpError):
    return False
  # A CPU build also lists an XLA_CPU device.
  return all(d.device_type in ("CPU", "XLA_CPU") for d in devices)


class GraphDiskMode(disk.DiskMode):
  """Disk mode over graph-mode host snapshots (see `disk.DiskMode`)."""

  fast_tier = HostMode
