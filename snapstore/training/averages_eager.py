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

import numpy as np

from snapstore._keras import is_keras_3_object
from snapstore._keras import keras_variable_value
from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore._tf import tf_variables
from snapstore.core import checks
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

  @staticmethod
  def rate(value, name, store):
    """A rate given as a tensor, checked: a scalar float `tf.Variable` (or
    Keras 3 variable), read at each update, or an eager scalar float tensor,
    a constant.

    Raises:
      TypeError: Not a scalar float variable or tensor.
    """
    del store
    if is_keras_3_object(value):
      inner = keras_variable_value(value)
      value = inner if inner is not None else value
    if not isinstance(value, (tf_variables.Variable, tf.Tensor)):
      raise TypeError(
        "%s must be a number, or a scalar float variable read at each "
        "update, got %r." % (name, value)
      )
    if not value.dtype.base_dtype.is_floating or value.shape.ndims != 0:
      raise TypeError(
        "%s must be a scalar float variable, got %s of dtype %s and shape "
        "%s." % (name, _name(value), value.dtype.base_dtype.name, value.shape)
      )
    return value

  def moving_average(
    self, tau, decay, tau_non_trainable, num_updates, form, name
  ):
    """Traces the `MovingAverage` update, a function named `name`; the
    update at rates given per call (`update(tau=...)`) is traced on first
    use, once per kind of rate (a number, 1.0, a tensor of a dtype)."""
    self._average = (decay, num_updates, form, name)
    self._rates = (tau, tau_non_trainable)
    self._update = copies.traced(
      lambda: self._body(tau, tau_non_trainable), name
    )
    self._given = {}

  def _body(self, tau, tau_non_trainable):
    """One update at these rates (numbers or tensors); returns a scalar, so
    that `update()` can give an op for `tf.cond`."""
    decay, num_updates, form, _ = self._average
    pairs = [
      pair
      for var, shadow in self._pairs
      for pair in zip(components(var), components(shadow))
    ]
    warm = None
    if num_updates is not None:
      with tf.device(num_updates.device):
        n = tf.cast(num_updates.value(), tf.float32, name="num_updates")
      warm = averages_rates.warmup(n)
    rates = averages_rates.Rates(form, warm)
    for var, shadow in pairs:
      dtype = var.dtype.base_dtype
      with tf.device(shadow.device):
        if not dtype.is_floating:
          shadow.assign(var.value(), read_value=False)
          continue
        kind, value = averages_rates.rate_key(
          tau, decay, tau_non_trainable, var.trainable, dtype
        )
        if averages_rates.is_hard_copy(kind, value):
          shadow.assign(var.value(), read_value=False)
          continue
        weights = rates(kind, value, dtype)
        average, current = shadow.value(), var.value()
        if form == "lerp":
          keep, rate = weights
          shadow.assign(keep * average + rate * current, read_value=False)
        else:
          (rate,) = weights
          shadow.assign_sub((average - current) * rate, read_value=False)
    return tf.constant(True)

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

  def update(self, tau=None, tau_non_trainable=None):
    """Runs the traced update once, at the average's rates or at those given.

    Args:
      tau: None (the average's own), or the rate of this update: a Python
        number, or a scalar float tensor (no retrace when its value
        changes).
      tau_non_trainable: Likewise for the non-trainable variables (None:
        the average's own, which without one is `tau`).

    Returns:
      Inside a `tf.function`, an op that runs the update (for a `tf.cond`
      branch, or control dependencies); eagerly, None (as `tf.group`).

    Raises:
      ValueError: Called inside `strategy.run` (replica context); called
        eagerly while steps scheduled on a `ClusterCoordinator` may still
        write the variables; a number rate out of (0, 1]; a rate given to
        an average whose rate is `decay`.
      TypeError: A rate that is neither a number nor a scalar float tensor.
    """
    distributed.check_cross_replica("%s.update()" % self._what)
    distributed.check_no_functions_in_flight_eagerly(
      self._ps_strategies, "%s.update" % self._what
    )
    if tau is None and tau_non_trainable is None:
      return tf.group(self._update())
    if self._average[0] is not None:
      raise ValueError(
        "%s.update(tau=...): this average was built with decay=, whose "
        "rate is 1 - decay in TF's EMA arithmetic; build it with tau= to "
        "give a rate per update." % self._what
      )
    own_tau, own_non_trainable = self._rates
    if tau is None:
      tau = own_tau
    if tau_non_trainable is None:
      tau_non_trainable = own_non_trainable
    dtypes = self._float_dtypes()
    rates = [
      _given_rate(value, name, dtypes)
      for value, name in (
        (tau, "tau"),
        (tau_non_trainable, "tau_non_trainable"),
      )
    ]
    # The function of this kind of rates: traced once per kind, taking the
    # rates' tensors as arguments (a new value does not retrace).
    kinds = tuple(kind for kind, _ in rates)
    if kinds not in self._given:
      self._given[kinds] = copies.traced(
        self._given_body(kinds, dtypes),
        self._average[3] + "_given",
        [tf2.TensorSpec([], t.dtype) for _, tensors in rates for t in tensors],
      )
    return tf.group(
      self._given[kinds](*[t for _, tensors in rates for t in tensors])
    )

  def _float_dtypes(self):
    """The float dtypes of the covered variables, in a fixed order."""
    return sorted(
      set(
        v.dtype.base_dtype
        for v, _ in self._pairs
        if v.dtype.base_dtype.is_floating
      ),
      key=lambda d: d.name,
    )

  def _given_body(self, kinds, dtypes):
    """The update body taking the tensors of rates of `kinds` as arguments
    (`_given_rate`)."""

    def body(*tensors):
      values = iter(tensors)
      args = []
      for kind in kinds:
        if kind[0] == "tensor":
          args.append(next(values))
        elif kind[0] == "number":
          args.append(
            averages_rates.Given(
              dict((d, (next(values), next(values))) for d in dtypes)
            )
          )
        else:  # "copy": 1.0; "none": the other rate's
          args.append(1.0 if kind[0] == "copy" else None)
      return self._body(*args)

    return body


def _given_rate(value, name, dtypes):
  """`(kind, tensors)` of a rate given to one update: `("tensor", dtype)`
  and the tensor; `("number",)` and, per float dtype of `dtypes`, `1 - tau`
  and `tau` rounded from the Python number (`averages_rates.Given`);
  `("copy",)` for 1.0; `("none",)` for no rate of its own."""
  if value is None:
    return ("none",), []
  if averages_rates.is_tensor(value):
    if is_keras_3_object(value):
      inner = keras_variable_value(value)
      value = inner if inner is not None else value
    if not isinstance(value, (tf_variables.Variable, tf.Tensor)):
      raise TypeError(
        "%s must be a number or a scalar float tensor, got %r." % (name, value)
      )
    value = tf.convert_to_tensor(value)
    if not value.dtype.is_floating or value.shape.ndims != 0:
      raise TypeError(
        "%s must be a scalar float tensor, got dtype %s and shape %s."
        % (name, value.dtype.name, value.shape)
      )
    return ("tensor", value.dtype), [value]
  checks.number(value, name)
  if not 0 < value <= 1:
    raise ValueError(
      "%s must be in (0, 1] (1.0 is a hard copy), got %r." % (name, value)
    )
  if value == 1.0:
    return ("copy",), []
  tensors = []
  for dtype in dtypes:  # rounded by numpy, as a traced constant is
    tensors.append(tf.constant(np.array(1 - value, dtype.as_numpy_dtype)))
    tensors.append(tf.constant(np.array(value, dtype.as_numpy_dtype)))
  return ("number",), tensors


def _name(value):
  try:
    return value.name
  except AttributeError:  # an eager tensor
    return repr(value)
