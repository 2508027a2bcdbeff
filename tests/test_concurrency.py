"""Store calls from several threads, and the disk writer next to restores.

Every value written into the variables here goes through the store
(`load_arrays` + `restore`), so each state the variables hold is one the test
knows: a pattern `p` in every element of every variable. A torn snapshot or
restore would mix patterns across variables (or within one); none may. Every
thread is joined with a timeout, so a deadlock fails the test instead of
hanging it.
"""

import os
import threading
import time

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from tests import helpers

_JOIN_TIMEOUT = 120
_CASES = helpers.mode_and_kind_cases(("device", "host", "disk"))


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
    self.graph = tf.Graph()
    with self.graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        self.variables = [
          tf.get_variable("v%d" % i, shape, dtype=dtype)
          for i, dtype in enumerate((tf.float32, tf.int64, tf.float64))
        ]
      if mode == "disk":
        options.setdefault("memory_budget", 0)
        options["spill_path"] = os.path.join(
          self.get_temp_dir(), "%s.h5" % self.id()
        )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep, **options
      )
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.addCleanup(self.store.close)
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    self.sess.run(init)

  def _state(self, pattern):
    return dict(
      (
        v.op.name[len("net/") :],
        np.full(v.shape.as_list(), pattern, v.dtype.base_dtype.as_numpy_dtype),
      )
      for v in self.variables
    )

  def _pattern(self, arrays, known, what):
    """The one pattern every element of every array holds; it must be known."""
    patterns = set()
    for key, value in arrays.items():
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

  def _live(self):
    return dict(
      (v.op.name[len("net/") :], value)
      for v, value in zip(self.variables, self.sess.run(self.variables))
    )


class StoreThreadsTest(_Case):
  @parameterized.named_parameters(*_CASES)
  def test_two_threads_snapshot_restore_and_evaluate(self, mode, use_resource):
    self._setup(mode, use_resource, max_to_keep=8)
    rounds = 25
    known = set()
    for t in range(2):
      known.update(float(t * 1000 + i) for i in range(rounds))
    taken = {}

    def worker(t):
      def run():
        for i in range(rounds):
          pattern = t * 1000 + i
          self.store.load_arrays(
            self._state(pattern), tag="load%d" % t, session=self.sess
          )
          self.store.restore("load%d" % t, session=self.sess)
          tag = self.store.snapshot("snap%d_%d" % (t, i % 3), session=self.sess)
          # Another thread may have restored in between: the snapshot holds
          # one state, whole, not necessarily this thread's.
          arrays = self.store.arrays(tag, session=self.sess)
          taken[(t, i)] = self._pattern(arrays, known, "snapshot %s" % tag)
          past = self.store.evaluate_with(
            self.variables, tag="load%d" % t, session=self.sess
          )
          self.assertEqual(
            self._pattern(dict(enumerate(past)), known, "evaluate_with"),
            pattern,
          )
          if i % 5 == 4:
            self.store.delete(tag)

      return run

    _run_threads([worker(0), worker(1)])
    self.assertLen(taken, 2 * rounds)
    self._pattern(self._live(), known, "the variables")
    for tag in self.store.tags():  # every snapshot left is whole
      self._pattern(self.store.arrays(tag, session=self.sess), known, tag)

  @parameterized.named_parameters(
    ("device", "device"), ("host", "host"), ("disk", "disk")
  )
  def test_close_while_another_thread_snapshots(self, mode):
    self._setup(mode, False, max_to_keep=4)
    stop = threading.Event()
    outcome = []

    def snapshots():
      try:
        while not stop.is_set():
          self.store.snapshot("t", session=self.sess)
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
  @parameterized.named_parameters(*helpers.kind_cases())
  def test_writer_runs_while_the_training_thread_restores(self, use_resource):
    # Big enough that each write takes a while, so restores (from memory and
    # from the file) and snapshots overlap writes in progress.
    self._setup("disk", use_resource, shape=(256, 256), max_pending=3)
    known = set(float(p) for p in range(60))
    for pattern in range(3):
      self.store.load_arrays(
        self._state(pattern), tag=pattern, session=self.sess
      )
    self.store.restore(0, session=self.sess)  # the variables hold a known state
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
        self.store.load_arrays(
          self._state(pattern), tag=pattern, session=self.sess
        )
        older = (
          pattern - 1 - (pattern * 7) % 3
        )  # in memory, queued or in the file
        overlapped.append(writing.is_set())
        self.store.restore(older, session=self.sess)
        self.assertEqual(
          self._pattern(self._live(), known, "restored %d" % older), older
        )
        self.assertEqual(self.store.files.tier(older) in ("host", "file"), True)

    def snapshots_from_another_thread():
      for i in range(30):
        tag = self.store.snapshot("other%d" % (i % 4), session=self.sess)
        self._pattern(self.store.arrays(tag), known, tag)

    _run_threads([training, snapshots_from_another_thread])
    self.assertTrue(any(overlapped), "no restore overlapped a write")
    self.store.files.flush()
    for tag in range(60):
      self.assertEqual(self._pattern(self.store.arrays(tag), known, tag), tag)

  def test_restore_from_the_file_waits_for_a_write_in_progress(self):
    self._setup("disk", False)
    self.store.load_arrays(self._state(1), tag="old", session=self.sess)
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
    self.store.load_arrays(self._state(2), tag="new", session=self.sess)
    self.assertTrue(entered.wait(10))
    threading.Timer(0.3, gate.set).start()
    started = time.time()
    self.store.restore("old", session=self.sess)  # waits for the file
    self.assertGreater(time.time() - started, 0.2)
    self.assertEqual(self._pattern(self._live(), {1.0}, "old"), 1)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier("new"), "file")


if __name__ == "__main__":
  tf.test.main()
