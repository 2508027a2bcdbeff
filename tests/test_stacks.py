"""One code base on TF 1.15 and TF 2.x: the compatibility module, graph mode, Keras 3.

The import-time behaviour runs in child processes: importing snapstore changes
(or refuses) the process's execution mode, which this process has settled.
"""

import ast
import os
import re
import subprocess
import sys
import unittest

import snapstore
from snapstore import _tf
from snapstore import _tf_startup
from snapstore import _keras
from snapstore._tf import tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(code, env, stderr=subprocess.STDOUT):
  """Runs `code` in a child Python of this stack, with environment `env`."""
  env = dict(env)
  env.pop(
    "TF2_BEHAVIOR", None
  )  # set by importing TF 2.x; not the child's choice
  return subprocess.run(
    [sys.executable, "-c", code],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=stderr,
    universal_newlines=True,
    timeout=120,
  )


def _python(code, keep_legacy_keras=True):
  """Runs `code` in a child Python of this stack; (returncode, output)."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  if not keep_legacy_keras:
    env.pop("TF_USE_LEGACY_KERAS", None)
  result = _child(code, env)
  return result.returncode, result.stdout


_MODES = (
  "v1 = tf.compat.v1\n"
  "print('modes', v1.executing_eagerly(), v1.resource_variables_enabled(), "
  "v1.control_flow_v2_enabled())\n"
)


class CompatModuleTest(unittest.TestCase):
  def test_only_the_compat_module_imports_tensorflow(self):
    package = os.path.join(ROOT, "snapstore")
    offenders = []
    for directory, _, files in os.walk(package):
      for name in files:
        if not name.endswith(".py"):
          continue
        path = os.path.join(directory, name)
        with open(path) as f:
          tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
          if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
          elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
          else:
            continue
          if any(
            m == "tensorflow" or m.startswith("tensorflow.") for m in modules
          ):
            offenders.append(
              "%s:%d" % (os.path.relpath(path, ROOT), node.lineno)
            )
    self.assertTrue(offenders, "the test found no TensorFlow import at all")
    self.assertEqual(
      [
        o
        for o in offenders
        if not o.startswith(os.path.join("snapstore", "_tf.py"))
      ],
      [],
    )

  def test_supported_versions_pass_the_gate(self):
    self.assertEqual(_tf.check_version("1.15.5"), (1, 15))
    self.assertEqual(_tf.check_version("2.15.1"), (2, 15))
    self.assertEqual(_tf.check_version("2.21.0"), (2, 21))
    self.assertEqual(_tf.check_version("2.22.0-rc1"), (2, 22))
    self.assertEqual(
      _tf.VERSION, _tf.check_version(_tf._tensorflow.__version__)
    )  # pylint: disable=protected-access

  def test_unsupported_versions_are_refused_with_the_fix(self):
    for version in ("1.14.0", "2.0.0", "2.14.1", "nightly"):
      with self.assertRaisesRegex(
        ImportError,
        r"needs TensorFlow 1\.15, or 2\.15 or newer .*found "
        r"TensorFlow %s\. Install TensorFlow .*pip install 'snapstore\[cpu\]'"
        % version,
      ):
        _tf.check_version(version)

  def test_snapshot_callback_is_a_tf1_keras_callback(self):
    # The suite runs with TF1-style Keras (conftest): TF's own on 1.15 and
    # 2.15, tf-keras on 2.16+.
    self.assertFalse(_keras.uses_keras_3())
    self.assertTrue(
      issubclass(snapstore.SnapshotCallback, tf.keras.callbacks.Callback)
    )


def _stderr_of(code, **env):
  """What a child Python of this stack running `code` writes to stderr."""
  child_env = dict(os.environ, PYTHONPATH=ROOT)
  # Unset unless asked for: importing snapstore.demo (other tests do) sets
  # SNAPSTORE_QUIET_TF in this process's environment.
  for name in ("TF_CPP_MIN_LOG_LEVEL", "SNAPSTORE_QUIET_TF"):
    child_env.pop(name, None)
  child_env.update(env)
  result = _child(code, child_env, stderr=subprocess.PIPE)
  assert result.returncode == 0, result.stderr
  return result.stderr


def _messages(stderr):
  """`stderr` without the time and thread of each C++ log line."""
  return re.sub(r"(?m)^[^\]\n]*\.cc:\d+\] ", "", stderr)


class QuietImportTest(unittest.TestCase):
  """SNAPSTORE_QUIET_TF=1 (the demo's and examples'): no start-up notices."""

  # What TF 2.21 (absl's format) and TF 2.15 write on a machine without a GPU.
  NOTICES = (
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n"
    "I0000 00:00:1796164485.486414   20890 port.cc:153] oneDNN custom "
    "operations are on. You may see slightly different numerical results.\n"
    "I0000 00:00:1796164485.486836   20890 cudart_stub.cc:31] Could not find "
    "cuda drivers on your machine, GPU will not be used.\n"
    "E0000 00:00:1796164507.302013   22009 cuda_platform.cc:52] failed call "
    "to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR "
    "(303)\n"
    "2026-12-01 22:39:35.138755: E external/local_xla/xla/stream_executor/"
    "cuda/cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered\n"
    "2026-12-01 22:39:35.159156: I tensorflow/core/platform/"
    "cpu_feature_guard.cc:182] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.\n"
    "To enable the following instructions: AVX2 FMA, in other operations, "
    "rebuild TensorFlow with the appropriate compiler flags.\n"
    "2026-12-01 22:39:36.436183: W tensorflow/compiler/tf2tensorrt/utils/"
    "py_utils.cc:38] TF-TRT Warning: Could not find TensorRT\n"
  )
  OTHERS = (
    "E0000 00:00:1796164507.302013   22009 op_kernel.cc:1830] OP_REQUIRES "
    "failed at example.cc:10: out of memory\n"
    "To enable the following instructions: a line of the program's own\n"
    "Traceback (most recent call last):\n"
  )

  def test_the_notices_are_dropped_and_nothing_else(self):
    self.assertEqual(_tf_startup.drop_notices(self.NOTICES), "")
    self.assertEqual(_tf_startup.drop_notices(self.OTHERS), self.OTHERS)
    self.assertEqual(
      _tf_startup.drop_notices(self.NOTICES + self.OTHERS + self.NOTICES),
      self.OTHERS,
    )

  def test_what_cpp_writes_in_the_block_comes_through_filtered(self):
    code = (
      "import os\n"
      "from snapstore import _tf_startup\n"
      "with _tf_startup.stderr_through(_tf_startup.drop_notices):\n"
      "  os.write(2, %r.encode())\n"
      "  print('from python', file=__import__('sys').stderr)\n"
      % (self.NOTICES + self.OTHERS)
    )
    self.assertEqual(
      _stderr_of(code, SNAPSTORE_QUIET_TF="1"), self.OTHERS + "from python\n"
    )

  def test_importing_snapstore_quietly_writes_nothing(self):
    code = (
      "import os, warnings\n"
      "import snapstore\n"
      "from snapstore._tf import tf\n"
      "tf.disable_v2_behavior()\n"  # TF 1.15's Python logger warns here
      "assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '2'\n"
    )
    self.assertEqual(_stderr_of(code, SNAPSTORE_QUIET_TF="1"), "")

  def test_without_it_tensorflow_writes_what_it_always_writes(self):
    self.assertEqual(
      _messages(_stderr_of("import snapstore")),
      _messages(_stderr_of("import tensorflow")),
    )


class EngineChoiceTest(unittest.TestCase):
  """`import snapstore` changes nothing in TF; each store picks its engine."""

  def test_import_leaves_tensorflow_s_mode_alone(self):
    code, out = _python("import tensorflow as tf\nimport snapstore\n" + _MODES)
    self.assertEqual(code, 0, out)
    if _tf.VERSION[0] >= 2:
      self.assertIn("modes True True True", out)  # TF 2.x's defaults
    else:
      self.assertIn("modes False False False", out)  # TF 1.15's

  def test_a_program_that_chose_graph_mode_keeps_its_settings(self):
    code, out = _python(
      "import tensorflow as tf\n"
      "tf.compat.v1.disable_eager_execution()\n"
      "tf.compat.v1.enable_resource_variables()\n"
      "tf.compat.v1.enable_control_flow_v2()\n"
      "import snapstore\n" + _MODES
    )
    self.assertEqual(code, 0, out)
    self.assertIn("modes False True True", out)

  @unittest.skipIf(_tf.VERSION[0] < 2, "the eager engine needs TF 2.15+")
  def test_a_store_built_eagerly_is_an_eager_store_graph_ones_stay_graph(self):
    code, out = _python(
      "import tensorflow as tf\n"
      "import snapstore\n"
      "v = tf.Variable(1.0)\n"
      "print('eager', snapstore.SnapshotStore(var_list=[v]).graph)\n"
      "with tf.Graph().as_default() as g:\n"
      "  w = tf.compat.v1.Variable(1.0, use_resource=True)\n"
      "  print('graph', snapstore.SnapshotStore(var_list=[w]).graph is g)\n"
    )
    self.assertEqual(code, 0, out)
    self.assertIn("eager None", out)
    self.assertIn("graph True", out)

  @unittest.skipIf(_tf.VERSION[0] >= 2, "TF 1.15 only")
  def test_eager_execution_on_tf_1_15_is_refused_with_the_fix(self):
    code, out = _python(
      "import tensorflow as tf\n"
      "tf.enable_eager_execution()\n"
      "import snapstore\n"
      "snapstore.SnapshotStore(var_list=[tf.Variable(1.0)])\n"
    )
    self.assertNotEqual(code, 0, out)
    self.assertIn("eager engine needs TensorFlow 2.15 or newer", out)


_KERAS_3_PROBE = """
import numpy as np
import keras
import snapstore
from snapstore._tf import tf
for what, make in (
    ("callback", lambda: snapstore.SnapshotCallback(every_n_batches=1)),
    ("variable", lambda: snapstore.SnapshotStore(
        var_list=[keras.Variable(np.zeros(3, np.float32), name="w")])),
    ("optimizer", lambda: snapstore.SnapshotStore(
        var_list=[tf.Variable(np.zeros(3, np.float32), name="v")],
        optimizer=keras.optimizers.SGD(0.1)))):
  with tf.Graph().as_default():
    try:
      make()
      print(what, "accepted")
    except Exception as e:  # pylint: disable=broad-except
      print(what, type(e).__name__, str(e).replace("\\n", " "))
"""


@unittest.skipUnless(
  _tf.VERSION >= (2, 16) and (_keras._keras_major() or 0) >= 3,  # pylint: disable=protected-access
  "Keras 3 exists only with TF 2.16+; here tf.keras is Keras 2",
)
class Keras3Test(unittest.TestCase):
  """Without TF_USE_LEGACY_KERAS=1, TF 2.16+'s tf.keras is Keras 3."""

  @classmethod
  def setUpClass(cls):
    super(Keras3Test, cls).setUpClass()
    code, out = _python(_KERAS_3_PROBE, keep_legacy_keras=False)
    assert code == 0, out
    cls.results = dict(
      line.split(" ", 1)
      for line in out.splitlines()
      if line.split(" ", 1)[0] in ("callback", "variable", "optimizer")
    )

  def _assert_refused(self, what, error, fragment):
    self.assertIn(what, self.results)
    message = self.results[what]
    self.assertTrue(message.startswith(error + " "), message)
    self.assertIn(fragment, message)
    self.assertIn("install tf-keras", message)
    self.assertIn("TF_USE_LEGACY_KERAS=1", message)

  def test_snapshot_callback_is_refused(self):
    self._assert_refused(
      "callback",
      "RuntimeError",
      "SnapshotCallback needs TF1-style Keras, but tf.keras is Keras 3 here",
    )

  def test_keras_3_variables_are_refused(self):
    self._assert_refused("variable", "TypeError", "a Keras 3 variable")

  def test_keras_3_optimizers_are_refused(self):
    self._assert_refused("optimizer", "TypeError", "is a Keras 3 optimizer")


if __name__ == "__main__":
  unittest.main()
