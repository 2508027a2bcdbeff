"""Files and threads a store holds are released: on close, on `with` exit, when
the store is dropped unclosed, and at interpreter exit (writes finished)."""

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from tests import helpers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MODES = [("device", "device"), ("host", "host"), ("disk", "disk")]

_EXITING = textwrap.dedent("""
    import sys
    sys.path.insert(0, %(root)r)
    import time
    import numpy as np
    import snapstore
    from snapstore.spill import file as spill_file
    from snapstore._tf import tf
    tf.disable_v2_behavior()

    write = spill_file.SpillFile.write
    def slow_write(*args, **kwargs):  # exit comes with writes queued
      time.sleep(0.1)
      return write(*args, **kwargs)
    spill_file.SpillFile.write = slow_write

    graph = tf.Graph()
    with graph.as_default():
      w = tf.get_variable("w", [64, 64])
      stores = [
          snapstore.SnapshotStore(var_list=[w], mode=mode, name=mode,
                                  spill_path="%%s/%%s.h5" %% (sys.argv[1], mode),
                                  max_pending=8,
                                  **({"memory_budget": 0} if mode == "disk" else {}))
          for mode in ("device", "host", "disk")]
      init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
    sess = tf.Session(graph=graph)
    sess.run(init)
    for tag in range(4):
      w.load(np.full([64, 64], tag, np.float32), sess)
      for store in stores:
        store.snapshot(tag, session=sess)
        if store.mode != "disk":
          store.files.spill(tag, session=sess)
    print(sum(s._h.mode._writer.pending for s in stores), flush=True)
    # No close(), no flush(): the interpreter exits here.
""")


def _fds():
  return sorted(os.listdir("/proc/self/fd"))


def _open_paths():
  paths = []
  for fd in _fds():
    try:
      paths.append(os.readlink("/proc/self/fd/" + fd))
    except OSError:
      pass  # the descriptor listing the directory
  return paths


def _writer_threads():
  return [t for t in threading.enumerate() if t.name == "snapstore-spill"]


class ResourcesTest(tf.test.TestCase, parameterized.TestCase):
  def setUp(self):
    super(ResourcesTest, self).setUp()
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = helpers.Model(dtypes=(tf.float32, tf.int64))
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    self.sess.run(init)
    gc.collect()  # stores of earlier tests
    self.fds, self.threads = _fds(), threading.active_count()
    self.writers = _writer_threads()

  def _store(self, mode, name="snapstore"):
    self.path = os.path.join(
      self.get_temp_dir(), "%s_%s.h5" % (self._testMethodName, name)
    )
    options = {"memory_budget": 0} if mode == "disk" else {}
    with self.graph.as_default():
      return snapstore.SnapshotStore(
        scope="net", mode=mode, spill_path=self.path, name=name, **options
      )

  def _use(self, store):
    """Snapshots twice, spills both; returns {tag: state}."""
    states = {}
    for seed in (1, 2):
      self.model.randomize(self.sess, seed)
      states[store.snapshot(session=self.sess)] = self.model.values(self.sess)
      store.files.spill(session=self.sess)
    return states

  def assertReleased(self, states):
    self.assertEqual(_fds(), self.fds)
    self.assertEqual(threading.active_count(), self.threads)
    self.assertEqual(_writer_threads(), self.writers)
    self.assertFalse(os.path.exists(self.path + "-journal"))  # cleanly closed
    with snapstore.open_spill(self.path) as f:  # every write was finished
      self.assertEqual(sorted(e.tag for e in f.entries()), sorted(states))
      for tag, state in states.items():
        helpers.assert_state(f.read(tag), state)

  @parameterized.named_parameters(*_MODES)
  def test_close_releases_the_file_and_the_thread(self, mode):
    store = self._store(mode)
    states = self._use(store)
    self.assertLen(_writer_threads(), len(self.writers) + 1)
    self.assertIn(self.path, _open_paths())
    store.close()
    self.assertReleased(states)
    store.close()  # safe twice
    with self.assertRaisesRegex(
      snapstore.StoreClosedError, r"'snapstore' is closed"
    ):
      store.snapshot(session=self.sess)

  @parameterized.named_parameters(*_MODES)
  def test_with_block_releases_also_when_it_raises(self, mode):
    with self.assertRaisesRegex(RuntimeError, "inside the block"):
      with self._store(mode) as store:
        states = self._use(store)
        raise RuntimeError("inside the block")
    self.assertReleased(states)

  @parameterized.named_parameters(*_MODES)
  def test_dropped_store_releases(self, mode):
    # A store dropped without close() kept its writer thread and spill file
    # open for good: a finished write's outcome, waiting in the writer,
    # held the store's mode.
    store = self._store(mode)
    states = self._use(store)
    deadline = time.time() + 10
    while store._h.mode._writer.pending and time.time() < deadline:  # pylint: disable=protected-access
      time.sleep(0.01)
    del store
    gc.collect()
    self.assertReleased(states)

  def test_interpreter_exit_finishes_writes_and_stops(self):
    directory = self.get_temp_dir()
    script = os.path.join(directory, "exiting.py")
    with open(script, "w") as f:
      f.write(_EXITING % {"root": _ROOT})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run(
      [sys.executable, script, directory],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      cwd=_ROOT,
      timeout=120,
    )
    self.assertEqual(child.returncode, 0, child.stderr.decode()[-2000:])
    self.assertGreater(int(child.stdout), 0)  # exit came with writes queued
    self.assertNotIn(b"snapstore: at exit", child.stderr)
    for mode in ("device", "host", "disk"):
      path = os.path.join(directory, mode + ".h5")
      self.assertFalse(os.path.exists(path + "-journal"), mode)
      with spill_file.SpillFile(path) as f:
        self.assertEqual([e.tag for e in f.entries()], [0, 1, 2, 3], mode)
        for tag in range(4):
          helpers.assert_bit_equal(
            f.read(tag)["w"], np.full([64, 64], tag, np.float32)
          )


if __name__ == "__main__":
  tf.test.main()
