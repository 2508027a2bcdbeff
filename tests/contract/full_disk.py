"""A disk that fills up and stays full: nothing is lost, the file stays valid.

Three ways for a disk-mode store's writes to fail: a real 2 MiB tmpfs that
fills up (ENOSPC; mounting needs root, and where it is not allowed the test
is skipped and says why), a file-size limit (`RLIMIT_FSIZE`, EFBIG, which
any user can set), and fault injection that makes every write of the spill
file fail with ENOSPC, so that the path where the rollback of a failed write
cannot write either is always tested. In each, the store reports a
`SpillError` naming the cause, the file, and every snapshot that was not
written; keeps those snapshots in host memory (saying how far over the
budget); stays usable; refuses to close rather than drop them; and writes
them bit-exact once the space is there.
"""

import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile

import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from snapstore.spill import journal
from tests import helpers
from tests.contract import worlds

_SHAPES = {"w": ([32, 1024], np.float32), "n": ([3], np.int64)}  # 128 KiB
_NO_SPACE = r"no space left"
_TOO_LARGE = r"File too large"


def _named(message):
  """The tags a SpillError's message says were not written."""
  tags = []
  for listed in re.findall(
    r"writing snapshot ([^(]+) failed|snapshot\(s\) ([^(]+) are not written",
    message,
  ):
    for tag in ", ".join(t for t in listed if t).split(", "):
      tags.append(int(tag))
  return tags


class _FullDiskCase(tf.test.TestCase):
  def _setup(self, path):
    self.path = path
    self.world = worlds.World(_SHAPES, "disk", spill_path=path, memory_budget=0)
    self.store = self.world.store
    self.addCleanup(_close_quietly, self.world)
    self.states = {}

  def _take(self, tag):
    """Snapshots state `tag`; returns the SpillErrors raised on the way."""
    state = worlds.values(_SHAPES, tag)
    self.world.write(state)
    raised = []
    while True:  # an error of an earlier write is reported once, then it works
      try:
        self.world.snapshot(tag)
        break
      except snapstore.SpillError as e:
        raised.append(str(e))
        self.assertLess(len(raised), 3, raised)
    self.states[tag] = state
    self.store._h.mode._writer.flush()  # pylint: disable=protected-access
    return raised

  def _assert_restores(self, tags):
    for tag in tags:
      self.world.restore(tag)
      helpers.assert_state(
        self.world.read(), self.states[tag], "snapshot %r" % (tag,)
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

  def _assert_full_then_freed(self, free, fill_tags, cause=_NO_SPACE):
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
      self.assertRegex(message, cause)
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
      cause,
      r"stays open",
      r"nothing is dropped",
    ) as refused:
      self.store.close()
    messages.append(str(refused.exception))
    # Every snapshot not written was named, and only snapshots taken on the
    # full disk were.
    named = set(t for m in messages for t in _named(m))
    self.assertLessEqual(set(in_memory), named, messages)
    self.assertLessEqual(named, set(fill_tags), messages)
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


class FileSizeLimitTest(_FullDiskCase):
  """A file-size limit (`ulimit -f`) that the spill file reaches: EFBIG."""

  def _limit(self):
    """Snapshot 0 in the file, then a limit that fits about five more.

    From here a write past 800 KiB into any file of this process fails with
    EFBIG (the signal ignored, so that the write returns the error instead of
    killing the process). Returns the function that lifts the limit.
    """
    self._setup(os.path.join(self.get_temp_dir(), "spill.h5"))
    self._take(0)
    self.store.files.flush()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    self.addCleanup(signal.signal, signal.SIGXFSZ, handler)
    resource.setrlimit(resource.RLIMIT_FSIZE, (800 << 10, hard))
    limited = [True]

    def lift():
      if limited[0]:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        limited[0] = False

    self.addCleanup(lift)
    return lift

  def test_file_that_cannot_grow(self):
    lift = self._limit()
    self._assert_full_then_freed(lift, list(range(1, 9)), cause=_TOO_LARGE)

  def test_the_error_says_how_to_make_room(self):
    self._limit()
    messages = []
    for tag in range(1, 9):
      messages.extend(self._take(tag))
    self.assertTrue(messages, "the file never reached the limit")
    for message in messages:
      self.assertRegex(message, _TOO_LARGE)
      self.assertRegex(
        message,
        r"raise the file-size limit \(ulimit -f\) or use a file system "
        r"that allows larger files",
      )

  def test_a_flush_that_hides_the_failed_write(self):
    # HDF5 can meet the failed write in a flush and say only that the flush
    # failed; the store names the write's own error (EFBIG) all the same.
    self._setup(os.path.join(self.get_temp_dir(), "spill.h5"))
    self._take(0)
    self.store.files.flush()
    real = spill_file.SpillFile._write_dataset  # pylint: disable=protected-access

    class TooLarge(object):
      def __getattr__(self, name):
        return getattr(os, name)

      def pwrite(self, fd, data, offset):
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    def hides(f, ds, array):
      journal.os = TooLarge()
      try:
        real(f, ds, array)
      except OSError:
        raise RuntimeError(
          "Unable to synchronously flush file (unable to flush file data)"
        )
      finally:
        journal.os = os
      return 0

    spill_file.SpillFile._write_dataset = hides  # pylint: disable=protected-access
    self.addCleanup(setattr, spill_file.SpillFile, "_write_dataset", real)
    self.addCleanup(setattr, journal, "os", os)
    messages = self._take(1)
    spill_file.SpillFile._write_dataset = real  # pylint: disable=protected-access
    messages += self._take(2)
    self.assertTrue(messages, "no write failed")
    self.assertRegex(messages[0], _TOO_LARGE)
    self.assertRegex(messages[0], r"raise the file-size limit \(ulimit -f\)")


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
        "full-disk test is skipped; the fault-injection and file-size "
        "tests still run: %s" % (detail.decode().strip() if detail else e)
      )
    self.addCleanup(subprocess.run, ["umount", self.mount], check=True)

  def test_disk_that_stays_full(self):
    filler = os.path.join(self.mount, "filler")
    with open(filler, "wb") as f:
      f.write(b"\0" * (1200 << 10))  # leaves room for about six snapshots
    self._setup(os.path.join(self.mount, "spill.h5"))
    self._assert_full_then_freed(lambda: os.remove(filler), list(range(9)))


def _close_quietly(world):
  try:
    world.close()
  except snapstore.Error:
    pass
  finally:
    # A store that could not write keeps its file open; release it so that
    # the tmpfs can be unmounted.
    world.store._h.mode._release()  # pylint: disable=protected-access
