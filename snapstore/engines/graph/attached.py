"""State kept on the graph or session it belongs to, so that it dies with it.

A dict keyed by a graph or session, even a `WeakKeyDictionary`, keeps its key
alive when the value refers back to it, as ops refer to their graph and
`Session.make_callable` results to their session: every graph or session an
object ever met would stay in memory, with its TensorFlow resources (an
Estimator builds a new graph and session for each `train()` call). Storing the
state as an attribute of the graph or session ties their lifetimes instead.

    stores = PerObject("hook_store")       # in a SnapshotHook
    stores.set(graph, store)
    stores.get(graph)                      # None for a graph without one
"""

import threading
import weakref

_LOCK = threading.Lock()  # two first `set`s on one object must share its dict


class PerObject(object):
  """Values attached to other objects (graphs, sessions) on behalf of one owner.

  Args:
    name: Names the attribute on the other objects (`_snapstore_<name>`).
  """

  def __init__(self, name):
    self._attr = "_snapstore_" + name

  def get(self, obj, default=None):
    """The value attached to `obj`, or `default`."""
    entry = getattr(obj, self._attr, {}).get(id(self))
    # The id of a dead owner can be reused by a new one: check it is us.
    if entry is None or entry[0]() is not self:
      return default
    return entry[1]

  def set(self, obj, value):
    """Attaches `value` to `obj` until `obj` is garbage."""
    with _LOCK:
      entries = getattr(obj, self._attr, None)
      if entries is None:
        entries = {}
        # setattr, not `obj.__dict__`: TF 2.x's Graph (a pybind11 class)
        # takes new attributes but has no `__dict__`.
        setattr(obj, self._attr, entries)
      entries[id(self)] = (weakref.ref(self), value)
