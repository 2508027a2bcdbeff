""".npz and spill files written on one TensorFlow stack read bit-exactly on the other.

Each direction runs in two processes, the writer with one stack's Python and
the reader with the other's (`tests/cross_stack_files.py` says what is written
and checked). The other stacks are the venvs that `make venv`, `make venv-tf2`
and `make venv-tf215` build at the repository root; `.ci/run` builds them all
before running any suite, so in CI (CI=true) a missing one is a failure.
"""

import os
import subprocess
import sys
import tempfile
import unittest

from snapstore import _tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "cross_stack_files.py")

# venv directory -> TensorFlow major version it holds (scripts/bootstrap).
STACKS = ((".venv", 1), (".venv-tf2", 2), (".venv-tf215", 2))


def _other_pythons():
  """The Pythons of the built stacks whose TensorFlow major version differs."""
  found = []
  for venv, major in STACKS:
    python = os.path.join(ROOT, venv, "bin", "python")
    if major != _tf.VERSION[0] and os.access(python, os.X_OK):
      found.append((venv, python))
  return found


class CrossStackFilesTest(unittest.TestCase):
  def _run(self, python, command, directory):
    env = dict(
      os.environ,
      PYTHONPATH=ROOT,
      TF_CPP_MIN_LOG_LEVEL="2",
      TF_USE_LEGACY_KERAS="1",
    )
    # Importing TF 2.x sets TF2_BEHAVIOR=1 in its process's environment, which
    # would turn on eager execution in a TF 1.15 child.
    env.pop("TF2_BEHAVIOR", None)
    result = subprocess.run(
      [python, SCRIPT, command, directory],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      timeout=300,
    )
    self.assertEqual(
      result.returncode, 0, "%s %s:\n%s" % (python, command, result.stdout)
    )
    return result.stdout

  def test_files_read_bit_exactly_across_stacks(self):
    others = _other_pythons()
    if not others:
      message = (
        "no other TensorFlow stack is built at the repository root "
        "(`make venv-tf2` or `make venv` builds one)"
      )
      if os.environ.get("CI") == "true":
        self.fail(message + "; .ci/run builds every stack first")
      self.skipTest(message)
    for venv, other in others:
      for writer, reader in ((other, sys.executable), (sys.executable, other)):
        with self.subTest(
          venv=venv, writer=writer
        ), tempfile.TemporaryDirectory() as directory:
          self._run(writer, "write", directory)
          out = self._run(reader, "check", directory)
          self.assertIn("checked npz and spill written on TensorFlow", out)


if __name__ == "__main__":
  unittest.main()
