"""`snapstore.engines.eager.skip_update`: the gated update, and what a step writes.

What `SnapshotCallback(in_step=True, in_step_undo="skip")` relies on: the
trace shows every variable written outside the optimizer's update (and
only those), a handle of no known variable written outside it is reported,
and the gate applies the update exactly when its condition holds.
"""

import numpy as np
import pytest
import tensorflow as tf

from snapstore.engines.eager import skip_update
from tests.eager import common
from tests.eager.common import keras


class _Step(object):
  """A step with a forward write, reads, and a Keras optimizer's update."""

  def __init__(self, outside=None):
    keras.utils.set_random_seed(0)
    self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    self.opt = keras.optimizers.Adam(0.1)
    self.opt.build(self.model.trainable_variables)
    self.stat = tf.Variable(np.zeros(1, np.float32), name="stat")
    self.outside = outside

  def variables(self):
    return common.state_variables(self.model, self.opt) + [self.stat]

  def __call__(self, x):
    weights = self.model.trainable_variables
    with tf.GradientTape() as tape:
      out = self.model(x)
      self.stat.assign_add(tf.reduce_mean(out, axis=0))  # a forward write
      loss = tf.reduce_mean(tf.square(out))
    self.opt.apply_gradients(zip(tape.gradient(loss, weights), weights))
    if self.outside is not None:
      self.outside.assign_add(1.0)  # after the update
    array = tf.TensorArray(tf.float32, size=1).write(0, loss)  # local
    return array.stack()[0]


def _trace(step):
  spec = tf.TensorSpec([None, 3], tf.float32)
  with skip_update.recording(step.opt) as update:
    graph = tf.function(step, autograph=False).get_concrete_function(spec).graph
  return graph, update


def test_only_the_forward_write_is_outside_the_update():
  step = _Step()
  graph, update = _trace(step)
  assert update.calls(graph) == 1
  writes = skip_update.outside_writes(graph, update, step.variables())
  assert [v.name for v in writes.variables] == [step.stat.name]
  assert writes.after == set() and writes.unknown == []
  # The update's own writes (kernel, bias, Adam's slots) are inside it.
  assert "apply_gradients" not in vars(step.opt)  # put back


def test_a_write_after_the_update_is_marked_after():
  outside = tf.Variable(0.0, name="late")
  step = _Step(outside)
  graph, update = _trace(step)
  writes = skip_update.outside_writes(
    graph, update, step.variables() + [outside]
  )
  assert [v.name for v in writes.variables] == [step.stat.name, outside.name]
  assert writes.after == {id(outside)}


def test_a_write_of_an_unlisted_variable_is_unknown():
  outside = tf.Variable(0.0, name="unlisted")
  step = _Step(outside)
  graph, update = _trace(step)
  writes = skip_update.outside_writes(graph, update, step.variables())
  assert len(writes.unknown) == 1 and "AssignAdd" in writes.unknown[0]


@pytest.mark.parametrize("finite", [True, False])
def test_the_gate_applies_the_update_exactly_when_its_condition_holds(finite):
  step = _Step()
  state = common.state_variables(step.model, step.opt)
  before = common.values(state)
  stat = step.stat.numpy().copy()

  @tf.function(autograph=False)
  def gated(x):
    with skip_update.gated(step.opt, lambda: tf.constant(finite)) as gate:
      step(x)
    return gate.applied

  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  assert bool(gated(x)) == finite
  after = common.values(state)
  changed = [a.tobytes() != b.tobytes() for a, b in zip(before, after)]
  if finite:  # the kernel moved, and Adam counted a step
    assert changed[0] and int(np.asarray(step.opt.iterations.numpy())) == 1
  else:  # weights, slots, iterations: untouched
    assert not any(changed)
  # The forward write is outside the gate: made either way.
  assert step.stat.numpy().tobytes() != stat.tobytes()
  assert "apply_gradients" not in vars(step.opt)


def test_a_second_update_in_a_gated_step_is_refused():
  step = _Step()
  weights = step.model.trainable_variables

  def twice():
    with skip_update.gated(step.opt, lambda: tf.constant(True)):
      for _ in range(2):
        step.opt.apply_gradients([(tf.ones_like(w), w) for w in weights])

  with pytest.raises(ValueError, match=r"apply_gradients more than once"):
    tf.function(twice, autograph=False).get_concrete_function()
  assert "apply_gradients" not in vars(step.opt)
