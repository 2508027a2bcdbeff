"""Averages of a model's variables, kept in a device store's shadows.

Two kinds, each one grouped op built once, that writes one device slot of a
`SnapshotStore(mode="device")` and pins it under a tag (see
`store.slots.pin`), so that `store.evaluate_with(..., tag=...)`,
`store.restore(tag)` and `store.files.save_npz(path, tag)` use the average:

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
- `RunningMean`: the running mean of stochastic weight averaging (Izmailov et
  al. 2018, "Averaging Weights Leads to Wider Optima and Better
  Generalization") with its count n:

      average <- average + (variable - average) / (n + 1);  n <- n + 1

  the first update (n = 0) copying the variables exactly.

Variables that are not floats (a global step, integer counters) are copied,
not averaged. Build the average after the train op and order it after the
step as with `tf.train.ExponentialMovingAverage`:

    store = snapstore.SnapshotStore(scope="net", mode="device", saveable=True)
    with tf.control_dependencies([train_op]):
      ema = snapstore.MovingAverage(store, tau=0.001)
    train_and_average = ema.update_op
    ...
    ema_loss = store.evaluate_with(loss, feed, tag=ema.tag, session=sess)

The average starts at the variables' initial values (the shadows' initial
value), as TF's EMA does. `saveable=True` on the store puts the averages in
checkpoints. The shadows holding the averages are the store's:
`store.slots.shadows(ema.slot)`.

On the eager engine (a device store built with eager execution on),
`MovingAverage` builds its update as one traced function when it is made:
`ema.update()` runs it, eagerly (one dispatch) or inside your own
`tf.function` train step after the optimizer's update (no extra dispatch; the
function's automatic control dependencies order it after the step's writes).
The arithmetic is the graph version's, bit for bit; `num_updates` is a
variable read at each update (e.g. the optimizer's `iterations`):

    store = snapstore.SnapshotStore(var_list=model, mode="device")
    ema = snapstore.MovingAverage(store, tau=0.001)

    @tf.function
    def train_step(x, y):
      ...
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      ema.update()
      return loss

    ema_loss = ema.evaluate_with(lambda: loss_fn(y, model(x)))

Inside a function compiled with XLA (`jit_compile=True`) the update is not
exact: XLA fuses the multiply and the add into one fused multiply-add,
rounded once (measured on CPU: about 1 in 8 float32 elements differs per
update). For the exact arithmetic there, call `ema.update()` after the
compiled step (one more dispatch).

The average starts at the values the variables hold when the store is built.
`evaluate_with` swaps the average in through scratch shadows and puts the
variables back bit for bit, also when the function raises (unlike Keras 3's
`SwapEMAWeights`, whose arithmetic swap changes bits). `RunningMean` is graph
mode's only.
"""

import numpy as np

from snapstore._tf import is_keras_3_object
from snapstore._tf import keras_variable_value
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import checks
from snapstore.engines.graph import copies
from snapstore.core import distributed
from snapstore.engines.graph import variables
from snapstore.engines.eager import copies as eager_copies
from snapstore.engines.eager import distributed as eager_distributed
from snapstore import errors
from snapstore.engines.eager import device as eager_device

# The arithmetic `MovingAverage` can use (see its docstring).
FORMS = ("ema", "lerp")


class _SlotAverage(object):
  """An average written by in-graph ops into a pinned device slot of `store`."""

  def __init__(self, store, slot, tag, what):
    try:
      slots = store.slots
    except errors.ModeError as e:
      raise errors.ModeError(
        "%s keeps its average in device shadows. %s" % (what, e)
      ) from None
    self._eager = is_eager(store)
    if self._eager:
      eager_device.check_not_traced(what)
    else:
      _check_cross_replica(what)
    self._store = store
    self._slot = slot
    # Every check first (shadows() refuses a packed store): a refused average
    # must leave no pinned tag behind.
    variables_ = list(store.variables.values())
    # Parameter-server strategies (v2) whose coordinator may be running
    # steps that write the variables: an eager update refuses to run then.
    self._ps_strategies = (
      eager_distributed.coordinated_strategies(variables_)
      if self._eager
      else []
    )
    if self._eager:  # a distributed variable's shadow is distributed
      self._pairs = list(zip(variables_, slots.shadows(slot).values()))
    else:
      # A graph-mode shadow per component (a distributed variable's are
      # plain variables, `snapstore.core.distributed`): each component is
      # averaged from its own value on its own device, as TF's EMA does
      # under a strategy (`extended.update` per component); replicas never
      # mix. `_parts` keeps the variable each component belongs to (the
      # variable is in TRAINABLE_VARIABLES, not its components).
      self._parts = [
        (var, part, shadow)
        for var, shadows in zip(
          variables_, slots.component_shadows(slot).values()
        )
        for part, shadow in zip(distributed.components(var), shadows)
      ]
      self._pairs = [(part, shadow) for _, part, shadow in self._parts]
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
    """The grouped op updating the average (one run is one update).

    Raises:
      ModeError: An eager store: call `update()` instead.
    """
    if self._eager:
      raise errors.ModeError(
        "update_op is graph mode's; this average's store runs eagerly. Call "
        "update() instead: one traced function, eagerly or inside your "
        "tf.function train step after the optimizer's update."
      )
    return self._update_op

  def update(self):
    """Eager engine: updates the average once (a traced function built once).

    Call it eagerly, or inside your own `tf.function` after the optimizer's
    update: the call then runs in the step's own function, ordered after the
    step's writes of the variables. Not inside a `jit_compile=True` function
    if the arithmetic must be exact (XLA fuses multiply-adds; see the module
    docstring).

    Under a `tf.distribute` strategy, call it outside `strategy.run` (each
    replica's component is averaged from its own values).

    Raises:
      ModeError: A graph-mode store: run `update_op` instead.
      ValueError: Called inside `strategy.run` (replica context); called
        eagerly while steps scheduled on a `ClusterCoordinator` may still
        write the variables (`coordinator.join()` first).
    """
    if not self._eager:
      raise errors.ModeError(
        "update() is the eager engine's; this average's store runs in graph "
        "mode. Run update_op in your session (e.g. sess.run(ema.update_op))."
      )
    eager_distributed.check_cross_replica("MovingAverage.update()")
    eager_distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "MovingAverage.update"
    )
    return self._update_fn()

  def evaluate_with(self, fetches, feed_dict=None, session=None):
    """Runs `fetches` with the averages, then puts the variables back bit for bit.

    Eagerly, `fetches` is a Python callable (`lambda: model(x)`), called with
    the averages in place (see `SnapshotStore.evaluate_with`).
    """
    return self._store.evaluate_with(
      fetches, feed_dict, tag=self._tag, session=session
    )


class MovingAverage(_SlotAverage):
  """An exponential moving average in a device slot (see module docstring).

  Two forms, because the two families of code a user replaces with this one
  round differently, and a run that must reproduce one of them (a checkpoint's
  averages, an RL agent's actions step for step) needs its arithmetic, not
  merely the same average up to rounding: after one update the forms differ
  in the last bit of about a quarter of float32 elements, and over thousands
  of updates these differences grow.

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

  Args:
    store: A device-mode `SnapshotStore`; the average lives in its `slot`.
    tau: The rate, 0 < tau <= 1; 1.0 makes each update a hard copy.
    decay: Instead of `tau`: 0 <= decay < 1, as for TF's EMA ("ema" form
      only).
    tau_non_trainable: The rate for covered variables that are not in
      TRAINABLE_VARIABLES (batch-norm moving statistics, optimizer state).
      Default: the same rate.
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

  Raises:
    ModeError: The store is not in device mode; eagerly, the average is
      built inside a `tf.function`.
    ValueError: Both or neither of `tau` and `decay`; a rate out of range;
      a `form` other than "ema" and "lerp"; `decay` with `form="lerp"`;
      the slot holds another snapshot (see `store.slots.pin`).
    TypeError: A `num_updates` that is not a numeric scalar tensor (eagerly:
      variable).
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
    if tau is not None:
      _check_rate(tau, "tau")
    else:
      _check_rate(decay, "decay", decay=True)
    if tau_non_trainable is not None:
      _check_rate(tau_non_trainable, "tau_non_trainable")
    if is_eager(store):
      if num_updates is not None:
        num_updates = _eager_num_updates(num_updates)
    elif num_updates is not None:
      _check_num_updates(num_updates, store.graph)
    super(MovingAverage, self).__init__(store, slot, tag, "MovingAverage")
    self._tau = tau
    self._decay = decay
    self._form = form
    if self._eager:
      self._update_fn = _eager_moving_average(
        self._pairs, tau, decay, tau_non_trainable, num_updates, form, name
      )
      return
    trainable = set(
      id(v)
      for v in store.graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    )
    with store.graph.as_default(), tf.name_scope(name) as scope:
      warmup = None
      if num_updates is not None:
        n = tf.cast(num_updates, tf.float32, name="num_updates")
        warmup = (1.0 + n) / (10.0 + n)
      rates = {}  # (kind, value, dtype) -> rate tensor, made once per rate
      updates = []
      for owner, var, shadow in self._parts:
        dtype = var.dtype.base_dtype
        if not dtype.is_floating:
          updates.append(_copy(var, shadow))
          continue
        if tau_non_trainable is not None and id(owner) not in trainable:
          key = ("tau", tau_non_trainable, dtype)
        elif decay is not None:
          key = ("decay", decay, dtype)
        else:
          key = ("tau", tau, dtype)
        if key[:2] == ("tau", 1.0):  # a hard copy, exact also for inf and NaN
          updates.append(_copy(var, shadow))
          continue
        if key not in rates:
          if form == "lerp":
            rates[key] = _lerp_weights(key[1], warmup, dtype)
          elif key[0] == "decay":
            rates[key] = _rate_from_decay(decay, warmup, dtype)
          else:
            rates[key] = _rate(key[1], warmup, dtype)
        updates.append(
          _lerp_update(var, shadow, *rates[key])
          if form == "lerp"
          else _ema_update(var, shadow, rates[key])
        )
      self._update_op = tf.group(*updates, name=scope)

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
    ModeError: The store is not in device mode.
    ValueError: The slot holds another snapshot (see `store.slots.pin`).
  """

  def __init__(self, store, slot=0, tag="swa", name="running_mean"):
    if is_eager(store):
      raise errors.ModeError(
        "RunningMean is graph mode's; this store runs eagerly. For an "
        "eager average use snapstore.MovingAverage(store, tau=...), or keep "
        "the SWA mean yourself and load it with store.load_arrays(arrays, "
        "tag)."
      )
    super(RunningMean, self).__init__(store, slot, tag, "RunningMean")
    first_var, first_shadow = self._pairs[0]
    graph = store.graph
    collections = [variables.SHADOW_VARIABLES]
    if any(
      v is first_shadow
      for v in graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
    ):
      collections.append(tf.GraphKeys.GLOBAL_VARIABLES)
    else:
      collections.append(tf.GraphKeys.LOCAL_VARIABLES)
    with graph.as_default(), tf.name_scope(name) as scope:
      with ops.init_scope(), ops.colocate_with(first_var):
        self._count = tf.Variable(
          np.int64(0),
          trainable=False,
          collections=collections,
          name="count",
          use_resource=copies.is_resource(first_var),
        )
      n = copies.read(self._count)
      averaged = tf.cond(
        tf.equal(n, 0),
        lambda: self._copy_all(),
        lambda: self._add_to_mean(n),
        name="average",
      )
      with tf.control_dependencies([averaged]):
        self._update_op = tf.group(
          copies.assign_add(self._count, tf.constant(1, tf.int64)), name=scope
        )
      with tf.control_dependencies(None):  # a reset never waits for a step
        self._reset_op = copies.assign(self._count, tf.constant(0, tf.int64))

  @property
  def count(self):
    """The int64 variable counting the values in the mean."""
    return self._count

  @property
  def reset_op(self):
    """An op setting the count to 0: the next update restarts the mean."""
    return self._reset_op

  def _copy_all(self):
    return copies.copy(
      [v for v, _ in self._pairs], [s for _, s in self._pairs], "copy"
    )

  def _add_to_mean(self, n):
    updates = []
    for var, shadow in self._pairs:
      if not var.dtype.base_dtype.is_floating:
        updates.append(_copy(var, shadow))
        continue
      with ops.colocate_with(var):
        dtype = var.dtype.base_dtype
        mean = copies.read(shadow)
        delta = (copies.read(var) - mean) / tf.cast(n + 1, dtype)
        updates.append(copies.assign_add(shadow, delta))
    return tf.group(*updates)


def _check_cross_replica(what):
  """Refuses building a graph-mode average inside `strategy.run`.

  Its update op updates every replica's component itself; built in replica
  context, each replica would build (and pin) one.

  Raises:
    ValueError: Called in replica context.
  """
  if eager_distributed.in_replica_context():
    raise ValueError(
      "%s was built inside strategy.run (replica context): its update op "
      "updates every replica's component itself, so each replica would "
      "build one. Build it after strategy.run returns, in cross-replica "
      "context, under tf.control_dependencies([train_op]) to order it "
      "after the step." % what
    )


def _copy(var, shadow):
  return copies.assign(shadow, copies.read(var))


def is_eager(store):
  """Whether `store` runs on the eager engine (built with eager execution on)."""
  return store.engine.name == "eager"


def _eager_num_updates(num_updates):
  """The `tf.Variable` an eager `num_updates` reads at each update."""
  if is_keras_3_object(num_updates):
    inner = keras_variable_value(num_updates)
    num_updates = inner if inner is not None else num_updates
  if not isinstance(num_updates, tf_variables.Variable):
    raise TypeError(
      "num_updates on an eager store must be a variable read at each update "
      "(e.g. optimizer.iterations), got %r. A tensor would be a constant "
      "fixed when the update is traced." % (num_updates,)
    )
  dtype = num_updates.dtype.base_dtype
  if not (dtype.is_integer or dtype.is_floating) or num_updates.shape.ndims:
    raise TypeError(
      "num_updates must be a numeric scalar, got %s of dtype %s and shape "
      "%s." % (num_updates.name, dtype.name, num_updates.shape)
    )
  return num_updates


def _eager_moving_average(
  pairs, tau, decay, tau_non_trainable, num_updates, form, name
):
  """The traced function of an eager `MovingAverage`'s update.

  The arithmetic of the graph version (the same rate helpers); which
  variables take `tau_non_trainable` is decided by the variables' own
  `trainable` flag (batch-norm statistics, optimizer state and Keras 3 seed
  states are not trainable).
  """

  # A distributed variable's components, each averaged from its own
  # replica's values on its own device (as TF's EMA under a strategy,
  # through `extended.update`); replicas never mix.
  component_pairs = [
    (part, target)
    for var, shadow in pairs
    for part, target in zip(
      eager_distributed.components(var), eager_distributed.components(shadow)
    )
  ]

  def update():
    warmup = None
    if num_updates is not None:
      with tf.device(num_updates.device):
        n = tf.cast(num_updates.value(), tf.float32, name="num_updates")
      warmup = (1.0 + n) / (10.0 + n)
    rates = {}  # (kind, value, dtype) -> rate tensor(s), made once per rate
    for var, shadow in component_pairs:
      dtype = var.dtype.base_dtype
      with tf.device(shadow.device):
        if not dtype.is_floating:
          shadow.assign(var.value(), read_value=False)
          continue
        if tau_non_trainable is not None and not var.trainable:
          key = ("tau", tau_non_trainable, dtype)
        elif decay is not None:
          key = ("decay", decay, dtype)
        else:
          key = ("tau", tau, dtype)
        if key[:2] == ("tau", 1.0):  # a hard copy, exact also for inf, NaN
          shadow.assign(var.value(), read_value=False)
          continue
        if key not in rates:
          if form == "lerp":
            rates[key] = _lerp_weights(key[1], warmup, dtype)
          elif key[0] == "decay":
            rates[key] = (_rate_from_decay(decay, warmup, dtype),)
          else:
            rates[key] = (_rate(key[1], warmup, dtype),)
        average, value = shadow.value(), var.value()
        if form == "lerp":
          keep, rate = rates[key]
          shadow.assign(keep * average + rate * value, read_value=False)
        else:
          shadow.assign_sub((average - value) * rates[key][0], read_value=False)

  return eager_copies.traced(update, name)


def _rate(tau, warmup, dtype):
  rate = tf.constant(tau, dtype, name="tau")
  if warmup is not None:
    rate = tf.maximum(rate, tf.cast(1.0 - warmup, dtype))
  return rate


def _rate_from_decay(decay, warmup, dtype):
  # The arithmetic of tf.train.ExponentialMovingAverage.apply and
  # assign_moving_average: decay in float32, warm-up, 1 - decay, then a cast.
  decay = tf.convert_to_tensor(decay, name="decay")
  if warmup is not None:
    decay = tf.minimum(decay, warmup)
  rate = 1.0 - decay
  return rate if dtype == rate.dtype else tf.cast(rate, dtype)


def _ema_update(var, shadow, rate):
  with ops.colocate_with(var):
    return copies.assign_sub(
      shadow, (copies.read(shadow) - copies.read(var)) * rate
    )


def _lerp_weights(tau, warmup, dtype):
  """`(1 - tau, tau)` as the RL libraries' soft update rounds them.

  `1 - tau` is taken on the `tau` given (a Python float: in float64), and
  each weight is rounded once to `dtype`, as `(1 - tau) * target` and
  `tau * source` convert their Python floats. With the warm-up, while
  `d = (1 + n) / (10 + n)` is below `1 - tau`, the weights are `d` and
  `1 - d` (in float32, as TF's EMA computes them).
  """
  keep = tf.constant(1 - tau, dtype, name="one_minus_tau")
  rate = tf.constant(tau, dtype, name="tau")
  if warmup is not None:
    # One condition picks both weights, so they always come from one pair.
    early_keep = tf.cast(warmup, dtype)
    early = tf.less(early_keep, keep, name="warming_up")
    keep = tf.where(early, early_keep, keep)
    rate = tf.where(early, tf.cast(1.0 - warmup, dtype), rate)
  return keep, rate


def _lerp_update(var, shadow, keep, rate):
  # (1 - tau) * target + tau * source: two products, each rounded, then their
  # sum, as the libraries' expression runs (IEEE products and sums commute,
  # so trfl's tau * source + (1 - tau) * target gives the same bits).
  with ops.colocate_with(var):
    return copies.assign(
      shadow, keep * copies.read(shadow) + rate * copies.read(var)
    )


def _check_rate(value, name, decay=False):
  checks.number(value, name)
  if decay and not 0 <= value < 1:
    raise ValueError("decay must be in [0, 1), got %r." % (value,))
  if not decay and not 0 < value <= 1:
    raise ValueError(
      "%s must be in (0, 1] (1.0 is a hard copy), got %r." % (name, value)
    )


def _check_num_updates(num_updates, graph):
  if not isinstance(num_updates, (tf.Tensor, tf_variables.Variable)):
    raise TypeError(
      "num_updates must be a scalar tensor or variable (e.g. the "
      "global step), got %r." % (num_updates,)
    )
  dtype = num_updates.dtype.base_dtype
  if (
    not (dtype.is_integer or dtype.is_floating) or num_updates.shape.ndims != 0
  ):
    raise TypeError(
      "num_updates must be a numeric scalar, got %s of dtype %s "
      "and shape %s." % (num_updates.name, dtype.name, num_updates.shape)
    )
  checks.same_graph(num_updates, graph, "num_updates %s" % num_updates.name)
