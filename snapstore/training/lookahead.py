"""Lookahead around a `tf.train.Optimizer`: k steps forward, one step back.

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

The contract: a synchronization leaves fast and slow weights equal bit for
bit; the inner optimizer's state is left as it is; a store with
`optimizer=lookahead` covers the inner optimizer's state, the step counter
and the slow weights, so a rollback takes Lookahead back too.

A Keras optimizer (Keras 3 or tf-keras, on the eager engine) has its own
class, `snapstore.KerasLookahead` (`training/keras_lookahead.py`).
`snapstore.Lookahead(keras_optimizer, ...)` still makes one, with a
`DeprecationWarning`, until the next release.
"""

import collections
import warnings

import numpy as np

from snapstore.core import distributed as core_distributed
from snapstore._tf import distributed_apply
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.core import checks
from snapstore.core import distributed
from snapstore.engines import choice
from snapstore.engines.graph import copies
from snapstore.store import SnapshotStore
from snapstore.training import keras_lookahead
from snapstore.training.wrapped_optimizer import WrapperOptimizer

# The tag the slow weights' slot is pinned under (as KerasLookahead's).
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

  For a Keras optimizer, use `snapstore.KerasLookahead`. Until the next
  release, `snapstore.Lookahead(keras_optimizer, k, alpha,
  var_list=model)` on the eager engine still returns one (which is not a
  `Lookahead`), with a `DeprecationWarning`.

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer` (in graph mode,
      Keras optimizers are not), or `k`/`alpha` have the wrong type.
    ValueError: `k < 1`, or `alpha` outside (0, 1].

  Example:
    Graph mode:

    ```python
    opt = snapstore.Lookahead(tf.train.MomentumOptimizer(0.05, 0.9), k=5, alpha=0.5)
    train_op = opt.minimize(loss, global_step=step)
    store = snapstore.SnapshotStore(scope="net", optimizer=opt)  # Lookahead's state too
    ...
    slow_loss = opt.evaluate_with(loss, feed, session=sess)  # at the slow weights
    ```
  """

  def __new__(cls, optimizer=None, *args, **kwargs):
    # Deprecated, until the next release: `Lookahead(keras_optimizer, ...)`
    # on the eager engine made a KerasLookahead; it still does, warning.
    if (
      cls is Lookahead
      and keras_lookahead.is_keras_optimizer(optimizer)
      and choice.new_engine().name == "eager"
    ):
      warnings.warn(
        "snapstore.Lookahead(keras_optimizer, ...) is deprecated and will be "
        "removed in the next release: use snapstore.KerasLookahead("
        "keras_optimizer, k, alpha, var_list=model), which it returns. "
        "snapstore.Lookahead is the tf.train.Optimizer wrapper.",
        DeprecationWarning,
        stacklevel=2,
      )
      return keras_lookahead.KerasLookahead(optimizer, *args, **kwargs)
    return super(Lookahead, cls).__new__(cls)

  _keras_way = (
    "For a Keras optimizer, use snapstore.KerasLookahead(optimizer, k, "
    "alpha, var_list=model), on the eager engine."
  )

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
    if core_distributed.in_replica_context():
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
      lambda: distributed_apply(
        self._optimizer, strategy, grads_and_vars, global_step
      ),
    )

  def _build(self, grads_and_vars, name, inner_apply):
    fast = self._trained_variables(grads_and_vars)
    graph = fast[0].graph
    state = self._states.get(graph)  # made by create_optimizer_slots, if run
    if state is None:
      state = self._make_state(fast)
      self._set_state(graph, state)
    else:
      _check_prepared(state, fast, self.get_name())
    self._mark_built(graph)
    pairs = _pairs(state.store)
    fast = [theta for theta, _ in pairs]
    slow = [phi for _, phi in pairs]
    counter = state.counter

    with tf.name_scope(name, self.get_name()) as scope:
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
    """`snapstore.create_optimizer_slots(lookahead, var_list)`: the slow
    weights and the counter now, before the train op, so that a store
    covering them can be built first (for `store.slots.snapshot_before`);
    the train op then uses them."""
    graph = var_list[0].graph
    if self._states.get(graph) is None:
      self._set_state(graph, self._make_state(var_list))

  def _make_state(self, fast):
    """The slow weights (a device store pinned at "slow") and the counter."""
    store = SnapshotStore(
      var_list=fast,
      mode="device",
      max_to_keep=1,
      name=self.get_name(),
      saveable=True,
    )
    store.slots.pin(0, SLOW)
    counter = self._own_variable(
      np.int64(0),
      self.get_name() + "_counter",
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
  """Refuses a train op over other variables than `create_optimizer_slots`
  was given.

  Raises:
    ValueError: They differ; names both.
  """
  prepared = list(state.store.variables.values())
  if set(map(id, prepared)) == set(map(id, trained)):
    return
  raise ValueError(
    "Lookahead %r made its slow weights for %s (create_optimizer_slots), but "
    "this train op trains %s. Pass create_optimizer_slots the variables the "
    "train op trains (those with a gradient)."
    % (
      name,
      sorted(v.op.name for v in prepared),
      sorted(v.op.name for v in trained),
    )
  )


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
