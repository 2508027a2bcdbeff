"""KerasLookahead: Lookahead next to a Keras optimizer, on the eager engine.

Zhang, Lucas, Hinton and Ba's Lookahead ("Lookahead Optimizer: k steps
forward, 1 step back", NeurIPS 2019, Algorithm 1) for a Keras 3 or tf-keras
optimizer. The optimizer steps the model's variables (the fast weights theta)
as it always does; a copy phi (the slow weights) starts at the values the
fast weights hold when the `KerasLookahead` is made, and every k steps:

    phi   <- phi + alpha * (theta - phi)
    theta <- phi

`KerasLookahead` is not an optimizer but a helper next to yours: its
`update()` is one traced function, built once, that counts an inner step and
synchronizes every k. Call it after `apply_gradients`, eagerly or inside your
`tf.function` step (no extra dispatch); with `fit`, its `callback()` calls it
after every batch:

    opt = keras.optimizers.Adam(1e-3)
    lookahead = snapstore.KerasLookahead(opt, k=5, alpha=0.5, var_list=model)

    @tf.function
    def train_step(x, y):
      ...
      opt.apply_gradients(zip(grads, model.trainable_variables))
      lookahead.update()

    # or: model.compile(optimizer=opt, ...)
    #     model.fit(x, y, callbacks=[lookahead.callback()])
    slow_loss = lookahead.evaluate_with(lambda: loss_fn(y, model(x)))

The contract: the slow weights are the shadows of a device `SnapshotStore`
over the fast weights (`store()`, slot 0 pinned under "slow"); a
synchronization leaves fast and slow equal bit for bit, with the arithmetic of
graph mode's `snapstore.Lookahead`; the optimizer's own state is left as it
is. With a `SnapshotCallback` in the same `fit` (in either order), a batch it
rolls back never happened for Lookahead either: its counter and slow weights
are rolled back with the model, and it counts only the batches that stand.

Graph mode's counterpart, which wraps a `tf.train.Optimizer`, is
`snapstore.Lookahead` (`training/lookahead.py`). Why a helper rather than a
wrapped Keras optimizer: docs/design/lookahead.md.
"""

import collections
import sys

import numpy as np

from snapstore._keras import keras_steps_per_execution
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core import checks
from snapstore.core.distributed import components
from snapstore.engines import choice
from snapstore.engines.eager import copies
from snapstore.engines.eager import device
from snapstore.engines.eager import distributed
from snapstore import errors
from snapstore.store import SnapshotStore
from snapstore.training import followers

# The tag the slow weights' slot is pinned under (as graph mode's Lookahead).
SLOW = "slow"


class KerasLookahead(object):
  """Lookahead next to a Keras 3 or tf-keras optimizer, on the eager engine.

  The optimizer takes every step on the fast weights (`var_list`); after
  each of its steps, `update()` counts the step and, every `k` steps, moves
  the slow weights a fraction `alpha` towards the fast weights and sets the
  fast weights to the result, bit for bit (see the module docstring). The
  optimizer's own state is left as it is, as in the paper's Algorithm 1.

  The slow weights start at the values the fast weights hold when the
  `KerasLookahead` is made, so make it after loading the weights training
  starts from (or call `reset()`).

      lookahead = snapstore.KerasLookahead(opt, k=5, alpha=0.5, var_list=model)

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
    ModeError: Made in graph mode (use `snapstore.Lookahead` there), or
      inside a `tf.function`.

  Example:
    ```python
    opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
    lookahead = snapstore.KerasLookahead(opt, k=5, alpha=0.5, var_list=model)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, callbacks=[lookahead.callback()])  # or lookahead.update()
    slow_loss = lookahead.evaluate_with(lambda: model.evaluate(x, y, verbose=0))
    ```
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
    if not is_keras_optimizer(optimizer):
      raise TypeError(
        "KerasLookahead takes a Keras optimizer (Keras 3 or tf-keras), got "
        "%r. To wrap a tf.train.Optimizer, use snapstore.Lookahead."
        % (optimizer,)
      )
    if use_locking:
      raise ValueError(
        "use_locking=True is for graph mode's tf.train.Optimizer; eager "
        "updates run in order in one traced function. Leave it False."
      )
    if choice.new_engine().name != "eager":
      raise errors.ModeError(
        "KerasLookahead runs on the eager engine, next to a Keras optimizer "
        "stepping eagerly; this program builds in graph mode. In graph mode, "
        "wrap a tf.train.Optimizer: snapstore.Lookahead("
        "tf.train.MomentumOptimizer(0.1, 0.9), k=5, alpha=0.5)."
      )
    device.check_not_traced("Lookahead")
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
    self._ps_strategies = distributed.coordinated_strategies(fast)
    with tf2.init_scope(), tf.device(fast[0].device):
      self._counter = tf2.Variable(
        np.int64(0), trainable=False, name=name + "/counter"
      )
    self._update = copies.traced(
      _update(fast, slow, self._counter, k, alpha), name
    )
    self._reset = copies.Lazy(
      lambda: copies.traced(_reset(fast, slow, self._counter), name + "_reset")
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
    one fused multiply-add, so the slow weights then differ from graph
    mode's in the last bit; call it after the compiled step to keep them
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
    distributed.check_cross_replica("Lookahead.update()")
    distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "Lookahead.update"
    )
    return self._update()

  def reset(self):
    """Starts over from the current fast weights: slow = fast, counter = 0."""
    distributed.check_no_functions_in_flight_eagerly(
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
        "snapstore.KerasLookahead." % (opt, self._optimizer)
      )
    steps = keras_steps_per_execution(model)
    steps = int(steps.numpy() if hasattr(steps, "numpy") else steps or 1)
    if steps != 1:
      raise ValueError(
        "The model is compiled with steps_per_execution=%d: fit runs %d "
        "steps between batch ends, and Lookahead's callback would count "
        "them as one. Compile with steps_per_execution=1, or call "
        "lookahead.update() in your own train step." % (steps, steps)
      )


def is_keras_optimizer(optimizer):
  """Whether `optimizer` is a Keras 3 or tf-keras optimizer."""
  return (
    not isinstance(optimizer, tf.train.Optimizer)
    and hasattr(optimizer, "apply_gradients")
    and hasattr(optimizer, "iterations")
    and type(optimizer).__module__.split(".")[0] in ("keras", "tf_keras")
  )


# -- the Keras callback ----------------------------------------------------------

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


# -- the fast weights and the traced update --------------------------------------


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


def _component_pairs(fast, slow):
  """(fast, slow) component pairs: a distributed variable's replicas each
  with their own, computed on their own device (replicas never mix)."""
  return [
    pair
    for theta, phi in zip(fast, slow)
    for pair in zip(components(theta), components(phi))
  ]


def _update(fast, slow, counter, k, alpha):
  """The body of `update()`: count a step; every `k`, synchronize."""
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


def _reset(fast, slow, counter):
  """The body of `reset()`: slow = fast, counter = 0."""
  pairs = _component_pairs(fast, slow)

  def reset():
    for theta, phi in pairs:
      with tf.device(phi.device):
        phi.assign(theta.value(), read_value=False)
    counter.assign(tf.constant(0, tf.int64), read_value=False)

  return reset
