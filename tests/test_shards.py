"""`SNAPSTORE_TEST_SHARD` (tests/conftest.py): n processes share a suite.

The Makefile's TF 2.x targets run every suite as two shards at once; a shard
that lost or repeated tests would pass CI while testing less.
"""

from unittest import mock

from absl.testing import parameterized

from snapstore._tf import tf
from tests import conftest


class _Item:
  cls = None

  def __init__(self, name):
    self.name = name


class _Config:
  def __init__(self):
    self.deselected = []
    self.hook = self

  def pytest_deselected(self, items):
    self.deselected.extend(items)


def _run_shard(index, count, items):
  config = _Config()
  items = list(items)
  with mock.patch.object(conftest, "SHARD_INDEX", index), mock.patch.object(
    conftest, "SHARD_COUNT", count
  ):
    conftest.pytest_collection_modifyitems(config, items)
  return items, config.deselected


class ShardTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.parameters(1, 2, 3)
  def test_shards_take_every_test_once_in_order(self, count):
    items = [_Item("test_%d" % i) for i in range(11)]
    kept = []
    for index in range(count):
      mine, others = _run_shard(index, count, items)
      self.assertEqual(len(mine) + len(others), len(items))
      self.assertEqual(set(mine) | set(others), set(items))
      # In collection order, each within a step of the last.
      self.assertEqual(mine, [i for i in items if i in set(mine)])
      kept.extend(mine)
    self.assertCountEqual(kept, items)  # none lost, none twice
    sizes = [len(_run_shard(i, count, items)[0]) for i in range(count)]
    self.assertLessEqual(max(sizes) - min(sizes), 1)

  @parameterized.parameters("2", "2/2", "-1/2", "a/b", "0/0")
  def test_a_bad_shard_is_refused(self, text):
    with self.assertRaisesRegex(
      ValueError, r"SNAPSTORE_TEST_SHARD must be 'i/n' with 0 <= i < n"
    ):
      conftest._shard(text)  # pylint: disable=protected-access

  def test_the_default_is_the_whole_suite(self):
    self.assertEqual(conftest._shard("0/1"), (0, 1))  # pylint: disable=protected-access


if __name__ == "__main__":
  tf.test.main()
