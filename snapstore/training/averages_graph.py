"""Graph mode's averages: the update of a `MovingAverage` or `RunningMean` as ops.

`GraphAverage` is the update builder `averages.py` picks for a store on the
graph engine (`store.engine.name == "graph"`). It builds one grouped op per
average, once, when the average is made, in the store's graph and under the
control dependencies in effect there (so an average built under
`tf.control_dependencies([train_op])` runs after the step); the user runs
it (`update_op`). A distributed variable is averaged per component: each
component from its own value, on its own device, into its own shadow (a
distributed variable's graph-mode shadows are plain variables, one per
component, `snapstore.core.distributed`), as TF's EMA does under a strategy
(`extended.update` per component); replicas never mix.
"""

import numpy as np

from snapstore.core import distributed as core_distributed
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import checks
from snapstore.core import distributed
from snapstore.engines.graph import copies
from snapstore.engines.graph import variables
from snapstore import errors
from snapstore.training import averages_rates


class GraphAverage(object):
  """Builds and holds the ops of one average in a graph-mode device slot.

  Args:
    store: The device-mode `SnapshotStore`.
    slot: The device slot holding the average.
    what: The average's class name, for messages.

  Raises:
    ValueError: Built inside `strategy.run` (replica context).
  """

  def __init__(self, store, slot, what):
    _check_cross_replica(what)
    self._store = store
    # `owner` is the variable each component belongs to: the variable is in
    # TRAINABLE_VARIABLES, not its components.
    self._parts = [
      (owner, part, shadow)
      for owner, shadows in zip(
        store.variables.values(), store.slots.component_shadows(slot).values()
      )
      for part, shadow in zip(distributed.components(owner), shadows)
    ]
    self._pairs = [(part, shadow) for _, part, shadow in self._parts]
    self._update_op = None

  @staticmethod
  def num_updates(num_updates, store):
    """`num_updates` checked: a numeric scalar tensor of the store's graph.

    Raises:
      TypeError: Not a numeric scalar tensor or variable.
      GraphMismatchError: Of another graph.
    """
    if num_updates is None:
      return None
    if not isinstance(num_updates, (tf.Tensor, tf_variables.Variable)):
      raise TypeError(
        "num_updates must be a scalar tensor or variable (e.g. the "
        "global step), got %r." % (num_updates,)
      )
    dtype = num_updates.dtype.base_dtype
    if (
      not (dtype.is_integer or dtype.is_floating)
      or num_updates.shape.ndims != 0
    ):
      raise TypeError(
        "num_updates must be a numeric scalar, got %s of dtype %s "
        "and shape %s." % (num_updates.name, dtype.name, num_updates.shape)
      )
    checks.same_graph(
      num_updates, store.graph, "num_updates %s" % num_updates.name
    )
    return num_updates

  @staticmethod
  def rate(value, name, store):
    """A rate given as a tensor, checked: a scalar float tensor or variable
    of the store's graph, read at each run of the update op (a placeholder
    to feed, or a variable to assign).

    Raises:
      TypeError: Not a scalar float tensor or variable.
      GraphMismatchError: Of another graph.
    """
    if not isinstance(value, (tf.Tensor, tf_variables.Variable)):
      raise TypeError(
        "%s must be a number or a scalar float tensor or variable, got %r."
        % (name, value)
      )
    if not value.dtype.base_dtype.is_floating or value.shape.ndims != 0:
      raise TypeError(
        "%s must be a scalar float tensor, got %s of dtype %s and shape %s."
        % (name, value.name, value.dtype.base_dtype.name, value.shape)
      )
    checks.same_graph(value, store.graph, "%s %s" % (name, value.name))
    return value

  @staticmethod
  def check_running_mean():
    """A `RunningMean` is built in graph mode (nothing to refuse)."""

  # -- the updates ------------------------------------------------------------------

  def moving_average(
    self, tau, decay, tau_non_trainable, num_updates, form, name
  ):
    """Builds the `MovingAverage` update: one grouped op named `name`."""
    graph = self._store.graph
    trainable = set(
      id(v) for v in graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    )
    with graph.as_default(), tf.name_scope(name) as scope:
      warm = None
      if num_updates is not None:
        n = tf.cast(num_updates, tf.float32, name="num_updates")
        warm = averages_rates.warmup(n)
      rates = averages_rates.Rates(form, warm)
      updates = []
      for owner, var, shadow in self._parts:
        dtype = var.dtype.base_dtype
        if not dtype.is_floating:
          updates.append(_copy(var, shadow))
          continue
        kind, value = averages_rates.rate_key(
          tau, decay, tau_non_trainable, id(owner) in trainable, dtype
        )
        if averages_rates.is_hard_copy(kind, value):
          updates.append(_copy(var, shadow))
          continue
        weights = rates(kind, value, dtype)
        updates.append(
          _lerp_update(var, shadow, *weights)
          if form == "lerp"
          else _ema_update(var, shadow, *weights)
        )
      self._update_op = tf.group(*updates, name=scope)

  def running_mean(self, name):
    """Builds the `RunningMean` update; returns `(count, reset_op)`.

    The count variable lives with the shadows (in GLOBAL_VARIABLES when the
    store is `saveable`, else LOCAL_VARIABLES), colocated with the first
    variable.
    """
    first_var, first_shadow = self._pairs[0]
    graph = self._store.graph
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
        count = tf.Variable(
          np.int64(0),
          trainable=False,
          collections=collections,
          name="count",
          use_resource=copies.is_resource(first_var),
        )
      n = copies.read(count)
      averaged = tf.cond(
        tf.equal(n, 0),
        self._copy_all,
        lambda: self._add_to_mean(n),
        name="average",
      )
      with tf.control_dependencies([averaged]):
        self._update_op = tf.group(
          copies.assign_add(count, tf.constant(1, tf.int64)), name=scope
        )
      with tf.control_dependencies(None):  # a reset never waits for a step
        reset_op = copies.assign(count, tf.constant(0, tf.int64))
    return count, reset_op

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

  # -- running them -----------------------------------------------------------------

  def update_op(self):
    """The grouped op updating the average."""
    return self._update_op

  def update(self, tau=None, tau_non_trainable=None):
    """Refuses the eager engine's `update()`.

    Raises:
      ModeError: Always; names `update_op`.
    """
    del tau, tau_non_trainable
    raise errors.ModeError(
      "update() is the eager engine's; this average's store runs in graph "
      "mode. Run update_op in your session (e.g. sess.run(ema.update_op)); "
      "for a rate that changes, build the average with tau= a scalar "
      "variable or placeholder, which each run of update_op reads."
    )


def _check_cross_replica(what):
  """Refuses building a graph-mode average inside `strategy.run`.

  Its update op updates every replica's component itself; built in replica
  context, each replica would build (and pin) one.

  Raises:
    ValueError: Called in replica context.
  """
  if core_distributed.in_replica_context():
    raise ValueError(
      "%s was built inside strategy.run (replica context): its update op "
      "updates every replica's component itself, so each replica would "
      "build one. Build it after strategy.run returns, in cross-replica "
      "context, under tf.control_dependencies([train_op]) to order it "
      "after the step." % what
    )


def _copy(var, shadow):
  return copies.assign(shadow, copies.read(var))


def _ema_update(var, shadow, rate):
  # average - (average - variable) * rate: TF's assign_moving_average.
  with ops.colocate_with(var):
    return copies.assign_sub(
      shadow, (copies.read(shadow) - copies.read(var)) * rate
    )


def _lerp_update(var, shadow, keep, rate):
  # (1 - tau) * target + tau * source: two products, each rounded, then their
  # sum, as the libraries' expression runs (IEEE products and sums commute,
  # so trfl's tau * source + (1 - tau) * target gives the same bits).
  with ops.colocate_with(var):
    return copies.assign(
      shadow, keep * copies.read(shadow) + rate * copies.read(var)
    )
