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

A restore feeds the arrays into placeholders built once and runs one grouped
assign. A `tf.distribute` variable is read and written as
`snapstore.core.distributed` says: one array per variable (a mirrored one's
first component, a sync-on-read one's aggregate), written back to every
component. Host memory holds `len(store) * store.param_nbytes` bytes; the device
holds nothing extra.
"""

import numpy as np

from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.core import attached
from snapstore.core import copies
from snapstore.core import distributed
from snapstore.core import variables
from snapstore.modes import host_book


class HostMode(host_book.HostBook):
  """Snapshots held as read-only numpy arrays (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: The most snapshots kept, or None for no bound.
    name: The store's name.
  """

  name = "host"

  def __init__(self, varset, max_to_keep, name):
    super(HostMode, self).__init__(varset, max_to_keep, name)
    reads = copies.SharedReads()
    self._reads = [reads(v) for v in varset.variables]
    self._copies = []
    for var, value in zip(varset.variables, self._reads):
      # A distributed variable's host read is on its first component's
      # device (see `snapstore.core.distributed`).
      with ops.colocate_with(distributed.anchor(var)):
        self._copies.append(tf.raw_ops.Snapshot(input=value))
    # Mirrored variables whose replicas may differ (each replica writes its
    # own): checked before each snapshot, which keeps one value for all.
    self._checked = [
      (key, v)
      for key, v in zip(varset.keys, varset.variables)
      if distributed.may_differ(v)
    ]
    self._differ = [distributed.differs(v) for _, v in self._checked]
    self._fetches = attached.PerObject(
      "host_fetches"
    )  # per session: which of the two
    self._feeder = copies.Feeder(varset.specs, "feed")
    self._load_op = self._feeder.assign_to(varset.variables, "restore")
    # What `stash` sets aside: the variables, or with distributed ones every
    # component, so that `unstash` gives each replica back its own bits (a
    # host value written back would make a sync-on-read variable's
    # components the aggregate and zeros).
    self._parts = None
    if any(distributed.is_distributed(v) for v in varset.variables):
      parts = [p for v in varset.variables for p in distributed.components(v)]
      specs = [
        variables.VariableSpec(p.op.name, p, tuple(p.shape.as_list()), dtype)
        for p in parts
        for dtype in [np.dtype(p.dtype.base_dtype.as_numpy_dtype)]
      ]
      self._parts = (
        [reads(p) for p in parts],
        copies.Feeder(specs, "stash_feed"),
      )
      self._parts += (self._parts[1].assign_to(parts, "unstash"),)
    self._initializer = tf.no_op(name="initializer")
    self._start_book()

  def take(self, tag, session, victim=None):
    self._keep(tag, self._fetch(session), victim)

  def restore(self, tag, session):
    self._load(self._snapshots[tag], session)

  def stash(self, session):
    if self._parts is not None:
      return self._run(session, self._parts[0])
    return self._fetch(session)

  def unstash(self, token, session):
    if self._parts is not None:
      _, feeder, op = self._parts
      self._feed(session, op, feeder, token)
      return
    self._load(token, session)

  def _fetch(self, session):
    if self._differ:  # replicas that may differ: refused if they do
      distributed.check_replicas_equal(
        [key for key, _ in self._checked], self._run(session, self._differ)
      )
    fetches = self._fetches.get(session)
    if fetches is None:
      fetches = self._copies if _local_cpu_only(session) else self._reads
      self._fetches.set(session, fetches)
    return self._run(session, fetches)

  def _load(self, arrays, session):
    self._feed(session, self._load_op, self._feeder, arrays)


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
