"""Host mode: snapshots as numpy arrays in this process's memory.

A snapshot is one `session.run` of a read of every variable, each colocated with
its variable, so on a GPU or a parameter server every variable is sent once and
in parallel. TF 1.15 copies fetched values into new numpy arrays (a fetch never
aliases a variable's buffer); the store keeps those arrays and marks them
read-only, so neither training nor the caller can change a snapshot.

A restore feeds the arrays into placeholders built once and runs one grouped
assign. Host memory holds `len(store) * store.param_nbytes` bytes; the device
holds nothing extra.
"""
import numpy as np

from snapstore import graph_ops
from snapstore._tf import tf
from snapstore.modes import base


class HostMode(base.CopyMode):
  """Snapshots held as read-only numpy arrays (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: The most snapshots kept, or None for no bound.
    name: The store's name.
  """

  name = "host"
  default_max_to_keep = 5
  allows_unbounded = True
  data_needs_session = False

  def __init__(self, varset, max_to_keep, name):
    super(HostMode, self).__init__(varset, max_to_keep, name)
    reads = graph_ops.SharedReads()
    self._reads = [reads(v) for v in varset.variables]
    self._feeder = graph_ops.Feeder(varset.specs, "feed")
    self._load_op = self._feeder.assign_to(varset.variables, "restore")
    self._initializer = tf.no_op(name="initializer")
    self._snapshots = {}

  def tags(self):
    return list(self._snapshots)

  @property
  def nbytes(self):
    return sum(a.nbytes for arrays in self._snapshots.values() for a in arrays)

  def take(self, tag, session, victim=None):
    self._keep(tag, self._run(session, self._reads), victim)

  def put(self, tag, arrays, session, victim=None):
    del session  # Nothing runs in TF.
    copies = [np.array(a, dtype=spec.dtype, order="C")  # always a new array
              for a, spec in zip(arrays, self._varset.specs)]
    self._keep(tag, copies, victim)

  def restore(self, tag, session):
    self._load(self._snapshots[tag], session)

  def arrays(self, tag, session):
    del session
    return list(self._snapshots[tag])

  def delete(self, tag):
    del self._snapshots[tag]

  def stash(self, session):
    return self._run(session, self._reads)

  def unstash(self, token, session):
    self._load(token, session)

  def _keep(self, tag, arrays, victim):
    for a in arrays:
      a.setflags(write=False)
    if victim is not None and victim != tag:
      self._snapshots.pop(victim, None)
    self._snapshots[tag] = tuple(arrays)

  def _load(self, arrays, session):
    self._run(session, self._load_op, self._feeder.placeholders, arrays)
