"""Which eager variables a store covers, and the key each one is stored under.

The eager engine's counterpart of `engines/graph/variables.py`'s resolution (TF 2.x
eager execution has no collections or variable scopes). A store covers:

- a list of `tf.Variable`s (Keras 3 `keras.Variable`s are unwrapped to the
  `tf.Variable` they hold): keys are the variables' names without `:0`
  (`path` for Keras 3);
- a dict `{key: variable}`, keys as given;
- a Keras model (tf-keras, or Keras 3 with the TensorFlow backend): every
  variable of `model.variables`: the weights, non-trainable ones such as
  batch-norm statistics included, and for Keras 3 the seed generators' states
  (so that a rollback replays the same dropout masks; pass
  `var_list=model.weights` to leave them out). Keys are the variables' paths
  without the model's own name (`d1/kernel`, not `sequential/d1/kernel`);
- a `tf.Module`: its variables, keyed by attribute path (`layers/0/w`).

The store's order (`store.keys`, `store.arrays()`, `slots.shadows()`) is
the order these give: a list's, a dict's, a module's `variables`; for a
model, `model.weights` (the order of `model.get_weights()`), then the rest
of `model.variables` (Keras 3 seed states), then other state the model
holds; an optimizer's state comes last. `store.key_of(v)` gives the key of
any object in `model.weights` (or the `tf.Variable` under it), and
`store.variable_of(key)` that object back.

Names that collide are keyed by position. A name that two or more variables
of a list share (TensorFlow names every unnamed variable "Variable"; tf-keras
names a nested model's weights without the model's name) is no key: each of
them is keyed "<name>/<position>", by its position in the list (or in
`model.variables`, as `get_weights()` orders weights), with "_" appended
while that is another variable's name. A name that one variable alone has
stays its key. The keys depend only on the names and their order, so the
same program gets the same keys in every run:

    w, a, b = tf.Variable(0.0, name="w"), tf.Variable(1.0), tf.Variable(2.0)
    SnapshotStore(var_list=[w, a, b]).keys  # ('Variable/1', 'Variable/2', 'w')

`optimizer=` adds a Keras optimizer's state: its iteration counter and its
slots (moments, EMA averages), under `optimizer/...`, and every other
variable it tracks, as a `tf.train.Checkpoint` of it would save them
(tf-keras keeps a `LossScaleOptimizer`'s loss scale and `Nadam`'s momentum
product outside `optimizer.variables`), not the variables it trains (a
Keras 3 optimizer tracks them; `var_list` covers them). The learning rate is
left out (Keras 3 keeps it in a variable), and so are a legacy optimizer's
other hyperparameters, so that a rollback never undoes a learning-rate
change. Slots named alike (those of variables that share a name) are keyed
by their position in `optimizer.variables`. An optimizer that has not built
its slots yet is built for the model's trainable variables when `var_list`
is a model (`optimizer.build`, what Keras does on the first step); otherwise
it is refused, with that fix.

A key that two variables still share (a listed variable named as an
optimizer's key, "optimizer/iteration") is refused with both named, and the
fix (a dict). Keys made from automatic names (`dense_1`, `sequential_2`)
depend on the order a process built its models in; a file written by one
process loads into another with the same keys.
"""

import collections

from snapstore._keras import keras_learning_rate
from snapstore._keras import keras_hyperparameters
from snapstore._keras import keras_trained_variables
from snapstore._keras import keras_layers
from snapstore._tf import in_graph_mode
from snapstore._keras import is_keras_3_object
from snapstore._tf import is_sharded_variable
from snapstore._keras import keras_variable_value
from snapstore._tf import module_variable_paths
from snapstore._tf import tf2
from snapstore._tf import tf_variables
from snapstore.core.varset import VariableSet

_GRAPH_ONLY = (
  "%s= is for graph mode (collections and variable scopes), which TF 2.x "
  "eager execution does not have. Pass the variables instead: "
  "var_list=<a Keras model, a tf.Module, or a list or dict of variables>."
)


def variable_set(
  var_list=None,
  scope=None,
  collection=None,
  optimizer=None,
  include_global_step=False,
):
  """The `VariableSet` an eager store covers (see module doc).

  Raises:
    ValueError: No var_list; graph-only arguments; duplicate keys; a variable
      listed twice; a deferred (unbuilt) Keras variable; an unbuilt
      optimizer that cannot be built here; a variable of a TF1 graph.
    TypeError: Objects that are not variables, a single variable as var_list.
  """
  for arg, value in (("scope", scope), ("collection", collection)):
    if value is not None:
      raise ValueError(_GRAPH_ONLY % arg)
  if include_global_step:
    raise ValueError(
      "include_global_step=True is for graph mode's global step; eagerly, "
      "put the step variable in var_list (an optimizer's `iterations` is "
      "covered with optimizer=)."
    )
  if var_list is None:
    raise ValueError(
      "An eager store needs var_list=: a Keras model, a tf.Module, or a list "
      "or dict of variables (there are no collections to default to)."
    )
  pairs, source, model = _resolve(var_list)
  if optimizer is not None:
    pairs += _optimizer_pairs(optimizer, model)
  _check_unique(pairs)
  for key, var in pairs:
    _check_eager(key, var)
  return VariableSet(pairs, source, origins=origins(var_list, optimizer))


def origins(var_list, optimizer=None):
  """`{id(tf.Variable): keras.Variable}` of the Keras 3 variables among what
  a store over `var_list` and `optimizer` covers: the object a user holds
  (in `model.weights`, in a list), for `store.variable_of`."""
  if _is_keras_model(var_list):
    try:
      held = list(var_list.variables) + list(var_list.weights)
    except ValueError:  # an unbuilt tf-keras model
      held = []
  elif isinstance(var_list, dict):
    held = list(var_list.values())
  elif isinstance(var_list, (list, tuple)):
    held = list(var_list)
  else:
    held = []
  for opt in optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]:
    if opt is not None and hasattr(opt, "variables"):
      held += _optimizer_variables(opt)
  out = {}
  for v in held:
    if is_keras_3_object(v):
      inner = keras_variable_value(v)
      if inner is not None:
        out.setdefault(id(inner), v)
  return out


def _resolve(var_list):
  """([(key, tf.Variable)], description, Keras model or None)."""
  if _is_keras_model(var_list):
    prefix = getattr(var_list, "name", "") or ""
    try:
      found = list(var_list.variables)
    except ValueError:  # tf-keras: "Weights for model ... not yet created"
      found = []
    metrics = dict((id(v), key) for key, v in metric_pairs(var_list))
    pairs = []
    for v in _dedupe(found):
      inner = _unwrap(v, "the model's")
      # (tf-keras lists the variables of metrics a model holds as its own)
      pairs.append(
        (metrics.get(id(inner)) or _strip(_name_of(v), prefix), inner)
      )
    # (tf-keras names a nested model's weights without the model's name)
    pairs = _by_position(pairs, range(len(pairs)))
    pairs = _weights_first(var_list, pairs)
    if not pairs:
      raise ValueError(
        "Keras model %r has no variables yet; build it first (call it on a "
        "batch, or model.build(input_shape))." % prefix
      )
    pairs += _model_state(var_list, pairs)
    return pairs, "Keras model %r" % prefix, var_list
  if isinstance(var_list, tf2.Module):
    pairs = [(k, v) for k, v in module_variable_paths(var_list)]
    if not pairs:
      raise ValueError("tf.Module %r has no variables." % var_list.name)
    return pairs, "tf.Module %r" % var_list.name, None
  if isinstance(var_list, dict):
    pairs = []
    for key, var in var_list.items():
      if not isinstance(key, str) or not key:
        raise TypeError(
          "var_list keys must be non-empty strings, got %r." % (key,)
        )
      pairs.append((key, _unwrap(var, "var_list[%r]" % key)))
    _check_listed_once(pairs, ["key %r" % k for k, _ in pairs])
    return _expand_shards(pairs), "var_list", None
  if _is_variable(var_list):
    raise TypeError(
      "var_list must be a list or dict of variables, a Keras model or a "
      "tf.Module, got the single variable %s. Pass a list: var_list=[v]."
      % _name_of(var_list)
    )
  if isinstance(var_list, (str, bytes)) or not hasattr(var_list, "__iter__"):
    raise TypeError(
      "var_list must be a list or dict of variables, a Keras model or a "
      "tf.Module, got %r." % (var_list,)
    )
  pairs = []
  for i, var in enumerate(var_list):
    inner = _unwrap(var, "var_list position %d" % i)
    pairs.append((_name_of(var), inner))
  _check_listed_once(pairs, ["position %d" % i for i in range(len(pairs))])
  pairs = _by_position(pairs, range(len(pairs)))
  return _expand_shards(pairs), "var_list", None


def _weights_first(model, pairs):
  """`pairs` of `model.variables` in the order of `model.weights`, then the
  rest (Keras 3 seed generators' states) in their own order: the order of
  `model.get_weights()`, so that the store's keys pair with it."""
  try:
    weights = list(model.weights)
  except ValueError:  # an unbuilt tf-keras model
    return pairs
  place = {}
  for i, w in enumerate(weights):
    inner = keras_variable_value(w) if is_keras_3_object(w) else w
    place.setdefault(id(inner), i)
  order = sorted(
    range(len(pairs)),
    key=lambda j: (place.get(id(pairs[j][1]), len(weights)), j),
  )
  return [pairs[j] for j in order]


def _by_position(pairs, positions):
  """`pairs` with each key that more than one of them has made unique by the
  position given: "<key>/<position>" ("_" appended while that is another's
  key). A key that one alone has is kept."""
  count = collections.Counter(key for key, _ in pairs)
  taken = set(key for key, n in count.items() if n == 1)
  out = []
  for (key, var), position in zip(pairs, positions):
    if count[key] > 1:
      key = unique_key("%s/%d" % (key, position), taken)
      taken.add(key)
    out.append((key, var))
  return out


def metric_pairs(model):
  """(key, tf.Variable) of the variables of `model.metrics`, each once:
  "metrics/<path>" (Keras 3's path, "loss/total") or "metrics/<metric>/<name>"
  (tf-keras names every Mean's variables "total" and "count")."""
  try:
    metrics = list(getattr(model, "metrics", None) or ())
  except (AttributeError, ValueError):  # an unbuilt model's metrics
    metrics = []
  pairs, seen, keys = [], set(), set()
  for metric in metrics:
    for v in getattr(metric, "variables", ()):
      inner = _unwrap(v, "metric %s's" % getattr(metric, "name", metric))
      if id(inner) in seen:
        continue
      seen.add(id(inner))
      name = getattr(v, "path", None) if is_keras_3_object(v) else None
      key = unique_key(
        "metrics/" + (name or "%s/%s" % (metric.name, _name_of(v))), keys
      )
      keys.add(key)
      pairs.append((key, inner))
  return pairs


def held_optimizers(model):
  """`model.optimizer` and the other optimizers the model holds (a GAN's
  `d_optimizer` and `g_optimizer`, set in its own `compile`), each once, in
  the order a checkpoint of the model finds them."""
  found = []
  first = getattr(model, "optimizer", None)
  if first is not None:
    found.append(first)
  found += [  # (one an optimizer wraps is its own)
    o
    for _, o in _walk(
      model,
      "",
      _is_optimizer,
      lambda o: not (_is_variable(o) or _is_metric(o)),
    )
  ]
  return _distinct(found)


def _is_optimizer(obj):
  return hasattr(obj, "apply_gradients") and hasattr(obj, "iterations")


def is_built(optimizer):
  """Whether a Keras optimizer has made its state (slots) yet."""
  return _has_slots(optimizer, _optimizer_variables(optimizer))


def unique_key(key, taken):
  """`key`, with "_" appended until no key in `taken` is the same."""
  while key in taken:
    key += "_"
  return key


def _distinct(objects, inner=lambda o: o):
  """`objects` in order, each once: by identity of `inner(object)`."""
  seen, out = set(), []
  for o in objects:
    key = id(inner(o))
    if key not in seen:
      seen.add(key)
      out.append(o)
  return out


def _model_state(model, pairs):
  """(key, variable) of state a Keras model holds outside `model.variables`.

  A step writes it, so a rollback must restore it; neither Keras lists it:
  a stateful RNN layer's states (tf-keras does not even track them: keyed
  "<layer>/states/<i>"), a `tf.random.Generator`'s state, a `tf.Variable`
  a Keras 3 layer holds as an attribute. Found as a `tf.train.Checkpoint` of
  the model finds its variables, keyed by the same paths, leaving out what
  optimizers and metrics the model holds (`optimizer=` adds an optimizer's
  state; metrics are no model state).
  """
  known = set(id(v) for _, v in _expand_shards(pairs))
  layers = [
    layer
    for layer in keras_layers(model)
    if layer is not model and not _is_metric(layer)  # tf-keras: layers too
  ]
  found = []
  for layer in layers:
    if getattr(layer, "stateful", False) is True:
      states = getattr(layer, "states", None)
      for i, state in enumerate(states if isinstance(states, list) else ()):
        if _is_variable(state):
          found.append(("%s/states/%d" % (layer.name, i), state))
  for root in [model] + layers:  # each layer's own, keyed under its name
    found += _tracked_by(root, "" if root is model else root.name)
  out = []
  for key, var in _expand_shards(
    [(key, _unwrap(var, "the model's")) for key, var in found]
  ):  # (a sharded variable's shards may be listed, the variable tracked)
    if id(var) not in known:
      known.add(id(var))
      out.append((key, var))
  return out


def _is_metric(obj):
  return hasattr(obj, "update_state") and hasattr(obj, "result")


def _tracked_by(root, prefix):
  """(path, variable) of what `root` tracks, not looking into layers (each is
  a root of its own), optimizers, metrics or variables."""
  return _walk(
    root,
    prefix,
    lambda o: _is_variable(o) or is_sharded_variable(o),
    lambda o: not (_is_keras_model(o) or _is_optimizer(o) or _is_metric(o)),
  )


def _walk(root, prefix, take, enter):
  """(path, object) of what `root` tracks (as a `tf.train.Checkpoint` of it
  finds it: the paths are its keys), breadth first: an object for which
  `take` is true is taken, and not looked into; one for which `enter` is
  true is looked into."""
  view = tf2.train.TrackableView(root)
  seen, queue, found = set([id(root)]), [(prefix, root)], []
  while queue:
    path, obj = queue.pop(0)
    for name, child in sorted(view.children(obj).items()):
      if id(child) in seen:
        continue
      seen.add(id(child))
      where = path + "/" + name if path else name
      if take(child):
        found.append((where, child))
      elif enter(child):
        queue.append((where, child))
  return found


def _optimizer_pairs(optimizer, model):
  """(key, variable) of a Keras optimizer's state, learning rate left out."""
  if isinstance(optimizer, (list, tuple)):
    optimizers = _distinct(optimizer)
    if len(optimizers) == 1:
      return _optimizer_pairs(optimizers[0], model)
    pairs, labels = [], set()
    for opt in optimizers:  # each under its name: all have an `iteration`
      label = unique_key(_opt_name(opt), labels)
      labels.add(label)
      pairs += [
        ("optimizer/%s/%s" % (label, key[len("optimizer/") :]), var)
        for key, var in _optimizer_pairs(opt, model)
      ]
    return pairs
  if not hasattr(optimizer, "variables") or not hasattr(
    optimizer, "iterations"
  ):
    raise TypeError(
      "optimizer= takes a Keras optimizer (Keras 3 or tf-keras) in eager "
      "mode, got %r. (tf.compat.v1.train optimizers are for graph mode.)"
      % (optimizer,)
    )
  variables = _optimizer_variables(optimizer)
  if not _has_slots(optimizer, variables):
    if not hasattr(optimizer, "build"):
      raise ValueError(
        "Optimizer %s (a legacy Keras optimizer) has no slots yet: it makes "
        "them on its first step. Apply gradients once before building the "
        "store, or use a current optimizer (keras.optimizers.%s)."
        % (_opt_name(optimizer), type(optimizer).__name__)
      )
    if model is None:
      raise ValueError(
        "Optimizer %s has not built its state yet (no slots). Build it "
        "first: optimizer.build(model.trainable_variables), or pass "
        "var_list=model so that the store builds it." % _opt_name(optimizer)
      )
    optimizer.build(model.trainable_variables)
    variables = _optimizer_variables(optimizer)
  rates = set(id(r) for r in _learning_rates(optimizer))
  rates.update(id(h) for h in _hyperparameters(optimizer))
  prefix = _opt_name(optimizer)
  model_prefix = (getattr(model, "name", "") or "") if model else ""
  pairs, positions, seen = [], [], set()
  for position, var in enumerate(variables):
    inner = _unwrap(var, "optimizer %s's" % prefix)
    if id(inner) in seen or id(inner) in rates or id(var) in rates:
      continue
    seen.add(id(inner))
    name = _strip(_name_of(var), prefix)
    if model_prefix and name.startswith(model_prefix + "_"):
      name = name[len(model_prefix) + 1 :]  # Keras 3 slots: model_layer_w_m
    pairs.append(("optimizer/" + _strip(name, model_prefix), inner))
    positions.append(position)
  # (slots of variables that share a name share theirs)
  pairs = _by_position(pairs, positions)
  listed = set(id(v) for v in variables)
  trained = set(id(v) for v in _trained_by(optimizer))
  extra = [
    ("optimizer/" + path, _unwrap(var, "optimizer %s's" % prefix))
    for path, var in _tracked_variables(optimizer)
    if id(var) not in listed and id(var) not in rates and id(var) not in trained
  ]
  return pairs + _expand_shards(extra)


def _trained_by(optimizer):
  """The variables `optimizer` (and any it wraps) was built for, unwrapped.

  No state of it: a Keras 3 optimizer tracks them (`_trainable_variables`),
  so that a checkpoint of it saves plain `tf.Variable`s it trains (a model's
  are Keras variables, which the search does not take). Left out, a
  variable in `var_list` is covered once, under its own key.
  """
  out = []
  for opt in wrapped_chain(optimizer):
    for var in keras_trained_variables(opt):
      inner = keras_variable_value(var) if is_keras_3_object(var) else var
      out.append(var if inner is None else inner)
  return out


def _tracked_variables(optimizer):
  """(path, tf.Variable) of every variable `optimizer` tracks, breadth first.

  What a `tf.train.Checkpoint` of the optimizer saves, keyed by the same
  attribute paths. tf-keras optimizers keep state outside their `variables`
  list: `LossScaleOptimizer`'s loss scale and its count of good steps,
  `Nadam`'s running product of momentum factors (`_u_product`). Keras 3
  optimizers list all of theirs in `variables` (not searched here). Slots
  are not children of the optimizer in this graph; they are all in
  `variables`.
  """
  # (A sharded variable's shards are its own. Keras 3 optimizers track the
  # variables they train too, in `_trainable_variables`: a model's are
  # Keras 3 objects, not looked into; plain ones are found, and left out by
  # `_trained_by`.)
  return _walk(
    optimizer,
    "",
    lambda o: isinstance(o, tf_variables.Variable) or is_sharded_variable(o),
    lambda o: not is_keras_3_object(o),
  )


def _hyperparameters(optimizer):
  """The hyperparameter variables of a legacy Keras optimizer (`_hyper`:
  beta_1, decay, momentum...), of it and of any optimizer it wraps: set by
  the user, never by a step, and left out as the learning rate is."""
  return [
    v
    for opt in wrapped_chain(optimizer)
    for v in keras_hyperparameters(opt).values()
    if _is_variable(v)
  ]


def wrapped_chain(optimizer):
  """`optimizer` and those it wraps, outermost first (a LossScaleOptimizer's
  `inner_optimizer`; a legacy one's `_optimizer`)."""
  chain = []
  while optimizer is not None and all(o is not optimizer for o in chain):
    chain.append(optimizer)
    optimizer = getattr(optimizer, "inner_optimizer", None) or getattr(
      optimizer, "_optimizer", None
    )
  return chain


def _optimizer_variables(optimizer):
  variables = optimizer.variables
  return list(variables() if callable(variables) else variables)


def _has_slots(optimizer, variables):
  built = getattr(optimizer, "built", None)
  if built is not None:
    return bool(built)
  # Legacy optimizers: slots exist once a step ran (`iterations` alone before).
  return len(variables) > 1


def _learning_rates(optimizer):
  """The learning-rate variables of `optimizer` and of any it wraps."""
  found = []
  for opt in wrapped_chain(optimizer):
    rate = keras_learning_rate(opt)
    if _is_variable(rate):  # not a schedule
      found.append(rate)
      inner = keras_variable_value(rate)
      if inner is not None:
        found.append(inner)
  return found


def _opt_name(optimizer):
  return getattr(optimizer, "name", None) or type(optimizer).__name__


def _is_keras_model(obj):
  """A Keras model or layer (either Keras): it has `variables` and `weights`."""
  cls = type(obj)  # the class: tf-keras' properties raise on unbuilt models
  return (
    hasattr(cls, "weights")
    and hasattr(cls, "variables")
    and hasattr(cls, "trainable_variables")
    and not isinstance(obj, (list, tuple, dict))
    and (
      is_keras_3_object(obj)
      # a subclass of a Keras model or layer, defined anywhere
      or any(
        c.__module__.split(".")[0] in ("keras", "tf_keras") for c in cls.__mro__
      )
    )
  )


def _is_variable(obj):
  return isinstance(obj, tf_variables.Variable) or (
    is_keras_3_object(obj) and hasattr(obj, "path") and hasattr(obj, "value")
  )


def _name_of(var):
  """The name a variable is known by: Keras 3's path, else its name sans :0."""
  if is_keras_3_object(var) and hasattr(var, "path"):
    return var.path
  if is_sharded_variable(
    var
  ):  # its name is its class's; its shards' "w/part_0"
    name = _name_of(var.variables[0])
    return name[: -len("/part_0")] if name.endswith("/part_0") else name
  name = getattr(var, "name", None)
  if not isinstance(name, str):
    raise TypeError("%r is not a tf.Variable." % (var,))
  return name[:-2] if name.endswith(":0") else name


def _strip(name, prefix):
  if prefix and name.startswith(prefix + "/"):
    return name[len(prefix) + 1 :]
  return name


def _unwrap(var, where):
  """The `tf.Variable` behind `var` (a Keras 3 variable is unwrapped)."""
  if isinstance(var, tf_variables.PartitionedVariable):
    raise TypeError(
      "%s holds a PartitionedVariable, which is graph mode's; eager "
      "variables are not partitioned." % where
    )
  if is_keras_3_object(var):
    inner = keras_variable_value(var)
    if inner is None:
      raise ValueError(
        "%s variable %s is not built yet (a deferred Keras variable); build "
        "the model first (call it on a batch, or model.build())."
        % (where, getattr(var, "path", var))
      )
    var = inner
  if is_sharded_variable(var):
    return var  # its shards, each a variable of its own (`_expand_shards`)
  if not isinstance(var, tf_variables.Variable):
    raise TypeError("%s holds %r, which is not a tf.Variable." % (where, var))
  return var


def _expand_shards(pairs):
  """A `ShardedVariable` (parameter-server training) as its shards, keyed
  "<key>/part_<i>" as graph mode keys a `PartitionedVariable`'s parts: each
  shard lives on its own parameter server, and is copied there."""
  out = []
  for key, var in pairs:
    if is_sharded_variable(var):
      out.extend(
        ("%s/part_%d" % (key, i), shard)
        for i, shard in enumerate(var.variables)
      )
    else:
      out.append((key, var))
  return out


def _dedupe(variables):
  """`variables` each once (a Keras 3 variable by the tf.Variable it holds)."""
  return _distinct(
    variables, lambda v: keras_variable_value(v) if is_keras_3_object(v) else v
  )


def _check_listed_once(pairs, where):
  first = {}
  for (_, var), place in zip(pairs, where):
    if id(var) in first:
      raise ValueError(
        "var_list names variable %s twice: at %s and at %s. List each "
        "variable once." % (var.name, first[id(var)], place)
      )
    first[id(var)] = place


def _check_unique(pairs):
  by_key, seen = {}, {}
  for key, var in pairs:
    if id(var) in seen:
      raise ValueError(
        "Variable %s is covered twice (as %r and %r): the optimizer's state "
        "and var_list overlap. List each variable once."
        % (var.name, seen[id(var)], key)
      )
    seen[id(var)] = key
    if key in by_key:
      raise ValueError(
        "Variables %s and %s both have the key %r. Pass var_list as a dict "
        "{key: variable} to name them." % (by_key[key].name, var.name, key)
      )
    by_key[key] = var


def _check_eager(key, var):
  if in_graph_mode(var):
    raise ValueError(
      "Variable %s (%r) belongs to a TF1 graph, but the store is built "
      "eagerly. Build the store where the variables were made (inside "
      "`with graph.as_default():`)." % (var.name, key)
    )
