"""`SNAPSTORE_TEST_SHARD` (tests/conftest.py): n processes share a suite.

The Makefile's TF 2.x targets run every suite as two shards at once; a shard
that lost or repeated tests would pass CI while testing less.
"""

import os
import re
import subprocess
from unittest import mock

from absl.testing import parameterized

from snapstore._tf import tf
from tests import conftest


class _Item:
  def __init__(self, name, module="tests/test_a.py", cls=None, scopes=()):
    self.name = name
    self.cls = cls
    self.nodeid = "%s::%s%s" % (
      module,
      cls.__name__ + "::" if cls else "",
      name,
    )
    self._fixtureinfo = mock.Mock(
      name2fixturedefs={
        "f%d" % i: [mock.Mock(scope=scope)] for i, scope in enumerate(scopes)
      }
    )


class _WithServers(tf.test.TestCase):
  @classmethod
  def setUpClass(cls):  # the suite's own: its tests share it
    super(_WithServers, cls).setUpClass()


class _Plain(tf.test.TestCase):  # TF's setUpClass only
  pass


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

  def test_tests_sharing_an_expensive_set_up_share_a_shard(self):
    cluster = [
      _Item("c%d" % i, "tests/test_b.py", scopes=("function", "module"))
      for i in range(4)
    ]
    servers = [_Item("s%d" % i, cls=_WithServers) for i in range(3)]
    plain = [_Item("p%d" % i, cls=_Plain) for i in range(4)]
    alone = [_Item("a%d" % i, scopes=("function",)) for i in range(5)]
    items = alone[:2] + cluster + servers + plain + alone[2:]
    for count in (2, 3):
      shards = dict(zip(items, conftest.shard_of(items, count)))
      self.assertLen(set(shards[i] for i in cluster), 1)
      self.assertLen(set(shards[i] for i in servers), 1)
      self.assertGreater(len(set(shards[i] for i in plain)), 1)  # spread
      kept = []
      for index in range(count):
        mine, _ = _run_shard(index, count, items)
        kept.extend(mine)
      self.assertCountEqual(kept, items)

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


class MakeTargetsTest(parameterized.TestCase):
  """`make test` / `test-tf2` / `test-tf215` fail when a suite of theirs fails.

  Each target hands its two shards' commands (one half of the tests each)
  to scripts/run_parallel as quoted strings. A shard that runs several
  suites ends in `exit $rc`; if the Makefile's shell expanded `$rc` there
  (unset: empty), every shard would exit with the status of its last
  assignment, 0, and CI would pass whatever the suites did.
  """

  def _shard_commands(self, target):
    """The commands `target` hands to run_parallel, as run_parallel gets them."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    recipe = subprocess.run(
      ["make", "-s", "-n", target],
      cwd=root,
      capture_output=True,
      text=True,
      check=True,
    ).stdout
    recipe = recipe[recipe.index("./scripts/run_parallel") :]
    listed = subprocess.run(
      [
        "bash",
        "-c",
        recipe.replace("./scripts/run_parallel", "printf '%s\\0'"),
      ],
      cwd=root,
      capture_output=True,
      text=True,
      check=True,
    ).stdout
    return [c for c in listed.split("\0") if c.strip()]

  @parameterized.parameters("test", "test-tf2", "test-tf215")
  def test_a_failing_suite_fails_the_shard(self, target):
    commands = self._shard_commands(target)
    self.assertLen(commands, 2)
    shards = []
    for command in commands:
      shards.append(re.search(r"SNAPSTORE_TEST_SHARD=(\S+);", command).group(1))
      for python, rc in (("false", 1), ("true", 0)):
        # Every suite's interpreter replaced: all fail, or all pass.
        run = re.sub(r"\S*\.venv(-tf2\d*)?/bin/python", python, command)
        self.assertNotEqual(run, command)
        done = subprocess.run(["bash", "-c", run], capture_output=True)
        self.assertEqual(done.returncode, rc, run)
    self.assertEqual(shards, ["0/2", "1/2"])  # each half once
