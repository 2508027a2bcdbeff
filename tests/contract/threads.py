"""Store calls from several threads, and the disk writer next to restores.

Every value written into the variables here goes through the store
(`load_arrays` + `restore`), so each state the variables hold is one the test
knows: a pattern `p` in every element of every variable. A torn snapshot or
restore would mix patterns across variables (or within one); none may. Every
thread is joined with a timeout, so a deadlock fails the test instead of
hanging it.
"""

import threading
import time

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from tests.contract import worlds

_JOIN_TIMEOUT = 120
_DTYPES = (np.float32, np.int64, np.float64)


def _run_threads(targets):
  """Runs the callables on threads started together; re-raises their errors."""
  errors = []
  start = threading.Barrier(len(targets))

  def wrapped(target):
    start.wait()
    try:
      target()
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=wrapped, args=(t,)) for t in targets]
  for thread in threads:
    thread.daemon = True  # a deadlocked one must not keep pytest alive
    thread.start()
  for thread in threads:
    thread.join(_JOIN_TIMEOUT)
  alive = [t.name for t in threads if t.is_alive()]
  if alive:
    raise AssertionError(
      "deadlock: %s still running after %d s" % (alive, _JOIN_TIMEOUT)
    )
  if errors:
    raise errors[0]


class _Case(tf.test.TestCase, parameterized.TestCase):
  def _setup(
    self, mode, use_resource, max_to_keep=None, shape=(3, 5), **options
  ):
    if mode == "disk":
      options.setdefault("memory_budget", 0)
      options["spill_path"] = self._path()
    self.shapes = dict(
      ("v%d" % i, (list(shape), dtype)) for i, dtype in enumerate(_DTYPES)
    )
    self.world = worlds.World(
      self.shapes, mode, max_to_keep, use_resource=use_resource, **options
    )
    self.addCleanup(self.world.close)
    self.store = self.world.store

  def _path(self):
    return "%s/%s.h5" % (self.get_temp_dir(), self.id())

  def _state(self, pattern):
    return worlds.patterned(self.shapes, pattern)

  def _pattern(self, arrays, known, what):
    """The one pattern every element of every array holds; it must be known."""
    patterns = set()
    for value in arrays.values():
      patterns.update(np.unique(np.asarray(value, np.float64)).tolist())
    self.assertLen(
      patterns,
      1,
      "%s is torn: %d patterns, e.g. %s"
      % (what, len(patterns), sorted(patterns)[:4]),
    )
    pattern = patterns.pop()
    self.assertIn(pattern, known, what)
    return pattern


class StoreThreadsTest(_Case):
  @parameterized.named_parameters(*worlds.cases(("device", "host", "disk")))
  def test_threads_snapshot_restore_evaluate_and_delete(
    self, mode, use_resource
  ):
    # Three threads set the variables (load_arrays + restore), snapshot,
    # read and evaluate; a fourth snapshots, evaluates any held snapshot and
    # deletes. No snapshot is evicted (max_to_keep is large enough), so the
    # tags left at the end are known.
    self._setup(mode, use_resource, max_to_keep=16)
    workers, rounds = 3, 20
    known = set(
      float(t * 1000 + i) for t in range(workers) for i in range(rounds)
    )
    start = -1.0  # what the variables hold until a worker's first restore
    self.world.load_arrays(self._state(start), tag="start")
    self.world.restore("start")
    self.store.delete("start")
    taken = {}

    def worker(t):
      def run():
        for i in range(rounds):
          pattern = t * 1000 + i
          self.world.load_arrays(self._state(pattern), tag="load%d" % t)
          self.world.restore("load%d" % t)
          tag = self.world.snapshot("snap%d_%d" % (t, i % 3))
          # Another thread may have restored in between: the snapshot holds
          # one state, whole, not necessarily this thread's.
          arrays = self.world.arrays(tag)
          taken[(t, i)] = self._pattern(arrays, known, "snapshot %s" % tag)
          past = self.world.evaluate("load%d" % t)
          self.assertEqual(self._pattern(past, known, "evaluate_with"), pattern)
          if i % 5 == 4:
            self.store.delete(tag)

      return run

    def churn():
      for i in range(2 * rounds):
        own = self.world.snapshot("churn%d" % (i % 2))
        self._pattern(self.world.arrays(own), known | {start}, own)
        held = self.store.tags()
        other = held[i % len(held)]
        try:
          self._pattern(self.world.evaluate(other), known | {start}, other)
        except snapstore.UnknownTagError:
          self.assertTrue(
            other.startswith("snap"), other
          )  # a worker deleted it
        self.store.delete(own)

    _run_threads([worker(t) for t in range(workers)] + [churn])
    self.assertLen(taken, workers * rounds)
    self._pattern(self.world.read(), known, "the variables")
    # Each worker's last load is its own; its snapshots are left unless the
    # last round that took one deleted it; churn deleted all of its own.
    expected = set()
    for t in range(workers):
      self.assertEqual(
        self._pattern(self.world.arrays("load%d" % t), known, "load"),
        t * 1000 + rounds - 1,
      )
      expected.add("load%d" % t)
      for k in range(3):
        last = max(i for i in range(rounds) if i % 3 == k)
        if last % 5 != 4:
          expected.add("snap%d_%d" % (t, k))
    self.assertCountEqual(self.store.tags(), expected)
    for tag in self.store.tags():  # every snapshot left is whole
      self._pattern(self.world.arrays(tag), known, tag)

  @parameterized.named_parameters(
    ("device", "device"), ("host", "host"), ("disk", "disk")
  )
  def test_close_while_another_thread_snapshots(self, mode):
    self._setup(mode, True, max_to_keep=4)
    stop = threading.Event()
    outcome = []

    def snapshots():
      try:
        while not stop.is_set():
          self.world.snapshot("t")
      except snapstore.Error as e:
        outcome.append(e)

    def closer():
      time.sleep(0.2)
      self.store.close()
      time.sleep(0.1)
      stop.set()

    _run_threads([snapshots, closer])
    self.assertLen(outcome, 1)
    self.assertIsInstance(outcome[0], snapstore.StoreClosedError)
    self.assertRegex(str(outcome[0]), r"store 'snapstore' is closed")


class DiskWriterTest(_Case):
  @parameterized.named_parameters(*worlds.cases(("disk",)))
  def test_writer_runs_while_the_training_thread_restores(
    self, mode, use_resource
  ):
    # Big enough that each write takes a while, so restores (from memory and
    # from the file) and snapshots overlap writes in progress.
    self._setup(mode, use_resource, shape=(256, 256), max_pending=3)
    known = set(float(p) for p in range(60))
    for pattern in range(3):
      self.world.load_arrays(self._state(pattern), tag=pattern)
    self.world.restore(0)  # the variables hold a known state
    overlapped = []
    writing = threading.Event()
    real_write = spill_file.SpillFile.write

    def timed_write(f, *args, **kwargs):
      writing.set()
      try:
        # Wider than a restore even on a busy machine, where a 256 KiB write
        # can fall between two restores: the overlap is what is tested.
        time.sleep(0.02)
        return real_write(f, *args, **kwargs)
      finally:
        writing.clear()

    spill_file.SpillFile.write = timed_write
    self.addCleanup(setattr, spill_file.SpillFile, "write", real_write)

    def training():
      for pattern in range(3, 60):
        self.world.load_arrays(self._state(pattern), tag=pattern)
        older = (
          pattern - 1 - (pattern * 7) % 3
        )  # in memory, queued or in the file
        overlapped.append(writing.is_set())
        self.world.restore(older)
        self.assertEqual(
          self._pattern(self.world.read(), known, "restored %d" % older), older
        )
        self.assertIn(self.store.files.tier(older), ("host", "file"))

    def snapshots_from_another_thread():
      for i in range(30):
        tag = self.world.snapshot("other%d" % (i % 4))
        self._pattern(self.world.arrays(tag), known, tag)

    _run_threads([training, snapshots_from_another_thread])
    self.assertTrue(any(overlapped), "no restore overlapped a write")
    self.store.files.flush()
    for tag in range(60):
      self.assertEqual(self._pattern(self.world.arrays(tag), known, tag), tag)

  def test_restore_from_the_file_waits_for_a_write_in_progress(self):
    self._setup("disk", True)
    self.world.load_arrays(self._state(1), tag="old")
    self.store.files.flush()
    self.assertEqual(self.store.files.tier("old"), "file")
    gate = threading.Event()
    entered = threading.Event()
    real_write = spill_file.SpillFile._write  # pylint: disable=protected-access

    def held_write(f, *args, **kwargs):  # holding the file, as a slow disk does
      entered.set()
      gate.wait(_JOIN_TIMEOUT)
      return real_write(f, *args, **kwargs)

    spill_file.SpillFile._write = held_write  # pylint: disable=protected-access
    self.addCleanup(setattr, spill_file.SpillFile, "_write", real_write)
    self.world.load_arrays(self._state(2), tag="new")
    self.assertTrue(entered.wait(10))
    threading.Timer(0.3, gate.set).start()
    started = time.time()
    self.world.restore("old")  # waits for the file
    self.assertGreater(time.time() - started, 0.2)
    self.assertEqual(self._pattern(self.world.read(), {1.0}, "old"), 1)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier("new"), "file")
