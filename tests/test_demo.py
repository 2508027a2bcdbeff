"""The demo and the README's quick start run as documented."""

import os
import re
import subprocess
import sys
import tempfile
import unittest


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


class ReadmeTest(unittest.TestCase):
  def test_quick_start_runs(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
      readme = f.read()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    # The device snapshots went with the session that the block closed.
    code += "\nassert np.isfinite(past_loss) and store.tags() == []\n"
    with tempfile.TemporaryDirectory() as tmp:
      result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        timeout=300,
      )
      self.assertEqual(result.returncode, 0, result.stdout)
      self.assertTrue(os.path.exists(os.path.join(tmp, "best.npz")))


if __name__ == "__main__":
  unittest.main()
