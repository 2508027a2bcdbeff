"""The demo and the README's quick start run as documented."""
import os
import subprocess
import sys
import tempfile
import unittest


class DemoTest(unittest.TestCase):

  def test_demo_rolls_back_every_spike_in_every_mode(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-m", "snapstore.demo", "--steps", "160"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, timeout=300)
    self.assertEqual(result.returncode, 0, result.stdout)
    for mode in ("device", "host"):
      self.assertEqual(result.stdout.count("[%s] step" % mode), 2, result.stdout)
      self.assertIn("[%s] held-out data: current" % mode, result.stdout)
    self.assertIn("rolled back to snapshot", result.stdout)


if __name__ == "__main__":
  unittest.main()


class ReadmeTest(unittest.TestCase):

  def test_quick_start_runs(self):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "README.md")) as f:
      readme = f.read()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code += "\nassert np.isfinite(past_loss) and len(store.tags()) == 3\n"
    with tempfile.TemporaryDirectory() as tmp:
      result = subprocess.run([sys.executable, "-c", code], cwd=tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=300)
      self.assertEqual(result.returncode, 0, result.stdout)
      self.assertTrue(os.path.exists(os.path.join(tmp, "best.npz")))
