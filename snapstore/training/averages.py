"""Averages of a model's variables, kept in a device store's shadows.

Two kinds, each updating one device slot of a `SnapshotStore(mode="device")`
pinned under a tag (see `store.slots.pin`), so that
`store.evaluate_with(..., tag=...)`, `store.restore(tag)` and
`store.files.save_npz(path, tag)` use the average:

- `MovingAverage`: the exponential (Polyak) moving average with rate tau,
  in one of two forms that are equal in exact arithmetic but round
  differently:

      form="ema":   average <- average - (average - variable) * tau
      form="lerp":  average <- (1 - tau) * average + tau * variable

  "ema" (the default) is `tf.train.ExponentialMovingAverage(decay=1 - tau)`'s
  arithmetic, "lerp" the soft target update of the RL libraries (trfl's
  `update_target_variables`, tf-agents' `soft_variables_update`, OpenAI
  baselines); each is bit-identical to its model. Both take TF's
  `num_updates` warm-up if given, and a separate rate for non-trainable
  variables (batch-norm statistics). `tau=1.0` is a hard copy in both (a
  target network's periodic update).
- `RunningMean` (graph mode): the running mean of stochastic weight
  averaging (Izmailov et al. 2018, "Averaging Weights Leads to Wider Optima
  and Better Generalization") with its count n:

      average <- average + (variable - average) / (n + 1);  n <- n + 1

  the first update (n = 0) copying the variables exactly.

Variables that are not floats (a global step, integer counters) are copied,
not averaged. The average starts at the values the shadows start with (graph
mode: the variables' initial values, as TF's EMA; eagerly: the values the
variables hold when the store is built). `evaluate_with` swaps the average in
and puts the variables back bit for bit.

How the update runs depends on the store's engine, each with its own builder
picked once by `store.engine.name` (`averages_graph.py`: one grouped op,
`update_op`, built under the control dependencies in effect; and
`averages_eager.py`: one traced function, `update()`). In graph mode, build
the average after the train op and order it after the step:

    store = snapstore.SnapshotStore(scope="net", mode="device", saveable=True)
    with tf.control_dependencies([train_op]):
      ema = snapstore.MovingAverage(store, tau=0.001)
    train_and_average = ema.update_op
    ...
    ema_loss = store.evaluate_with(loss, feed, tag=ema.tag, session=sess)

Eagerly, call `update()` after the optimizer's update, also inside your
`tf.function` step (not one compiled with `jit_compile=True` if the
arithmetic must be exact: XLA fuses the multiply and the add):

    store = snapstore.SnapshotStore(var_list=model, mode="device")
    ema = snapstore.MovingAverage(store, tau=0.001)

    @tf.function
    def train_step(x, y):
      ...
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      ema.update()
      return loss

    ema_loss = ema.evaluate_with(lambda: loss_fn(y, model(x)))

`saveable=True` on a graph-mode store puts the averages in checkpoints. The
shadows holding the averages are the store's: `store.slots.shadows(ema.slot)`.
Why two forms, and what XLA does to the update: docs/design/averages.md.
"""

from snapstore.core import checks
from snapstore import errors
from snapstore.training import averages_eager
from snapstore.training import averages_graph
from snapstore.training import averages_rates

# The arithmetic `MovingAverage` can use (see its docstring).
FORMS = ("ema", "lerp")

# The update builder of each engine, by `store.engine.name`.
_BUILDERS = {
  "graph": averages_graph.GraphAverage,
  "eager": averages_eager.EagerAverage,
}


class _SlotAverage(object):
  """An average written by its update into a pinned device slot of `store`."""

  def __init__(self, store, slot, tag, what):
    try:
      slots = store.slots
    except errors.ModeError as e:
      raise errors.ModeError(
        "%s keeps its average in device shadows. %s" % (what, e)
      ) from None
    self._store = store
    self._slot = slot
    # Every check first (the builder refuses a packed store, a trace, a
    # replica context): a refused average must leave no pinned tag behind.
    self._builder = builder(store)(store, slot, what)
    self._tag = slots.pin(slot, tag)

  @property
  def store(self):
    return self._store

  @property
  def slot(self):
    return self._slot

  @property
  def tag(self):
    """The store tag naming the average."""
    return self._tag

  @property
  def update_op(self):
    """Graph mode: the grouped op updating the average (one run is one update).

    Raises:
      ModeError: An eager store: call `update()` instead.
    """
    return self._builder.update_op()

  def update(self, tau=None, tau_non_trainable=None):
    """Eager engine: updates the average once (a traced function built once).

    Call it eagerly, or inside your own `tf.function` after the optimizer's
    update: the call then runs in the step's own function, ordered after the
    step's writes of the variables. Not inside a `jit_compile=True` function
    if the arithmetic must be exact (XLA fuses multiply-adds).

        soft.update()                    # at the rate it was built with
        soft.update(tau=0.01)            # at another rate, this update only
        tf.cond(step % 100 == 0, soft.update, tf.no_op)   # now and then

    Under a `tf.distribute` strategy, call it outside `strategy.run` (each
    replica's component is averaged from its own values).

    Args:
      tau: The rate of this update, instead of the average's: a Python
        number (in (0, 1]; 1.0 is a hard copy) or a scalar float tensor
        (a schedule's value; a new value does not retrace). A `MovingAverage`
        only, built with `tau=`.
      tau_non_trainable: Likewise, the rate of the non-trainable variables.

    Returns:
      Inside a `tf.function`, the op of the update (what `tf.group`
      returns), so that it can be a `tf.cond` branch or a control
      dependency; eagerly, None.

    Raises:
      ModeError: A graph-mode store: run `update_op` instead.
      ValueError: Called inside `strategy.run` (replica context); called
        eagerly while steps scheduled on a `ClusterCoordinator` may still
        write the variables (`coordinator.join()` first); a rate out of
        range, or a rate for an average built with `decay=`.
      TypeError: A rate that is neither a number nor a scalar float tensor.
    """
    if tau is None and tau_non_trainable is None:
      return self._builder.update()
    return self._builder.update(tau, tau_non_trainable)

  def evaluate_with(self, fetches, feed_dict=None, session=None):
    """Runs `fetches` with the averages, then puts the variables back bit for bit.

    Eagerly, `fetches` is a Python callable (`lambda: model(x)`), called with
    the averages in place (see `SnapshotStore.evaluate_with`).
    """
    return self._store.evaluate_with(
      fetches, feed_dict, tag=self._tag, session=session
    )


def builder(store):
  """The update builder class for `store`'s engine (see module doc)."""
  return _BUILDERS[store.engine.name]


class MovingAverage(_SlotAverage):
  """An exponential moving average in a device slot (see module docstring).

  Two forms, because the two families of code a user replaces with this one
  round differently, and a run that must reproduce one of them (a
  checkpoint's averages, an RL agent's actions step for step) needs its
  arithmetic, not merely the same average up to rounding (how much they
  differ: docs/design/averages.md).

  - `form="ema"` (the default): `average - (average - variable) * rate`,
    the arithmetic of `tf.train.ExponentialMovingAverage` and
    `assign_moving_average`. Give the rate as `tau` or, in TF's terms, as
    `decay = 1 - tau`. With `decay`, the arithmetic is exactly that of
    `tf.train.ExponentialMovingAverage(decay, num_updates)` (the rate is
    computed in float32 as `1 - decay`), so both give bit-identical averages;
    with `tau`, the rate is `tau` itself, rounded once to the variable's
    dtype.
  - `form="lerp"`: `(1 - tau) * average + tau * variable`, the soft (Polyak)
    target update of trfl's `update_target_variables`, tf-agents'
    `soft_variables_update` and OpenAI baselines' DDPG/SAC, bit-identical to
    it: `1 - tau` is computed in Python from the `tau` given, then `1 - tau`
    and `tau` are each rounded once to the variable's dtype, as converting
    those Python floats does in the libraries. Takes `tau`, not `decay`.

  With `num_updates` (e.g. the global step), the rate early in training is
  larger, as in TF's EMA: with `d = (1 + n) / (10 + n)` computed in float32,
  the "ema" form uses `rate = max(tau, 1 - d)` (i.e. `decay = min(decay,
  d)`); the "lerp" form uses `d * average + (1 - d) * variable` while `d`
  (in the variable's dtype) is below `1 - tau`, and its exact `1 - tau`,
  `tau` weights afterwards. `tau_non_trainable` takes the same form as
  `tau` (tf-agents' `soft_variables_update` has the same argument), with
  its own warm-up. A rate of exactly 1.0 is a hard copy in both forms
  (exact also for inf and NaN, which `0 * average` would not keep), as the
  libraries special-case `tau == 1.0`. Variables that are not floats are
  copied.

  A rate that changes (a schedule, TF-Agents' `target_update_tau` as a
  tensor, an `update_target(target, online, tau)` called with several) is a
  tensor: give `tau` (or `decay`) as a scalar float variable, read at each
  update (graph mode: also a placeholder, fed at each run), or, eagerly,
  pass each update's own rate, `update(tau=...)`, a number or a tensor. A
  number is rounded to each variable's dtype as a Python float is, so
  `update(tau=t)` gives the bits of a `MovingAverage` built with `tau=t`;
  from a tensor, `1 - tau` is computed in the tensor's dtype, as
  `(1 - tau) * target + tau * source` computes it with that tensor. A
  tensor rate of 1.0 is the formula, not a copy; one out of range fails the
  update when it runs.

  Args:
    store: A device-mode `SnapshotStore`; the average lives in its `slot`.
    tau: The rate, 0 < tau <= 1 (1.0 makes each update a hard copy), or a
      scalar float tensor or variable holding it (see above).
    decay: Instead of `tau`: 0 <= decay < 1, as for TF's EMA ("ema" form
      only); a number or a scalar float tensor or variable.
    tau_non_trainable: The rate for covered variables that are not in
      TRAINABLE_VARIABLES (batch-norm moving statistics, optimizer state),
      as `tau`. Default: the same rate.
    num_updates: Optional scalar tensor counting updates, for the warm-up.
      On an eager store, a numeric scalar variable (e.g. the optimizer's
      `iterations`), read at each update.
    slot: The device slot holding the average.
    tag: The tag the slot is pinned under.
    name: Name scope of the ops (eagerly, the traced function's name).
    form: "ema" or "lerp": which arithmetic the update uses (see above).

  On an eager store (see the module docstring) the update is one traced
  function, run by `update()`; which variables take `tau_non_trainable` is
  told by each variable's `trainable` flag instead of TRAINABLE_VARIABLES.

  Example:
    ```python
    store = snapstore.SnapshotStore(var_list=critic)  # eagerly
    soft = snapstore.MovingAverage(store, tau=0.005, form="lerp", tag="target")
    target_critic = store.slots.past(critic, soft.slot)
    ...  # in the train step, after the optimizer's update:
    soft.update()  # (1 - tau) * target + tau * online
    ```

  Raises:
    ModeError: The store is not in device mode; eagerly, the average is
      built inside a `tf.function`.
    ValueError: Both or neither of `tau` and `decay`; a number rate out of
      range;
      a `form` other than "ema" and "lerp"; `decay` with `form="lerp"`;
      the slot holds another snapshot (see `store.slots.pin`).
    TypeError: A `num_updates` that is not a numeric scalar tensor (eagerly:
      variable); a rate that is neither a number nor a scalar float tensor
      or variable.
    GraphMismatchError: `num_updates` of another graph.
  """

  def __init__(
    self,
    store,
    tau=None,
    decay=None,
    tau_non_trainable=None,
    num_updates=None,
    slot=0,
    tag="ema",
    name="moving_average",
    form="ema",
  ):
    if form not in FORMS:
      raise ValueError(
        "form must be 'ema' (average - (average - variable) * tau, as "
        "tf.train.ExponentialMovingAverage) or 'lerp' ((1 - tau) * average "
        "+ tau * variable, the RL libraries' soft target update), got %r."
        % (form,)
      )
    if (tau is None) == (decay is None):
      raise ValueError(
        "Give the rate as tau= or as decay= (decay = 1 - tau), "
        "not %s." % ("both" if tau is not None else "neither")
      )
    if form == "lerp" and decay is not None:
      raise ValueError(
        "form='lerp' takes the rate as tau= (the weight of the variable in "
        "(1 - tau) * average + tau * variable), not decay=; decay= is for "
        "form='ema', TF's EMA arithmetic."
      )
    rate_of = builder(store).rate
    if tau is not None:
      tau = _check_rate(tau, "tau", rate_of, store)
    else:
      decay = _check_rate(decay, "decay", rate_of, store, decay=True)
    if tau_non_trainable is not None:
      tau_non_trainable = _check_rate(
        tau_non_trainable, "tau_non_trainable", rate_of, store
      )
    num_updates = builder(store).num_updates(num_updates, store)
    super(MovingAverage, self).__init__(store, slot, tag, "MovingAverage")
    self._tau = tau
    self._decay = decay
    self._form = form
    self._builder.moving_average(
      tau, decay, tau_non_trainable, num_updates, form, name
    )

  @property
  def tau(self):
    """The rate given as tau, or None when given as decay."""
    return self._tau

  @property
  def decay(self):
    """The rate given as decay, or None when given as tau."""
    return self._decay

  @property
  def form(self):
    """ "ema" or "lerp": the arithmetic of the update (see the class doc)."""
    return self._form


class RunningMean(_SlotAverage):
  """The SWA running mean of the variables, in a device slot, with its count.

  Each run of `update_op` adds the variables' current values to the mean
  (see the module docstring); `count` is the number of values averaged.
  `reset_op` sets the count to 0, so the next update starts a new mean. The
  count variable lives with the shadows (in GLOBAL_VARIABLES when the store
  is `saveable`, else LOCAL_VARIABLES), so a checkpoint of the average has
  its count.

      swa = snapstore.RunningMean(store)
      for epoch in range(epochs):
        ...train an epoch...
        if epoch >= swa_start:
          sess.run(swa.update_op)
      store.restore(swa.tag, session=sess)   # the SWA weights

  Args:
    store: A device-mode `SnapshotStore`; the mean lives in its `slot`.
    slot: The device slot holding the mean.
    tag: The tag the slot is pinned under.
    name: Name scope of the ops and of the count variable.

  Raises:
    ModeError: The store is not in device mode, or runs eagerly.
    ValueError: The slot holds another snapshot (see `store.slots.pin`).

  Example:
    ```python
    store = snapstore.SnapshotStore(scope="net", mode="device")  # graph mode
    swa = snapstore.RunningMean(store)
    ...  # each epoch after the start of averaging:
    sess.run(swa.update_op)
    store.restore(swa.tag, session=sess)  # the SWA weights
    ```
  """

  def __init__(self, store, slot=0, tag="swa", name="running_mean"):
    builder(store).check_running_mean()
    super(RunningMean, self).__init__(store, slot, tag, "RunningMean")
    self._count, self._reset_op = self._builder.running_mean(name)

  @property
  def count(self):
    """The int64 variable counting the values in the mean."""
    return self._count

  @property
  def reset_op(self):
    """An op setting the count to 0: the next update restarts the mean."""
    return self._reset_op


def _check_rate(value, name, rate_of, store, decay=False):
  """`value`, a rate: a number in range, or a tensor the engine's builder
  takes (`rate_of`: checked when the update runs)."""
  if averages_rates.is_tensor(value):
    return rate_of(value, name, store)
  checks.number(value, name)
  if decay and not 0 <= value < 1:
    raise ValueError("decay must be in [0, 1), got %r." % (value,))
  if not decay and not 0 < value <= 1:
    raise ValueError(
      "%s must be in (0, 1] (1.0 is a hard copy), got %r." % (name, value)
    )
  return value
