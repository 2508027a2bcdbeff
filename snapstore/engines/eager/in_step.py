"""The eager in-step snapshot: a copy into a slot inside the user's tf.function.

The eager counterpart of `engines/graph/in_step.py` (`snapshot_before`). Made by
`store.slots.snapshot_in_step()`:

    snap = store.slots.snapshot_in_step()      # pins "before_step" to slot 0

    @tf.function
    def train_step(x, y):
      start = snap.begin()                     # first: the values the step starts from
      with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
      grads = tape.gradient(loss, model.trainable_variables)
      opt.apply_gradients(zip(grads, model.trainable_variables))
      start.commit(if_finite=loss)             # into the slot, if the loss is finite
      return loss

`begin()` reads every covered variable; `commit()` writes those reads into
the slot's shadows. Why this is exact: TensorFlow's automatic control
dependencies make every later write of a variable in the function (a
batch-norm statistic in the forward pass, the optimizer's update) wait for
the reads made before it in program order, and a read tensor keeps the value
it read (an update of a variable whose buffer a read still holds writes a
copy). So `begin()` must come before anything writes the variables: the top
of the step. `commit()` may come anywhere after it; with `if_finite` it
writes only when every element of that tensor is finite, so the slot keeps
the start of the newest step whose loss was finite. `snap()` is
`snap.begin().commit()`: an unconditional copy at that point.

Called eagerly (outside a `tf.function`), the same calls run at once. A step
costs no extra dispatch: the copy runs inside the step's own function.
"""

from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.engines.eager import distributed


def _not_converted(method):
  """Called from a user's `tf.function`, AutoGraph leaves it as it is: it
  has no Python control flow on tensors (its `tf.cond` is explicit), and
  converting it would read this file's source at every trace."""
  return tf2.autograph.experimental.do_not_convert(method)


class InStepSnapshot(object):
  """Copies into one slot from inside a traced step (see module doc).

  Args:
    variables: The covered variables, in the store's key order.
    shadows: The slot's shadow of each.
    tag: The tag pinned to the slot.
  """

  def __init__(self, variables, shadows, tag):
    self._variables = list(variables)
    self._shadows = list(shadows)
    self.tag = tag

  @_not_converted
  def begin(self):
    """Reads the variables now; returns the `Start` to `commit` later.

    Inside `strategy.run` (replica context) each replica reads its own
    component and later writes its own shadow component; elsewhere every
    component is read, on its own device.
    """
    pairs, reads = [], {}
    if distributed.in_replica_context():
      for var, shadow in zip(self._variables, self._shadows):
        value = distributed.local(var).value()
        pairs.append((distributed.local(shadow), value))
        reads[id(var)] = value
      return Start(pairs, reads, replica=True)
    for var, shadow in zip(self._variables, self._shadows):
      parts = distributed.components(var)
      for part, target in zip(parts, distributed.components(shadow)):
        with tf.device(part.device):
          pairs.append((target, part.value(), part.device))
      if len(parts) == 1:
        reads[id(var)] = pairs[-1][1]
    return Start(pairs, reads)

  @_not_converted
  def __call__(self, if_finite=None):
    """Copies the variables into the slot now (`begin().commit(if_finite)`)."""
    return self.begin().commit(if_finite)


class Start(object):
  """The values a step started from, read by `InStepSnapshot.begin`.

  Args:
    pairs: (shadow, value) or (shadow component, value, device) to write.
    reads: {id(variable): value} of the variables read whole (one
      component, or in replica context this replica's), for `value_of`.
    replica: Read in replica context (inside `strategy.run`): `commit`'s
      `if_finite` is then decided by every replica together.
  """

  def __init__(self, pairs, reads, replica=False):
    self._pairs = pairs
    self._reads = reads
    self._replica = replica

  def value_of(self, variable):
    """The value `begin` read of `variable`, or None (not covered, or read
    per component): a step that undoes itself writes it back."""
    return self._reads.get(id(variable))

  @_not_converted
  def commit(self, if_finite=None):
    """Writes the values into the slot; with `if_finite`, only if it is finite.

    Inside `strategy.run`, every replica decides alike: the slot is
    written in every replica or in none, none when `if_finite` is not
    finite on any replica (of any worker). Each replica checks its own
    loss, and one deciding alone would leave the slot's components at the
    starts of different steps: a restore would make the replicas differ.
    It costs one all-reduce of a flag per commit.

    Args:
      if_finite: None, or a float tensor (typically the step's loss).

    Returns:
      A bool tensor: whether the slot was written.

    Raises:
      TypeError: `if_finite` is not a float tensor.
    """

    def write():
      for pair in self._pairs:
        if len(pair) == 3:  # a component, on its device
          with tf.device(pair[2]):
            pair[0].assign(pair[1], read_value=False)
        else:  # replica context: this replica's component of the shadow
          pair[0].assign(pair[1], read_value=False)
      return tf.constant(True)

    if if_finite is None:
      return write()
    condition = tf.convert_to_tensor(if_finite)
    if not condition.dtype.is_floating:
      raise TypeError(
        "if_finite must be a float tensor (the step's loss), got dtype %s."
        % condition.dtype.name
      )
    finite = tf.reduce_all(tf.math.is_finite(condition))
    if self._replica:
      # How many replicas saw a value that is not finite.
      failed = tf2.distribute.get_replica_context().all_reduce(
        tf2.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32)
      )
      finite = tf.equal(failed, 0.0)
    return tf.cond(finite, write, lambda: tf.constant(False))
