"""Which variables a graph-mode store covers, and the key each one is stored under.

A store covers an explicit list (or `{key: variable}` dict, as `tf.train.Saver`
takes), every global variable under a scope, or a collection; by default the
trainable variables. Optimizer state (slot variables such as Adam's `m` and `v`
and non-slot variables such as `beta1_power`) and `global_step` can be added, so
that a rollback is exact.

Keys are variable names relative to the store's scope, without the `:0` output
suffix: `online/dense/kernel:0` under scope `online` is `dense/kernel`. Two models
built under different scopes therefore have the same keys, and a snapshot of one
restores into the other. A variable outside the scope (an optimizer's
`beta1_power`, `global_step`) keeps its full name.

    varset = variable_set(scope="online", optimizer=opt, include_global_step=True)
    varset.keys   # ('beta1_power', 'beta2_power', 'dense/kernel', ...)

The result is a `core.varset.VariableSet`.
"""

from snapstore._tf import wrapper_state
from snapstore._tf import makes_no_state
from snapstore._tf import wrapped_optimizer
from snapstore._tf import optimizer_name
from snapstore._keras import is_keras_3_object
from snapstore._keras import KERAS_3_FIX
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import distributed
from snapstore.core import varset

SHADOW_VARIABLES = "snapstore_shadows"
"""The graph collection holding every shadow variable any store made.

Graph mode. Shadows are never themselves covered by a store's `scope` or
`collection` (a store over `GLOBAL_VARIABLES` leaves another store's
`saveable=True` shadows out), and this collection finds them all.

Example:
  ```python
  shadows = tf.get_collection(snapstore.SHADOW_VARIABLES)
  ```
"""


def variable_set(
  var_list=None,
  scope=None,
  collection=None,
  optimizer=None,
  include_global_step=False,
):
  """The `VariableSet` a graph-mode store covers (see module doc).

  Args:
    var_list: A list of variables (a `PartitionedVariable` counts as its parts),
      or a dict `{key: variable}` whose keys are used as given.
    scope: A scope name or `tf.VariableScope`. Keys are names relative to it.
      Without `var_list` or `collection`, every global variable under it.
    collection: A graph collection key, e.g. `tf.GraphKeys.MODEL_VARIABLES`.
      Filtered by `scope` when both are given.
    optimizer: A `tf.train.Optimizer` (or Keras optimizer, or a list of them)
      whose state is added: its slots for the covered variables and its
      non-slot variables. Build its train op before creating the set.
    include_global_step: Add the graph's global step.

  Raises:
    ValueError: Both `var_list` and `collection`; a variable listed twice in
      `var_list`; no variables; a variable with
      a shape that is not fully defined or an unsupported dtype; two variables
      with one key; variables of several graphs; an optimizer with no state yet;
      `include_global_step` on a graph without a global step.
    TypeError: A non-variable in `var_list` or in the collection, or a single
      variable as `var_list`.
  """
  if var_list is not None and collection is not None:
    raise ValueError(
      "Pass var_list or collection, not both (got a var_list and "
      "collection=%r)." % (collection,)
    )
  prefix = _scope_name(scope)
  pairs, graph, source = _resolve(var_list, collection, prefix)
  if optimizer is not None:
    pairs += _optimizer_pairs(optimizer, [v for _, v in pairs], graph)
  if include_global_step:
    _check_no_sync_replicas(optimizer)
    step = tf.train.get_global_step(graph)
    if step is None:
      raise ValueError(
        "include_global_step=True, but the graph has no global step. Create "
        "it with tf.train.get_or_create_global_step() before the store."
      )
    pairs.append((None, step))
  return varset.VariableSet(pairs, source, prefix)


def _resolve(var_list, collection, prefix):
  """Returns ([(explicit key or None, variable)], graph, description)."""
  if var_list is not None:
    if isinstance(var_list, tf_variables.Variable):
      raise TypeError(
        "var_list must be a list or dict of variables, got the single "
        "variable %s. Pass a list: var_list=[%s]."
        % (var_list.name, var_list.op.name)
      )
    if isinstance(var_list, dict):
      pairs, where = [], []
      for key, var in var_list.items():
        if not isinstance(key, str) or not key:
          raise TypeError(
            "var_list keys must be non-empty strings, got %r." % (key,)
          )
        parts = _parts(var, "var_list[%r]" % key)
        if len(parts) == 1:
          pairs.append((key, parts[0]))
        else:
          pairs.extend(
            ("%s/part_%d" % (key, i), p) for i, p in enumerate(parts)
          )
        where.extend(["key %r" % key] * len(parts))
    else:
      if isinstance(var_list, (str, bytes)) or not hasattr(
        var_list, "__iter__"
      ):
        raise TypeError(
          "var_list must be a list or dict of variables, got %r." % (var_list,)
        )
      pairs, where = [], []
      for i, var in enumerate(var_list):
        parts = _parts(var, "var_list")
        pairs.extend((None, p) for p in parts)
        where.extend(["position %d" % i] * len(parts))
    _check_listed_once([v for _, v in pairs], where)
    return pairs, None, "var_list"
  graph = tf.get_default_graph()
  key = collection
  if key is None:
    key = (
      tf.GraphKeys.GLOBAL_VARIABLES
      if prefix is not None
      else tf.GraphKeys.TRAINABLE_VARIABLES
    )
  shadows = set(id(v) for v in graph.get_collection(SHADOW_VARIABLES))
  pairs = []
  for var in graph.get_collection(key):
    if not isinstance(var, tf_variables.Variable):
      raise TypeError(
        "Collection %r holds %r, which is not a variable." % (key, var)
      )
    if id(var) in shadows or not _under(varset.op_name(var), prefix):
      continue
    pairs.append((None, var))
  if prefix is not None:
    source = "collection %r under scope %r" % (key, prefix)
  else:
    source = "collection %r of the default graph" % (key,)
  return pairs, graph, source


def _optimizer_pairs(optimizer, primaries, graph):
  """Slot variables of `primaries` and non-slot variables of the optimizers."""
  optimizers = (
    optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
  )
  if primaries:
    graph = primaries[0].graph
  graph = graph or tf.get_default_graph()
  pairs = []
  for opt in optimizers:
    if is_keras_3_object(opt):
      raise TypeError(
        "optimizer %r is a Keras 3 optimizer. %s" % (opt, KERAS_3_FIX)
      )
    if not _is_optimizer(opt):
      raise TypeError(
        "optimizer must be a tf.train.Optimizer or a Keras "
        "optimizer, got %r." % (opt,)
      )
    parts = _wrapper_parts(opt, graph, primaries)
    if parts is not None:
      base, own = parts
      pairs.extend(_optimizer_pairs(base, primaries, graph))
      pairs.extend((None, v) for v in own)
      continue
    with graph.as_default():  # Optimizer.variables() filters by default graph.
      opt_vars = list(opt.variables())
    if not opt_vars and makes_no_state(opt):
      continue  # GradientDescent: nothing to cover
    if not opt_vars:
      raise ValueError(
        "Optimizer %s has no variables yet. Build its train op (minimize() or "
        "apply_gradients()) before creating the store, so that its slots "
        "exist; or, for store.slots.snapshot_before, which builds the train "
        "op after the store, make them first with "
        "snapstore.create_optimizer_slots(optimizer, var_list)."
        % optimizer_name(opt)
      )
    names = list(opt.get_slot_names())
    candidates = (
      list(primaries)
      + graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
      + graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    )
    # TF 1.15's get_slot of a distributed variable gives the slot's
    # component on the variable's device; the store covers the slot.
    whole = dict(
      (id(part), v)
      for v in opt_vars
      if distributed.is_distributed(v)
      for part in distributed.components(v)
    )
    any_slot = set(
      id(whole.get(id(s), s)) for p in candidates for s in _slots(opt, p, names)
    )
    pairs.extend(
      (None, whole.get(id(s), s))
      for p in primaries
      for s in _slots(opt, p, names)
    )
    pairs.extend((None, v) for v in opt_vars if id(v) not in any_slot)
  return pairs


def _under(name, prefix):
  return prefix is None or name.startswith(prefix + "/")


def _scope_name(scope):
  if scope is None:
    return None
  if isinstance(scope, tf.VariableScope):
    scope = scope.name
  if not isinstance(scope, str):
    raise TypeError(
      "scope must be a string or tf.VariableScope, got %r." % (scope,)
    )
  scope = scope.rstrip("/")
  return scope or None


def _check_listed_once(variables, where):
  """Refuses a var_list that names a variable twice (`where[i]` names entry i).

  The second entry would be dropped: under another key, a snapshot would
  silently lack it.
  """
  first = {}
  for var, place in zip(variables, where):
    if id(var) in first:
      raise ValueError(
        "var_list names variable %s twice: at %s and at %s. List each "
        "variable once." % (var.name, first[id(var)], place)
      )
    first[id(var)] = place


def _parts(var, where):
  if isinstance(var, tf_variables.PartitionedVariable):
    return list(var)
  if not isinstance(var, tf_variables.Variable):
    if is_keras_3_object(var):
      raise TypeError(
        "%s holds %r, a Keras 3 variable. %s" % (where, var, KERAS_3_FIX)
      )
    raise TypeError("%s holds %r, which is not a tf.Variable." % (where, var))
  return [var]


def _check_no_sync_replicas(optimizer):
  """Refuses the global step with a `SyncReplicasOptimizer`.

  Raises:
    ValueError: `optimizer` is or holds one.
  """
  optimizers = (
    optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
  )
  for opt in optimizers:
    if isinstance(opt, tf.train.SyncReplicasOptimizer):
      raise ValueError(
        "include_global_step=True with a SyncReplicasOptimizer: it counts "
        "steps by the global step in state that is no variable (its token "
        "queue, its gradient accumulators, each worker's local step), which a "
        "restore cannot put back, so restoring the global step would make "
        "every later gradient stale and training would hang. Leave the global "
        "step out of the store (the weights and the optimizer's slots are "
        "restored as usual)."
      )


def _is_optimizer(opt):
  return all(
    hasattr(opt, a) for a in ("variables", "get_slot", "get_slot_names")
  )


def _wrapper_parts(opt, graph, primaries):
  """(wrapped optimizer, the wrapper's own variables) of an optimizer wrapper
  whose own `variables()` lists neither; None for any other optimizer.

  TF 1.15's wrappers keep the optimizer they wrap in `_optimizer` or `_opt`
  and answer `variables()` from their own, empty, state (or raise, when
  they never ran `Optimizer.__init__`); their own state is
  - `MixedPrecisionLossScaleOptimizer` (what
    `enable_mixed_precision_graph_rewrite` makes) and Keras's
    `LossScaleOptimizer`: the loss scale and its count of good steps
    (`_loss_scale`);
  - `tf.contrib.mixed_precision.LossScaleOptimizer`: its loss-scale
    manager's variables (the scale, counts of good and bad steps);
  - `tf.contrib.opt.MovingAverageOptimizer`: the averages of the covered
    variables;
  - `tf.contrib.opt.DropStaleGradientOptimizer`: none it keeps (the count
    of dropped gradients behind its summary is made inside
    `apply_gradients` and held by nothing: not covered).
  TF 2.x's wrappers list both, and are left as they are.
  """
  base = wrapped_optimizer(opt)
  if base is None or base is opt or not _is_optimizer(base):
    return None
  try:
    with graph.as_default():
      if list(opt.variables()):
        return None
  except AttributeError:  # no Optimizer.__init__ (contrib's wrappers)
    pass
  own = []
  weights, manager, ema = wrapper_state(opt)
  if isinstance(weights, dict):  # {(name, graph key): variable}
    own += [v for _, v in sorted(weights.items(), key=lambda kv: kv[0][0])]
  if manager is not None:
    own += [
      v for _, v in sorted(vars(manager).items()) if isinstance(v, tf.Variable)
    ]
  if ema is not None and hasattr(ema, "average"):
    own += [a for a in (ema.average(p) for p in primaries) if a is not None]
  return base, [v for v in own if v.graph is graph]


def _slots(opt, primary, names):
  out = []
  for name in names:
    try:
      slot = opt.get_slot(primary, name)
    except KeyError:  # Keras optimizers raise instead of returning None.
      slot = None
    if slot is not None:
      out.append(slot)
  return out
