"""The rates of a `MovingAverage`'s update, as tensors: both engines' arithmetic.

Each function makes the rate tensor(s) one update multiplies by, from the rate
the user gave and the optional warm-up `d = (1 + n) / (10 + n)` (a float32
tensor, or None). Graph mode's ops (`averages_graph.py`) and the eager traced
update (`averages_eager.py`) call the same functions, so both engines'
averages are the same bits. The update rules are in `averages.py`.

A rate is a Python number, fixed when the update is built, or a scalar float
tensor (a variable, a placeholder, an eager update's argument), read when
the update runs. A number is rounded once to each variable's dtype, as
converting a Python float does; from a tensor, `1 - tau` is computed in the
tensor's own dtype and then cast, as `(1 - tau) * target + tau * source`
computes it with that tensor. A tensor rate is checked when the update runs
(0 < tau <= 1; 0 <= decay < 1), by an assertion that fails the run.
"""

import numbers

from snapstore._tf import tf


class Given(object):
  """A number rate given to one eager update, as tensors rounded from it in
  Python for each float dtype: `{dtype: (1 - tau, tau)}`, each weight
  rounded once from the Python float by numpy, as a constant of it is in a
  traced function (a float64 tensor cast to float16 rounds twice, through
  float32, and so may an eager constant)."""

  def __init__(self, by_dtype):
    self.by_dtype = by_dtype


def is_tensor(value):
  """Whether a rate is a tensor or variable (read when the update runs)."""
  return not isinstance(value, numbers.Number)


def warmup(n):
  """`(1 + n) / (10 + n)`, TF's EMA warm-up after `n` updates (`n` a float32
  tensor)."""
  return (1.0 + n) / (10.0 + n)


def checked(value, name, decay=False):
  """A tensor rate, read, with an assertion of its range when it runs."""
  value = tf.convert_to_tensor(value, name=name)
  if decay:
    ok = tf.logical_and(value >= 0, value < 1)
    what = "decay must be in [0, 1)"
  else:
    ok = tf.logical_and(value > 0, value <= 1)
    what = "%s must be in (0, 1]" % name
  check = tf.debugging.Assert(ok, [what + ", got", value], name=name + "_check")
  with tf.control_dependencies([check]):
    return tf.identity(value)


def _as(value, dtype):
  return value if value.dtype == dtype else tf.cast(value, dtype)


def rate(tau, warm, dtype):
  """The "ema" form's rate given as `tau`: `max(tau, 1 - d)` with a warm-up."""
  if isinstance(tau, Given):
    out = tau.by_dtype[dtype][1]
  elif is_tensor(tau):
    out = _as(checked(tau, "tau"), dtype)
  else:
    out = tf.constant(tau, dtype, name="tau")
  if warm is not None:
    out = tf.maximum(out, tf.cast(1.0 - warm, dtype))
  return out


def rate_from_decay(decay, warm, dtype):
  """The "ema" form's rate given as `decay`: `1 - min(decay, d)`.

  The arithmetic of `tf.train.ExponentialMovingAverage.apply` and
  `assign_moving_average`: decay in float32 (a number; a tensor in its own
  dtype), the warm-up, `1 - decay`, then a cast to the variable's dtype.
  """
  if is_tensor(decay):
    decay = checked(decay, "decay", decay=True)
  else:
    decay = tf.convert_to_tensor(decay, name="decay")
  if warm is not None:
    decay = tf.minimum(decay, _as(warm, decay.dtype))
  out = 1.0 - decay
  return _as(out, dtype)


def lerp_weights(tau, warm, dtype):
  """`(1 - tau, tau)` as the RL libraries' soft update rounds them.

  A number: `1 - tau` is taken on the `tau` given (a Python float: in
  float64), and each weight is rounded once to `dtype`, as `(1 - tau) *
  target` and `tau * source` convert their Python floats. A tensor: `1 -
  tau` in its dtype, both then cast to `dtype`. With the warm-up, while
  `d = (1 + n) / (10 + n)` is below `1 - tau`, the weights are `d` and
  `1 - d` (in float32, as TF's EMA computes them).
  """
  if isinstance(tau, Given):
    keep, out = tau.by_dtype[dtype]
  elif is_tensor(tau):
    tau = checked(tau, "tau")
    keep, out = _as(1 - tau, dtype), _as(tau, dtype)
  else:
    keep = tf.constant(1 - tau, dtype, name="one_minus_tau")
    out = tf.constant(tau, dtype, name="tau")
  if warm is not None:
    # One condition picks both weights, so they always come from one pair.
    early_keep = tf.cast(warm, dtype)
    early = tf.less(early_keep, keep, name="warming_up")
    keep = tf.where(early, early_keep, keep)
    out = tf.where(early, tf.cast(1.0 - warm, dtype), out)
  return keep, out


def rate_key(tau, decay, tau_non_trainable, trainable, dtype):
  """Which rate a float variable takes: `(kind, value)`, kind "tau" or
  "decay" (a rate's tensors are made once per kind, value and dtype)."""
  if tau_non_trainable is not None and not trainable:
    return "tau", tau_non_trainable
  if decay is not None:
    return "decay", decay
  return "tau", tau


def is_hard_copy(kind, value):
  """A rate of exactly 1.0, a number: the update is a copy (exact also for
  inf and NaN, which `0 * average` would not keep), as the libraries
  special-case `tau == 1.0`. A tensor rate is always the formula."""
  return kind == "tau" and not is_tensor(value) and value == 1.0


class Rates(object):
  """The rate tensors of one update, made once per (kind, value, dtype)."""

  def __init__(self, form, warm):
    self._form = form
    self._warm = warm
    self._made = {}

  def __call__(self, kind, value, dtype):
    """`(keep, rate)` for "lerp", `(rate,)` for "ema"."""
    key = (
      kind,
      value if not is_tensor(value) else ("tensor", id(value)),
      dtype,
    )
    if key not in self._made:
      if self._form == "lerp":
        self._made[key] = lerp_weights(value, self._warm, dtype)
      elif kind == "decay":
        self._made[key] = (rate_from_decay(value, self._warm, dtype),)
      else:
        self._made[key] = (rate(value, self._warm, dtype),)
    return self._made[key]
