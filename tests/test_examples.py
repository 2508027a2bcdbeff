"""Every script in examples/ runs and checks itself: the graph-mode ones here
(the graph suites), the eager ones in tests/eager/test_examples.py (the eager
suites, with each Keras). The docs' code: tests/test_docs.py."""

import os
import subprocess
import sys
import unittest

from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXPECTED = {
  "target_network.py": ["greedy policy RRRRR"],
  "lookahead_classification.py": ["Lookahead(k=5, alpha=0.5), slow weights"],
  "rollback_divergence.py": [
    "plain     loss NaN after step",
    "rollback  held-out",
    "trial     held-out",
  ],
  "checkpoint_ensemble.py": ["member 2 (seed 2)", "ensemble, majority vote"],
}
# Eager (TensorFlow 2.x): run by tests/eager/test_examples.py.
EAGER = {
  "eager_fit_nan_batch.py": [
    "no callback                          MSE nan",
    "every_n_batches=1                    MSE",
    "bit for bit as without the bad batch: True",
  ],
  "eager_tape_rollback.py": [
    "no rollback     loss nan",
    "1 rollback(s), Adam at step 59",
    "bit for bit the same weights and Adam: True",
  ],
  "soft_target_update.py": [
    "every variable and target bit for bit as with separate target "
    "networks: True"
  ],
}


class ExampleRunner(object):
  """Runs examples/`script` in a child process, as a user would, and checks
  its exit status and that it printed each line of `expected[script]`."""

  expected = EXPECTED

  def _run(self, script, *args, timeout=180):
    # As a user runs it: the script itself keeps TensorFlow's lines out
    # (importing snapstore.demo, as other tests do, sets SNAPSTORE_QUIET_TF).
    env = dict(os.environ, PYTHONPATH=ROOT)
    for name in ("TF_CPP_MIN_LOG_LEVEL", "SNAPSTORE_QUIET_TF"):
      env.pop(name, None)
    result = subprocess.run(
      [sys.executable, os.path.join("examples", script)] + list(args),
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      universal_newlines=True,
      timeout=timeout,
    )
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    for line in self.expected[script]:
      self.assertIn(line, result.stdout)
    # Its own output only.
    self.assertEqual(result.stderr, "")
    self.assertEqual(helpers.tensorflow_lines(result.stdout), [])
    return result.stdout


class ExamplesTest(ExampleRunner, unittest.TestCase):
  def test_every_example_is_covered(self):
    scripts = sorted(
      f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py")
    )
    self.assertEqual(scripts, sorted(list(EXPECTED) + list(EAGER)))

  def test_target_network(self):
    self._run("target_network.py")

  def test_target_network_soft_update(self):
    self._run("target_network.py", "--tau", "0.05")  # MovingAverage, lerp form

  def test_lookahead_classification(self):
    self._run("lookahead_classification.py")

  def test_rollback_divergence(self):
    self._run("rollback_divergence.py")

  def test_checkpoint_ensemble(self):
    self._run("checkpoint_ensemble.py")


if __name__ == "__main__":
  unittest.main()
