"""The eager scripts of examples/ run and check themselves, with this
suite's Keras (on TensorFlow 2.21 the eager suite runs once with tf-keras and
once with Keras 3). The graph-mode ones: tests/test_examples.py."""

import re
import unittest

from tests.test_examples import EAGER
from tests.test_examples import ExampleRunner


class EagerExamplesTest(ExampleRunner, unittest.TestCase):
  expected = EAGER

  def test_fit_nan_batch(self):
    self._run("eager_fit_nan_batch.py")

  def test_tape_rollback(self):
    self._run("eager_tape_rollback.py")

  def test_soft_target_update(self):
    # Past parameters read from a store slot, its soft update by
    # MovingAverage: bit for bit the run with separate target networks,
    # and the policy learns the task.
    out = self._run(
      "soft_target_update.py", "--steps", "500", "--check", timeout=600
    )
    before, after = re.search(
      r"return over 20 steps: (\S+) before training, (\S+) after", out
    ).groups()
    self.assertGreater(float(after), float(before) / 2)


if __name__ == "__main__":
  unittest.main()
