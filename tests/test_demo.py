"""The demo runs as documented: graph mode, and on TF 2.x the eager engine too.

(The programs of README.md and docs/ run in tests/test_docs.py.)"""

import os
import re
import subprocess
import sys
import unittest

from snapstore import _tf


class DemoTest(unittest.TestCase):
  def test_demo_rolls_back_every_spike_in_every_mode(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
      [sys.executable, "-m", "snapstore.demo", "--steps", "160"],
      cwd=root,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      timeout=300,
    )
    self.assertEqual(result.returncode, 0, result.stdout)
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
