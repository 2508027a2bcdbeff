"""Snapshots of another run's spill file, loaded like checkpoints and .npz files."""

import os

from absl.testing import parameterized
import h5py
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


def _linear(scope, use_resource, w_value=None):
  """y = x + w under `scope`, in the default graph."""
  x = tf.placeholder(tf.float32, [None])
  with tf.variable_scope(scope, use_resource=use_resource):
    w = tf.get_variable(
      "w", [], initializer=tf.constant_initializer(w_value or 0.0)
    )
  return x, w, x + w


class _SpillCase(tf.test.TestCase, parameterized.TestCase):
  def _write_run(self, path, values, scope="run1"):
    """A disk-mode store under `scope` spilling one snapshot per w in `values`."""
    graph = tf.Graph()
    with graph.as_default():
      _, w, _ = _linear(scope, False)
      store = snapstore.SnapshotStore(
        scope=scope, mode="disk", spill_path=path, memory_budget=0
      )
    with tf.Session(graph=graph) as sess, store:
      helpers.init(sess)
      for i, value in enumerate(values):
        w.load(value, sess)
        store.snapshot("w%d" % i, session=sess)
      store.files.flush()

  def _store(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x, w, y = _linear("net", use_resource, w_value=-5.0)
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=3)
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    helpers.init(sess)
    return store, sess, x, w, y


class LoadSpillTest(_SpillCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_loads_bit_exact_under_another_scope(self, mode, use_resource):
    path = os.path.join(self.get_temp_dir(), "run1.h5")
    values = np.array([1.5, -0.0, np.nan], np.float32)
    self._write_run(path, values)
    store, sess, _, w, _ = self._store(mode, use_resource)
    for i, value in enumerate(values):
      self.assertEqual(
        store.files.load_spill(path, "w%d" % i, tag=i, session=sess), i
      )
    self.assertEqual(sess.run(w), -5.0)  # loading changes no variable
    for i, value in enumerate(values):
      store.restore(i, session=sess)
      helpers.assert_bit_equal(sess.run(w), value)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_ensemble_of_a_checkpoint_an_npz_and_a_spilled_snapshot(
    self, use_resource
  ):
    directory = self.get_temp_dir()
    spill_path = os.path.join(directory, "run.h5")
    self._write_run(spill_path, [3.0])
    npz_path = os.path.join(directory, "w2.npz")
    np.savez(npz_path, w=np.float32(2.0))
    graph = tf.Graph()
    with graph.as_default():
      _, w, _ = _linear("other", use_resource, w_value=1.0)
      with tf.Session() as sess:
        helpers.init(sess)
        ckpt = tf.train.Saver().save(sess, os.path.join(directory, "ckpt"))
    for mode in ("device", "host"):
      store, sess, x, w, y = self._store(mode, use_resource)
      with store.graph.as_default():
        ensemble = snapstore.Ensemble(store, y, tags=["ckpt", "npz", "spill"])
      store.files.load_checkpoint(
        ckpt, tag="ckpt", strip_prefix="other", session=sess
      )
      store.files.load_npz(npz_path, tag="npz", session=sess)
      store.files.load_spill(spill_path, "w0", tag="spill", session=sess)
      result = ensemble.evaluate(
        {x: np.array([10.0], np.float32)}, session=sess
      )
      self.assertEqual(
        [float(v[0]) for v in result.members.values()], [11.0, 12.0, 13.0]
      )
      self.assertEqual(float(result.combined[0]), 12.0)
      self.assertEqual(sess.run(w), -5.0, mode)


class LoadSpillErrorsTest(_SpillCase):
  def setUp(self):
    super(LoadSpillErrorsTest, self).setUp()
    self.path = os.path.join(self.get_temp_dir(), "run1.h5")
    self._write_run(self.path, [1.0, 2.0])
    self.store, self.sess, _, self.w, _ = self._store("device", False)
    self.store.snapshot("mine", session=self.sess)

  def assertUnchanged(self):
    self.assertEqual(self.sess.run(self.w), -5.0)
    self.assertEqual(self.store.tags(), ["mine"])

  def test_unknown_snapshot_lists_the_file_s_tags(self):
    with self.assertRaisesRegex(snapstore.UnknownTagError, r"'w9'.*'w0', 'w1'"):
      self.store.files.load_spill(self.path, "w9", session=self.sess)
    self.assertUnchanged()

  def test_incompatible_variables_are_named(self):
    with helpers.assert_raises_naming(
      self,
      snapstore.IncompatibleSnapshotError,
      r"Snapshot 'w0' in \S*run1\.h5",
      r"missing variables: w\b",
      r"variables the store does not have: x\b",
    ):
      self.store.files.load_spill(
        self.path, "w0", mapping=lambda name: "x", session=self.sess
      )
    self.assertUnchanged()

  def test_corrupt_data_names_the_variable(self):
    with h5py.File(self.path, "r") as f:
      group = [g for name, g in f["snapshots"].items() if name.endswith("w1")][
        0
      ]
      offset = [ds for ds in group.values()][0].id.get_offset()
    with open(self.path, "r+b") as f:
      f.seek(offset)
      byte = f.read(1)
      f.seek(offset)
      f.write(bytes([byte[0] ^ 0xFF]))
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError,
      r"checksum mismatch in variable 'w' of snapshot 'w1'",
    ):
      self.store.files.load_spill(self.path, "w1", session=self.sess)
    self.assertUnchanged()
    self.store.files.load_spill(
      self.path, "w0", tag="good", session=self.sess
    )  # still usable

  def test_not_a_spill_file(self):
    npz_path = os.path.join(self.get_temp_dir(), "x.npz")
    np.savez(npz_path, w=np.float32(1))
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"x\.npz is not an HDF5 file"
    ):
      self.store.files.load_spill(npz_path, "w0", session=self.sess)
    self.assertUnchanged()


if __name__ == "__main__":
  tf.test.main()
