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
"""

import collections

import numpy as np

from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.core import checks
from snapstore.core import copies
from snapstore.store import SnapshotStore
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
    alpha: Slow-weights step size, 0 < alpha <= 1 (1 gives the inner
      optimizer's trajectory).
    use_locking: Passed to `tf.train.Optimizer`.
    name: Name of the optimizer's ops and of the slow-weight shadows.

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer` (Keras optimizers are
      not), or `k`/`alpha` have the wrong type.
    ValueError: `k < 1`, or `alpha` outside (0, 1].
  """

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
    fast = self._trained_variables(grads_and_vars)
    graph = fast[0].graph
    store = SnapshotStore(
      var_list=fast,
      mode="device",
      max_to_keep=1,
      name=self._name,
      saveable=True,
    )
    store.slots.pin(0, SLOW)
    fast = list(store.variables.values())
    slow = list(store.slots.shadows(0).values())
    counter = self._own_variable(
      np.int64(0), self._name + "_counter", min(fast, key=lambda v: v.name)
    )
    self._set_state(
      graph, _State(store, counter, {id(f): s for f, s in zip(fast, slow)})
    )

    with tf.name_scope(name, self._name) as scope:
      start = tf.cond(
        tf.equal(counter, 0),
        lambda: copies.copy(fast, slow, "take_start"),
        tf.no_op,
        name="start",
      )
      with tf.control_dependencies([start]):
        inner_step = self._optimizer.apply_gradients(
          grads_and_vars, global_step=global_step
        )
      with tf.control_dependencies([inner_step]):
        with tf.control_dependencies([copies.assign_add(counter, np.int64(1))]):
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

  # -- tf.train.Optimizer's view of the state ------------------------------------------

  def get_slot(self, var, name):
    if name == SLOW:
      state = self._states.get(var.graph)
      return state.slow_of.get(id(var)) if state is not None else None
    return self._optimizer.get_slot(var, name)

  def get_slot_names(self):
    return sorted(set(self._optimizer.get_slot_names()) | {SLOW})

  def _own_variables(self, state):
    return [state.counter] + list(state.store.slots.shadows(0).values())
