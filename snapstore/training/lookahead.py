"""Lookahead: k steps forward with any optimizer, then one step back.

`Lookahead` wraps a `tf.train.Optimizer` (the inner optimizer: SGD, Momentum,
Adam, ...) as in Zhang, Lucas, Hinton and Ba, "Lookahead Optimizer: k steps
forward, 1 step back", NeurIPS 2019 (arXiv:1907.08610), Algorithm 1. The
inner optimizer updates the model's variables (the fast weights theta) every
step; a copy phi (the slow weights) starts at the parameters training starts
from, and every k inner steps:

    phi   <- phi + alpha * (theta - phi)
    theta <- phi

Everything happens in the graph: one `session.run(train_op)` is one step, with
no Python-side branching. The slow weights are the shadows of a device-mode
`SnapshotStore` (slot 0, pinned under the tag "slow"): one more copy of the
parameters in device memory, next to each variable.

    opt = snapstore.Lookahead(tf.train.MomentumOptimizer(0.1, 0.9), k=5, alpha=0.5)
    train_op = opt.minimize(loss, global_step=step)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      for feed in batches:
        sess.run(train_op, feed)
      slow_loss = opt.evaluate_with(loss, held_out, session=sess)  # with phi

On the eager engine, `Lookahead` takes a Keras optimizer (Keras 3 or
tf-keras) and the variables it trains, and returns a `KerasLookahead`: not an
optimizer but a helper next to yours. Its `update()` is one traced function,
built once, that counts an inner step and synchronizes every k; call it after
`apply_gradients`, eagerly or inside your `tf.function` step (no extra
dispatch). With `fit`, its `callback()` calls it after every batch:

    opt = keras.optimizers.Adam(1e-3)
    lookahead = snapstore.Lookahead(opt, k=5, alpha=0.5, var_list=model)

    @tf.function
    def train_step(x, y):
      ...
      opt.apply_gradients(zip(grads, model.trainable_variables))
      lookahead.update()

    # or: model.compile(optimizer=opt, ...)
    #     model.fit(x, y, callbacks=[lookahead.callback()])
    slow_loss = lookahead.evaluate_with(lambda: loss_fn(y, model(x)))

With a `SnapshotCallback` in the same `fit` (in either order), a batch it
rolls back never happened for Lookahead either: its counter and slow weights
are rolled back with the model, and it counts only the batches that stand
(`KerasLookahead.callback`).

Why a helper and not a wrapped Keras optimizer: wrapping means subclassing
two optimizer base classes (Keras 3's and tf-keras's, each with its own
build, variable tracking, loss scaling, EMA and serialization) and keeping up
with their private hooks; a helper that touches only `tf.Variable`s works
with any optimizer as it is (a `LossScaleOptimizer`, `use_ema=True`) and
leaves `model.optimizer`, its checkpoints and its config unchanged.
"""

import collections
import sys

import numpy as np

from snapstore._tf import builds_eagerly
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core import checks
from snapstore.engines.graph import copies
from snapstore.core import distributed
from snapstore.engines.eager import copies as eager_copies
from snapstore.engines.eager import distributed as eager_distributed
from snapstore.engines.eager import device as eager_device
from snapstore.store import SnapshotStore
from snapstore.training import followers
from snapstore.training.wrapped_optimizer import WrapperOptimizer

SLOW = "slow"

_State = collections.namedtuple("_State", ["store", "counter", "slow_of"])


class Lookahead(WrapperOptimizer):
  """Lookahead around an inner `tf.train.Optimizer` (Zhang et al. 2019).

  The inner optimizer takes every step on the model's variables (the fast
  weights). Every `k` of its steps, the slow weights move a fraction `alpha`
  of the way to the fast weights, and the fast weights are set to the result,
  bit for bit (see the module docstring for the rule).

  Defaults `k=5, alpha=0.5`: the setting the paper uses for its ImageNet
  experiments (Section 5); its sensitivity study (Section 6) varies k over
  {5, 10} and alpha over {0.5, 0.8} and finds Lookahead robust to both. The
  authors' reference code (github.com/michaelrzhang/lookahead) defaults to
  k=5, alpha=0.8.

  The inner optimizer's own state (momentum, Adam's moments and beta powers)
  is left as it is at a synchronization: Algorithm 1 of the paper resets only
  the parameters, and the authors' implementation keeps the inner state too.

  Slow weights: shadows named `<variable>/<name>/slot_0`, colocated with
  their variable, in GLOBAL_VARIABLES: a `tf.train.Saver` checkpoints them
  like optimizer slots, and `tf.global_variables_initializer()` initializes
  them to the variables' initial values. They also take the parameters of the
  very first step (when the step counter is 0), so training that starts from
  values loaded after initialization (a pretrained model) starts phi there
  too. `get_slot(var, "slow")` returns a variable's slow weights;
  `variables()` lists the inner optimizer's variables, the step counter and
  the slow weights, so `SnapshotStore(..., optimizer=lookahead)` covers all
  of Lookahead's state.

  Each instance builds one train op per graph (one `minimize` or
  `apply_gradients` call).

  Args:
    optimizer: The inner `tf.train.Optimizer`.
    k: Synchronization period: inner steps between slow-weight updates (>= 1).
    alpha: Slow-weights step size, 0 < alpha <= 1 (1 follows the inner
      optimizer's trajectory up to rounding: `slow + 1 * (fast - slow)` is
      not always `fast` in floating point).
    use_locking: Passed to `tf.train.Optimizer`.
    name: Name of the optimizer's ops and of the slow-weight shadows.

  On the eager engine, a Keras optimizer (and `var_list=`) makes a
  `KerasLookahead` instead (see the module docstring).

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer` (in graph mode,
      Keras optimizers are not), or `k`/`alpha` have the wrong type.
    ValueError: `k < 1`, or `alpha` outside (0, 1].
  """

  def __new__(cls, optimizer=None, *args, **kwargs):
    if cls is Lookahead and _is_keras_optimizer(optimizer) and builds_eagerly():
      return KerasLookahead(optimizer, *args, **kwargs)
    return super(Lookahead, cls).__new__(cls)

  def __init__(
    self, optimizer, k=5, alpha=0.5, use_locking=False, name="Lookahead"
  ):
    k = checks.integer(k, "k", 1)
    alpha = checks.number(alpha, "alpha")
    if not 0 < alpha <= 1:
      raise ValueError(
        "alpha must be in (0, 1] (the slow weights' step size), "
        "got %r." % (alpha,)
      )
    super(Lookahead, self).__init__(optimizer, use_locking, name)
    self._k = k
    self._alpha = alpha

  @property
  def k(self):
    return self._k

  @property
  def alpha(self):
    return self._alpha

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Builds the Lookahead train op: an inner step, and a synchronization every k.

    Under a `tf.distribute` strategy (graph mode, `MirroredStrategy`), call
    it (or `minimize`) inside `strategy.run` as with any
    `tf.train.Optimizer`: one train op is built for every replica (in a
    `merge_call`, as TensorFlow's optimizers build their update), with the
    slow weights one shadow per replica component, each synchronized from
    its own replica's fast weights on its own device.

    Args:
      grads_and_vars: As for `tf.train.Optimizer.apply_gradients`.
      global_step: Incremented by the inner optimizer's step.
      name: Name of the returned op.

    Returns:
      The train op.

    Raises:
      ValueError: No gradients, or this Lookahead already has a train op in
        this graph.
    """
    grads_and_vars = tuple(grads_and_vars)
    if eager_distributed.in_replica_context():
      # As tf.train.Optimizer.apply_gradients under a strategy: the
      # replicas' gradients meet in one merge_call, which builds the step
      # once, in cross-replica context, for every replica.
      self._trained_variables(grads_and_vars)  # every check before merging
      return tf.distribute.get_replica_context().merge_call(
        self._cross_replica_apply,
        args=(
          tuple((g, v) for g, v in grads_and_vars if g is not None),
          global_step,
          name,
        ),
      )
    return self._build(
      grads_and_vars,
      name,
      lambda: self._optimizer.apply_gradients(
        grads_and_vars, global_step=global_step
      ),
    )

  def _cross_replica_apply(self, strategy, grads_and_vars, global_step, name):
    """`apply_gradients` in the `merge_call` of a strategy's replicas."""
    return self._build(
      grads_and_vars,
      name,
      # What the inner optimizer's own apply_gradients merges into.
      lambda: self._optimizer._distributed_apply(  # pylint: disable=protected-access
        strategy, grads_and_vars, global_step=global_step
      ),
    )

  def _build(self, grads_and_vars, name, inner_apply):
    fast = self._trained_variables(grads_and_vars)
    graph = fast[0].graph
    state = self._states.get(graph)  # made by create_slots, if it ran
    if state is None:
      state = self._make_state(fast)
      self._set_state(graph, state)
    else:
      _check_prepared(state, fast, self._name)
    self._mark_built(graph)
    pairs = _pairs(state.store)
    fast = [theta for theta, _ in pairs]
    slow = [phi for _, phi in pairs]
    counter = state.counter

    with tf.name_scope(name, self._name) as scope:
      start = tf.cond(
        tf.equal(_value(counter), 0),
        lambda: copies.copy(fast, slow, "take_start"),
        tf.no_op,
        name="start",
      )
      with tf.control_dependencies([start]):
        inner_step = inner_apply()
      with tf.control_dependencies([inner_step]):
        with tf.control_dependencies([_count(counter)]):
          count = copies.read(counter)
        synced = tf.cond(
          tf.equal(tf.math.floormod(count, self._k), 0),
          lambda: self._synchronize(fast, slow),
          tf.no_op,
          name="synchronize",
        )
      return self._replaces(
        inner_step, tf.group(inner_step, synced, name=scope)
      )

  def _synchronize(self, fast, slow):
    assigns = []
    for theta, phi in zip(fast, slow):
      with ops.colocate_with(theta):
        phi_value = copies.read(phi)
        alpha = tf.constant(self._alpha, dtype=phi_value.dtype)
        new = phi_value + alpha * (copies.read(theta) - phi_value)
        # Both from one tensor, so fast and slow are equal bit for bit.
        assigns += [copies.assign(phi, new), copies.assign(theta, new)]
    return tf.group(*assigns)

  # -- the slow weights ------------------------------------------------------------

  def store(self, graph=None):
    """The device store holding the slow weights of `graph` under tag "slow".

    Use it to read, restore or save the slow weights (`store.arrays("slow")`,
    `store.restore("slow")`, `store.files.save_npz(path, "slow")`). Its one slot is
    pinned to the slow weights, so it takes no snapshots under other tags.

    Raises:
      ValueError: This Lookahead has no train op in `graph` (default: the
        graph of its only train op, else the default graph).
    """
    return self._state(graph).store

  def evaluate_with(self, fetches, feed_dict=None, session=None):
    """Runs `fetches` with the slow weights, then puts the fast weights back.

    See `SnapshotStore.evaluate_with`: afterwards the variables hold bit for
    bit what they held before.
    """
    return self._state_of_session(session).store.evaluate_with(
      fetches, feed_dict, tag=SLOW, session=session
    )

  def _prepare(self, var_list):
    """`snapstore.create_slots(lookahead, var_list)`: the slow weights and the
    counter now, before the train op, so that a store covering them can be
    built first (for `store.slots.snapshot_before`); the train op then uses
    them."""
    graph = var_list[0].graph
    if self._states.get(graph) is None:
      self._set_state(graph, self._make_state(var_list))

  def _make_state(self, fast):
    """The slow weights (a device store pinned at "slow") and the counter."""
    store = SnapshotStore(
      var_list=fast,
      mode="device",
      max_to_keep=1,
      name=self._name,
      saveable=True,
    )
    store.slots.pin(0, SLOW)
    counter = self._own_variable(
      np.int64(0),
      self._name + "_counter",
      distributed.anchor(min(store.variables.values(), key=lambda v: v.name)),
    )
    pairs = _pairs(store)
    return _State(store, counter, {id(f): s for f, s in pairs})

  # -- tf.train.Optimizer's view of the state ------------------------------------------

  def get_slot(self, var, name):
    """A slot of `var`; for "slow", its slow weights.

    A `tf.distribute` variable's slow weights are one variable per
    component: ask with the component (`var.values[i]`).
    """
    if name == SLOW:
      state = self._states.get(var.graph)
      return state.slow_of.get(id(var)) if state is not None else None
    return self._optimizer.get_slot(var, name)

  def get_slot_names(self):
    return sorted(set(self._optimizer.get_slot_names()) | {SLOW})

  def _own_variables(self, state):
    return [state.counter] + [
      phi
      for phis in state.store.slots.component_shadows(0).values()
      for phi in phis
    ]


def _pairs(store):
  """(fast, slow) per component: a distributed variable's replicas each with
  their own slow weights, on their own device (replicas never mix)."""
  return [
    pair
    for theta, phis in zip(
      store.variables.values(), store.slots.component_shadows(0).values()
    )
    for pair in zip(distributed.components(theta), phis)
  ]


def _check_prepared(state, trained, name):
  """Refuses a train op over other variables than `create_slots` was given.

  Raises:
    ValueError: They differ; names both.
  """
  prepared = list(state.store.variables.values())
  if set(map(id, prepared)) == set(map(id, trained)):
    return
  raise ValueError(
    "Lookahead %r made its slow weights for %s (create_slots), but this "
    "train op trains %s. Pass create_slots the variables the train op "
    "trains (those with a gradient)."
    % (
      name,
      sorted(v.op.name for v in prepared),
      sorted(v.op.name for v in trained),
    )
  )


# -- the eager engine: Lookahead next to a Keras optimizer -----------------------


class KerasLookahead(object):
  """Lookahead next to a Keras 3 or tf-keras optimizer, on the eager engine.

  Made by `snapstore.Lookahead(keras_optimizer, k, alpha, var_list=...)`
  when eager execution is on (see the module docstring). The optimizer takes
  every step on the fast weights (`var_list`); after each of its steps,
  `update()` counts the step and, every `k` steps, moves the slow weights a
  fraction `alpha` towards the fast weights and sets the fast weights to the
  result, bit for bit (the same arithmetic as the graph version). The
  optimizer's own state is left as it is, as in the paper's Algorithm 1.

  The slow weights are the shadows of a device `SnapshotStore` over the fast
  weights (`store`, one slot pinned under "slow"); they start at the values
  the fast weights hold when the `KerasLookahead` is made, so make it after
  loading the weights training starts from (or call `reset()`).

  Args:
    optimizer: The Keras optimizer (Keras 3 or tf-keras) that steps the fast
      weights.
    k: Synchronization period: inner steps between slow-weight updates (>= 1).
    alpha: Slow-weights step size, 0 < alpha <= 1.
    use_locking: Graph mode's option; refused when True.
    name: Name of the store and of the traced functions.
    var_list: The fast weights: a Keras model or layer, or a `tf.Module`
      (their trainable variables), or a list or dict of float variables.

  Raises:
    TypeError: `k`/`alpha` of the wrong type; `optimizer` not a Keras
      optimizer.
    ValueError: No `var_list`; a variable that is not a float; `k < 1`;
      `alpha` outside (0, 1]; `use_locking=True`.
    ModeError: Made inside a `tf.function`.
  """

  def __init__(
    self,
    optimizer,
    k=5,
    alpha=0.5,
    use_locking=False,
    name="Lookahead",
    var_list=None,
  ):
    k = checks.integer(k, "k", 1)
    alpha = checks.number(alpha, "alpha")
    if not 0 < alpha <= 1:
      raise ValueError(
        "alpha must be in (0, 1] (the slow weights' step size), "
        "got %r." % (alpha,)
      )
    if not _is_keras_optimizer(optimizer):
      raise TypeError(
        "KerasLookahead takes a Keras optimizer (Keras 3 or tf-keras), got "
        "%r." % (optimizer,)
      )
    if use_locking:
      raise ValueError(
        "use_locking=True is for graph mode's tf.train.Optimizer; eager "
        "updates run in order in one traced function. Leave it False."
      )
    eager_device.check_not_traced("Lookahead")
    if var_list is None:
      raise ValueError(
        "Lookahead with a Keras optimizer needs the variables it trains: "
        "var_list=model (its trainable variables) or a list of variables. "
        "(A Keras optimizer does not say which variables it steps.)"
      )
    fast = _fast_variables(var_list)
    self._optimizer = optimizer
    self._k = k
    self._alpha = alpha
    self._name = name
    self._store = SnapshotStore(
      var_list=fast, mode="device", max_to_keep=1, name=name
    )
    self._store.slots.pin(0, SLOW)
    fast = list(self._store.variables.values())
    slow = list(self._store.slots.shadows(0).values())
    # Parameter-server strategies (v2) whose coordinator may be running
    # steps that write the fast weights: an eager update refuses then.
    self._ps_strategies = eager_distributed.coordinated_strategies(fast)
    with tf2.init_scope(), tf.device(fast[0].device):
      self._counter = tf2.Variable(
        np.int64(0), trainable=False, name=name + "/counter"
      )
    self._update = eager_copies.traced(
      _eager_update(fast, slow, self._counter, k, alpha), name
    )
    self._reset = eager_copies.Lazy(
      lambda: eager_copies.traced(
        _eager_reset(fast, slow, self._counter), name + "_reset"
      )
    )

  @property
  def optimizer(self):
    """The Keras optimizer stepping the fast weights."""
    return self._optimizer

  @property
  def k(self):
    return self._k

  @property
  def alpha(self):
    return self._alpha

  @property
  def counter(self):
    """The int64 variable counting inner steps (`update()` calls)."""
    return self._counter

  def store(self):
    """The device store holding the slow weights under tag "slow".

    `store().arrays("slow")`, `store().restore("slow")`,
    `store().files.save_npz(path, "slow")`; `store().slots.shadows(0)` are the
    slow-weight variables (hand them and `counter` to a
    `tf.train.Checkpoint` to save Lookahead's state).
    """
    return self._store

  def variables(self):
    """`{key: variable}` of Lookahead's state: the counter and slow weights.

    Keyed "<name>/counter" and "<name>/slow/<fast weight's key>" (`name`
    the constructor's). The state a rollback of the fast weights must take
    back too: `SnapshotCallback`'s default store covers it; add it to the
    `var_list` of a store of your own (`dict(var_list,
    **lookahead.variables())`), or to a `tf.train.Checkpoint`.
    """
    out = collections.OrderedDict([(self._name + "/counter", self._counter)])
    for key, phi in self._store.slots.shadows(0).items():
      out["%s/slow/%s" % (self._name, key)] = phi
    return out

  def update(self):
    """Counts one inner step; every `k`, synchronizes slow and fast weights.

    One traced function, built once. Call it after the optimizer's
    `apply_gradients`, eagerly or inside your `tf.function` step. Inside a
    `jit_compile=True` function XLA fuses `phi + alpha * (theta - phi)` into
    one fused multiply-add, so the slow weights then differ from the graph
    version's in the last bit; call it after the compiled step to keep them
    exact.

    Under a `tf.distribute` strategy, call it outside `strategy.run` (each
    replica's component is synchronized with its own values).

    Returns:
      A bool tensor: whether this step synchronized.

    Raises:
      ValueError: Called inside `strategy.run` (replica context); called
        eagerly while steps scheduled on a `ClusterCoordinator` may still
        write the fast weights (`coordinator.join()` first).
    """
    eager_distributed.check_cross_replica("Lookahead.update()")
    eager_distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "Lookahead.update"
    )
    return self._update()

  def reset(self):
    """Starts over from the current fast weights: slow = fast, counter = 0."""
    eager_distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "Lookahead.reset"
    )
    self._reset()

  def evaluate_with(self, fn):
    """Calls `fn()` with the slow weights in place, then puts the fast back.

    See `SnapshotStore.evaluate_with`: afterwards the variables hold bit for
    bit what they held before, also when `fn` raises.
    """
    return self._store.evaluate_with(fn, tag=SLOW)

  def callback(self):
    """A Keras callback calling `update()` after every training batch of `fit`.

    For `model.compile(optimizer=<this optimizer>)` and
    `model.fit(..., callbacks=[lookahead.callback()])`. `fit` must run one
    step per batch end (`steps_per_execution=1`, the default); the callback
    checks this, and the optimizer, when training begins.

    With a `SnapshotCallback` in the same `fit`, in either order, a
    rolled-back batch never happened for Lookahead either: the
    `SnapshotCallback` calls `update()` once it knows the batch stands (from
    its own batch end), and its rollbacks restore Lookahead's counter and
    slow weights too (its default store covers `variables()`; a store of
    your own must, or `fit` is refused).
    """
    base = _callback_base(self._optimizer)
    if base not in _CALLBACKS:
      _CALLBACKS[base] = _callback_class(base)
    return _CALLBACKS[base](self)

  def check_fit(self, model):
    """Refuses a `fit` the callback cannot follow step by step.

    Raises:
      ValueError: `model`'s optimizer is not this Lookahead's, or it runs
        several steps between batch ends (`steps_per_execution` > 1).
    """
    opt = getattr(model, "optimizer", None)
    if opt is not self._optimizer and (
      getattr(opt, "inner_optimizer", None) is not self._optimizer
    ):
      raise ValueError(
        "The model trains with optimizer %r, not the one this Lookahead "
        "follows (%r). Compile the model with the optimizer given to "
        "snapstore.Lookahead." % (opt, self._optimizer)
      )
    steps = getattr(model, "steps_per_execution", None)
    if steps is None:  # tf-keras keeps it in a variable
      steps = getattr(model, "_steps_per_execution", None)
    steps = int(steps.numpy() if hasattr(steps, "numpy") else steps or 1)
    if steps != 1:
      raise ValueError(
        "The model is compiled with steps_per_execution=%d: fit runs %d "
        "steps between batch ends, and Lookahead's callback would count "
        "them as one. Compile with steps_per_execution=1, or call "
        "lookahead.update() in your own train step." % (steps, steps)
      )


_CALLBACKS = {}  # Keras Callback base class -> the Lookahead callback class


def _callback_class(base):
  class LookaheadCallback(base):
    """Calls `KerasLookahead.update()` after every training batch, or lets
    a `SnapshotCallback` of the same `fit` call it after each batch it does
    not roll back (`followers.follow_rollbacks`)."""

    def __init__(self, lookahead):
      super(LookaheadCallback, self).__init__()
      self.lookahead = lookahead
      followers.follow_rollbacks(self)

    def on_train_begin(self, logs=None):
      del logs
      self.lookahead.check_fit(self.model)

    def on_train_batch_end(self, batch, logs=None):
      del batch, logs
      if not followers.is_led(self):
        self.lookahead.update()

    def rollback_variables(self):
      return self.lookahead.variables()

    def batch_stands(self):
      self.lookahead.update()

  return LookaheadCallback


def _callback_base(optimizer):
  """The `Callback` class of the Keras the optimizer belongs to."""
  package = sys.modules[type(optimizer).__module__.split(".")[0]]
  return package.callbacks.Callback


def _is_keras_optimizer(optimizer):
  return (
    not isinstance(optimizer, tf.train.Optimizer)
    and hasattr(optimizer, "apply_gradients")
    and hasattr(optimizer, "iterations")
    and type(optimizer).__module__.split(".")[0] in ("keras", "tf_keras")
  )


def _fast_variables(var_list):
  """The variables Lookahead trains: a model's or module's trainable ones."""
  if hasattr(var_list, "trainable_variables") and not isinstance(
    var_list, (list, tuple, dict)
  ):
    variables = list(var_list.trainable_variables)
    if not variables:
      raise ValueError(
        "%r has no trainable variables (build the model first)." % (var_list,)
      )
    return variables
  if isinstance(var_list, dict):
    variables = list(var_list.values())
  else:
    variables = list(var_list)
  for var in variables:
    dtype = getattr(var, "dtype", None)
    if not getattr(tf.as_dtype(dtype) if dtype else None, "is_floating", 0):
      raise ValueError(
        "Lookahead trains float variables; %r is not one. Leave it out of "
        "var_list." % (var,)
      )
  return var_list


def _value(counter):
  """The step counter's value (a distributed one's first component)."""
  if distributed.is_distributed(counter):
    return copies.read(counter)
  return counter


def _count(counter):
  """An op adding 1 to the step counter: to every component of a
  distributed one (made in a strategy's scope), each on its device, so that
  they stay equal."""
  if not distributed.is_distributed(counter):
    return copies.assign_add(counter, np.int64(1))
  return tf.group(
    *[
      copies.assign_add(c, np.int64(1)) for c in distributed.components(counter)
    ]
  )


def _component_pairs(fast, slow):
  """(fast, slow) component pairs: a distributed variable's replicas each
  with their own, computed on their own device (replicas never mix)."""
  return [
    pair
    for theta, phi in zip(fast, slow)
    for pair in zip(
      eager_distributed.components(theta), eager_distributed.components(phi)
    )
  ]


def _eager_update(fast, slow, counter, k, alpha):
  pairs = _component_pairs(fast, slow)

  def update():
    with tf.device(counter.device):
      count = counter.assign_add(tf.constant(1, tf.int64))

    def synchronize():
      for theta, phi in pairs:
        with tf.device(theta.device):
          phi_value = phi.value()
          rate = tf.constant(alpha, dtype=phi_value.dtype)
          new = phi_value + rate * (theta.value() - phi_value)
          # Both from one tensor, so fast and slow are equal bit for bit.
          phi.assign(new, read_value=False)
          theta.assign(new, read_value=False)
      return tf.constant(True)

    return tf.cond(
      tf.equal(tf.math.floormod(count, k), 0),
      synchronize,
      lambda: tf.constant(False),
    )

  return update


def _eager_reset(fast, slow, counter):
  pairs = _component_pairs(fast, slow)

  def reset():
    for theta, phi in pairs:
      with tf.device(phi.device):
        phi.assign(theta.value(), read_value=False)
    counter.assign(tf.constant(0, tf.int64), read_value=False)

  return reset
