"""Soak: thousands of snapshot/restore cycles per mode leak nothing.

`StoreSoakTest` is the soak both engines run (tests/contract/soak.py; the
eager suite runs it in tests/eager/test_soak.py). `SoakTest` is graph mode's
own. It runs the loop of `bench/soak.py` for 10,000 cycles per mode (3,000
for disk mode, whose cycles write a spill file and take seven times as long)
on 64 KiB of parameters (the script runs longer and larger; see
bench/README.md), with its checks: bit-exact restores, a constant op count on
the finalized graph, open files and threads unchanged, RSS growth after
warm-up under 8 MiB where one leaked copy of the parameters per cycle would
be over 100 MiB, and fewer than 200 new Python objects where one per cycle
would be thousands. And every call reuses its session callables.
"""

import os
import sys

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests.contract.soak import StoreSoakTest  # noqa: F401

sys.path.insert(
  0,
  os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"
  ),
)
import soak  # pylint: disable=g-import-not-at-top,wrong-import-position

_MAX_GROWTH_MIB = 8.0
_MAX_NEW_OBJECTS = 200


class SoakTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("device_ref", "device", False, 10000, 64),
    ("host_resource", "host", True, 10000, 64),
    ("disk_ref", "disk", False, 3000, 64),
  )
  def test_cycles_leak_nothing(self, mode, use_resource, cycles, kib):
    result = soak.soak(
      mode,
      cycles,
      kib=kib,
      workdir=self.get_temp_dir(),
      use_resource=use_resource,
    )
    self.assertEqual(
      soak.problems(result, _MAX_GROWTH_MIB, _MAX_NEW_OBJECTS), [], result
    )
    # The bounds would catch a leaked copy of the parameters per cycle.
    self.assertGreater(
      result["leak_of_one_copy_per_cycle_mib"], 10 * _MAX_GROWTH_MIB
    )

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_every_call_reuses_its_callables(self, mode, use_resource):
    # Host restores, evaluate_with and restores from a spill file fed a new
    # list of placeholders on every call, which made (and kept) a new
    # callable each time: the session and the store grew without bound.
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(use_resource=use_resource, dtypes=(tf.float32,))
      store = snapstore.SnapshotStore(
        scope="net",
        mode=mode,
        max_to_keep=2,
        spill_path=os.path.join(self.get_temp_dir(), "%s.h5" % self.id()),
      )
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.addCleanup(store.close)
    w = model.variables["v0_float32"]
    with tf.Session(graph=graph) as raw:
      raw.run(init)
      sess = helpers.CountingSession(raw)
      made = []
      for round_ in range(3):
        value = np.full([3, 5], round_, np.float32)
        store.load_arrays({"v0_float32": value}, tag="loaded", session=sess)
        store.restore("loaded", session=sess)
        store.snapshot("taken", session=sess)
        store.evaluate_with(w, tag="loaded", session=sess)
        store.arrays("taken", session=sess)
        store.files.spill("taken", session=sess)
        store.files.flush()
        store.restore("taken", session=sess)  # from the file
        helpers.assert_bit_equal(raw.run(w), value)
        made.append(sess.made)
      self.assertGreater(made[0], 0)
      self.assertEqual(made[1:], [made[0]] * 2)


if __name__ == "__main__":
  tf.test.main()
