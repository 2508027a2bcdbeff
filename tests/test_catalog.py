"""snapstore.core.catalog: tag order, automatic tags, eviction and pins, without TensorFlow.

These tests import only the catalog and what it imports. `test_runs_without_tensorflow`
runs them again in a child process where importing TensorFlow fails, which
proves the catalog needs none.
"""

import os
import subprocess
import sys
import unittest

from snapstore import errors
from snapstore.core import catalog

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs this file's tests with `snapstore` and `snapstore.core` as bare
# packages (their __init__ files, which import TensorFlow, are not run) and
# with every import of tensorflow failing.
_WITHOUT_TF = """
import sys, types, unittest
sys.modules["tensorflow"] = None
for name, path in (("snapstore", "snapstore"), ("snapstore.core", "snapstore/core")):
  module = types.ModuleType(name)
  module.__path__ = [path]
  sys.modules[name] = module
from tests import test_catalog
assert not any(m == "tensorflow" or m.startswith("tensorflow.") for m in sys.modules
               if sys.modules[m] is not None)
suite = unittest.defaultTestLoader.loadTestsFromTestCase(test_catalog.CatalogTest)
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=0).run(suite)
print("ran %d" % result.testsRun)
sys.exit(0 if result.wasSuccessful() else 1)
"""


class CatalogTest(unittest.TestCase):
  def test_automatic_tags_count_up_and_skip_given_ints(self):
    c = catalog.Catalog(capacity=None)
    self.assertEqual(c.record(c.new_tag(None), None, 1.0), 0)
    self.assertEqual(c.record(c.new_tag(7), None, 2.0), 7)
    self.assertEqual(c.record(c.new_tag("best"), None, 3.0), "best")
    self.assertEqual(c.new_tag(None), 8)
    c.drop(7)
    self.assertEqual(c.new_tag(None), 8)  # never names an older snapshot again
    self.assertEqual(c.tags(), [0, "best"])
    self.assertEqual(len(c), 2)
    self.assertIn("best", c)
    self.assertNotIn(7, c)

  def test_numpy_integer_tags_are_ints(self):
    import numpy as np  # pylint: disable=g-import-not-at-top

    c = catalog.Catalog(capacity=None)
    tag = c.new_tag(np.int64(3))
    self.assertIs(type(tag), int)

  def test_bad_tags(self):
    c = catalog.Catalog(capacity=None)
    for bad in ("", True, 1.5, b"x", [1]):
      with self.assertRaisesRegex(
        TypeError, "A tag must be an int or a non-empty string"
      ):
        c.new_tag(bad)

  def test_order_is_oldest_first_and_a_replaced_tag_becomes_newest(self):
    c = catalog.Catalog(capacity=None)
    for tag, when in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
      c.record(tag, None, when)
    c.record("a", None, 4.0)
    self.assertEqual(c.tags(), ["b", "c", "a"])
    self.assertEqual(c.infos()[-1], catalog.SnapshotInfo("a", 4.0))
    self.assertEqual(c.info("b").time, 2.0)
    self.assertEqual(c.existing(None), "a")

  def test_victim_is_the_oldest_counted_unpinned_tag(self):
    c = catalog.Catalog(capacity=2)
    c.record("a", None, 1.0)
    self.assertIsNone(c.victim("b"))
    c.record("b", None, 2.0)
    self.assertEqual(c.victim("c"), "a")
    self.assertIsNone(c.victim("b"))  # replacing a held tag evicts nothing
    c.pin("a")
    self.assertEqual(c.victim("c"), "b")
    # A tag that does not count (spilled) is neither counted nor evicted.
    self.assertIsNone(c.victim("c", counts=lambda t: t != "b"))
    c.record("c", "b", 3.0)
    self.assertEqual(c.tags(), ["a", "c"])

  def test_every_slot_pinned(self):
    c = catalog.Catalog(capacity=2)
    for tag in ("a", "b"):
      c.record(tag, None, 1.0)
      c.pin(tag)
    with self.assertRaisesRegex(
      errors.PinnedTagError,
      r"'c': every slot of the store is pinned \('a', 'b'\)",
    ):
      c.victim("c")
    self.assertIsNone(c.victim("a"))  # a pinned tag can be overwritten
    self.assertEqual(c.pinned(), ["a", "b"])

  def test_unbounded_never_evicts(self):
    c = catalog.Catalog(capacity=None)
    for i in range(100):
      self.assertIsNone(c.victim(i))
      c.record(i, None, float(i))
    self.assertEqual(len(c), 100)

  def test_unknown_tags_name_the_held_ones(self):
    c = catalog.Catalog(capacity=3)
    with self.assertRaisesRegex(
      errors.UnknownTagError, "holds no snapshots yet"
    ):
      c.existing(None)
    c.record("a", None, 1.0)
    c.record(1, None, 2.0)
    with self.assertRaisesRegex(
      errors.UnknownTagError, r"No snapshot tagged 'x'.*'a', 1\b"
    ):
      c.existing("x")
    with self.assertRaisesRegex(
      errors.UnknownTagError, "No snapshot tagged None"
    ):
      c.existing(None, allow_default=False)

  def test_check_unpinned(self):
    c = catalog.Catalog(capacity=2)
    c.record("slow", None, 1.0)
    c.record("b", None, 2.0)
    c.check_unpinned("b", "never", lambda t: self.fail("asked for a slot"))
    c.pin("slow")
    with self.assertRaisesRegex(
      errors.PinnedTagError,
      r"'slow' is pinned to device slot 3.*it cannot be deleted",
    ):
      c.check_unpinned("slow", "it cannot be deleted", lambda t: 3)

  def test_keep_only_forgets_lost_tags_and_their_pins(self):
    c = catalog.Catalog(capacity=None)
    for tag in ("a", "b", "c"):
      c.record(tag, None, 1.0)
    c.pin("b")
    self.assertEqual(c.keep_only({"a"}), ["b", "c"])
    self.assertEqual(c.tags(), ["a"])
    self.assertEqual(c.pinned(), [])
    self.assertEqual(catalog.lost_note([]), "")
    self.assertRegex(
      catalog.lost_note(["b", 3]),
      r"Snapshot\(s\) 'b', 3 were being overwritten and are dropped",
    )

  def test_adopted_tags_move_automatic_tags_past_them(self):
    c = catalog.Catalog(capacity=None)
    c.adopt(41, 1.0)
    c.adopt("x", 2.0)
    self.assertEqual(c.new_tag(None), 42)
    self.assertEqual(c.tags(), [41, "x"])


class WithoutTensorFlowTest(unittest.TestCase):
  def test_runs_without_tensorflow(self):
    result = subprocess.run(
      [sys.executable, "-c", _WITHOUT_TF],
      cwd=_ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      timeout=120,
    )
    self.assertEqual(result.returncode, 0, result.stdout)
    self.assertIn(
      "ran %d"
      % unittest.defaultTestLoader.loadTestsFromTestCase(
        CatalogTest
      ).countTestCases(),
      result.stdout,
    )


if __name__ == "__main__":
  unittest.main()
