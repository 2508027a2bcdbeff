"""The eager programs of README.md and docs/ run, with this suite's Keras.

The eager suite runs on TensorFlow 2.x only, and on 2.21 twice: with
tf-keras (TF_USE_LEGACY_KERAS=1) and with Keras 3 (TF_USE_LEGACY_KERAS=0), so
each program runs with each Keras the stack has. The markers and the
graph-mode programs: tests/test_docs.py; the mechanism: tests/docs_blocks.py.
"""

import os
import unittest

from absl.testing import parameterized

from tests import docs_blocks
from tests import docs_checks

_, PROGRAMS, _ = docs_blocks.read_all()
EAGER = [(i, b) for i, b in PROGRAMS.items() if b[0].reason == "eager"]


class EagerDocsTest(parameterized.TestCase):
  @parameterized.named_parameters(EAGER or [("none", None)])
  def test_runs(self, blocks):
    self.assertIsNotNone(blocks, "no <!-- test: run eager --> block")
    code, where = docs_blocks.program(
      blocks, docs_checks.CHECKS.get(blocks[0].id, "")
    )
    result = docs_blocks.run_program(blocks[0].id, code, os.environ)
    self.assertEqual(
      result.returncode,
      0,
      "TF_USE_LEGACY_KERAS=%s\n" % os.environ.get("TF_USE_LEGACY_KERAS")
      + "\n".join(where)
      + "\n"
      + result.stdout,
    )


if __name__ == "__main__":
  unittest.main()
