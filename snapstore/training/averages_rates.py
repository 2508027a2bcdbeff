"""The rates of a `MovingAverage`'s update, as tensors: both engines' arithmetic.

Each function makes the rate tensor(s) one update multiplies by, from the rate
the user gave and the optional warm-up `d = (1 + n) / (10 + n)` (a float32
tensor, or None). Graph mode's ops (`averages_graph.py`) and the eager traced
update (`averages_eager.py`) call the same functions, so both engines'
averages are the same bits. The update rules are in `averages.py`.
"""

from snapstore._tf import tf


def warmup(n):
  """`(1 + n) / (10 + n)`, TF's EMA warm-up after `n` updates (`n` a float32
  tensor)."""
  return (1.0 + n) / (10.0 + n)


def rate(tau, warm, dtype):
  """The "ema" form's rate given as `tau`: `max(tau, 1 - d)` with a warm-up."""
  out = tf.constant(tau, dtype, name="tau")
  if warm is not None:
    out = tf.maximum(out, tf.cast(1.0 - warm, dtype))
  return out


def rate_from_decay(decay, warm, dtype):
  """The "ema" form's rate given as `decay`: `1 - min(decay, d)`.

  The arithmetic of `tf.train.ExponentialMovingAverage.apply` and
  `assign_moving_average`: decay in float32, the warm-up, `1 - decay`, then
  a cast to the variable's dtype.
  """
  decay = tf.convert_to_tensor(decay, name="decay")
  if warm is not None:
    decay = tf.minimum(decay, warm)
  out = 1.0 - decay
  return out if dtype == out.dtype else tf.cast(out, dtype)


def lerp_weights(tau, warm, dtype):
  """`(1 - tau, tau)` as the RL libraries' soft update rounds them.

  `1 - tau` is taken on the `tau` given (a Python float: in float64), and
  each weight is rounded once to `dtype`, as `(1 - tau) * target` and
  `tau * source` convert their Python floats. With the warm-up, while
  `d = (1 + n) / (10 + n)` is below `1 - tau`, the weights are `d` and
  `1 - d` (in float32, as TF's EMA computes them).
  """
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
  """Which rate a float variable takes: `(kind, value, dtype)`, kind "tau"
  or "decay"; a rate is made once per key and shared."""
  if tau_non_trainable is not None and not trainable:
    return ("tau", tau_non_trainable, dtype)
  if decay is not None:
    return ("decay", decay, dtype)
  return ("tau", tau, dtype)


def is_hard_copy(key):
  """A rate of exactly 1.0: the update is a copy (exact also for inf and
  NaN, which `0 * average` would not keep)."""
  return key[:2] == ("tau", 1.0)


def rates(key, form, warm):
  """The rate tensors of `key` for `form`: `(keep, rate)` for "lerp",
  `(rate,)` for "ema"."""
  kind, value, dtype = key
  if form == "lerp":
    return lerp_weights(value, warm, dtype)
  if kind == "decay":
    return (rate_from_decay(value, warm, dtype),)
  return (rate(value, warm, dtype),)
