"""Crash safety of the spill file: a kill after any write leaves a usable file.

A process killed with SIGKILL loses no write the kernel accepted and makes no
write after. So the file a kill leaves is the file as it was after some prefix
of the writer's system calls. These tests stop the writer after its n-th
mutating call (write, pwrite, ftruncate, unlink, rename), for every n, and
check what a reader and a new writer find.
"""

import os
import shutil

import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.engines.graph.variables import variable_set
from snapstore.spill import file as spill_file
from snapstore.spill import journal
from tests import helpers

_MUTATING = ("write", "pwrite", "ftruncate", "unlink", "rename")


class _Killed(BaseException):
  """The simulated SIGKILL; BaseException so no `except Exception` eats it."""


class _DyingOs(object):
  """`os` for snapstore.journal that dies at its `limit`-th mutating call."""

  def __init__(self, limit):
    self._limit = limit
    self.calls = 0
    self.dead = False

  def __getattr__(self, name):
    real = getattr(os, name)
    if name not in _MUTATING:
      return real

    def call(*args, **kwargs):
      if self.dead:
        raise _Killed()
      self.calls += 1
      if self.calls == self._limit:
        self.dead = True
        raise _Killed()
      return real(*args, **kwargs)

    return call


def _varset():
  graph = tf.Graph()
  with graph.as_default():
    with tf.variable_scope("net"):
      tf.get_variable("dense/kernel", [40, 30])
      tf.get_variable("step", [], dtype=tf.int64)
      tf.get_variable("mask", [7], dtype=tf.bool)
    return variable_set(scope="net")


def _arrays(varset, seed):
  rng = np.random.RandomState(seed)
  return [helpers.random_value(rng, s.shape, s.dtype) for s in varset.specs]


class CrashAtEveryWriteTest(tf.test.TestCase):
  def setUp(self):
    super(CrashAtEveryWriteTest, self).setUp()
    self.varset = _varset()
    self.base = os.path.join(self.get_temp_dir(), "base.h5")
    with spill_file.SpillFile.open_for_writing(self.base, self.varset) as f:
      for seed in (0, 1, 2):
        f.write(
          seed, 100.0 + seed, None, self.varset.keys, _arrays(self.varset, seed)
        )

  def _work(self, f, done):
    """A deletion, then writes that reuse its space; `done` lists finished steps."""
    f.delete(0)
    done.append(("deleted", 0))
    for seed in (3, 4):
      f.write(
        seed, 100.0 + seed, None, self.varset.keys, _arrays(self.varset, seed)
      )
      done.append(("written", seed))

  def _run_until(self, limit, path):
    shutil.copy(self.base, path)
    dying = _DyingOs(limit)
    done = []
    real_os = journal.os
    journal.os = dying
    f = None
    try:
      f = spill_file.SpillFile.open_for_writing(path, self.varset)
      self._work(f, done)
    except (_Killed, OSError, RuntimeError, ValueError):
      # h5py may report the kill inside its driver as its own error.
      if not dying.dead:
        raise
    finally:
      if f is not None and f._file is not None:  # pylint: disable=protected-access
        f._file.abandon()  # pylint: disable=protected-access
        dying.dead = True  # the process is gone: nothing more reaches the disk
        try:
          f.close()
        except _Killed:
          pass
      journal.os = real_os
    return dying.calls, done

  def _check(self, path, done):
    expected = {1: 1, 2: 2}
    if ("deleted", 0) not in done:
      expected[0] = 0
    finished = [seed for what, seed in done if what == "written"]
    expected.update((seed, seed) for seed in finished)
    in_progress = [s for s in (3, 4) if s not in finished][:1]
    with spill_file.open_spill(path) as reader:
      listed = dict((e.tag, e) for e in reader.entries())
      for tag in expected:
        self.assertIn(tag, listed)
      extra = set(listed) - set(expected)
      # Only the snapshot being written (committed just before the kill) or
      # the one being deleted may be there besides.
      self.assertLessEqual(extra, set(in_progress) | {0})
      for tag in listed:
        arrays = reader.read(tag, self.varset)
        for got, want in zip(arrays.values(), _arrays(self.varset, tag)):
          helpers.assert_bit_equal(got, want, "snapshot %r" % tag)
      incomplete = reader.incomplete()
      self.assertLessEqual(set(incomplete), set(in_progress))
      for tag in incomplete:
        with self.assertRaisesRegex(
          snapstore.UnknownTagError, "no complete snapshot %r" % (tag,)
        ):
          reader.read(tag)
    return incomplete

  def test_every_crash_point(self):
    path = os.path.join(self.get_temp_dir(), "crash.h5")
    total, done = self._run_until(10**9, path)
    self.assertLen(done, 3)
    self.assertGreater(total, 20)
    stages, incomplete_seen = set(), 0
    for limit in range(1, total + 1):
      _, done = self._run_until(limit, path)
      # A reader sees the last commit and changes nothing ...
      before = open(path, "rb").read()
      incomplete = self._check(path, done)
      self.assertEqual(open(path, "rb").read(), before)
      # ... and a writer rolls back, then works on.
      with spill_file.SpillFile.open_for_writing(path, self.varset) as f:
        f.delete_incomplete()
        f.write(9, 109.0, None, self.varset.keys, _arrays(self.varset, 9))
      self.assertFalse(os.path.exists(journal.journal_path(path)))
      with spill_file.open_spill(path) as reader:
        self.assertIn(9, reader)
        self.assertEqual(reader.incomplete(), [])
      stages.add(len(done))
      incomplete_seen += bool(incomplete)
    # Kills hit the delete and both writes, some between a write's two commits.
    self.assertEqual(stages, {0, 1, 2})
    self.assertGreater(incomplete_seen, 0)


if __name__ == "__main__":
  tf.test.main()
