"""The eager scripts of examples/ run and check themselves, with this
suite's Keras (on TensorFlow 2.21 the eager suite runs once with tf-keras and
once with Keras 3). The graph-mode ones: tests/test_examples.py."""

import unittest

from tests.test_examples import EAGER
from tests.test_examples import ExampleRunner


class EagerExamplesTest(ExampleRunner, unittest.TestCase):
  expected = EAGER

  def test_fit_nan_batch(self):
    self._run("eager_fit_nan_batch.py")

  def test_tape_rollback(self):
    self._run("eager_tape_rollback.py")


if __name__ == "__main__":
  unittest.main()
