"""Peak memory of a store in a child process (tests/memory_child.py), per mode.

A model of 256 MiB in 8 float32 variables; two snapshots (`max_to_keep=2`)
and one restore, checked bit for bit. The child's peak RSS over its RSS once
the model exists may exceed what the mode must hold (host: both snapshots;
disk, `memory_budget=1`: the one kept and the one on its way to the file;
device: its slots, both engines) by a quarter of the model: one more model-sized copy
anywhere fails. In host and disk mode, `arrays`, `load_arrays`, `save_npz`,
`load_npz` (and, disk, `load_spill` from the file the store leaves) may each
need a quarter of the model beyond what they keep; `evaluate_with` one model
more (the current values, set aside while the snapshot's are in place).
A host snapshot over a held tag (a full ring's next one) copies into the
arrays it replaces: a quarter of the model too.
Memory, unlike time, is stable on a loaded machine.
"""

import json
import os
import subprocess
import sys

from absl.testing import parameterized
import numpy as np

from snapstore._tf import tf
from tests import helpers
from tests.contract import worlds

_ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_CHILD = os.path.join(_ROOT, "tests", "memory_child.py")
SLACK = 0.25  # of the model: less than one more model-sized copy
# A part's own bound: a quarter of the model (two of its eight variables:
# `save_npz` streams a member while zipfile buffers one) and a few MiB of
# Python's, numpy's and h5py's own.
PART_SLACK = SLACK + 0.02
PATHS = {
  "device": "",
  "host": "arrays,load_arrays,npz,evaluate,ring",
  "disk": "arrays,load_arrays,npz,evaluate,load_spill",
}
# The bytes beyond what a part keeps that it may need, in models.
ALLOWED = {"evaluate": 1 + PART_SLACK}
# The children run with the system allocator: with oneDNN's
# (TensorFlow 2.x's CPU allocator where oneDNN is on, by default on x86 CPUs
# with AVX512_VNNI, AMX and the like) a process's RSS is that pool's, not
# the bytes alive: freed memory stays resident and new tensors take
# untouched pages first (bench/probe_cpu_allocator.py shows it without
# snapstore). TF_ONEDNN_USE_SYSTEM_ALLOCATOR keeps oneDNN's kernels, where
# the CPU runs them, and makes the peak measure the store on every CPU
# (TensorFlow 1.15 and CPUs without oneDNN use the system allocator anyway).
# docs/performance.md, "Memory", gives the figures under both.
CHILD_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"}


def measure(mode, paths, directory, mib=256, count=8):
  """The child's JSON result for `mode` (see tests/memory_child.py)."""
  out = subprocess.run(
    [sys.executable, _CHILD, worlds.ENGINE, mode, "--mib", str(mib)]
    + ["--vars", str(count), "--dir", directory, "--paths", paths],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    env=dict(os.environ, **CHILD_ENV),
    cwd=_ROOT,
    timeout=300,
  )
  text = out.stdout.decode("utf-8", "replace")
  assert out.returncode == 0, text
  return json.loads(text.strip().splitlines()[-1])


class MemoryTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("device", "device"), ("host", "host"), ("disk", "disk")
  )
  def test_peak_is_what_the_mode_holds(self, mode):
    result = measure(mode, PATHS[mode], self.get_temp_dir())
    self.assertTrue(result["exact"], "a restore was not bit-exact")
    core = result["core"]
    self.assertLessEqual(
      core["extra_models"],
      core["held_models"] + SLACK,
      "two snapshots and a restore of a %d-byte model took %.2f models of "
      "memory, for %d held: %s"
      % (
        result["nbytes"],
        core["extra_models"],
        core["held_models"],
        json.dumps(result),
      ),
    )
    for name, part in sorted(result["parts"].items()):
      self.assertLessEqual(
        part["transient"],
        ALLOWED.get(name, PART_SLACK),
        "%s needed %.2f models beyond what it keeps: %s"
        % (name, part["transient"], json.dumps(result)),
      )


SHAPES = {"a": ([256, 1024], np.float32), "b": ([100], np.float32)}


class ReplaceTest(tf.test.TestCase, parameterized.TestCase):
  """A snapshot replaced by `load_arrays` or a file load reuses or adopts
  arrays only where nothing else (the caller, the variables after a restore)
  sees them: the variables and the other snapshots keep their bits."""

  @parameterized.named_parameters(("host", "host"), ("disk", "disk"))
  def test_replacing_a_held_snapshot(self, mode):
    options = {}
    if mode == "disk":
      options = dict(
        spill_path=os.path.join(self.get_temp_dir(), "s.h5"),
        memory_budget=10**9,
      )
    world = worlds.World(SHAPES, mode, max_to_keep=3, **options)
    try:
      one, two, three = (worlds.values(SHAPES, seed) for seed in (1, 2, 3))
      world.write(one)
      world.snapshot(1)
      world.load_arrays(dict(two), tag=1)  # nobody else holds the arrays
      world.write(three)
      world.snapshot(1)
      world.restore(1)  # the variables may share memory with snapshot 1
      world.load_arrays(dict(two), tag=1)
      _same(world.read(), three, "the variables changed")
      path = os.path.join(self.get_temp_dir(), "three.npz")
      world.write(three)
      world.snapshot(3)
      world.store.files.save_npz(path, tag=3, **world._session)
      world.restore(1)
      _same(world.read(), two)
      world.store.files.load_npz(path, tag=1, **world._session)
      _same(world.read(), two, "the variables changed")
      world.write(one)
      world.snapshot(2)  # over nothing the variables hold
      world.restore(1)
      _same(world.read(), three)
      world.restore(2)
      _same(world.read(), one)
      world.restore(3)
      _same(world.read(), three)
    finally:
      world.close()


def _same(got, want, msg=""):
  """Bit equality of two `{key: array}` of the same keys."""
  assert sorted(got) == sorted(want), (sorted(got), sorted(want))
  for key in want:
    helpers.assert_bit_equal(got[key], want[key], "%s %s" % (msg, key))
