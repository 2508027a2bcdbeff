"""Guard's graph-mode names (issue 36): `watch_tensors=`, `call_block`, `call_step`.

The old spellings, `watch=`, `guard.watch` and `guard.call`, still work for one
release: each warns with a DeprecationWarning naming the new spelling, and
does what the new one does (same failures, same values, bit for bit).
"""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th

BLOW_UP = 1e30  # a learning rate that makes the next loss infinite


class GuardNamesTest(tf.test.TestCase, parameterized.TestCase):
  def setUp(self):
    super(GuardNamesTest, self).setUp()
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = th.Regression()
      self.store = self.model.store(max_to_keep=1)
    self.sess = th.session(self, self.graph)
    th.run_steps(self.sess, self.model.train_op, self.model.feeds(0, 3))
    self.feed = self.model.feeds(1, 1)[0]

  def _state(self):
    return th.state(self.store, self.sess)

  def _blow_up_then_check(self, guard):
    """A block whose step makes the loss infinite: (failures, state after)."""
    start = self._state()
    with guard:
      guard.run(self.model.train_op, self.model.with_lr(self.feed, BLOW_UP))
      guard.run(self.model.loss, self.feed)
    self.assertTrue(guard.failed)
    after = self._state()
    helpers.assert_state(after, start, "after rollback")
    return [str(e) for e in guard.failures], after

  # -- watch_tensors ----------------------------------------------------------------

  def test_watch_tensors_fetches_and_checks_with_each_run(self):
    model = self.model
    guard = snapstore.Guard(
      self.store, watch_tensors=model.loss, reraise=False, session=self.sess
    )
    self.assertEqual(guard.watch_tensors, [model.loss])
    self.assertIsNone(guard.watch_result)
    failures, _ = self._blow_up_then_check(guard)
    self.assertRegex(failures[0], r"Watched tensor loss:0 is inf \(attempt 1")

  def test_watch_warns_and_does_what_watch_tensors_does(self):
    model = self.model
    new = snapstore.Guard(
      self.store, watch_tensors=model.loss, reraise=False, session=self.sess
    )
    with self.assertWarnsRegex(
      DeprecationWarning,
      r"snapstore.Guard\(watch=...\) is deprecated.*engine 'graph'\) use "
      r"watch_tensors=...",
    ) as caught:
      old = snapstore.Guard(
        self.store, watch=model.loss, reraise=False, session=self.sess
      )
    self.assertEqual(caught.filename, __file__)  # points at the caller
    self.assertEqual(old.watch_tensors, [model.loss])
    new_failures, new_state = self._blow_up_then_check(new)
    old_failures, old_state = self._blow_up_then_check(old)
    self.assertEqual(old_failures, new_failures)
    helpers.assert_state(old_state, new_state)

  def test_the_watch_property_warns_and_is_watch_tensors(self):
    guard = snapstore.Guard(
      self.store, watch_tensors=[self.model.loss], session=self.sess
    )
    with self.assertWarnsRegex(
      DeprecationWarning, r"guard.watch is deprecated.*use guard.watch_tensors"
    ):
      self.assertEqual(guard.watch, [self.model.loss])

  def test_messages_name_the_argument_as_written(self):
    with self.assertRaisesRegex(
      TypeError, "^watch_tensors takes float tensors"
    ):
      snapstore.Guard(self.store, watch_tensors=self.model.loss.op)
    with self.assertRaisesRegex(TypeError, "^watch takes float tensors"):
      snapstore.Guard(self.store, watch=self.model.loss.op)

  def test_watch_result_is_refused_in_graph_mode(self):
    with self.assertRaisesRegex(
      TypeError,
      r"watch_result=True picks what an eager step function returns, but "
      r"this store runs in graph mode. Pass watch_tensors=",
    ):
      snapstore.Guard(self.store, watch_result=True)

  def test_watch_and_its_new_name_together_are_refused(self):
    with self.assertRaisesRegex(
      TypeError, r"got watch= and watch_tensors=; pass watch_tensors= only"
    ):
      snapstore.Guard(
        self.store, watch=self.model.loss, watch_tensors=self.model.loss
      )

  def test_watch_stays_the_second_positional_argument(self):
    with self.assertWarns(DeprecationWarning):
      guard = snapstore.Guard(self.store, self.model.loss, 1)
    self.assertEqual(guard.watch_tensors, [self.model.loss])

  # -- call_block, call_step, call ---------------------------------------------------

  def _block(self, guard, lrs):
    def block():
      guard.run(self.model.train_op, self.model.with_lr(self.feed, next(lrs)))
      return guard.run(self.model.loss, self.feed)

    return block

  def test_call_block_retries_a_block(self):
    guard = snapstore.Guard(
      self.store, watch_tensors=self.model.loss, retries=2, session=self.sess
    )
    value = guard.call_block(self._block(guard, iter([BLOW_UP, 0.01])))
    self.assertTrue(np.isfinite(value))
    self.assertLen(guard.failures, 1)
    self.assertFalse(guard.failed)

  def test_call_block_passes_its_arguments(self):
    guard = snapstore.Guard(self.store, session=self.sess)
    self.assertEqual(guard.call_block(lambda a, b=0: a + b, 1, b=2), 3)

  def test_call_step_retries_one_run(self):
    model = self.model
    start = self._state()
    guard = snapstore.Guard(
      self.store,
      watch_tensors=model.loss,
      retries=1,
      reraise=False,
      session=self.sess,
    )
    # A step whose loss (before its update) is fine: kept.
    result = guard.call_step([model.train_op, model.loss], self.feed)
    self.assertTrue(np.isfinite(result[1]))
    self.assertFalse(guard.failed)
    helpers.assert_state_differs(self._state(), start)
    # A NaN loss in every attempt: rolled back twice, swallowed.
    kept = self._state()
    nan_feed = dict(self.feed)
    nan_feed[model.x] = np.full_like(self.feed[model.x], np.nan)
    self.assertIsNone(guard.call_step(model.train_op, nan_feed))
    self.assertTrue(guard.failed)
    self.assertLen(guard.failures, 2)
    helpers.assert_state(self._state(), kept)

  def test_call_warns_and_does_what_call_block_does(self):
    store, sess, loss = self.store, self.sess, self.model.loss
    start = self._state()
    new = snapstore.Guard(store, watch_tensors=loss, retries=2, session=sess)
    new_value = new.call_block(self._block(new, iter([BLOW_UP, 0.01])))
    new_state = self._state()
    store.restore("guard", session=sess)
    helpers.assert_state(self._state(), start)
    old = snapstore.Guard(store, watch_tensors=loss, retries=2, session=sess)
    with self.assertWarnsRegex(
      DeprecationWarning,
      r"guard.call\(\) is deprecated.*use guard.call_block\(\), calls a block",
    ) as caught:
      old_value = old.call(self._block(old, iter([BLOW_UP, 0.01])))
    self.assertEqual(caught.filename, __file__)
    self.assertEqual(old_value.tobytes(), new_value.tobytes())
    self.assertEqual(
      [str(e) for e in old.failures], [str(e) for e in new.failures]
    )
    helpers.assert_state(self._state(), new_state)


if __name__ == "__main__":
  tf.test.main()
