"""Sessions: default session, MonitoredSession and hook sessions."""

from absl.testing import parameterized

import snapstore
from snapstore._tf import tf
from tests import helpers


class SnapshotInHook(tf.train.SessionRunHook):
  """Snapshots through run_context.session, the raw session hooks get."""

  def __init__(self, store):
    self.store = store
    self.tags = []

  def after_run(self, run_context, run_values):
    self.tags.append(self.store.snapshot(session=run_context.session))


class MonitoredSessionTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_store_calls_do_not_count_as_steps(self, mode, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net", mode=mode)
      hook = helpers.CountingHook()
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        model.randomize(sess._tf_sess(), seed=1)  # pylint: disable=protected-access
        saved = model.values(sess)
        runs = hook.runs
        tag = store.snapshot(session=sess)
        sess.run(model.train_op)
        helpers.assert_state_differs(model.values(sess), saved)
        store.evaluate_with(model.train_op, session=sess)
        store.restore(tag, session=sess)
        helpers.assert_state(model.values(sess), saved)
        # Only the user's own runs went through the hooks.
        self.assertEqual(hook.runs, runs + 3)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_snapshot_from_a_hook(self, mode, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=2)
      hook = SnapshotInHook(store)
      with tf.train.SingularMonitoredSession(hooks=[hook]) as sess:
        raw = sess.raw_session()  # reads that do not go through the hook
        sess.run(model.train_op)
        after_first = model.values(raw)
        sess.run(model.train_op)
        self.assertEqual(hook.tags, [0, 1])
        store.restore(0, session=sess)
        helpers.assert_state(model.values(raw), after_first)

  def test_closed_monitored_session(self):
    with tf.Graph().as_default():
      helpers.Model()
      store = snapstore.SnapshotStore(scope="net")
      sess = tf.train.MonitoredTrainingSession()
      sess.close()
      with self.assertRaisesRegex(
        snapstore.NoSessionError, "The MonitoredSession is closed"
      ):
        store.snapshot(session=sess)


if __name__ == "__main__":
  tf.test.main()
