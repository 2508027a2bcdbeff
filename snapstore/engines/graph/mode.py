"""What the graph engine's copy modes share: runs in a session, and feeds.

`GraphMode` gives a mode its session runs (callables cached per session,
`sessions.run_cached`) and, for a spill file's snapshots, an `ArrayWriter`:
arrays fed into placeholders built once, one grouped assign.
"""

import numpy as np

from snapstore._tf import tf
from snapstore.core import distributed
from snapstore.core import varset
from snapstore.engines.graph import copies
from snapstore.engines.graph import sessions
from snapstore.modes import base


class GraphMode(base.CopyMode):
  """A copy mode of the graph engine (see module doc)."""

  def array_writer(self, name):
    """A function `(arrays, session, replicas=None)` writing arrays into the
    variables, and `replicas` (what `replicas(tag)` gave) into theirs.

    For snapshots held outside the mode (a spill file's). Its ops are built
    now: call it when the store is built.
    """
    return ArrayWriter(self._varset, name + "_feed", name)

  def _run(self, session, fetches):
    return sessions.run_cached(session, fetches)

  def _feed(self, session, op, feeder, arrays):
    """Runs `op`, which consumes `feeder`'s placeholders, fed with `arrays`."""
    return sessions.run_cached(
      session, op, feeder.placeholders, feeder.values(arrays)
    )


class ArrayWriter(object):
  """Writes arrays into the variables, with one `session.run` (graph mode).

  Called `(arrays, session, replicas=None)`: `arrays` one per variable (a
  distributed one's as a host write writes it, see
  `snapstore.core.distributed`), then `replicas` (what a mode's
  `replicas(tag)` gave) each into its own component. Its placeholders and
  ops are built at construction.

  Args:
    varset: The store's `VariableSet`.
    feed_name: Name scope of the placeholders.
    name: Name of the op writing the variables.
  """

  def __init__(self, varset, feed_name, name):
    self._feeder = copies.Feeder(varset.specs, feed_name)
    self._op = self._feeder.assign_to(varset.variables, name)
    self._layout = distributed.replica_layout(varset.variables)
    parts = [
      part
      for i, _ in self._layout
      for part in distributed.kept_components(varset.variables[i])
    ]
    self._replica_feeder = self._replica_op = None
    if parts:
      self._replica_feeder = copies.Feeder(
        component_specs(parts), feed_name + "_replicas"
      )
      # After the variables' writes, which wrote these components too.
      with tf.control_dependencies([self._op]):
        self._replica_op = self._replica_feeder.assign_to(
          parts, name + "_replicas"
        )

  def __call__(self, arrays, session, replicas=None):
    if not replicas:
      sessions.run_cached(
        session,
        self._op,
        self._feeder.placeholders,
        self._feeder.values(arrays),
      )
      return
    values = base.replica_values(self._layout, arrays, replicas)
    sessions.run_cached(
      session,
      self._replica_op,
      self._feeder.placeholders + self._replica_feeder.placeholders,
      self._feeder.values(arrays) + self._replica_feeder.values(values),
    )


def component_specs(parts):
  """`VariableSpec`s of component variables, to feed them."""
  return [
    varset.VariableSpec(p.op.name, p, tuple(p.shape.as_list()), dtype)
    for p in parts
    for dtype in [np.dtype(p.dtype.base_dtype.as_numpy_dtype)]
  ]
