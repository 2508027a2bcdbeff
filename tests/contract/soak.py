"""Soak: many snapshot/restore cycles on one store leak nothing and build nothing.

Each cycle is what a training loop does around a step: the variables take
new values (a cycle counter among them), `snapshot()`, other values,
`restore()` of the snapshot; every 10th cycle also evaluates the oldest
snapshot, loads arrays as a snapshot and reads it back, and (device mode
with a spill file) spills a snapshot and deletes the oldest spilled one. Every 25th restore is compared bit for bit with the
values snapshotted. The store keeps 4 snapshots (8, two in memory, in disk
mode), so cycles evict.

After a warm-up (whatever a store builds on first use is built then), the
measured cycles must build nothing: no op added to the graph (graph mode; the
graph is finalized) and no function traced (eager; `World.counting`). And they
must leak nothing: resident memory (RSS) grows less than 8 MiB in one of
the measured cycles' two halves where one leaked copy of the parameters per
cycle would be 50 MiB or more in each, fewer than 200 new Python objects, the
same open files and threads.
"""

import gc
import os
import threading

from absl.testing import parameterized
import numpy as np
import psutil

from snapstore._tf import tf
from tests import helpers
from tests.contract import worlds

_PER = 16384  # float32 elements per variable: 4 x 64 KiB of parameters
_SHAPES = dict(("v%d" % i, ([_PER], np.float32)) for i in range(4))
_SHAPES["count"] = ([], np.int64)
_MAX_GROWTH_MIB = 8.0
_MAX_NEW_OBJECTS = 200
_MIB = float(1 << 20)


def _usage():
  """(RSS bytes, open files, threads, Python objects), after a collection."""
  gc.collect()
  return (
    psutil.Process().memory_info().rss,
    len(os.listdir("/proc/self/fd")),
    threading.active_count(),
    len(gc.get_objects()),
  )


class StoreSoakTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("device", "device", False, 1000),
    ("host", "host", False, 1000),
    ("disk", "disk", True, 500),
    ("device_spill", "device", True, 500),
  )
  def test_cycles_leak_nothing_and_build_nothing(self, mode, spills, cycles):
    options = {}
    if spills:
      options["spill_path"] = os.path.join(self.get_temp_dir(), "soak.h5")
    if mode == "disk":
      options["memory_budget"] = 2 * 4 * _PER * 4
    world = worlds.World(
      _SHAPES, mode, max_to_keep=8 if mode == "disk" else 4, **options
    )
    self.addCleanup(world.close)
    states = [worlds.values(_SHAPES, seed) for seed in range(3)]
    taken = {}  # tag -> what it holds
    spilled = []

    def cycle(i):
      state = dict(states[i % 2], count=np.int64(i))
      world.write(state)
      tag = world.snapshot()
      taken[tag] = state
      world.write(states[2])
      world.restore(tag)
      if i % 25 == 0:
        helpers.assert_state(world.read(), state, "cycle %d restore" % i)
      if i % 10 == 0:
        oldest = world.store.tags()[0]
        helpers.assert_state(
          world.evaluate(oldest), taken[oldest], "cycle %d past" % i
        )
        helpers.assert_state(world.read(), state, "cycle %d after" % i)
        loaded = dict(states[(i + 1) % 2], count=np.int64(-i))
        world.load_arrays(loaded, tag="loaded")
        taken["loaded"] = loaded
        helpers.assert_state(world.arrays("loaded"), loaded, "loaded")
        if spills and mode != "disk":
          # Spilled snapshots are outside max_to_keep: keep the newest 4.
          world.spill(tag)
          spilled.append(tag)
          if len(spilled) > 4:
            world.store.delete(spilled.pop(0))
      for gone in set(taken) - set(world.store.tags()):
        del taken[gone]

    warmup = cycles // 5
    for i in range(warmup):
      cycle(i)
    world.store.files.flush()  # no write in progress: its journal is closed
    half = (warmup + cycles) // 2
    with world.counting() as built:
      before = _usage()
      for i in range(warmup, half):
        cycle(i)
      world.store.files.flush()
      middle = _usage()
      for i in range(half, cycles):
        cycle(i)
      world.store.files.flush()
      after = _usage()
      self.assertEqual(built(), 0, "the cycles built ops or traces")
    # A leak grows RSS in both halves; what else the process does meanwhile
    # (threads an earlier test left: a Keras fit's prefetching) grows it now
    # and then, so the smaller half's growth is what the store is held to.
    growth = min(middle[0] - before[0], after[0] - middle[0]) / _MIB
    one_copy_per_cycle = (cycles - half) * world.store.param_nbytes / _MIB
    self.assertGreater(one_copy_per_cycle, 6 * _MAX_GROWTH_MIB)
    self.assertLess(
      growth,
      _MAX_GROWTH_MIB,
      "RSS grew %.1f MiB and %.1f MiB in the two halves"
      % ((middle[0] - before[0]) / _MIB, (after[0] - middle[0]) / _MIB),
    )
    self.assertEqual(after[1:3], before[1:3], "open files, threads")
    self.assertLess(after[3] - before[3], _MAX_NEW_OBJECTS, "new objects")
