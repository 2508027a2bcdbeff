"""Failures inside TensorFlow: nothing half-done is left unreported or lost.

Faults are injected with a session wrapper that raises a TF error for chosen
runs; the store treats it like any session (it has `run` and `graph`).
"""

from absl.testing import parameterized

import snapstore
from snapstore._tf import tf
from tests import helpers


class FlakySession(object):
  """Runs through `sess`; a run fails while `should_fail(fetches)` is true."""

  def __init__(self, sess):
    self._sess = sess
    self.graph = sess.graph
    self.should_fail = lambda fetches: False

  def run(self, fetches, feed_dict=None):
    if self.should_fail(fetches):
      raise tf.errors.UnavailableError(None, None, "injected fault")
    return self._sess.run(fetches, feed_dict=feed_dict)


def fetching(*names):
  """A predicate: the run fetches an op or tensor with one of `names`."""

  def predicate(fetches):
    flat = fetches if isinstance(fetches, (list, tuple)) else [fetches]
    return any(getattr(f, "name", None) in names for f in flat)

  return predicate


def nth(predicate, n):
  """A predicate true only for the n-th run (1-based) matching `predicate`."""
  seen = [0]

  def counted(fetches):
    if predicate(fetches):
      seen[0] += 1
      return seen[0] == n
    return False

  return counted


class FaultTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode, use_resource, max_to_keep=2):
    graph = tf.Graph()
    with graph.as_default():
      self.model = helpers.Model(
        use_resource=use_resource, dtypes=(tf.float32,)
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep
      )
    self.w = self.model.variables["v0_float32"]
    self.sess = tf.Session(graph=graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.flaky = FlakySession(self.sess)

  def _op(self, name):
    return "%s/%s" % (self.store.name, name)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_failed_put_back_is_kept_and_recovered(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.model.randomize(self.sess, seed=1)
    past = self.sess.run(self.w)
    self.store.snapshot(session=self.sess)
    self.model.randomize(self.sess, seed=2)
    current = self.sess.run(self.w)
    if mode == "device":
      put_back = fetching(self._op("unstash"))
    else:  # host loads the past and puts back with one op: fail the second run
      put_back = nth(fetching(self._op("restore")), 2)
    self.flaky.should_fail = put_back
    with helpers.assert_raises_naming(
      self,
      snapstore.RestoreError,
      r"could not write the current parameters back: injected fault",
      r"recover\(\)",
    ):
      self.store.evaluate_with(self.w, session=self.flaky)
    helpers.assert_bit_equal(self.sess.run(self.w), past)  # the past is loaded
    self.flaky.should_fail = lambda fetches: True
    with helpers.assert_raises_naming(
      self,
      snapstore.RestoreError,
      r"still not written back: injected fault",
      r"recover\(\)",
    ):
      self.store.recover(session=self.flaky)
    self.flaky.should_fail = lambda fetches: False
    # The next call writes the current values back first, then does its job.
    tag = self.store.snapshot(session=self.flaky)
    helpers.assert_bit_equal(self.sess.run(self.w), current)
    self.sess.run(self.model.train_op)
    self.store.restore(tag, session=self.sess)
    helpers.assert_bit_equal(self.sess.run(self.w), current)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_failed_set_aside_changes_nothing(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.store.snapshot(session=self.sess)
    self.model.randomize(self.sess, seed=2)
    current = self.sess.run(self.w)
    stash = self._op("stash") if mode == "device" else None
    self.flaky.should_fail = (
      fetching(stash)
      if stash
      else nth(lambda fetches: isinstance(fetches, list), 1)
    )
    with self.assertRaisesRegex(
      snapstore.SnapshotError, r"could not set the current parameters aside"
    ):
      self.store.evaluate_with(self.w, session=self.flaky)
    helpers.assert_bit_equal(self.sess.run(self.w), current)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_failed_device_snapshot_drops_overwritten_slot(self, use_resource):
    self._setup("device", use_resource, max_to_keep=2)
    self.store.snapshot("a", session=self.sess)
    self.store.snapshot("b", session=self.sess)
    live = self.sess.run(self.w)
    # Full: the next snapshot reuses the slot of "a", the oldest.
    self.flaky.should_fail = fetching(
      self.store.slots.snapshot_op(self.store.slots.slot_of("a")).name
    )
    with helpers.assert_raises_naming(
      self,
      snapstore.SnapshotError,
      r"Taking snapshot 0 failed: injected fault",
      r"'a' were being overwritten and are dropped",
    ):
      self.store.snapshot(session=self.flaky)
    self.assertEqual(self.store.tags(), ["b"])
    helpers.assert_bit_equal(self.sess.run(self.w), live)
    self.flaky.should_fail = lambda fetches: False
    self.assertEqual(self.store.snapshot(session=self.flaky), 0)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_failed_host_snapshot_keeps_everything(self, use_resource):
    self._setup("host", use_resource, max_to_keep=1)
    self.model.randomize(self.sess, seed=3)
    kept = self.sess.run(self.w)
    self.store.snapshot("a", session=self.sess)
    self.model.randomize(self.sess, seed=4)
    self.flaky.should_fail = lambda fetches: isinstance(
      fetches, list
    )  # the reads
    with helpers.assert_raises_naming(
      self,
      snapstore.SnapshotError,
      r"Taking snapshot 0 failed: injected fault",
      r"variables are unchanged",
    ) as caught:
      self.store.snapshot(session=self.flaky)
    self.assertNotIn(
      "overwritten", str(caught.exception)
    )  # no snapshot was dropped
    self.assertEqual(self.store.tags(), ["a"])  # not evicted for nothing
    self.store.restore("a", session=self.sess)
    helpers.assert_bit_equal(self.sess.run(self.w), kept)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_failed_restore_says_snapshot_is_intact(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.model.randomize(self.sess, seed=5)
    saved = self.sess.run(self.w)
    self.store.snapshot("s", session=self.sess)
    self.sess.run(self.model.train_op)
    restore = (
      self.store.slots.restore_op(self.store.slots.slot_of("s")).name
      if mode == "device"
      else self._op("restore")
    )
    self.flaky.should_fail = fetching(restore)
    with helpers.assert_raises_naming(
      self,
      snapstore.RestoreError,
      r"Restoring snapshot 's' failed: injected fault",
      r"snapshot is intact",
      r"restore\('s'\) again",
    ):
      self.store.restore("s", session=self.flaky)
    self.flaky.should_fail = lambda fetches: False
    self.store.restore("s", session=self.flaky)
    helpers.assert_bit_equal(self.sess.run(self.w), saved)


if __name__ == "__main__":
  tf.test.main()
