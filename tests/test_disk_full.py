"""A disk that fills up and stays full: nothing is lost, the file stays valid.

Two ways: a real 2 MiB tmpfs (mounting needs root; where it is not allowed
the test is skipped and says why), and fault injection that makes every write
of the spill file fail with ENOSPC, so the path where the rollback of a failed
write cannot write either is always tested. In both, the store reports a
`SpillError` naming "no space left" and the file, keeps the snapshots in host
memory (saying how far over the budget), stays usable, refuses to close
rather than drop them, and writes them bit-exact once space is freed.
"""

import errno
import os
import shutil
import subprocess
import tempfile

import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from snapstore.spill import journal
from tests import helpers

_SHAPE = [32, 1024]  # 128 KiB of float32 per snapshot


class _FullDiskCase(tf.test.TestCase):
  def _setup(self, path):
    self.path = path
    self.graph = tf.Graph()
    with self.graph.as_default():
      with tf.variable_scope("net"):
        self.w = tf.get_variable("w", _SHAPE, tf.float32)
        self.n = tf.get_variable("n", [3], tf.int64)
      self.store = snapstore.SnapshotStore(
        scope="net", mode="disk", spill_path=path, memory_budget=0
      )
    self.addCleanup(_close_quietly, self.store)
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.states = {}

  def _state(self, seed):
    rng = np.random.RandomState(seed)
    return {
      "w": helpers.random_value(rng, _SHAPE, np.float32),
      "n": helpers.random_value(rng, [3], np.int64),
    }

  def _take(self, tag):
    """Snapshots state `tag`; returns the SpillErrors raised on the way."""
    state = self._state(tag)
    self.w.load(state["w"], self.sess)
    self.n.load(state["n"], self.sess)
    raised = []
    while True:  # an error of an earlier write is reported once, then it works
      try:
        self.store.snapshot(tag, session=self.sess)
        break
      except snapstore.SpillError as e:
        raised.append(str(e))
        self.assertLess(len(raised), 3, raised)
    self.states[tag] = state
    self.store._h.mode._writer.flush()  # pylint: disable=protected-access
    return raised

  def _assert_restores(self, tags):
    for tag in tags:
      self.store.restore(tag, session=self.sess)
      helpers.assert_state(
        dict(zip(("w", "n"), self.sess.run([self.w, self.n]))),
        self.states[tag],
        "snapshot %r" % (tag,),
      )

  def _assert_file_holds(self, path, tags, incomplete=()):
    with snapstore.open_spill(path) as f:
      self.assertEqual([e.tag for e in f.entries()], tags)
      # A write cut short by the full disk may stay listed incomplete (never
      # read) until the next write of its tag or the next store over the file.
      self.assertLessEqual(set(f.incomplete()), set(incomplete))
      self.assertEqual(f.damaged(), [])
      for tag in tags:
        helpers.assert_state(f.read(tag), self.states[tag], "file %r" % (tag,))

  def _assert_full_then_freed(self, free, fill_tags):
    """Snapshots `fill_tags` on a disk that fills; then `free()` and checks."""
    before = self.store.tags()
    messages = []
    for tag in fill_tags:
      messages.extend(self._take(tag))
    self.assertTrue(messages, "the disk never filled; the test proves nothing")
    with self.assertRaises(snapstore.SpillError) as caught:
      self.store.files.flush()  # every write tried again, and reported
    messages.append(str(caught.exception))
    for message in messages:
      self.assertRegex(message, r"no space left")
      self.assertIn(self.path, message)
      self.assertRegex(
        message,
        r"kept in host memory \(host memory now holds "
        r"\d+ bytes of snapshots, \d+ over memory_budget=0\)",
      )
    every = before + fill_tags
    self.assertEqual(self.store.tags(), every)
    in_memory = [t for t in every if self.store.files.tier(t) == "host"]
    self.assertTrue(in_memory)
    self._assert_restores(every)  # every tier, still usable
    with helpers.assert_raises_naming(
      self,
      snapstore.SpillError,
      r"no space left",
      r"stays open",
      r"nothing is dropped",
    ):
      self.store.close()
    self.assertEqual(self.store.tags(), every)
    self._assert_restores(in_memory)
    # The file is valid meanwhile: a copy (with any journal) reads as of its
    # last commit, the snapshots written before the disk filled.
    copy = os.path.join(
      self.get_temp_dir(), "copy_%s.h5" % self._testMethodName
    )
    for suffix in ("", "-journal"):
      if os.path.exists(self.path + suffix):
        shutil.copy(self.path + suffix, copy + suffix)
    self._assert_file_holds(
      copy, [t for t in every if t not in in_memory], incomplete=in_memory
    )
    free()
    self._take(len(every))  # writing resumes
    self.store.close()
    self.assertFalse(os.path.exists(journal.journal_path(self.path)))
    self._assert_file_holds(self.path, every + [len(every)])


class FaultInjectionTest(_FullDiskCase):
  """Every write of the spill file fails with ENOSPC, journal writes included."""

  def _fail_every_write(self):
    failing = [True]

    class FullDisk(object):
      def __getattr__(self, name):
        return getattr(os, name)

      def pwrite(self, fd, data, offset):
        if failing[0]:
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.pwrite(fd, data, offset)

      def write(self, fd, data):
        if failing[0]:
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    journal.os = FullDisk()
    self.addCleanup(setattr, journal, "os", os)
    return lambda: failing.__setitem__(0, False)

  def test_disk_that_stays_full(self):
    self._setup(os.path.join(self.get_temp_dir(), "spill.h5"))
    self._take(0)
    self._take(1)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier(1), "file")
    free = self._fail_every_write()
    self._assert_full_then_freed(free, [2, 3, 4])

  def test_failed_rollback_write_does_not_recurse(self):
    # The data write fails after the snapshot's first commit; removing the
    # incomplete snapshot needs a journal write, which fails too.
    self._setup(os.path.join(self.get_temp_dir(), "spill.h5"))
    real = spill_file.SpillFile._write_dataset  # pylint: disable=protected-access
    free = [None]

    def data_fails(f, ds, array):
      free[0] = free[0] or self._fail_every_write()
      return real(f, ds, array)

    spill_file.SpillFile._write_dataset = data_fails  # pylint: disable=protected-access
    self.addCleanup(setattr, spill_file.SpillFile, "_write_dataset", real)

    def free_space():
      spill_file.SpillFile._write_dataset = real  # pylint: disable=protected-access
      free[0]()

    self._assert_full_then_freed(free_space, [0, 1, 2])


class RealFullDiskTest(_FullDiskCase):
  """A 2 MiB tmpfs that fills up (skipped, saying why, where mounting fails)."""

  def setUp(self):
    super(RealFullDiskTest, self).setUp()
    self.mount = tempfile.mkdtemp(prefix="snapstore_tmpfs_")
    self.addCleanup(os.rmdir, self.mount)
    try:
      subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", self.mount],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=30,
      )
    except (OSError, subprocess.SubprocessError) as e:
      detail = getattr(e, "stderr", None)
      self.skipTest(
        "cannot mount a 2 MiB tmpfs here (needs root), so the real "
        "full-disk test is skipped; the fault-injection test still "
        "runs: %s" % (detail.decode().strip() if detail else e)
      )
    self.addCleanup(subprocess.run, ["umount", self.mount], check=True)

  def test_disk_that_stays_full(self):
    filler = os.path.join(self.mount, "filler")
    with open(filler, "wb") as f:
      f.write(b"\0" * (1200 << 10))  # leaves room for about six snapshots
    self._setup(os.path.join(self.mount, "spill.h5"))
    self._assert_full_then_freed(lambda: os.remove(filler), list(range(9)))


def _close_quietly(store):
  try:
    store.close()
  except snapstore.Error:
    pass
  finally:
    # A store that could not write keeps its file open; release it so that
    # the tmpfs can be unmounted.
    store._h.mode._release()  # pylint: disable=protected-access


if __name__ == "__main__":
  tf.test.main()
