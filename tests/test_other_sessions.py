"""A snapshot used from another session than the one that took it.

A device snapshot lives in the session that took it (a local `tf.Session`) or
on the cluster's tasks (a `grpc://` target). Another local session, or a
cluster whose task restarted, has shadows holding something else: the store
refuses there (and drops the snapshots of a closed local session) instead of
restoring those values. Host snapshots are numpy arrays and restore anywhere.
"""

import os

from absl.testing import parameterized

import snapstore
from snapstore._tf import tf
from tests import cluster as cluster_lib
from tests import helpers

_CONFIG = tf.ConfigProto(operation_timeout_in_ms=60000)  # fail, never hang


class _Case(tf.test.TestCase, parameterized.TestCase):
  def _build(self, mode, use_resource, **options):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = helpers.Model(
        use_resource=use_resource, dtypes=(tf.float32, tf.int32)
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=2, **options
      )
      self.w = self.model.variables["v0_float32"]
    self.addCleanup(self.store.close)

  def _snapshot_a(self, target=""):
    """A new session, and the values snapshot 'a' takes there."""
    first = self._session(target)
    taken = self.model.randomize(first, seed=1)
    self.store.snapshot("a", session=first)
    return first, taken

  def _session(self, target=""):
    sess = tf.Session(target, graph=self.graph, config=_CONFIG)
    self.addCleanup(sess.close)
    helpers.init(sess)
    return sess


class AnotherLocalSessionTest(_Case):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_while_the_first_session_is_open(self, mode, use_resource):
    self._build(mode, use_resource)
    first, taken = self._snapshot_a()
    second = self._session()  # its shadows hold its own initial values
    live = self.model.randomize(second, seed=2)
    helpers.assert_state_differs(live, taken)
    if mode == "host":  # numpy arrays: usable from any session, exactly
      self.store.restore("a", session=second)
      helpers.assert_state(self.model.values(second), taken)
      return
    calls = {
      "restore": lambda: self.store.restore("a", session=second),
      "arrays": lambda: self.store.arrays("a", session=second),
      "evaluate_with": lambda: self.store.evaluate_with(
        self.w, tag="a", session=second
      ),
      "evaluate_each": lambda: self.store.evaluate_each(self.w, session=second),
      "save_npz": lambda: self.store.files.save_npz(
        os.path.join(self.get_temp_dir(), "a.npz"), "a", session=second
      ),
    }
    for what, call in calls.items():
      with helpers.assert_raises_naming(
        self,
        snapstore.SessionMismatchError,
        r"Snapshot 'a' is a device snapshot held by Session at 0x[0-9a-f]+ "
        r"\(still open\), not by %s\(\)'s session" % what,
        r"this session's shadows do not hold it",
        r"store.load_arrays\(store.arrays\('a', session=old\)",
      ):
        call()
      helpers.assert_state(self.model.values(second), live, what)
    self.assertEqual(self.store.tags(), ["a"])  # still held, by the first
    self.assertFalse(os.path.exists(os.path.join(self.get_temp_dir(), "a.npz")))
    # Where it lives, it is intact; carried over, it restores in the second.
    self.model.randomize(first, seed=3)
    self.store.restore("a", session=first)
    helpers.assert_state(self.model.values(first), taken)
    self.store.load_arrays(
      self.store.arrays("a", session=first), tag="a", session=second
    )
    self.store.restore("a", session=second)
    helpers.assert_state(self.model.values(second), taken)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_after_the_first_session_is_closed(self, mode, use_resource):
    self._build(mode, use_resource)
    first, taken = self._snapshot_a()
    first.close()
    # A new session whose initializers ran: its shadows are initialized, and
    # hold its variables' initial values, not the snapshot.
    second = self._session()
    live = self.model.randomize(second, seed=2)
    if mode == "host":
      self.assertEqual(self.store.tags(), ["a"])
      self.store.restore(session=second)
      helpers.assert_state(self.model.values(second), taken)
      return
    self.assertEqual(self.store.tags(), [])  # the values went with the session
    self.assertNotIn("a", self.store)
    for call in (
      lambda: self.store.restore("a", session=second),
      lambda: self.store.arrays("a", session=second),
    ):
      with helpers.assert_raises_naming(
        self,
        snapstore.SessionMismatchError,
        r"Snapshot 'a' was a device snapshot of Session at 0x[0-9a-f]+ \(closed\)",
        r"its values went with that session's resources",
        r"the store dropped it",
        r"save_npz\(\) or spill\(\) it first",
      ):
        call()
    with helpers.assert_raises_naming(
      self,
      snapstore.SessionMismatchError,
      r"The store holds no snapshots\. "
      r"Snapshot 'a' was a device snapshot",
    ):
      self.store.restore(session=second)  # the newest
    helpers.assert_state(self.model.values(second), live)
    # The slot is free again: a snapshot in the new session works as usual.
    self.store.snapshot("a", session=second)
    self.model.randomize(second, seed=3)
    self.store.restore("a", session=second)
    helpers.assert_state(self.model.values(second), live)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_second_monitored_training_session(self, use_resource):
    # As recovery after a failure starts one: a new raw session underneath.
    self._build("device", use_resource)
    with self.graph.as_default():
      with tf.train.MonitoredTrainingSession() as sess:
        taken = self.model.randomize(sess._tf_sess(), seed=1)  # pylint: disable=protected-access
        tag = self.store.snapshot(session=sess)
        sess.run(self.model.train_op)
        self.store.restore(tag, session=sess)  # same raw session: fine
        helpers.assert_state(self.model.values(sess), taken)
      with tf.train.MonitoredTrainingSession() as sess:
        live = self.model.values(sess)
        with helpers.assert_raises_naming(
          self,
          snapstore.SessionMismatchError,
          # The closed session, or (once garbage-collected) one that no longer
          # exists: either way the snapshot went with it.
          r"Snapshot 0 was a device snapshot of (Session .* \(closed\)|a "
          r"session that no longer exists)",
        ):
          self.store.restore(tag, session=sess)
        helpers.assert_state(self.model.values(sess), live)
        self.assertEqual(self.store.tags(), [])

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_pinned_slot_is_whatever_the_slot_holds_in_each_session(
    self, use_resource
  ):
    # pin_slot names a slot that in-graph ops write, in any session.
    self._build("device", use_resource)
    self.store.slots.pin(0, "target")
    for seed in (1, 2):
      sess = self._session()
      taken = self.model.randomize(sess, seed=seed)
      sess.run(self.store.slots.snapshot_op(0))
      self.model.randomize(sess, seed=seed + 10)
      self.store.restore("target", session=sess)
      helpers.assert_state(self.model.values(sess), taken)
      sess.close()
    self.assertEqual(self.store.tags(), ["target"])

  def test_a_spilled_snapshot_is_no_longer_tied_to_its_session(self):
    self._build(
      "device", False, spill_path=os.path.join(self.get_temp_dir(), "spill.h5")
    )
    first = self._session()
    taken = self.model.randomize(first, seed=1)
    self.store.snapshot("a", session=first)
    self.store.files.spill("a", session=first)
    first.close()
    second = self._session()
    self.assertEqual(self.store.tags(), ["a"])
    self.store.restore("a", session=second)
    helpers.assert_state(self.model.values(second), taken)

  def test_sessions_under_wrappers_are_told_apart_by_the_session(self):
    self._build("device", False)
    sess = self._session()
    taken = self.model.randomize(sess, seed=1)
    self.store.snapshot("a", session=helpers.CountingSession(sess))
    self.model.randomize(sess, seed=2)
    self.store.restore("a", session=sess)
    helpers.assert_state(self.model.values(sess), taken)
    other = helpers.CountingSession(self._session())
    with helpers.assert_raises_naming(
      self, snapstore.SessionMismatchError, r"still open"
    ):
      self.store.restore("a", session=other)
    self.assertEqual(other.runs, 0)

  def test_no_new_ops_and_no_extra_runs(self):
    self._build("device", False)
    sess = helpers.CountingSession(self._session())
    self.store.snapshot("a", session=sess)
    self.store.restore("a", session=sess)
    runs = sess.runs
    with helpers.assert_no_new_ops(self.graph):
      self.store.snapshot("a", session=sess)
      self.store.restore("a", session=sess)
      self.store.tags()
    self.assertEqual(sess.runs, runs + 2)  # one copy each, no check run


class ClusterTargetTest(_Case):
  """Sessions on a `grpc://` target share the variables on the cluster's tasks."""

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_later_session_on_the_same_target_restores_exactly(
    self, use_resource
  ):
    server = tf.train.Server.create_local_server()
    self._build("device", use_resource)
    first, taken = self._snapshot_a(server.target)
    first.close()
    # The initializers run again (as a recovering chief's do): they leave the
    # shadows, which hold the snapshot on the server, as they are.
    second = self._session(server.target)
    self.model.randomize(second, seed=2)
    self.assertEqual(self.store.tags(), ["a"])
    helpers.assert_state(self.store.arrays("a", session=second), taken)
    self.store.restore("a", session=second)
    helpers.assert_state(self.model.values(second), taken)
    # A local session has its own variables: refused, naming the cluster.
    local = self._session()
    with helpers.assert_raises_naming(
      self,
      snapstore.SessionMismatchError,
      r"held by the cluster at %s" % server.target,
    ):
      self.store.restore("a", session=local)

  def test_a_restarted_task_lost_the_snapshot(self):
    with cluster_lib.LoopbackCluster({"ps": 1, "worker": 1}) as cluster:
      self.graph = tf.Graph()
      with self.graph.as_default():
        with tf.device("/job:ps/task:0"):
          self.model = helpers.Model(dtypes=(tf.float32,))
        self.store = snapstore.SnapshotStore(scope="net", mode="device")
      target = cluster.target("worker", 0)
      first = self._session(target)
      self.model.randomize(first, seed=1)
      self.store.snapshot("a", session=first)
      first.close()
      cluster.restart(
        "ps", 0
      )  # its variables, the shadows among them, are gone
      second = self._session(target)  # initializes everything afresh
      live = self.model.randomize(second, seed=2)
      with helpers.assert_raises_naming(
        self,
        snapstore.SessionMismatchError,
        r"Snapshot 'a' was held on the cluster at %s, whose tasks have "
        r"restarted since" % target,
        r"the store dropped it",
      ):
        self.store.restore("a", session=second)
      helpers.assert_state(self.model.values(second), live)
      self.assertEqual(self.store.tags(), [])
      second.close()


if __name__ == "__main__":
  tf.test.main()
