"""`python -m snapstore`: list, show, diff, verify, export; bad files exit 1."""

import io
import os
import subprocess
import sys
import tracemalloc

import h5py
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore import cli
from tests import helpers

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CliTest(tf.test.TestCase):
  def setUp(self):
    super(CliTest, self).setUp()
    self.path = os.path.join(self.get_temp_dir(), "run.h5")
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        w = tf.get_variable("dense/kernel", [2, 3])
        b = tf.get_variable("bias", [3], dtype=tf.int32)
      step = tf.train.get_or_create_global_step()
      store = snapstore.SnapshotStore(
        scope="net",
        mode="disk",
        memory_budget=0,
        spill_path=self.path,
        include_global_step=True,
      )
    self.w = np.arange(6, dtype=np.float32).reshape(2, 3)
    self.b = np.array([1, 2, 3], np.int32)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      w.load(self.w, sess)
      b.load(self.b, sess)
      step.load(7, sess)
      store.snapshot(session=sess)  # 0
      w.load(self.w + np.float32(0.5), sess)
      b.load(self.b - 2, sess)
      store.snapshot("later", session=sess)
    store.close()

  def run_cli(self, *argv):
    out, err = io.StringIO(), io.StringIO()
    status = cli.main(list(argv), out=out, err=err)
    return status, out.getvalue(), err.getvalue()

  def test_list(self):
    status, out, _ = self.run_cli("list", self.path)
    self.assertEqual(status, 0)
    lines = out.splitlines()
    self.assertRegex(lines[0], r"^tag\s+time\s+step\s+size\s+variables$")
    self.assertRegex(
      lines[1], r"^0\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+7\s+44 B\s+3$"
    )
    self.assertRegex(lines[2], r"^'later'\s+.*\s+7\s+44 B\s+3$")
    self.assertEqual(lines[3], "2 snapshot(s) in %s" % self.path)

  def test_show(self):
    status, out, _ = self.run_cli("show", self.path + ":0")
    self.assertEqual(status, 0)
    self.assertIn("snapshot 0 of %s" % self.path, out)
    self.assertRegex(out, r"\nbias\s+\(3,\)\s+int32\s+1\s+3\s+2\s+0\n")
    self.assertRegex(
      out, r"\ndense/kernel\s+\(2, 3\)\s+float32\s+0\s+5\s+2\.5\s+0\n"
    )
    # Default: the newest.
    _, newest, _ = self.run_cli("show", self.path)
    self.assertIn("snapshot 'later'", newest)

  def test_diff(self):
    status, out, _ = self.run_cli(
      "diff", self.path + ":0", self.path + ":later"
    )
    self.assertEqual(status, 0)
    self.assertRegex(out, r"\nbias\s+2\s+3\.4641\s+no\n")  # sqrt(3 * 2**2)
    self.assertRegex(
      out, r"\ndense/kernel\s+0\.5\s+1\.22474\s+no\n"
    )  # sqrt(6 * .25)
    self.assertRegex(out, r"\nglobal_step\s+0\s+0\s+yes\n")

  def test_export_then_diff_and_list_npz(self):
    npz = os.path.join(self.get_temp_dir(), "zero.npz")
    status, out, _ = self.run_cli("export", self.path + ":0", npz)
    self.assertEqual((status, out), (0, "wrote %s (3 variables)\n" % npz))
    with np.load(npz, allow_pickle=False) as data:
      helpers.assert_bit_equal(data["dense/kernel"], self.w)
      helpers.assert_bit_equal(data["bias"], self.b)
    status, out, _ = self.run_cli("diff", npz, self.path + ":0")
    self.assertEqual(status, 0)
    self.assertEqual(out.count(" yes"), 3)
    status, out, _ = self.run_cli("list", npz)
    self.assertEqual(status, 0)
    self.assertRegex(out, r"'zero\.npz'\s+.*\s+-\s+44 B\s+3")

  def test_verify_good_and_corrupt(self):
    status, out, _ = self.run_cli("verify", self.path)
    self.assertEqual(
      (status, out), (0, "ok      0\nok      'later'\n2 checked, 0 failed\n")
    )
    with h5py.File(self.path, "r") as h5:
      offset = h5["snapshots/slater/vbias"].id.get_offset()
    with open(self.path, "r+b") as f:
      f.seek(offset)
      byte = f.read(1)[0]
      f.seek(offset)
      f.write(bytes([byte ^ 0x10]))
    status, out, _ = self.run_cli("verify", self.path)
    self.assertEqual(status, 1)
    self.assertIn("ok      0\n", out)
    self.assertIn(
      "FAILED  %s: checksum mismatch in variable 'bias' of snapshot "
      "'later'" % self.path,
      out,
    )
    self.assertIn("2 checked, 1 failed\n", out)
    self.assertTrue(
      out.endswith(
        "intact, can be saved (snapstore export %s:TAG out.npz): 0\n"
        % self.path
      )
    )
    status, _, err = self.run_cli("show", self.path + ":later")
    self.assertEqual(status, 1)
    self.assertIn("checksum mismatch in variable 'bias'", err)

  def test_bad_files(self):
    text = os.path.join(self.get_temp_dir(), "notes.h5")
    with open(text, "w") as f:
      f.write("hello" * 200)
    foreign = os.path.join(self.get_temp_dir(), "foreign.h5")
    with h5py.File(foreign, "w") as h5:
      h5["data"] = np.arange(3)
    truncated = os.path.join(self.get_temp_dir(), "cut.h5")
    with open(self.path, "rb") as f, open(truncated, "wb") as g:
      g.write(f.read()[:-200])
    cases = [
      (("list", text), r"notes\.h5 is not an HDF5 file"),
      (
        ("list", foreign),
        r"foreign\.h5 is an HDF5 file, but not a snapstore spill",
      ),
      (("verify", truncated), r"cut\.h5 is truncated"),
      (("list", text + ".missing"), r"notes\.h5\.missing: no such file"),
      (
        ("show", self.path + ":nope"),
        r"no complete snapshot 'nope'.*0, 'later'",
      ),
    ]
    for argv, message in cases:
      status, out, err = self.run_cli(*argv)
      self.assertEqual(status, 1, argv)
      self.assertEqual(out, "")
      # The format of the line is fixed; the message is matched by its key part.
      self.assertRegex(err, r"^snapstore %s: error: .*%s" % (argv[0], message))

  def _spill_with_tags(self, tags):
    """A spill file holding one float snapshot per tag; returns its path."""
    path = os.path.join(self.get_temp_dir(), "tags.h5")
    graph = tf.Graph()
    with graph.as_default():
      v = tf.get_variable("v", [2])
      store = snapstore.SnapshotStore(
        var_list=[v], mode="disk", memory_budget=0, spill_path=path
      )
    with tf.Session(graph=graph) as sess:
      sess.run(v.initializer)
      for i, tag in enumerate(tags):
        v.load([i, -i], sess)
        store.snapshot(tag, session=sess)
    store.close()
    return path

  def test_tag_with_colons(self):
    path = self._spill_with_tags(["a:b", "c"])
    status, out, _ = self.run_cli("show", path + ":a:b")
    self.assertEqual(status, 0)
    self.assertIn("snapshot 'a:b' of %s" % path, out)
    self.assertRegex(out, r"\nv\s+\(2,\)\s+float32\s+0\s+0\s+0\s+0\n")
    status, out, _ = self.run_cli("show", path, "--tag", "a:b")
    self.assertIn("snapshot 'a:b'", out)
    npz = os.path.join(self.get_temp_dir(), "ab.npz")
    self.assertEqual(self.run_cli("export", path, npz, "--tag", "a:b")[0], 0)
    self.assertEqual(
      self.run_cli("verify", path + ":a:b")[1],
      "ok      'a:b'\n1 checked, 0 failed\n",
    )

  def test_list_pads_tags_to_a_capped_width(self):
    path = self._spill_with_tags(["t" * 200, "short"])
    status, out, _ = self.run_cli("list", path)
    self.assertEqual(status, 0)
    lines = out.splitlines()
    self.assertTrue(lines[1].startswith("'%s'  " % ("t" * 200)))  # whole
    self.assertRegex(
      lines[2], r"^'short' {%d}\d{4}-" % (cli._TAG_WIDTH - 7 + 2)
    )  # pylint: disable=protected-access

  def test_export_never_onto_its_own_input(self):
    with open(self.path, "rb") as f:
      before = f.read()
    for output in (
      self.path,
      os.path.join(os.path.dirname(self.path), ".", "run.h5"),
    ):
      status, out, err = self.run_cli("export", self.path + ":0", output)
      self.assertEqual((status, out), (1, ""))
      self.assertRegex(err, r"Refusing to export .* onto itself")
    npz = os.path.join(self.get_temp_dir(), "self.npz")
    self.assertEqual(self.run_cli("export", self.path + ":0", npz)[0], 0)
    status, _, err = self.run_cli("export", npz, npz)
    self.assertEqual(status, 1)
    self.assertRegex(err, r"Refusing to export .* onto itself")
    with open(self.path, "rb") as f:
      self.assertEqual(f.read(), before)

  def test_directory_as_a_file(self):
    for argv in (
      ("list", self.get_temp_dir()),
      ("show", self.get_temp_dir()),
      ("verify", self.get_temp_dir()),
      ("export", self.path + ":0", self.get_temp_dir()),
    ):
      status, out, err = self.run_cli(*argv)
      self.assertEqual((status, out), (1, ""), argv)
      self.assertRegex(
        err,
        r"^snapstore %s: error: .* is a directory; name a "
        r"file" % argv[0],
      )

  def test_show_large_npz_uses_about_its_size(self):
    npz = os.path.join(self.get_temp_dir(), "large.npz")
    member = np.arange(8 << 20, dtype=np.float32)  # 32 MiB
    np.savez(npz, w=member)
    del member
    tracemalloc.start()
    try:
      status, out, _ = self.run_cli("show", npz)
      peak = tracemalloc.get_traced_memory()[1]
    finally:
      tracemalloc.stop()
    self.assertEqual(status, 0)
    self.assertRegex(
      out,
      r"\nw\s+\(8388608,\)\s+float32\s+0\s+8\.38861e\+06\s+"
      r"4\.1943e\+06\s+0\n",
    )
    self.assertLess(peak, 2 * (32 << 20), "show used %d bytes" % peak)

  def test_python_dash_m_entry_point(self):
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    good = subprocess.run(
      [sys.executable, "-m", "snapstore", "list", self.path],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
    )
    self.assertEqual(good.returncode, 0)
    self.assertIn(b"2 snapshot(s)", good.stdout)
    bad = subprocess.run(
      [sys.executable, "-m", "snapstore", "frobnicate"],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      env=env,
    )
    self.assertEqual(bad.returncode, 2)
    self.assertIn(b"invalid choice: 'frobnicate'", bad.stderr)


if __name__ == "__main__":
  tf.test.main()
