"""Where each covered variable sits in the structure of what a store covers.

A store's keys come from names (`dense/kernel`), and Keras makes names
automatically, counting per process: a second network built by the same
code gets `dense_1/kernel`. Two networks of one structure therefore do not
share keys, but they do share where each variable sits among the objects:
the path a `tf.train.Checkpoint` of the network saves it under
(`layer_with_weights-0/kernel` in tf-keras, `_functional/_operations/1/_kernel`
in Keras 3, `layers/0/w` in a `tf.Module`). This module finds that path for
each variable, by the same breadth-first walk over the objects' trackable
children that a checkpoint takes (`tf.train.TrackableView.children`, in
their own order; the first path found is a variable's).

    paths = structure_paths(model, None, varset)
    # {"dense/kernel": ("layer_with_weights-0", "kernel"), ...}

`store.load_arrays(other_model)` matches variables by these paths, and
`store.slots.trackable(slot)` lays a slot's shadows out along them, so that
a checkpoint of it restores into a network built with other names. An
optimizer's state is walked from the optimizer, under "optimizer/". A
variable no walk reaches (a Keras 3 seed generator's state) is placed by
its position among those: "unreached/<i>", in the store's order. What is
not a model, a layer or a `tf.Module` (a list or dict of variables) has no
structure but its keys: each variable's path is its key. A path is a tuple
of names: the walked ones of one name per object on the way, the others
of one name ("unreached/0", the key).
"""

import collections

from snapstore._keras import is_keras_3_object
from snapstore._keras import keras_variable_value
from snapstore._tf import tf2
from snapstore._tf import tf_variables
from snapstore._tf import trackable_children

# The path prefix of variables no walk reaches.
UNREACHED = "unreached"


def has_structure(obj):
  """Whether `obj` is a model, a layer or a `tf.Module` (objects to walk)."""
  return isinstance(obj, tf2.Module) or (
    hasattr(type(obj), "variables")
    and hasattr(type(obj), "trainable_variables")
    and not isinstance(obj, (list, tuple, dict))
  )


def structure_paths(root, optimizer, varset):
  """`{key: path}` of every variable of `varset` (see module doc).

  Args:
    root: What the store was built over (its `var_list`).
    optimizer: Its `optimizer=` (one, a list, or None).
    varset: The store's `VariableSet`.
  """
  if not has_structure(root):
    return collections.OrderedDict((k, (k,)) for k in varset.keys)
  found = _walk(root, "")
  for i, opt in enumerate(_optimizers(optimizer)):
    prefix = "optimizer" if i == 0 else "optimizer_%d" % i
    for variable_id, path in _walk(opt, prefix).items():
      found.setdefault(variable_id, path)
  out, unreached = collections.OrderedDict(), 0
  for spec in varset:
    path = found.get(id(spec.variable))
    if path is None:
      path = ("%s/%d" % (UNREACHED, unreached),)
      unreached += 1
    out[spec.key] = path
  return out


def _optimizers(optimizer):
  if optimizer is None:
    return []
  return (
    list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
  )


def _walk(root, prefix):
  """`{id(tf.Variable): path}` of the variables reachable from `root`,
  breadth first (module doc); a Keras 3 variable stands for the
  `tf.Variable` it holds."""
  seen = set([id(root)])
  queue = collections.deque([((prefix,) if prefix else (), root)])
  found = {}
  while queue:
    path, obj = queue.popleft()
    for name, child in trackable_children(obj).items():
      if id(child) in seen:
        continue
      seen.add(id(child))
      where = path + (name,)
      variable = _variable(child)
      if variable is not None:
        found.setdefault(id(variable), where)
      else:
        queue.append((where, child))
  return found


def _variable(obj):
  if isinstance(obj, tf_variables.Variable):
    return obj
  if is_keras_3_object(obj):
    return keras_variable_value(obj)
  return None


def matched(paths, other_paths):
  """`{key: other key}` pairing the store's variables (`paths`, `{key:
  path}`) with another's (`other_paths`) at the same path, and the problems
  found: the places either side lacks, named."""
  by_path = dict((path, key) for key, path in other_paths.items())
  pairs, missing = collections.OrderedDict(), []
  for key, path in paths.items():
    other = by_path.pop(path, None)
    if other is None:
      missing.append("%s (at %s)" % (key, "/".join(path)))
    else:
      pairs[key] = other
  extra = ["%s (at %s)" % (k, "/".join(p)) for p, k in by_path.items()]
  problems = []
  if missing:
    problems.append("nothing where the store has %s" % ", ".join(missing))
  if extra:
    problems.append("variables where the store has none: %s" % ", ".join(extra))
  return pairs, problems


def trackable(paths, keys, shadows, new_node):
  """A trackable object holding `shadows` (of `keys`) along their `paths`:
  a checkpoint of it names each shadow by its variable's path, as one of the
  network names the variable (module doc).

  Args:
    paths: `{key: path}` (`structure_paths`).
    keys: The store's keys, in order.
    shadows: A slot's shadow of each.
    new_node: Makes an empty trackable object (`_tf.auto_trackable`).
  """
  root = new_node()
  for key, shadow in zip(keys, shadows):
    node = root
    path = paths[key]
    for name in path[:-1]:
      child = trackable_children(node).get(name)
      if child is None:
        child = new_node()
        setattr(node, name, child)
      node = child
    setattr(node, path[-1], shadow)
  return root
