"""The demo runs as documented: graph mode, and on TF 2.x the eager engine too.

(The programs of README.md and docs/ run in tests/test_docs.py.)"""

import os
import re
import subprocess
import sys
import unittest

from snapstore import _tf
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DemoTest(unittest.TestCase):
  def test_the_make_targets_run_the_demo_quietly(self):
    # `python -m snapstore.demo` imports the package, and TensorFlow with
    # it, before the demo's code runs: the variable must come from outside.
    for target in ("demo", "demo-tf2"):
      recipe = subprocess.run(
        ["make", "-s", "-n", target],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        universal_newlines=True,
        check=True,
      ).stdout
      self.assertRegex(
        recipe, r"SNAPSTORE_QUIET_TF=1 .*python -m snapstore\.demo\n"
      )

  def test_the_check_sees_tensorflow_s_lines(self):
    output = (
      "E0000 00:00:1796164507.755053   21323 cuda_platform.cc:52] failed call "
      "to cuInit: UNKNOWN ERROR (303)\n"
      "2026-12-01 22:39:35.090754: I external/local_tsl/tsl/cuda/"
      "cudart_stub.cc:31] Could not find cuda drivers on your machine\n"
      "WARNING: All log messages before absl::InitializeLog() is called are "
      "written to STDERR\n"
      "/work/snapstore/demo.py:82: UserWarning: `tf.layers.dense` is "
      "deprecated\n"
      "WARNING:tensorflow:From v2_compat.py:68: disable_resource_variables\n"
      "[device] step 31: loss 7.2e+09 after a learning-rate spike\n"
    )
    self.assertEqual(helpers.tensorflow_lines(output), output.splitlines()[:-1])

  def test_demo_rolls_back_every_spike_in_every_mode(self):
    # As `make demo` / `make demo-tf2` run it; TF_CPP_MIN_LOG_LEVEL unset.
    env = dict(os.environ, SNAPSTORE_QUIET_TF="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = subprocess.run(
      [sys.executable, "-m", "snapstore.demo", "--steps", "160"],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      universal_newlines=True,
      timeout=300,
    )
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    # Its own output only: nothing on stderr, none of TensorFlow's lines.
    self.assertEqual(result.stderr, "")
    self.assertEqual(helpers.tensorflow_lines(result.stdout), [])
    for mode in ("device", "host", "disk"):
      self.assertEqual(
        result.stdout.count("[%s] step" % mode), 2, result.stdout
      )
      self.assertIn("[%s] held-out data: current" % mode, result.stdout)
    self.assertIn("rolled back to snapshot", result.stdout)
    # Disk mode holds one snapshot in memory and reads the older ones from its file.
    self.assertRegex(
      result.stdout, r"\[disk\] held-out data: snapshot \d+ \(step \d+, file\)"
    )
    self.assertRegex(
      result.stdout, r"\[disk\] held-out data: snapshot \d+ \(step \d+, host\)"
    )
    # Every mode took the same steps and rollbacks, so each reports the same
    # held-out figures.
    held_out = {}
    for mode in ("device", "host", "disk"):
      held_out[mode] = [
        re.sub(r", (device|host|file)\)", ")", line.split("] ", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("[%s] held-out" % mode)
      ]
    self.assertEqual(len(held_out["device"]), 4, result.stdout)
    self.assertEqual(held_out["host"], held_out["device"])
    self.assertEqual(held_out["disk"], held_out["device"])
    self._check_eager_run(result.stdout)

  def _check_eager_run(self, out):
    """On TF 2.x the demo runs again on the eager engine (Keras 3 there)."""
    if _tf.VERSION[0] < 2:
      self.assertNotIn("eager demo", out)
      return
    self.assertIn(
      "eager demo (%s" % ("Keras 3" if _tf.VERSION >= (2, 16) else "Keras 2"),
      out,
    )
    held_out = {}
    for mode in ("device", "host", "disk"):
      self.assertEqual(out.count("[eager %s] step" % mode), 2, out)
      held_out[mode] = [
        re.sub(r", (device|host|file)\)", ")", line.split("] ", 1)[1])
        for line in out.splitlines()
        if line.startswith("[eager %s] held-out" % mode)
      ]
    self.assertEqual(len(held_out["device"]), 4, out)
    self.assertEqual(held_out["host"], held_out["device"])
    self.assertEqual(held_out["disk"], held_out["device"])
    self.assertRegex(
      out,
      r"\[eager disk\] held-out data: snapshot \d+ "
      r"\(step \d+, file\)",
    )


if __name__ == "__main__":
  unittest.main()
