"""Names of a TF2 object-based checkpoint, matched to live variables.

`tf.train.Checkpoint.write` (and Keras' `save_weights` in the TF format) names
each variable by its path through the saved objects
(`model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE`); a variable
reachable by two paths is written once, under one of them. Key strings are
therefore not a stable way to find a variable: this module walks the
checkpoint's object graph (the proto in its object graph entry) from its root
together with the live objects (`tf.train.TrackableView.children`), matching
children by name as TensorFlow's own restore does, and returns, for each
checkpoint name that holds a variable's value, the live variable. Nothing
live is read or written; no op is built.

    found = live_variables(reader_bytes, tf.train.Checkpoint(model=m, optimizer=opt))
    # {"model/.../VARIABLE_VALUE": <tf.Variable>, ...}
"""

from snapstore._keras import keras_variable_value
from snapstore._tf import parse_object_graph
from snapstore._tf import tf2
from snapstore._tf import tf_variables
from snapstore._tf import trackable_children
from snapstore import errors

_VALUE = "VARIABLE_VALUE"


def root_object(root):
  """The trackable the checkpoint was written from: `root`, or a
  `tf.train.Checkpoint` of a dict's entries (`{"model": m, "optimizer": o}`).

  Raises:
    TypeError: Neither a dict nor a trackable object.
    CheckpointError: TensorFlow 1.15, which cannot walk live objects.
  """
  if not hasattr(tf2.train, "TrackableView"):
    raise errors.CheckpointError(
      "load_checkpoint(root=...) needs TensorFlow 2.x (tf.train.TrackableView); "
      "on TensorFlow 1.15, pass mapping= from the checkpoint's names."
    )
  if isinstance(root, dict):
    return tf2.train.Checkpoint(**root)
  if not hasattr(root, "_serialize_to_tensors") and not hasattr(
    root, "_trackable_children"
  ):
    raise TypeError(
      "root= takes the object the checkpoint was written from (a "
      "tf.train.Checkpoint, a Keras model, a tf.Module) or a dict of its "
      "children such as {'model': model, 'optimizer': optimizer}; got %r."
      % (root,)
    )
  return root


def live_variables(serialized_graph, root):
  """`{checkpoint name: live tf.Variable}` by walking both graphs (module doc)."""
  graph = parse_object_graph(serialized_graph)
  found, seen = {}, set()
  stack = [(root, 0)]
  while stack:
    obj, node_id = stack.pop()
    if node_id in seen:
      continue
    seen.add(node_id)
    node = graph.nodes[node_id]
    variable = _variable(obj)
    for attribute in node.attributes:
      if attribute.name == _VALUE and variable is not None:
        found[attribute.checkpoint_key] = variable
    children = trackable_children(obj)
    for ref in node.children:
      if ref.local_name in children:
        stack.append((children[ref.local_name], ref.node_id))
  return found


def _variable(obj):
  if isinstance(obj, tf_variables.Variable):
    return obj
  return keras_variable_value(obj)
