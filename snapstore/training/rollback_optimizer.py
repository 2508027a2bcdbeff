"""RollbackOptimizer: take a step, check the loss, roll the step back if it rose.

A training step with `RollbackOptimizer` is two runs, both plain graph ops with
no Python branching:

1. `train_op` (from `minimize`): records the loss at the current parameters,
   copies the parameters and the inner optimizer's state into a device
   snapshot, then lets the inner optimizer take its step (the store's
   `snapshot_before`, under the tag "before_step").
2. `opt.check`: evaluates the loss again, at the new parameters, on the batch
   you feed it. If the loss is not finite, or rose by more than the tolerance,

       loss_after - loss_before > tolerance + relative_tolerance * |loss_before|,

   the parameters and the optimizer state are restored, bit for bit, to what
   they were before the step, and the learning rate variable (if given) is
   multiplied by `backoff`. It returns True when it rolled back.

    lr = tf.Variable(0.1, trainable=False, name="lr")
    opt = snapstore.RollbackOptimizer(tf.train.MomentumOptimizer(lr, 0.9),
                                      learning_rate=lr, backoff=0.5)
    train_op = opt.minimize(loss, global_step=step)
    ...
    sess.run(train_op, feed)
    rolled_back = sess.run(opt.check, feed)      # the same batch

What is rolled back: the variables the step updated, the inner optimizer's
slots for them and its non-slot variables (Adam's beta powers). Not rolled
back: the global step (a rejected step still counts, so step-based schedules
and `StopAtStepHook` move on), the learning rate variable (it is what
`backoff` changes), and anything else. A check decides once per step: a second
check, or a check without a step, does nothing and returns False. Run the check
in a `session.run` of its own, after the train op's: fetched in the same run it
would race the update.

`loss_before` is the loss the train step computed; compare it with the check
on the same batch (feed the same placeholders). With an input pipeline in the
graph, each run draws a new batch, so build the loss the check evaluates on
fixed data instead.

Eager execution (TF 2.x's default) and Keras optimizers have no counterpart
class: the protocol above is two graph ops run by `session.run`, and a Keras
optimizer is not a `tf.train.Optimizer` to wrap. Both are refused with the
eager way, a `snapstore.Trial` around each step, which does the same with
any Keras optimizer:

    store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
    with snapstore.Trial(
        store,
        metric=lambda: loss_fn(y, model(x, training=False)),  # this batch
        accept=lambda before, after: bool(
            np.isfinite(after)
            and after - before <= tolerance + rtol * abs(before))) as trial:
      train_step(x, y)
    if not trial.kept:  # rolled back, bit for bit
      opt.learning_rate.assign(opt.learning_rate * backoff)

Differences: the trial evaluates the loss before the step itself (one more
forward pass; in inference mode, so that both evaluations use the same
batch-norm statistics), and the optimizer's `iterations` is rolled back with
the rest. The learning rate is not: a store leaves it out, so the backoff
survives the next rollback.
"""

import collections

import numpy as np

from snapstore._tf import create_slots
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import checks
from snapstore.engines import choice
from snapstore.engines.graph import copies
from snapstore import errors
from snapstore.store import SnapshotStore
from snapstore.training.wrapped_optimizer import WrapperOptimizer

_State = collections.namedtuple(
  "_State", ["store", "loss_before", "armed", "rollbacks", "check"]
)


class RollbackOptimizer(WrapperOptimizer):
  """Rolls an inner optimizer's step back when it made the loss rise.

  See the module docstring for the protocol: run `train_op`, then `check`
  with the same batch.

  Memory: one device copy of the trained variables and of the inner
  optimizer's state (a `SnapshotStore(mode="device")` with one slot, shadows
  named `<variable>/<name>/slot_0`, in LOCAL_VARIABLES: not checkpointed).

  Args:
    optimizer: The inner `tf.train.Optimizer`. Its state must be created by
      its `_create_slots` (true of every optimizer in `tf.train`).
    tolerance: How much the loss may rise before the step is rolled back.
    relative_tolerance: More allowed rise, as a fraction of |loss_before|.
    learning_rate: A scalar float variable the inner optimizer reads its
      learning rate from, to multiply by `backoff` at each rollback.
    backoff: The factor for `learning_rate` at each rollback, 0 < backoff.
    use_locking: Passed to `tf.train.Optimizer`.
    name: Name of the ops, variables and shadows.

  Raises:
    TypeError: `optimizer` is not a `tf.train.Optimizer` (a Keras optimizer:
      the message gives the eager way); `learning_rate` is not a scalar float
      variable; a tolerance or `backoff` that is not a number.
    ValueError: A negative tolerance; `backoff` without `learning_rate` or
      the other way round; `backoff <= 0`.
    ModeError: Eager execution is on (TF 2.x's default); the message gives
      the eager way.

  Example:
    Graph mode: a step that made the loss rise is undone, and the rate halved.

    ```python
    lr = tf.Variable(0.5, trainable=False)
    opt = snapstore.RollbackOptimizer(
      tf.train.MomentumOptimizer(lr, 0.9), learning_rate=lr, backoff=0.5
    )
    train_op = opt.minimize(loss)
    ...
    sess.run(train_op, feed)
    rolled_back = sess.run(opt.check, feed)  # the same batch
    ```
  """

  def __init__(
    self,
    optimizer,
    tolerance=0.0,
    relative_tolerance=0.0,
    learning_rate=None,
    backoff=None,
    use_locking=False,
    name="Rollback",
  ):
    _check_graph_mode(optimizer)
    for value, what in (
      (tolerance, "tolerance"),
      (relative_tolerance, "relative_tolerance"),
    ):
      if checks.number(value, what) < 0:
        raise ValueError("%s must be >= 0, got %r." % (what, value))
    if (learning_rate is None) != (backoff is None):
      raise ValueError(
        "learning_rate= and backoff= go together: the learning "
        "rate variable is multiplied by backoff at each rollback."
      )
    if backoff is not None:
      if checks.number(backoff, "backoff") <= 0:
        raise ValueError("backoff must be > 0, got %r." % (backoff,))
      if not (
        isinstance(learning_rate, tf_variables.Variable)
        and learning_rate.dtype.base_dtype.is_floating
        and learning_rate.shape.ndims == 0
      ):
        raise TypeError(
          "learning_rate must be a scalar float tf.Variable (the "
          "one the inner optimizer was built with), got %r." % (learning_rate,)
        )
    super(RollbackOptimizer, self).__init__(optimizer, use_locking, name)
    self._tolerance = float(tolerance)
    self._relative_tolerance = float(relative_tolerance)
    self._learning_rate = learning_rate
    self._backoff = backoff

  # -- building the train op ---------------------------------------------------------

  def minimize(
    self,
    loss,
    global_step=None,
    var_list=None,
    gate_gradients=tf.train.Optimizer.GATE_OP,
    aggregation_method=None,
    colocate_gradients_with_ops=False,
    name=None,
    grad_loss=None,
  ):
    """As `tf.train.Optimizer.minimize`; `loss` is also what `check` evaluates."""
    grads_and_vars = self.compute_gradients(
      loss,
      var_list=var_list,
      gate_gradients=gate_gradients,
      aggregation_method=aggregation_method,
      colocate_gradients_with_ops=colocate_gradients_with_ops,
      grad_loss=grad_loss,
    )
    return self.apply_gradients(
      grads_and_vars, global_step=global_step, name=name, loss=loss
    )

  def apply_gradients(
    self, grads_and_vars, global_step=None, name=None, loss=None
  ):  # pylint: disable=arguments-differ
    """Builds the train op and the check for `loss`.

    Args:
      grads_and_vars: As for `tf.train.Optimizer.apply_gradients`.
      global_step: Incremented by the inner step (and not rolled back).
      name: Name of the returned op.
      loss: The scalar float loss tensor to compare before and after the step.

    Returns:
      The train op.

    Raises:
      ValueError: No `loss`, no gradients, or a train op in this graph already.
      TypeError: `loss` is not a scalar float tensor.
      GraphMismatchError: `loss` is of another graph than the variables.
    """
    grads_and_vars = tuple(grads_and_vars)
    variables = self._trained_variables(grads_and_vars)
    graph = variables[0].graph
    _check_loss(loss, graph)
    if self._learning_rate is not None:
      checks.same_graph(
        self._learning_rate,
        graph,
        "learning_rate %s" % self._learning_rate.name,
        than="the trained variables",
      )
    first = min(variables, key=lambda v: v.name)
    with graph.as_default():
      # The inner optimizer's state must exist before the store covers it, and
      # the store's copy must run before the inner step writes.
      with ops.init_scope():
        create_slots(self._optimizer, variables)
      loss_before = self._own_variable(
        np.zeros((), loss.dtype.as_numpy_dtype),
        self.get_name() + "_loss_before",
        first,
      )
      armed = self._own_variable(
        np.bool_(False), self.get_name() + "_armed", first
      )
      rollbacks = self._own_variable(
        np.int64(0), self.get_name() + "_rollbacks", first
      )
      inner_state = self._optimizer.variables()
      store = SnapshotStore(
        var_list=variables,
        mode="device",
        max_to_keep=1,
        optimizer=self._optimizer if inner_state else None,
        name=self.get_name(),
      )
      before_step = set(id(v) for v in inner_state)
      with tf.name_scope(name, self.get_name()) as scope:
        record = tf.group(
          copies.assign(loss_before, loss),
          copies.assign(armed, tf.constant(True)),
          name="record_loss",
        )

        def inner_step():
          with tf.control_dependencies([record]):  # in parallel with the copy
            return self._optimizer.apply_gradients(
              grads_and_vars, global_step=global_step
            )

        step = store.slots.snapshot_before(
          inner_step, slot=0, tag="before_step"
        )
        train_op = self._replaces(step, tf.group(step, name=scope))
      missed = [
        v.name for v in self._optimizer.variables() if id(v) not in before_step
      ]
      if missed:
        raise ValueError(
          "The inner optimizer created state while building its step (%s) that "
          "RollbackOptimizer could not snapshot first; it needs an optimizer "
          "whose _create_slots creates all of its variables."
          % ", ".join(missed)
        )
      check = self._build_check(loss, store, loss_before, armed, rollbacks)
    self._set_state(graph, _State(store, loss_before, armed, rollbacks, check))
    self._mark_built(graph)
    return train_op

  def _build_check(self, loss, store, loss_before, armed, rollbacks):
    variables = list(store.variables.values())
    shadows = list(store.slots.shadows(0).values())

    def roll_back():
      restore = copies.copy(shadows, variables, "restore")
      with tf.control_dependencies([restore]):
        done = [copies.assign_add(rollbacks, tf.constant(1, tf.int64))]
        if self._learning_rate is not None:
          lr = self._learning_rate
          done.append(
            copies.assign(
              lr, copies.read(lr) * tf.cast(self._backoff, lr.dtype.base_dtype)
            )
          )
      with tf.control_dependencies(done):
        return tf.constant(True)

    with tf.name_scope(self.get_name() + "_check"):
      before = copies.read(loss_before)
      allowed = self._tolerance + self._relative_tolerance * tf.abs(before)
      worse = tf.logical_or(
        tf.logical_not(tf.math.is_finite(loss)), loss - before > allowed
      )
      rolled_back = tf.cond(
        tf.logical_and(copies.read(armed), worse),
        roll_back,
        lambda: tf.constant(False),
        name="decide",
      )
      with tf.control_dependencies([rolled_back]):
        disarm = copies.assign(armed, tf.constant(False))
      with tf.control_dependencies([disarm]):
        return tf.identity(rolled_back, name="rolled_back")

  # -- what the user runs and reads ------------------------------------------------------

  @property
  def check(self):
    """A bool tensor: run it after the train op (same feed) to check the step.

    Evaluating it evaluates the loss at the new parameters and rolls the step
    back if the loss rose; its value is True when it rolled back. For the
    default graph.
    """
    return self._state(None).check

  @property
  def rollbacks(self):
    """An int64 variable counting the rollbacks (default graph)."""
    return self._state(None).rollbacks

  @property
  def loss_before(self):
    """The variable holding the loss the last train step computed (default graph)."""
    return self._state(None).loss_before

  @property
  def learning_rate(self):
    """The learning rate variable `backoff` scales, or None."""
    return self._learning_rate

  def store(self, graph=None):
    """The device store holding the state from before the last step."""
    return self._state(graph).store

  def _own_variables(self, state):
    return [state.loss_before, state.armed, state.rollbacks]


# The eager way, for the errors of RollbackOptimizer built eagerly.
_EAGER_WAY = (
  "Eagerly, wrap each step in a snapstore.Trial over a store of the model "
  "and the Keras optimizer: store = snapstore.SnapshotStore(var_list=model, "
  "optimizer=opt); then `with snapstore.Trial(store, metric=lambda: "
  "loss_fn(y, model(x, training=False))) as trial: train_step(x, y)` rolls "
  "the step back, bit for bit, unless the loss on its batch stayed finite "
  "and did not rise (accept= sets a tolerance); then `if not trial.kept: "
  "opt.learning_rate.assign(opt.learning_rate * backoff)` (README, "
  '"Training-loop integration").'
)


def _check_graph_mode(optimizer):
  """Refuses Keras optimizers and the eager engine, naming the eager way.

  The engine is the one a store built now would run on (`engines.choice`):
  RollbackOptimizer's stores are built with its train op.

  Raises:
    TypeError: `optimizer` is a Keras optimizer.
    ModeError: Eager execution is on.
  """
  if not isinstance(optimizer, tf.train.Optimizer) and hasattr(
    optimizer, "apply_gradients"
  ):
    raise TypeError(
      "RollbackOptimizer wraps a graph-mode tf.train.Optimizer, got the "
      "Keras optimizer %r, which it cannot wrap. %s" % (optimizer, _EAGER_WAY)
    )
  if choice.new_engine().name != "graph":
    raise errors.ModeError(
      "RollbackOptimizer is for graph mode: its train op and check are graph "
      "ops run with session.run, and eager execution is on (TF 2.x's "
      "default; a TF1-style program calls "
      "tf.compat.v1.disable_v2_behavior() first). %s" % _EAGER_WAY
    )


def _check_loss(loss, graph):
  if loss is None:
    raise ValueError(
      "RollbackOptimizer needs the loss to check the step: "
      "minimize(loss) passes it; with apply_gradients, pass loss=."
    )
  if not isinstance(loss, tf.Tensor):
    raise TypeError("loss must be a tensor, got %r." % (loss,))
  if not loss.dtype.is_floating or loss.shape.ndims != 0:
    raise TypeError(
      "loss must be a scalar float tensor, got %s with dtype %s "
      "and shape %s." % (loss.name, loss.dtype.name, loss.shape)
    )
  checks.same_graph(
    loss, graph, "The loss %s" % loss.name, than="the trained variables"
  )
