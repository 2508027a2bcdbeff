"""Where the parts meet: spill tiers with rewiring, pinned slots and ensembles of tiers."""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


class SpillTierWithDeviceFeaturesTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        self.w = tf.get_variable("w", [3, 2])
      self.y = tf.matmul(self.x, self.w)
      self.store = snapstore.SnapshotStore(
        scope="net",
        mode="device",
        max_to_keep=2,
        spill_path=os.path.join(self.get_temp_dir(), "s.h5"),
      )
      self.y_past = [self.store.slots.past(self.y, slot=k) for k in range(2)]
    self.sess = tf.Session(graph=graph)
    self.addCleanup(self.sess.close)
    self.addCleanup(self.store.close)
    helpers.init(self.sess)
    self.feed = {self.x: np.arange(6, dtype=np.float32).reshape(2, 3)}

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_evaluate_with_a_spilled_snapshot_falls_back_to_the_swap(
    self, use_resource
  ):
    self._setup(use_resource)
    self.w.load(np.ones([3, 2], np.float32), self.sess)
    expected = self.sess.run(self.y, self.feed)
    self.store.snapshot("old", session=self.sess)
    self.store.files.spill("old", session=self.sess)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier("old"), "file")
    self.w.load(np.full([3, 2], 7, np.float32), self.sess)
    current = self.sess.run(self.w)
    past = self.store.evaluate_with(
      self.y, self.feed, tag="old", session=self.sess
    )
    helpers.assert_bit_equal(past, expected)
    helpers.assert_bit_equal(self.sess.run(self.w), current)
    # A snapshot in a slot still uses the rewired tensors: one run that
    # reads the slot, where the swap takes four (set the variables aside,
    # load the snapshot, run, put them back) and gives the same values.
    in_slot = np.full([3, 2], 3, np.float32)
    self.w.load(in_slot, self.sess)
    self.store.snapshot("slot", session=self.sess)
    self.assertEqual(self.store.files.tier("slot"), "device")
    self.w.load(current, self.sess)
    counting = helpers.CountingSession(self.sess)
    past = self.store.evaluate_with(
      self.y, self.feed, tag="slot", session=counting
    )
    helpers.assert_bit_equal(past, self.feed[self.x].dot(in_slot))
    helpers.assert_bit_equal(self.sess.run(self.w), current)
    self.assertEqual(
      counting.runs,
      1,
      "evaluate_with swapped the slot's snapshot in (%d runs) instead of "
      "running the rewired tensors" % counting.runs,
    )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_pinned_slot_on_a_spilling_store(self, use_resource):
    self._setup(use_resource)
    self.store.slots.pin(0, "target")
    self.assertEqual(self.store.slots.pinned(), ["target"])
    self.sess.run(self.store.slots.snapshot_op(0))
    helpers.assert_bit_equal(
      self.store.evaluate_with(
        self.y, self.feed, tag="target", session=self.sess
      ),
      self.sess.run(self.y, self.feed),
    )
    with self.assertRaisesRegex(
      snapstore.PinnedTagError, r"'target' is pinned to device slot 0"
    ):
      self.store.files.spill("target", session=self.sess)
    self.assertEqual(self.store.files.tier("target"), "device")


if __name__ == "__main__":
  tf.test.main()
