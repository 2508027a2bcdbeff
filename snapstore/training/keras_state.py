"""What a Keras model holds, for `SnapshotCallback`'s stores in eager `fit`.

The default store covers all of a model's state that training writes, so
that a rollback is exact: the model's variables (weights, batch-norm
statistics, Keras 3 seed-generator states), the state of every optimizer it
holds (slots and `iterations`, not the learning rate) and its compiled
metrics' variables, plus the state of callbacks following the rollbacks.
Keras 3 variables are unwrapped to the `tf.Variable` they hold (`inner`).
This module says which variables those are, builds the default store over
them, and checks a store of your own (see docs/design/callback.md).

    store = keras_state.default_store(model, followed)   # a device store
    rate = keras_state.learning_rate(model, backoff)     # what backoff cuts
"""

import collections

from snapstore._keras import is_keras_3_object
from snapstore._keras import keras_learning_rate
from snapstore._keras import keras_variable_value
from snapstore._tf import tf2
from snapstore.engines.eager import variables as eager_variables
from snapstore import errors
from snapstore.store import SnapshotStore


def inner(variable):
  """The `tf.Variable` behind a Keras 3 variable (others as they are)."""
  if is_keras_3_object(variable):
    value = keras_variable_value(variable)
    return value if value is not None else variable
  return variable


def default_variables(model):
  """The variables `default_store` would cover now, unwrapped."""
  return list(default_var_list(model).values())


def default_var_list(model):
  """{key: variable} of `default_store`: the model's variables, those of
  every optimizer it holds (a GAN's own, set in its `compile`, once built:
  `unbuilt_optimizers`), and the metrics' variables the model does not list
  (tf-keras lists them)."""
  optimizers = [
    o
    for o in eager_variables.held_optimizers(model)
    if o is model.optimizer or eager_variables.is_built(o)
  ]
  varset = eager_variables.variable_set(
    var_list=model, optimizer=optimizers or None
  )
  var_list = collections.OrderedDict((s.key, s.variable) for s in varset)
  covered = set(id(v) for v in var_list.values())
  for key, variable in eager_variables.metric_pairs(model):
    if id(variable) not in covered:
      var_list[eager_variables.unique_key(key, var_list)] = variable
  return var_list


def default_store(model, followed=None, max_to_keep=2):
  """Device store of the model, its optimizers' state, the metrics made and
  `followed` ({key: variable}: the state of callbacks following rollbacks)."""
  var_list = default_var_list(model)
  covered = set(id(v) for v in var_list.values())
  for key, variable in (followed or {}).items():
    if id(variable) not in covered:
      var_list[eager_variables.unique_key(key, var_list)] = variable
  return SnapshotStore(
    var_list=dict(var_list),
    mode="device",
    max_to_keep=max_to_keep,
    name="snapshot_callback",
  )


def warm_up(store, model):
  """Runs each copy of a new default store once, at `on_train_begin`.

  The first call of a traced function instantiates it in TensorFlow's
  runtime, which tf-keras would count against the batch hooks ("Callback
  method ... is slow"). Snapshots of the current values, restored into the
  variables: nothing changes. Also the eager ops of a rollback's finiteness
  check.
  """
  tags = ["snapshot_callback/warm_up_%d" % i for i in range(store.max_to_keep)]
  for tag in tags:
    store.snapshot(tag)
  for tag in tags:
    store.restore(tag)
    store.delete(tag)
  all_finite([inner(v) for v in model.trainable_variables[:1]])


def held_name(model, optimizer):
  """The attribute of `model` holding `optimizer`, or its name."""
  for name, value in vars(model).items():
    if value is optimizer:
      return name
  return getattr(optimizer, "name", None) or "an optimizer"


def unbuilt_optimizers(model):
  """Optimizers the model holds besides `model.optimizer` with no state yet
  (Keras makes it at their first `apply_gradients`, with the variables given
  there): a store made now could not cover it."""
  return [
    o
    for o in eager_variables.held_optimizers(model)
    if o is not model.optimizer and not eager_variables.is_built(o)
  ]


def build_compiled_metrics(model):
  """Makes tf-keras's compiled loss and metrics now, as its first step would.

  tf-keras builds them (and their variables) from the structure of the
  model's outputs in the first train step; Keras 3 has built them before
  `on_train_begin`. Each is built once, for outputs shaped as the model's.
  """
  if is_keras_3_object(model) or not getattr(model, "outputs", None):
    return
  outputs = model.outputs[0] if len(model.outputs) == 1 else model.outputs
  for container, args in (
    (getattr(model, "compiled_loss", None), (outputs,)),
    (getattr(model, "compiled_metrics", None), (outputs, outputs)),
  ):
    if container is not None and not getattr(container, "built", True):
      container.build(*args)


def metric_variables(model):
  """The compiled metrics' variables, unwrapped, each once."""
  return [v for _, v in eager_variables.metric_pairs(model)]


def trainable_floats(model):
  """The model's trainable float variables, unwrapped."""
  return [
    v
    for v in (inner(w) for w in model.trainable_variables)
    if v.dtype.is_floating
  ]


def all_finite(variables):
  """Whether every element of every variable is finite (eager ops)."""
  found = [tf2.reduce_all(tf2.math.is_finite(v)) for v in variables]
  return bool(tf2.reduce_all(tf2.stack(found)).numpy()) if found else True


def learning_rate(model, backoff):
  """The learning-rate `tf.Variable` that `backoff` multiplies, or None.

  Raises:
    ValueError: `backoff` with a learning rate that is not a variable.
  """
  if backoff is None:
    return None
  # Under a LossScaleOptimizer (mixed precision), the optimizer it wraps
  # applies the rate (Keras 3's wrapper has a learning rate of its own, unused).
  chain = eager_variables.wrapped_chain(model.optimizer)
  optimizer = chain[-1] if chain else None
  # What the optimizer was given (a variable, or a schedule): tf-keras's
  # `learning_rate` with a schedule is a variable the schedule overwrites at
  # every step. Legacy optimizers keep none apart.
  rate = keras_learning_rate(optimizer)
  if rate is None:
    rate = getattr(optimizer, "learning_rate", None)
  value = inner(rate) if rate is not None else None
  if not isinstance(value, tf2.Variable):
    raise ValueError(
      "backoff= multiplies the optimizer's learning rate at each rollback, "
      "but %s's learning rate is %r, not a variable (a schedule?). Pass a "
      "float learning rate to the optimizer, or cut it yourself in "
      "on_rollback=." % (type(optimizer).__name__, rate)
    )
  return value


def own_store(store, model):
  """The store of your own: `store`, or what the function `store` returns
  for `model`.

  Raises:
    TypeError: A store function that returns no `SnapshotStore`.
  """
  if isinstance(store, SnapshotStore):
    return store
  made = store(model)
  if not isinstance(made, SnapshotStore):
    raise TypeError(
      "The store function returned %r, not a SnapshotStore." % (made,)
    )
  return made


def check_not_graph_store(store):
  """Refuses a store built in graph mode for an eager `fit`.

  Raises:
    ValueError: The store has a graph.
  """
  if store.graph is not None:
    raise ValueError(
      "SnapshotCallback's store %r was built in graph mode, but fit runs "
      "eagerly here. Build the store eagerly, next to the model (or pass "
      "store=None for the default store)." % store.name
    )


def check_in_step_store(store):
  """Refuses a store the train step cannot copy into.

  Raises:
    ValueError: A store built in graph mode, or without device slots.
  """
  check_not_graph_store(store)
  try:
    store.slots
  except errors.ModeError as e:
    raise ValueError(
      "SnapshotCallback(in_step=...) copies into a device slot in the train "
      "step, but store %r has none: %s" % (store.name, e)
    )
