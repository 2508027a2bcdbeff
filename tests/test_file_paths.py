"""Paths a store writes or reads: its own spill file is never overwritten, bad paths get plain errors."""

import os

import snapstore
from snapstore._tf import tf
from tests import helpers


class FilePathsTest(tf.test.TestCase):
  def setUp(self):
    super(FilePathsTest, self).setUp()
    self.dir = self.get_temp_dir()
    self.spill = os.path.join(self.dir, "live.h5")
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = helpers.Model(dtypes=(tf.float32,))
      self.store = snapstore.SnapshotStore(
        scope="net", mode="disk", spill_path=self.spill, memory_budget=0
      )
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.state = self.model.randomize(self.sess, 0)
    self.store.snapshot(0, session=self.sess)
    self.store.files.flush()

  def _disk_store(self, spill_path):
    with self.graph.as_default():
      return snapstore.SnapshotStore(
        scope="net",
        mode="disk",
        name="other",
        spill_path=spill_path,
        memory_budget=0,
      )

  def test_save_npz_refuses_the_live_spill_file(self):
    with helpers.assert_raises_naming(
      self,
      snapstore.SnapshotFileError,
      r"Refusing to write an \.npz archive over .*live\.h5: it is an HDF5 "
      r"file",
      r"Choose another path",
    ):
      self.store.files.save_npz(self.spill)
    later = self.model.randomize(self.sess, 1)
    self.store.snapshot(1, session=self.sess)  # the store still writes its file
    self.store.close()
    with snapstore.open_spill(self.spill) as f:
      helpers.assert_state(f.read(0), self.state)
      helpers.assert_state(f.read(1), later)

  def test_save_npz_refuses_a_symlink(self):
    target = os.path.join(self.dir, "target.npz")
    self.store.files.save_npz(target)
    link = os.path.join(self.dir, "link.npz")
    os.symlink(target, link)
    with helpers.assert_raises_naming(
      self,
      snapstore.SnapshotFileError,
      r"link\.npz: it is a symbolic link",
      r"Write to the file it names \(.*target\.npz\)",
    ):
      self.store.files.save_npz(link)
    self.assertTrue(os.path.islink(link))

  def test_save_npz_refuses_a_special_file(self):
    # A named pipe of our own: a system node such as /dev/null must never be
    # what a test (run on code that still replaced it) writes to.
    fifo = os.path.join(self.dir, "pipe.npz")
    os.mkfifo(fifo)
    with helpers.assert_raises_naming(
      self,
      snapstore.SnapshotFileError,
      r"pipe\.npz: it is not a regular file",
      r"Choose another path",
    ):
      self.store.files.save_npz(fifo)
    self.assertFalse(os.path.isfile(fifo))

  def test_save_npz_none(self):
    with helpers.assert_raises_naming(
      self,
      TypeError,
      r"The \.npz path must be a string or os\.PathLike, got None",
    ):
      self.store.files.save_npz(None)

  def test_save_npz_directory(self):
    with helpers.assert_raises_naming(
      self, ValueError, r"The \.npz path .* is a directory; name a file"
    ):
      self.store.files.save_npz(self.dir)

  def test_load_npz_directory(self):
    with helpers.assert_raises_naming(
      self, ValueError, r"The \.npz path .* is a directory; name a file"
    ):
      self.store.files.load_npz(self.dir)

  def test_empty_spill_path(self):
    with helpers.assert_raises_naming(
      self, ValueError, r"spill_path must not be empty"
    ):
      self._disk_store("")

  def test_directory_as_spill_path(self):
    with helpers.assert_raises_naming(
      self, ValueError, r"spill_path .* is a directory; name a file"
    ):
      self._disk_store(self.dir)

  def test_open_spill_directory(self):
    with helpers.assert_raises_naming(
      self, ValueError, r"A spill file path .* is a directory; name a file"
    ):
      snapstore.open_spill(self.dir)


if __name__ == "__main__":
  tf.test.main()
