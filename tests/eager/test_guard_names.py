"""Guard's eager names (issue 36): `watch_result=`, `call_step`, `call_block`.

The old spellings, `watch=`, `guard.watch` and `guard.call`, still work for one
release: each warns with a DeprecationWarning naming the new spelling, and
does what the new one does (same failures, same values, bit for bit).
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values

GOOD, NAN = common.batches(2, seed=7, nan_at=(1,))


class _Setup(object):
  """A model, its SGD, a store over both and a `tf.function` step."""

  def __init__(self):
    self.model = common.small_model()
    self.opt = keras.optimizers.SGD(0.01)
    self.loss_fn = keras.losses.MeanSquaredError()
    self.step = tf.function(self._step)
    self.step(*GOOD)
    self.store = snapstore.SnapshotStore(
      var_list=self.model, optimizer=self.opt
    )

  def _step(self, x, y):
    with tf.GradientTape() as tape:
      loss = self.loss_fn(y, self.model(x, training=True))
    grads = tape.gradient(loss, self.model.trainable_variables)
    self.opt.apply_gradients(zip(grads, self.model.trainable_variables))
    return {"loss": loss}

  def values(self):
    return values(self.store.variables.values())


def _good_then_nan(s, guard):
  """A block of a good step and a NaN step: (failures, values after)."""
  start = s.values()
  with guard:
    guard.run(s.step, *GOOD)
    guard.run(s.step, *NAN)
  assert guard.failed
  assert_bits_equal(start, s.values())
  return [str(e) for e in guard.failures], s.values()


# -- watch_result ------------------------------------------------------------------


def test_watch_result_picks_what_the_step_returns():
  s = _Setup()
  guard = snapstore.Guard(s.store, watch_result="loss", reraise=False)
  assert guard.watch_result == "loss" and guard.watch_tensors == []
  failures, _ = _good_then_nan(s, guard)
  assert "Result['loss'] is nan (attempt 1 of 1)" in failures[0]


def test_watch_warns_and_does_what_watch_result_does():
  s = _Setup()
  new = snapstore.Guard(s.store, watch_result="loss", reraise=False)
  with pytest.warns(
    DeprecationWarning,
    match=r"snapstore.Guard\(watch=...\) is deprecated.*engine 'eager'\) use "
    r"watch_result=...",
  ) as caught:
    old = snapstore.Guard(s.store, watch="loss", reraise=False)
  assert caught[0].filename == __file__  # points at the caller
  assert old.watch_result == "loss"
  new_failures, new_values = _good_then_nan(s, new)
  old_failures, old_values = _good_then_nan(s, old)
  assert old_failures == new_failures
  assert_bits_equal(new_values, old_values)


def test_the_watch_property_warns_and_is_watch_result():
  s = _Setup()
  guard = snapstore.Guard(s.store, watch_result=True)
  with pytest.warns(
    DeprecationWarning, match=r"guard.watch is deprecated.*guard.watch_result"
  ):
    assert guard.watch is True


def test_messages_name_the_argument_as_written():
  s = _Setup()
  with pytest.raises(TypeError, match="^watch_result='' picks nothing"):
    snapstore.Guard(s.store, watch_result="")
  with pytest.raises(TypeError, match="^On an eager store, watch_result picks"):
    snapstore.Guard(s.store, watch_result=tf.constant(1.0))
  with pytest.raises(TypeError, match=r"^watch_result='lost' picks result"):
    with snapstore.Guard(s.store, watch_result="lost") as guard:
      guard.run(s.step, *GOOD)
  with pytest.warns(DeprecationWarning):
    with pytest.raises(TypeError, match="^watch='' picks nothing"):
      snapstore.Guard(s.store, watch="")


def test_a_function_picks_under_its_name():
  s = _Setup()
  with pytest.raises(
    snapstore.NonFiniteError, match=r"Watch_result\(result\) is nan"
  ):
    with snapstore.Guard(s.store, watch_result=lambda out: out["loss"]) as g:
      g.run(s.step, *NAN)


def test_watch_tensors_is_refused_on_an_eager_store():
  s = _Setup()
  with pytest.raises(
    TypeError,
    match=r"watch_tensors=.* names tensors that a graph-mode guard fetches "
    r"in each session.run, but this store runs eagerly. Pass watch_result=",
  ):
    snapstore.Guard(s.store, watch_tensors=tf.constant(1.0))
  with pytest.raises(TypeError, match=r"got watch= and watch_result="):
    snapstore.Guard(s.store, watch=True, watch_result=True)


# -- call_step, call_block, call ---------------------------------------------------


def test_call_step_runs_one_step_with_retries():
  s = _Setup()
  start = s.values()
  guard = snapstore.Guard(s.store, watch_result=True, retries=1, reraise=False)
  assert guard.call_step(s.step, *NAN) is None
  assert guard.failed and len(guard.failures) == 2
  assert_bits_equal(start, s.values())
  result = guard.call_step(s.step, *GOOD)
  assert np.isfinite(result["loss"].numpy()) and not guard.failed


def test_call_block_calls_a_block_that_runs_its_steps():
  s = _Setup()
  guard = snapstore.Guard(s.store, watch_result="loss", retries=2)
  batches = iter([NAN, GOOD])
  seen = []

  def block(scale):
    seen.append(s.values())
    result = guard.run(s.step, *next(batches))
    return scale * result["loss"].numpy()

  loss = guard.call_block(block, 2.0)
  assert np.isfinite(loss) and len(guard.failures) == 1
  assert_bits_equal(seen[0], seen[1])  # the retry started from the snapshot


def test_call_warns_and_does_what_call_step_does():
  s = _Setup()
  start = s.values()
  new = snapstore.Guard(s.store, watch_result=True, retries=1, reraise=False)
  assert new.call_step(s.step, *NAN) is None
  new_failures = [str(e) for e in new.failures]
  new_result = new.call_step(s.step, *GOOD)
  new_values = s.values()
  s.store.restore("guard")
  assert_bits_equal(start, s.values())
  old = snapstore.Guard(s.store, watch_result=True, retries=1, reraise=False)
  with pytest.warns(
    DeprecationWarning,
    match=r"guard.call\(\) is deprecated.*use guard.call_step\(\), runs one "
    r"step",
  ) as caught:
    assert old.call(s.step, *NAN) is None
  assert caught[0].filename == __file__
  assert [str(e) for e in old.failures] == new_failures
  assert len(new_failures) == 2
  with pytest.warns(DeprecationWarning):
    old_result = old.call(s.step, *GOOD)
  assert old_result["loss"].numpy().tobytes() == (
    new_result["loss"].numpy().tobytes()
  )
  assert_bits_equal(new_values, s.values())
