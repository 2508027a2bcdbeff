"""A disk-mode store killed with SIGKILL mid-spill leaves a file that restores.

A child process (of the engine the test runs) snapshots seeded random values
in a loop and writes each one to the spill file (memory budget 0, so every
snapshot is spilled), printing the tag once its write is committed
(`flush()`). The parent kills it with SIGKILL at a random moment after at
least one write completed, then reopens the file: every snapshot reported
complete must be listed and restore bit-exactly; the snapshot being written
may be listed complete (the kill came after its commit), listed incomplete
(never read), or absent. A child that exits without `close()` or `flush()`
finishes its queued writes first.
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
from tests.contract import worlds

_ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

# Large enough that a write takes milliseconds, so kills land inside writes.
SHAPES = {
  "a": ([512, 256], np.float32),
  "b": ([256, 256], np.float32),
  "c": ([1000], np.float32),
}

# The child builds its store for the parent's engine (argv[2]).
_START = """
    import sys
    sys.path.insert(0, %(root)r)
    from snapstore._tf import tf
    if sys.argv[2] == "graph":
      tf.disable_v2_behavior()
    from tests.contract import kill
    from tests.contract import worlds
    assert worlds.ENGINE == sys.argv[2], worlds.ENGINE
"""

_CHILD = (
  _START
  + """
    world = worlds.World(kill.SHAPES, "disk", memory_budget=0,
                         spill_path=sys.argv[1])
    for tag in range(10 ** 6):
      world.write(kill.values(tag))
      world.snapshot(tag)
      world.store.files.flush()
      print(tag, flush=True)
"""
)

# Exits without close() or flush(): the writes still queued must be finished.
_EXITING_CHILD = (
  _START
  + """
    import time
    from snapstore.spill import file as spill_file

    write = spill_file.SpillFile.write
    def slow_write(*args, **kwargs):  # so that exit comes with writes queued
      time.sleep(0.2)
      return write(*args, **kwargs)
    spill_file.SpillFile.write = slow_write

    world = worlds.World(kill.SHAPES, "disk", memory_budget=0,
                         spill_path=sys.argv[1], max_pending=8)
    for tag in range(4):
      world.write(kill.values(tag))
      world.snapshot(tag)
    print(world.store._h.mode._writer.pending, flush=True)
"""
)


def values(tag):
  """The values snapshot `tag` holds."""
  return worlds.values(SHAPES, tag)


class SigkillTest(tf.test.TestCase):
  def _script(self, text):
    script = os.path.join(self.get_temp_dir(), "child_%s.py" % self.id())
    with open(script, "w") as f:
      f.write(textwrap.dedent(text % {"root": _ROOT}))
    return [sys.executable, script]

  def _kill_during_spills(self, path, rng):
    child = subprocess.Popen(
      self._script(_CHILD) + [path, worlds.ENGINE],
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
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
        helpers.assert_state(spill.read(tag), values(tag), "tag %d" % tag)
    self.assertEqual(listed[: len(done)], done)
    self.assertLessEqual(len(listed), len(done) + 1)  # the one being written
    self.assertLessEqual(set(incomplete), {len(done)})
    self.assertFalse(set(incomplete) & set(listed))
    # A store over the file adopts the complete snapshots and restores them.
    world = worlds.World(SHAPES, "disk", memory_budget=0, spill_path=path)
    try:
      self.assertEqual(world.store.tags(), listed)
      for tag in done:
        world.restore(tag)
        helpers.assert_state(world.read(), values(tag), "restored %d" % tag)
    finally:
      world.close()

  def test_interpreter_exit_finishes_queued_writes(self):
    path = os.path.join(self.get_temp_dir(), "exit.h5")
    child = subprocess.run(
      self._script(_EXITING_CHILD) + [path, worlds.ENGINE],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
      cwd=_ROOT,
    )
    self.assertEqual(child.returncode, 0, child.stderr.decode()[-2000:])
    self.assertGreater(int(child.stdout), 0)  # exit came with writes queued
    with snapstore.open_spill(path) as spill:
      self.assertEqual([e.tag for e in spill.entries()], [0, 1, 2, 3])
      for tag in range(4):
        helpers.assert_state(spill.read(tag), values(tag), "tag %d" % tag)

  def test_kill_at_random_moments(self):
    rng = random.Random(1234)
    for run in range(3):
      path = os.path.join(self.get_temp_dir(), "kill%d.h5" % run)
      done = self._kill_during_spills(path, rng)
      self._check(path, done)
