"""`store.slots.snapshot_in_step()`: the eager in-step snapshot.

Checked against a reference run: after every step the slot must hold, bit for
bit, what the variables held when the step started (with `if_finite`, the
start of the newest step whose loss was finite), with batch-norm statistics
and dropout seed state that the forward pass writes, with and without XLA.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values


def _setup(dropout):
  model = common.small_model(dropout=dropout)
  opt = keras.optimizers.Adam(0.01)
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
  return model, opt, store


def _step_fn(model, opt, snap, use_if_finite, jit, order="begin_first"):
  loss_fn = keras.losses.MeanSquaredError()

  def step(x, y):
    start = snap.begin() if order == "begin_first" else None
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    if order == "after_update":
      opt.apply_gradients(zip(grads, model.trainable_variables))
      snap()
      return loss
    opt.apply_gradients(zip(grads, model.trainable_variables))
    start.commit(if_finite=loss if use_if_finite else None)
    return loss

  return tf.function(step, jit_compile=jit)


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "xla"])
@pytest.mark.parametrize("dropout", [False, True], ids=["bn", "bn_dropout"])
def test_the_slot_holds_the_start_of_every_step(jit, dropout):
  model, opt, store = _setup(dropout)
  snap = store.slots.snapshot_in_step()
  assert snap.tag == "before_step" and store.slots.pinned() == ["before_step"]
  step = _step_fn(model, opt, snap, False, jit)
  state = list(store.variables.values())
  for x, y in common.batches(6):
    start = values(state)
    step(x, y)
    assert_bits_equal(start, list(store.arrays("before_step").values()))
  end = values(state)
  store.restore("before_step")
  assert_bits_equal(start, values(state))
  assert end[0].tobytes() != start[0].tobytes() or any(
    a.tobytes() != b.tobytes() for a, b in zip(end, start)
  )


def test_a_copy_after_the_update_does_not_hold_the_start():
  # The negative control: the check above can fail.
  model, opt, store = _setup(False)
  snap = store.slots.snapshot_in_step()
  step = _step_fn(model, opt, snap, False, False, order="after_update")
  state = list(store.variables.values())
  x, y = common.batches(1)[0]
  start = values(state)
  step(x, y)
  held = list(store.arrays("before_step").values())
  assert any(a.tobytes() != b.tobytes() for a, b in zip(start, held))


def test_if_finite_keeps_the_newest_finite_step_start():
  model, opt, store = _setup(False)
  snap = store.slots.snapshot_in_step(tag="good")
  step = _step_fn(model, opt, snap, True, False)
  state = list(store.variables.values())
  good = None
  for x, y in common.batches(5, nan_at=(2, 3)):
    start = values(state)
    loss = float(step(x, y))
    if np.isfinite(loss):
      good = start
    assert_bits_equal(good, list(store.arrays("good").values()))
  store.restore("good")
  assert_bits_equal(good, values(state))


def test_called_eagerly_it_copies_at_once():
  v = tf.Variable([1.0, 2.0])
  store = snapstore.SnapshotStore(var_list=[v])
  snap = store.slots.snapshot_in_step(tag="now")
  v.assign([5.0, 6.0])
  snap()
  v.assign([0.0, 0.0])
  store.restore("now")
  assert v.numpy().tolist() == [5.0, 6.0]
  v.assign([3.0, 3.0])
  start = snap.begin()
  v.assign([7.0, 7.0])
  assert not bool(start.commit(if_finite=tf.constant(np.nan)))
  assert bool(start.commit(if_finite=tf.constant(1.0)))
  store.restore("now")
  assert v.numpy().tolist() == [3.0, 3.0]  # what begin() read


def test_if_finite_must_be_a_float_tensor():
  v = tf.Variable([1.0])
  store = snapstore.SnapshotStore(var_list=[v])
  snap = store.slots.snapshot_in_step()
  with pytest.raises(TypeError, match="if_finite must be a float tensor"):
    snap(if_finite=tf.constant(1))
