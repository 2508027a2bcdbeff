"""A disk-mode store killed with SIGKILL mid-spill leaves a file that restores.

A child process snapshots seeded random values in a loop and writes each one
to the spill file (memory budget 0, so every snapshot is spilled), printing the
tag once its write is committed (`flush()`). The parent kills it with SIGKILL
at a random moment after at least one write completed, then reopens the file:
every snapshot reported complete must be listed and restore bit-exactly; the
snapshot being written may be listed complete (the kill came after its commit),
listed incomplete (never read), or absent.
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Large enough that a write takes milliseconds, so kills land inside writes.
_SHAPES = {"a": [512, 256], "b": [256, 256], "c": [1000]}

_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, %(root)r)
    import numpy as np
    import snapstore
    from snapstore._tf import tf
    tf.disable_v2_behavior()
    from tests import helpers
    from tests import test_sigkill

    graph = tf.Graph()
    with graph.as_default():
      variables = test_sigkill.build()
      store = snapstore.SnapshotStore(scope="net", mode="disk", memory_budget=0,
                                      spill_path=sys.argv[1])
    with tf.Session(graph=graph) as sess:
      sess.run(tf.variables_initializer(list(variables.values())))
      for tag in range(10 ** 6):
        for key, value in test_sigkill.values(tag).items():
          variables[key].load(value, sess)
        store.snapshot(tag, session=sess)
        store.files.flush()
        print(tag, flush=True)
""")


# Exits without close() or flush(): the writes still queued must be finished.
_EXITING_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, %(root)r)
    import time
    import snapstore
    from snapstore.spill import file as spill_file
    from snapstore._tf import tf
    tf.disable_v2_behavior()
    from tests import test_sigkill

    write = spill_file.SpillFile.write
    def slow_write(*args, **kwargs):  # so that exit comes with writes queued
      time.sleep(0.2)
      return write(*args, **kwargs)
    spill_file.SpillFile.write = slow_write

    graph = tf.Graph()
    with graph.as_default():
      variables = test_sigkill.build()
      store = snapstore.SnapshotStore(scope="net", mode="disk", memory_budget=0,
                                      spill_path=sys.argv[1], max_pending=8)
    sess = tf.Session(graph=graph)
    sess.run(tf.variables_initializer(list(variables.values())))
    for tag in range(4):
      for key, value in test_sigkill.values(tag).items():
        variables[key].load(value, sess)
      store.snapshot(tag, session=sess)
    print(store._h.mode._writer.pending, flush=True)
""")


def build():
  with tf.variable_scope("net"):
    return dict(
      (k, tf.get_variable(k, shape, dtype=tf.float32))
      for k, shape in sorted(_SHAPES.items())
    )


def values(tag):
  rng = np.random.RandomState(tag)
  return dict(
    (k, helpers.random_value(rng, shape, np.float32))
    for k, shape in sorted(_SHAPES.items())
  )


class SigkillTest(tf.test.TestCase):
  def _kill_during_spills(self, path, rng):
    script = os.path.join(self.get_temp_dir(), "child.py")
    with open(script, "w") as f:
      f.write(_CHILD % {"root": _ROOT})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.Popen(
      [sys.executable, script, path],
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=env,
      cwd=_ROOT,
    )
    done = []
    try:
      wanted = rng.randint(1, 4)
      while len(done) < wanted:
        line = child.stdout.readline()
        self.assertTrue(
          line, "the child died before writing %d snapshots" % wanted
        )
        done.append(int(line))
      time.sleep(rng.uniform(0, 0.05))  # somewhere inside a later write
    finally:
      child.send_signal(signal.SIGKILL)
      child.wait()
    # Lines the child printed before the kill are complete too.
    done.extend(int(line) for line in child.stdout.read().split())
    child.stdout.close()
    self.assertEqual(child.returncode, -signal.SIGKILL)
    return done

  def _check(self, path, done):
    with snapstore.open_spill(path) as spill:
      listed = [e.tag for e in spill.entries()]
      incomplete = spill.incomplete()
      for tag in listed:
        for key, value in spill.read(tag).items():
          helpers.assert_bit_equal(
            value, values(tag)[key], "tag %d %s" % (tag, key)
          )
    self.assertEqual(listed[: len(done)], done)
    self.assertLessEqual(len(listed), len(done) + 1)  # the one being written
    self.assertLessEqual(set(incomplete), {len(done)})
    self.assertFalse(set(incomplete) & set(listed))
    # A store over the file adopts the complete snapshots and restores them.
    graph = tf.Graph()
    with graph.as_default():
      variables = build()
      store = snapstore.SnapshotStore(
        scope="net", mode="disk", memory_budget=0, spill_path=path
      )
    with tf.Session(graph=graph) as sess:
      sess.run(tf.variables_initializer(list(variables.values())))
      self.assertEqual(store.tags(), listed)
      for tag in done:
        store.restore(tag, session=sess)
        for key, var in variables.items():
          helpers.assert_bit_equal(sess.run(var), values(tag)[key])
    store.close()
    return incomplete

  def test_interpreter_exit_finishes_queued_writes(self):
    path = os.path.join(self.get_temp_dir(), "exit.h5")
    script = os.path.join(self.get_temp_dir(), "exiting.py")
    with open(script, "w") as f:
      f.write(_EXITING_CHILD % {"root": _ROOT})
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run(
      [sys.executable, script, path],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
      cwd=_ROOT,
    )
    self.assertEqual(child.returncode, 0, child.stderr.decode()[-2000:])
    self.assertGreater(int(child.stdout), 0)  # exit came with writes queued
    with snapstore.open_spill(path) as spill:
      self.assertEqual([e.tag for e in spill.entries()], [0, 1, 2, 3])
      for tag in range(4):
        for key, value in spill.read(tag).items():
          helpers.assert_bit_equal(value, values(tag)[key])

  def test_kill_at_random_moments(self):
    rng = random.Random(1234)
    for run in range(3):
      path = os.path.join(self.get_temp_dir(), "kill%d.h5" % run)
      done = self._kill_during_spills(path, rng)
      self._check(path, done)


if __name__ == "__main__":
  tf.test.main()
