"""Every script in examples/ runs and checks itself (README.md's code: test_readme.py)."""

import os
import re
import subprocess
import sys
import unittest

from snapstore import _tf

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
  "soft_target_update.py": [
    "every variable and target bit for bit as with separate target "
    "networks: True"
  ],
}


class ExamplesTest(unittest.TestCase):
  def test_every_example_is_covered(self):
    scripts = sorted(
      f for f in os.listdir(os.path.join(ROOT, "examples")) if f.endswith(".py")
    )
    self.assertEqual(scripts, sorted(EXPECTED))

  def _run(self, script, *args, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
      [sys.executable, os.path.join("examples", script)] + list(args),
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      timeout=timeout,
    )
    self.assertEqual(result.returncode, 0, result.stdout)
    for line in EXPECTED[script]:
      self.assertIn(line, result.stdout)
    return result.stdout

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

  @unittest.skipIf(_tf.VERSION < (2, 15), "an eager program: TensorFlow 2.x")
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
