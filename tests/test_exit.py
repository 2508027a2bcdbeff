"""Interpreter exit when the spill file cannot be written: a clean exit.

A child process fills its spill files' disk (a file-size limit, `ulimit -f`,
makes every write past the files' end fail with EFBIG, as a full disk makes
them fail with ENOSPC) and ends without `close()`. It used to die with SIGSEGV
after the at-exit close failed: the file stayed open in HDF5, whose own exit
handler then closed it through h5py's Python file driver after Python had shut
down. Now the exit is the program's own, stderr names the snapshots that could
not be written and are lost with the process, and the file holds every
snapshot committed before, bit for bit. Each child runs a disk store and a
device and a host store with `spill_path=` side by side, and one of: exit with
snapshots in memory, exit while the writer is inside a write that fails, exit
on a full disk (ENOSPC, fault injection) after a delete failed too, and a
store dropped and garbage-collected after a write failed.
"""

import errno
import os
import re
import subprocess
import sys
import textwrap
import time

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import journal
from tests import helpers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODES = ("disk", "host", "device")
_SHAPE = [16, 16]  # small: the test is about the exit, not the data

_CHILD = textwrap.dedent("""
    import gc
    import os
    import resource
    import signal
    import sys
    import time
    import weakref
    sys.path.insert(0, %(root)r)
    import snapstore
    from snapstore.spill import file as spill_file
    from snapstore._tf import tf
    tf.disable_v2_behavior()
    from tests import test_exit

    variant, directory = sys.argv[1], sys.argv[2]
    graph = tf.Graph()
    with graph.as_default():
      w = tf.get_variable("w", test_exit._SHAPE, tf.float32)
      stores = dict(
          (mode, snapstore.SnapshotStore(
              var_list=[w], mode=mode, name=mode,
              spill_path=os.path.join(directory, mode + ".h5"),
              **({"memory_budget": 1 << 20} if mode == "disk"
                 else {"max_to_keep": 4})))
          for mode in test_exit._MODES)
    sess = tf.Session(graph=graph)
    sess.run(w.initializer)

    def take(store, tag):
      w.load(test_exit.value(tag), sess)
      store.snapshot(tag, session=sess)

    for store in stores.values():
      for tag in (0, 1):
        take(store, tag)
        store.files.spill(tag, session=sess)
      store.files.flush()  # 0 and 1 are committed
    if variant != "full_disk":
      # From here every write past the files' end fails with EFBIG (the signal
      # ignored, so that the write returns the error instead of killing us).
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      limit = min(os.path.getsize(s._h.mode._file.path) for s in stores.values())
      resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    if variant == "in_memory":
      for store in stores.values():
        take(store, 2)
        take(store, 3)
        # 2 goes to the file; a disk store's 3 waits in memory for close().
        store.files.spill(2, session=sess)
      print("exiting", flush=True)
      sys.exit(3)  # the program's own status, kept

    if variant == "full_disk":
      # Every write fails with ENOSPC instead (as in test_disk_full), and a
      # delete fails too; the jobs are slowed so that no call of ours sees
      # their failure before the exit does.
      test_exit.fail_every_write()
      for name in ("write", "delete"):
        setattr(spill_file.SpillFile, name,
                test_exit.slowed(getattr(spill_file.SpillFile, name)))
      for store in stores.values():
        take(store, 2)
        take(store, 3)
        store.delete(0)
        store.files.spill(2, session=sess)
      print("exiting", flush=True)

    if variant == "mid_write":
      started = set()
      write = spill_file.SpillFile.write
      def slow_write(f, *args, **kwargs):  # exit comes inside the write
        started.add(f.path)
        time.sleep(0.3)
        return write(f, *args, **kwargs)
      spill_file.SpillFile.write = slow_write
      for store in stores.values():
        take(store, 2)
        store.files.spill(2, session=sess)
      deadline = time.time() + 30
      while len(started) < len(stores) and time.time() < deadline:
        time.sleep(0.01)
      print("exiting with %%d writes running" %% len(started), flush=True)

    if variant == "dropped":
      for store in stores.values():
        take(store, 2)
        store.files.spill(2, session=sess)
      deadline = time.time() + 30
      writers = [s._h.mode._writer for s in stores.values()]
      while any(w.pending for w in writers) and time.time() < deadline:
        time.sleep(0.01)
      # The failures wait in the writers, not collected by any call of ours.
      print("failed writes waiting: %%d" %% sum(
          e is not None for w in writers for _, e in w._done), flush=True)
      modes = [weakref.ref(s._h.mode) for s in stores.values()]
      del store, writers
      stores.clear()
      gc.collect()
      print("collected %%d of %%d" %% (sum(m() is None for m in modes),
                                      len(modes)), flush=True)
""")


# (cause, hint) in the message, per way of filling the disk.
_EFBIG = (
  r"[^\n]*File too large[^\n]*",
  r"raise the file-size limit \(ulimit -f\) or use a file system that "
  r"allows larger files, or ",
)
_ENOSPC = (
  r"no space left on the device: OSError: [^\n]*",
  r"free space on that disk, or ",
)


def value(tag):
  return helpers.random_value(np.random.RandomState(tag), _SHAPE, np.float32)


def fail_every_write():
  """Makes every write of a spill file or its journal fail with ENOSPC."""

  class FullDisk(object):
    def __getattr__(self, name):
      return getattr(os, name)

    def pwrite(self, fd, data, offset):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(self, fd, data):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  journal.os = FullDisk()


def slowed(method):
  def slow(*args, **kwargs):
    time.sleep(0.2)
    return method(*args, **kwargs)

  return slow


class ExitTest(tf.test.TestCase, parameterized.TestCase):
  def _run(self, variant):
    directory = os.path.join(self.get_temp_dir(), variant)
    os.makedirs(directory)
    script = os.path.join(directory, "child.py")
    with open(script, "w") as f:
      f.write(_CHILD % {"root": _ROOT})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run(
      [sys.executable, script, variant, directory],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      cwd=_ROOT,
      timeout=300,
    )
    self.stdout = child.stdout.decode()
    self.stderr = child.stderr.decode()
    self.directory = directory
    return child.returncode

  def _assert_file_holds_committed(self, mode):
    """The file opens and holds snapshots 0 and 1, bit-exact, and nothing else."""
    path = os.path.join(self.directory, mode + ".h5")
    with snapstore.open_spill(path) as f:
      self.assertEqual([e.tag for e in f.entries()], [0, 1], mode)
      self.assertEqual(f.incomplete(), [], mode)
      self.assertEqual(f.damaged(), [], mode)
      for tag in (0, 1):
        helpers.assert_bit_equal(
          f.read(tag)["w"], value(tag), "%s snapshot %d" % (mode, tag)
        )

  def _assert_lost_named(self, mode, tags, cause, hint, undeleted=""):
    path = os.path.join(self.directory, mode + ".h5")
    self.assertRegex(
      self.stderr,
      r"snapstore: at exit: the program is ending, and snapshot\(s\) %s "
      r"could not be written to the spill file %s \(%s\): they are lost "
      r"with the process\. The file is closed and valid, with every snapshot "
      r"committed before%s\. Next time, %scall the store's close\(\) before "
      r"the program ends and handle its SpillError \(the snapshots stay in "
      r"memory: call close\(\) again once the file can be written, or save "
      r"them elsewhere with save_npz\)\."
      % (", ".join(map(str, tags)), re.escape(path), cause, undeleted, hint),
    )

  @parameterized.named_parameters(
    ("in_memory", "in_memory", 3, _EFBIG),
    ("mid_write", "mid_write", 0, _EFBIG),
    ("full_disk", "full_disk", 0, _ENOSPC),
  )
  def test_exit_names_what_is_lost_and_keeps_the_file(
    self, variant, status, cause_and_hint
  ):
    returncode = self._run(variant)
    self.assertEqual(returncode, status, self.stderr[-3000:])
    self.assertIn("exiting", self.stdout)
    if variant == "mid_write":
      self.assertIn("with %d writes running" % len(_MODES), self.stdout)
    self.assertNotIn("Traceback", self.stderr)
    for mode in _MODES:
      # A disk store's snapshots in memory were bound for the file too; a
      # device or host store's own tier ends with the store, as always.
      lost = [2, 3] if mode == "disk" and variant != "mid_write" else [2]
      undeleted = (
        r"; deleting snapshot\(s\) 0 from it failed, so it still "
        r"holds them"
        if variant == "full_disk"
        else ""
      )
      self._assert_lost_named(mode, lost, *cause_and_hint, undeleted=undeleted)
      self._assert_file_holds_committed(mode)
    self.assertEqual(self.stderr.count("snapstore: at exit"), len(_MODES))

  def test_dropped_store_after_a_failed_write_exits_cleanly(self):
    # The failed write's traceback, kept by the writer (until collected, and
    # in its loop until the next job), held the store's mode: the store was
    # never collected, and its at-exit close crashed.
    returncode = self._run("dropped")
    self.assertEqual(returncode, 0, self.stderr[-3000:])
    self.assertIn("failed writes waiting: %d" % len(_MODES), self.stdout)
    self.assertIn(
      "collected %d of %d" % (len(_MODES), len(_MODES)), self.stdout
    )
    self.assertNotIn(
      "snapstore: at exit", self.stderr
    )  # released on collection
    for mode in _MODES:
      self._assert_file_holds_committed(mode)


if __name__ == "__main__":
  tf.test.main()
