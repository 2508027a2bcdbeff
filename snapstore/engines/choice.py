"""The one choice of an engine: graph mode or eager execution, for a new store.

Made where TensorFlow would create a variable now (`_tf.builds_eagerly`):
under `init_scope`, which leaves a `tf.function` being traced for the eager
context, or for the TF1 graph it is traced in. Nothing else in snapstore
asks which engine runs; it asks the engine (`engines/base.py`).
"""

from snapstore._tf import builds_eagerly
from snapstore.engines.eager.engine import EagerEngine
from snapstore.engines.graph.engine import GraphEngine


def new_engine():
  """A new engine for a store built now."""
  return EagerEngine() if builds_eagerly() else GraphEngine()
