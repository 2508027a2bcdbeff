"""snapstore.Guard(store) and snapstore.Trial(store): what they restore, retries, re-raise, errors."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th

CASES = helpers.mode_and_kind_cases()
BLOW_UP = 1e30  # a learning rate that makes the next loss infinite


class _GuardCase(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode="device", use_resource=False, optimizer_fn=None):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = th.Regression(
        use_resource=use_resource, optimizer_fn=optimizer_fn
      )
      self.store = self.model.store(mode=mode, max_to_keep=1)
    self.sess = th.session(self, self.graph)
    th.run_steps(self.sess, self.model.train_op, self.model.feeds(0, 3))
    return self.model, self.store, self.sess

  def _state(self):
    return th.state(self.store, self.sess)


class GuardTest(_GuardCase):
  @parameterized.named_parameters(*CASES)
  def test_rollback_is_exact_and_replays_bit_identically(
    self, mode, use_resource
  ):
    model, store, sess = self._setup(mode, use_resource, tf.train.AdamOptimizer)
    start = self._state()
    feeds = model.feeds(1, 4)
    with snapstore.Guard(
      store, watch=model.loss, reraise=False, session=sess
    ) as guard:
      for feed in feeds:
        guard.run(model.train_op, feed)
      after_k = self._state()
      guard.run(model.train_op, model.with_lr(feeds[0], BLOW_UP))
      guard.run(model.train_op, feeds[1])  # the loss of the blown-up parameters
    self.assertTrue(guard.failed)
    self.assertIsInstance(guard.failures[0], snapstore.NonFiniteError)
    # Model, Adam's slots and beta powers, and the global step: all restored.
    self.assertIn("global_step", start)
    self.assertIn("beta1_power", start)
    helpers.assert_state(self._state(), start, "after rollback")
    th.run_steps(sess, model.train_op, feeds)
    helpers.assert_state(self._state(), after_k, "replayed")

  @parameterized.named_parameters(*CASES)
  def test_retry_runs_again_from_the_snapshot(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    start = self._state()
    feed = model.feeds(1, 1)[0]
    seen = []
    guard = snapstore.Guard(store, watch=model.loss, retries=3, session=sess)
    for attempt in guard:
      with attempt:
        seen.append((attempt.number, self._state()))
        lr = BLOW_UP if attempt.number < 2 else 0.01
        attempt.run(model.train_op, model.with_lr(feed, lr))
        attempt.run(model.loss, feed)
    self.assertEqual([n for n, _ in seen], [0, 1, 2])
    for number, values in seen:  # every attempt started from the snapshot
      helpers.assert_state(values, start, "attempt %d" % number)
    self.assertLen(guard.failures, 2)
    self.assertFalse(guard.failed)
    retried = self._state()
    store.restore("guard", session=sess)
    sess.run(model.train_op, feed)  # lr 0.01, the default
    helpers.assert_state(retried, self._state(), "one good step")

  @parameterized.named_parameters(*helpers.mode_and_kind_cases(("device",)))
  def test_retries_exhausted_reraise_after_restoring(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    start = self._state()
    feed = model.feeds(1, 1)[0]
    guard = snapstore.Guard(store, watch=[model.loss], retries=1, session=sess)
    attempts = []
    with self.assertRaisesRegex(
      snapstore.NonFiniteError,
      r"Watched tensor loss:0 is inf \(attempt 2 of 2\)",
    ):
      for attempt in guard:
        with attempt:
          attempts.append(attempt.number)
          attempt.run(model.train_op, model.with_lr(feed, BLOW_UP))
          attempt.run(model.loss, feed)
    self.assertEqual(attempts, [0, 1])
    self.assertTrue(guard.failed)
    self.assertLen(guard.failures, 2)
    helpers.assert_state(self._state(), start)

  def test_exception_in_block_restores_and_propagates(self):
    model, store, sess = self._setup()
    start = self._state()
    with self.assertRaisesRegex(ValueError, "user code failed"):
      with snapstore.Guard(store, session=sess):
        sess.run(model.train_op, model.feeds(1, 1)[0])
        raise ValueError("user code failed")
    helpers.assert_state(self._state(), start)

  def test_op_error_restores(self):
    model, store, sess = self._setup()
    start = self._state()
    with self.assertRaises(tf.errors.InvalidArgumentError):
      with snapstore.Guard(store, session=sess) as guard:
        guard.run(model.train_op, model.feeds(1, 1)[0])
        guard.run(model.train_op)  # x not fed
    helpers.assert_state(self._state(), start)

  def test_exception_outside_catch_is_not_rolled_back(self):
    model, store, sess = self._setup()
    with self.assertRaisesRegex(KeyError, "not caught"):
      with snapstore.Guard(store, catch=tf.errors.OpError, session=sess):
        sess.run(model.train_op, model.feeds(1, 1)[0])
        changed = self._state()
        raise KeyError("not caught")
    helpers.assert_state(self._state(), changed)
    # A watched tensor's failure always rolls back.
    with snapstore.Guard(
      store, catch=tf.errors.OpError, reraise=False, session=sess
    ) as guard:
      sess.run(model.train_op, model.feeds(1, 1)[0])
      guard.check(np.inf)
    self.assertTrue(guard.failed)
    helpers.assert_state(self._state(), changed)

  def test_success_keeps_the_update_and_the_snapshot(self):
    model, store, sess = self._setup()
    start = self._state()
    with snapstore.Guard(store, watch=model.loss, session=sess) as guard:
      guard.run(model.train_op, model.feeds(1, 1)[0])
    self.assertFalse(guard.failed)
    helpers.assert_state_differs(self._state(), start)
    self.assertIn("guard", store.tags())
    store.restore("guard", session=sess)
    helpers.assert_state(self._state(), start)

  def test_check_fails_on_values_the_user_fetched(self):
    model, store, sess = self._setup()
    start = self._state()
    with self.assertRaisesRegex(
      snapstore.NonFiniteError,
      r"Value 1 is 2 of 3 elements not finite \(first: nan\)",
    ):
      with snapstore.Guard(store, session=sess) as guard:
        _, value = sess.run([model.train_op, model.loss], model.feeds(1, 1)[0])
        guard.check(value, np.array([1.0, np.nan, np.inf]))
    helpers.assert_state(self._state(), start)

  def test_check_rejects_non_float_values(self):
    _, store, sess = self._setup()
    with self.assertRaisesRegex(TypeError, "Value 0 is not a float value"):
      with snapstore.Guard(store, session=sess, catch=snapstore.Error) as guard:
        guard.check(np.array([1, 2]))

  def test_call_retries_a_function(self):
    model, store, sess = self._setup()
    feed = model.feeds(1, 1)[0]
    guard = snapstore.Guard(store, watch=model.loss, retries=2, session=sess)
    lrs = iter([BLOW_UP, 0.01])

    def step():
      guard.run(model.train_op, model.with_lr(feed, next(lrs)))
      return guard.run(model.loss, feed)

    value = guard.call(step)
    self.assertTrue(np.isfinite(value))
    self.assertLen(guard.failures, 1)
    swallowed = snapstore.Guard(
      store, watch=model.loss, reraise=False, session=sess
    )

    def blow_up():
      swallowed.run(model.train_op, model.with_lr(feed, BLOW_UP))
      return swallowed.run(model.loss, feed)

    self.assertIsNone(swallowed.call(blow_up))
    self.assertTrue(swallowed.failed)

  def test_one_guard_serves_every_step_without_new_ops(self):
    model, store, sess = self._setup()
    guard = snapstore.Guard(store, watch=model.loss, retries=1, session=sess)
    self.graph.finalize()
    with helpers.assert_no_new_ops(self.graph):
      for i, feed in enumerate(model.feeds(1, 20)):
        for attempt in guard:
          with attempt:
            lr = BLOW_UP if i % 5 == 0 and attempt.number == 0 else 0.01
            attempt.run(model.train_op, model.with_lr(feed, lr))
            attempt.run(model.loss, feed)
        with snapstore.Trial(
          store, metric=model.loss, feed_dict=feed, session=sess
        ):
          sess.run(model.train_op, feed)
    self.assertTrue(np.isfinite(sess.run(model.loss, feed)))

  def test_run_goes_through_a_monitored_session(self):
    with tf.Graph().as_default() as graph:
      model = th.Regression()
      store = model.store(max_to_keep=1)
      counter = helpers.CountingHook()
      with tf.train.MonitoredTrainingSession(hooks=[counter]) as sess:
        start = th.state(store, sess._tf_sess())  # pylint: disable=protected-access
        with snapstore.Guard(
          store, watch=model.loss, reraise=False, session=sess
        ) as guard:
          guard.run(
            model.train_op, model.with_lr(model.feeds(1, 1)[0], BLOW_UP)
          )
          guard.run(model.loss, model.feeds(1, 1)[0])
        self.assertTrue(guard.failed)
        self.assertEqual(counter.runs, 2)  # the user's runs only
        helpers.assert_state(th.state(store, sess._tf_sess()), start)  # pylint: disable=protected-access
    del graph


class GuardErrorsTest(_GuardCase):
  def test_watch_must_be_float_tensors_of_the_store_graph(self):
    model, store, _ = self._setup()
    with self.assertRaisesRegex(TypeError, "watch takes float tensors"):
      snapstore.Guard(store, watch=model.loss.op)
    with self.graph.as_default():
      step_read = tf.identity(model.step)
    with self.assertRaisesRegex(TypeError, "Watched tensor .*has dtype int64"):
      snapstore.Guard(store, watch=step_read)
    with tf.Graph().as_default():
      other = tf.constant(1.0)
    with self.assertRaisesRegex(
      snapstore.GraphMismatchError, "Const:0 belongs to another graph"
    ):
      snapstore.Guard(store, watch=[model.loss, other])

  def test_bad_arguments(self):
    _, store, _ = self._setup()
    with self.assertRaisesRegex(ValueError, "retries must be >= 0, got -1"):
      snapstore.Guard(store, retries=-1)
    with self.assertRaisesRegex(TypeError, "retries must be an int"):
      snapstore.Guard(store, retries=1.5)
    with self.assertRaisesRegex(TypeError, "reraise must be a bool"):
      snapstore.Guard(store, reraise="no")
    with self.assertRaisesRegex(TypeError, "catch must be an exception type"):
      snapstore.Guard(store, catch=(ValueError, "x"))
    with self.assertRaisesRegex(TypeError, "needs a fixed tag"):
      snapstore.Guard(store, tag=None)
    with self.assertRaisesRegex(
      TypeError, "A tag must be an int or a non-empty"
    ):
      snapstore.Trial(store, tag="")

  def test_with_statement_cannot_retry(self):
    _, store, sess = self._setup()
    with self.assertRaisesRegex(
      ValueError, "retries=2 needs the block to run again.*for attempt in"
    ):
      with snapstore.Guard(store, retries=2, session=sess):
        pass

  def test_run_and_check_outside_the_block(self):
    model, store, sess = self._setup()
    with self.assertRaisesRegex(RuntimeError, r"guard.run\(\) runs inside"):
      snapstore.Guard(store, session=sess).run(model.loss, model.feeds(1, 1)[0])
    with self.assertRaisesRegex(RuntimeError, r"guard.check\(\) runs inside"):
      snapstore.Guard(store, session=sess).check(np.nan)

  def test_attempts_must_be_entered(self):
    _, store, sess = self._setup()
    with self.assertRaisesRegex(RuntimeError, "as a context manager"):
      for _ in snapstore.Guard(store, retries=1, session=sess):
        pass

  def test_guard_without_session(self):
    _, store, _ = self._setup()
    with self.assertRaisesRegex(
      snapstore.NoSessionError, r"snapshot\(\) needs a session"
    ):
      with snapstore.Guard(store):
        pass


class TrialTest(_GuardCase):
  @parameterized.named_parameters(*CASES)
  def test_metric_decides(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    feed = model.feeds(1, 1)[0]
    with snapstore.Trial(
      store, metric=model.loss, feed_dict=feed, session=sess
    ) as trial:
      sess.run(model.train_op, feed)
    self.assertTrue(trial.kept)
    self.assertLess(trial.after, trial.before)
    kept = self._state()
    with snapstore.Trial(
      store, metric=model.loss, feed_dict=feed, session=sess
    ) as trial:
      sess.run(model.train_op, model.with_lr(feed, 5.0))
    self.assertFalse(trial.kept)
    self.assertGreater(trial.after, trial.before)
    helpers.assert_state(self._state(), kept)

  def test_non_finite_metric_is_rejected(self):
    model, store, sess = self._setup()
    start = self._state()
    feed = model.feeds(1, 1)[0]
    with snapstore.Trial(
      store, metric=model.loss, feed_dict=feed, session=sess
    ) as trial:
      sess.run(model.train_op, model.with_lr(feed, BLOW_UP))
    self.assertFalse(trial.kept)
    self.assertFalse(np.isfinite(trial.after))
    helpers.assert_state(self._state(), start)

  def test_custom_accept(self):
    model, store, sess = self._setup()
    feed = model.feeds(1, 1)[0]
    calls = []

    def accept(before, after):
      calls.append((before, after))
      return after < before - 1e6  # an improvement no step makes

    start = self._state()
    with snapstore.Trial(
      store, metric=model.loss, feed_dict=feed, accept=accept, session=sess
    ) as trial:
      sess.run(model.train_op, feed)
    self.assertFalse(trial.kept)
    self.assertLen(calls, 1)
    self.assertEqual(calls[0], (trial.before, trial.after))
    helpers.assert_state(self._state(), start)

  def test_explicit_decisions(self):
    model, store, sess = self._setup()
    feed = model.feeds(1, 1)[0]
    start = self._state()
    with snapstore.Trial(store, session=sess) as trial:
      sess.run(model.train_op, feed)
      trial.reject()
    self.assertFalse(trial.kept)
    helpers.assert_state(self._state(), start)
    with snapstore.Trial(
      store, metric=model.loss, feed_dict=feed, session=sess
    ) as trial:
      sess.run(model.train_op, model.with_lr(feed, 5.0))
      trial.keep()  # wins over the metric
    self.assertTrue(trial.kept)
    self.assertIsNone(trial.after)
    helpers.assert_state_differs(self._state(), start)
    with snapstore.Trial(store, session=sess) as trial:
      trial.decide(np.bool_(False))
    self.assertFalse(trial.kept)

  def test_no_decision_rolls_back_and_raises(self):
    model, store, sess = self._setup()
    start = self._state()
    with self.assertRaisesRegex(snapstore.TrialError, "without a decision"):
      with snapstore.Trial(store, session=sess):
        sess.run(model.train_op, model.feeds(1, 1)[0])
    helpers.assert_state(self._state(), start)

  def test_exception_rolls_back(self):
    model, store, sess = self._setup()
    start = self._state()
    with self.assertRaisesRegex(ZeroDivisionError, "division"):
      with snapstore.Trial(store, session=sess) as trial:
        sess.run(model.train_op, model.feeds(1, 1)[0])
        trial.keep()
        1 / 0  # pylint: disable=pointless-statement
    self.assertFalse(trial.kept)
    helpers.assert_state(self._state(), start)

  def test_bad_arguments(self):
    model, store, _ = self._setup()
    with self.assertRaisesRegex(ValueError, "pass metric= too"):
      snapstore.Trial(store, accept=lambda b, a: True)
    with self.assertRaisesRegex(TypeError, "accept must be a function"):
      snapstore.Trial(store, metric=model.loss, accept=1)
    with tf.Graph().as_default():
      other = tf.constant(1.0)
    with self.assertRaisesRegex(
      snapstore.GraphMismatchError, "Const:0 belongs to another graph"
    ):
      snapstore.Trial(store, metric=other)


if __name__ == "__main__":
  tf.test.main()
