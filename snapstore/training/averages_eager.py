"""The eager engine's averages: a `MovingAverage`'s update as one traced function.

`EagerAverage` is the update builder `averages.py` picks for a store on the
eager engine (`store.engine.name == "eager"`). It traces the update once,
when the average is made; `update()` runs it, eagerly (one dispatch) or
inside the user's own `tf.function` step, after the optimizer's update (no
extra dispatch; the function's automatic control dependencies order it after
the step's writes). The arithmetic is graph mode's, bit for bit (the same
`averages_rates`); `num_updates` is a variable read at each update. Which
variables take `tau_non_trainable` is told by each variable's own
`trainable` flag (batch-norm statistics, optimizer state and Keras 3 seed
states are not trainable). A distributed variable is averaged per component,
each from its own replica's values on its own device (as TF's EMA under a
strategy, through `extended.update`); replicas never mix. `RunningMean` is
graph mode's only.
"""

from snapstore._keras import is_keras_3_object
from snapstore._keras import keras_variable_value
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core.distributed import components
from snapstore.engines.eager import copies
from snapstore.engines.eager import device
from snapstore.engines.eager import distributed
from snapstore import errors
from snapstore.training import averages_rates


class EagerAverage(object):
  """Builds and runs the traced update of one average in an eager device slot.

  Args:
    store: The device-mode `SnapshotStore`.
    slot: The device slot holding the average.
    what: The average's class name, for messages.

  Raises:
    ModeError: Built inside a `tf.function`.
  """

  def __init__(self, store, slot, what):
    device.check_not_traced(what)
    self._what = what
    variables = list(store.variables.values())
    # A distributed variable's eager shadow is distributed too: paired by
    # component when the update is traced.
    self._pairs = list(zip(variables, store.slots.shadows(slot).values()))
    # Parameter-server strategies (v2) whose coordinator may be running
    # steps that write the variables: an eager update refuses to run then.
    self._ps_strategies = distributed.coordinated_strategies(variables)
    self._update = None

  @staticmethod
  def num_updates(num_updates, store):
    """The `tf.Variable` an eager `num_updates` reads at each update.

    Raises:
      TypeError: Not a numeric scalar variable (a tensor would be a
        constant, fixed when the update is traced).
    """
    del store
    if num_updates is None:
      return None
    if is_keras_3_object(num_updates):
      inner = keras_variable_value(num_updates)
      num_updates = inner if inner is not None else num_updates
    if not isinstance(num_updates, tf_variables.Variable):
      raise TypeError(
        "num_updates on an eager store must be a variable read at each "
        "update (e.g. optimizer.iterations), got %r. A tensor would be a "
        "constant fixed when the update is traced." % (num_updates,)
      )
    dtype = num_updates.dtype.base_dtype
    if not (dtype.is_integer or dtype.is_floating) or num_updates.shape.ndims:
      raise TypeError(
        "num_updates must be a numeric scalar, got %s of dtype %s and shape "
        "%s." % (num_updates.name, dtype.name, num_updates.shape)
      )
    return num_updates

  @staticmethod
  def check_running_mean():
    """Refuses a `RunningMean`, graph mode's only.

    Raises:
      ModeError: Always; names the eager ways.
    """
    raise errors.ModeError(
      "RunningMean is graph mode's; this store runs eagerly. For an "
      "eager average use snapstore.MovingAverage(store, tau=...), or keep "
      "the SWA mean yourself and load it with store.load_arrays(arrays, "
      "tag)."
    )

  def moving_average(
    self, tau, decay, tau_non_trainable, num_updates, form, name
  ):
    """Traces the `MovingAverage` update, a function named `name`."""
    pairs = [
      pair
      for var, shadow in self._pairs
      for pair in zip(components(var), components(shadow))
    ]

    def update():
      warm = None
      if num_updates is not None:
        with tf.device(num_updates.device):
          n = tf.cast(num_updates.value(), tf.float32, name="num_updates")
        warm = averages_rates.warmup(n)
      rates = {}  # (kind, value, dtype) -> rate tensors, made once per rate
      for var, shadow in pairs:
        dtype = var.dtype.base_dtype
        with tf.device(shadow.device):
          if not dtype.is_floating:
            shadow.assign(var.value(), read_value=False)
            continue
          key = averages_rates.rate_key(
            tau, decay, tau_non_trainable, var.trainable, dtype
          )
          if averages_rates.is_hard_copy(key):
            shadow.assign(var.value(), read_value=False)
            continue
          if key not in rates:
            rates[key] = averages_rates.rates(key, form, warm)
          average, value = shadow.value(), var.value()
          if form == "lerp":
            keep, rate = rates[key]
            shadow.assign(keep * average + rate * value, read_value=False)
          else:
            (rate,) = rates[key]
            shadow.assign_sub((average - value) * rate, read_value=False)

    self._update = copies.traced(update, name)

  # -- running it -------------------------------------------------------------------

  def update_op(self):
    """Refuses graph mode's `update_op`.

    Raises:
      ModeError: Always; names `update()`.
    """
    raise errors.ModeError(
      "update_op is graph mode's; this average's store runs eagerly. Call "
      "update() instead: one traced function, eagerly or inside your "
      "tf.function train step after the optimizer's update."
    )

  def update(self):
    """Runs the traced update once.

    Raises:
      ValueError: Called inside `strategy.run` (replica context); called
        eagerly while steps scheduled on a `ClusterCoordinator` may still
        write the variables.
    """
    distributed.check_cross_replica("%s.update()" % self._what)
    distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "%s.update" % self._what
    )
    return self._update()
