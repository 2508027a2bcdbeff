"""SnapshotHook in an Estimator trained under `ParameterServerStrategy` v1.

`RunConfig(train_distribute=tf.compat.v1.distribute.experimental.
ParameterServerStrategy())` with a `TF_CONFIG` of a chief and two ps tasks:
`tf.estimator.train_and_evaluate` runs the chief through TF's distribute
coordinator, which starts the chief's server and configures the strategy;
the variables (a sharded weight, its Momentum slots, the global step) live
on the ps tasks. The chief runs in a child process (`tests/ps_estimator.py`:
its server cannot be stopped in TF 1.15); the ps tasks are plain
`tf.train.Server` processes (`tests/cluster.py`), fresh for each test (a
chief finding its variables initialized would not initialize them).

Checked: the step with an infinite loss is rolled back, bit for bit, to the
trusted snapshot (every variable, shard, slot and the global step equal to
what they were after the step before it), every step that is not rolled
back is the Momentum update computed in numpy from the recorded values, and
each device shadow sits on its variable's ps task.
"""

import json
import os
import subprocess
import sys
import time
import unittest

from absl.testing import parameterized
import numpy as np

from snapstore._tf import tf
from tests import cluster as cluster_lib
from tests import helpers
from tests import ps_estimator as chief

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_KEYS = [  # sorted
  "global_step",
  "net/b",
  "net/b/Momentum",
  "net/w/part_0",
  "net/w/part_0/Momentum",
  "net/w/part_1",
  "net/w/part_1/Momentum",
]


def _momentum_step(values, x, y):
  """The values after one Momentum step on batch (x, y), in numpy (float32)."""
  w = np.concatenate([values["net/w/part_0"], values["net/w/part_1"]])
  residual = x.dot(w) + values["net/b"] - y
  grads = {
    "w": np.float32(2.0 / len(x)) * x.T.dot(residual),
    "b": np.float32(2.0 / len(x)) * residual.sum(),
  }
  grads["net/w/part_0"], grads["net/w/part_1"] = np.split(grads.pop("w"), 2)
  grads["net/b"] = grads.pop("b")
  out = {"global_step": values["global_step"] + 1}
  for name, grad in grads.items():
    accum = values[name + "/Momentum"] * np.float32(chief.MOMENTUM) + grad
    out[name + "/Momentum"] = accum
    out[name] = values[name] - np.float32(chief.LEARNING_RATE) * accum
  return out


def _stop(proc):
  if proc.poll() is None:
    proc.kill()
    proc.wait()
  if proc.stderr is not None:
    proc.stderr.close()


@unittest.skipUnless(
  hasattr(tf, "estimator"), "tf.estimator is gone from TensorFlow 2.16 on"
)
class PsEstimatorTest(tf.test.TestCase, parameterized.TestCase):
  def _cluster(self, unserved):
    """Two fresh ps tasks, in a spec that also names `unserved` tasks."""
    try:
      cluster = cluster_lib.LoopbackCluster({"ps": 2}, unserved=unserved)
    except cluster_lib.ClusterError as e:
      self.skipTest("loopback tf.train.Server processes did not start: %s" % e)
    self.addCleanup(cluster.close)
    return cluster

  def _start(self, spec, mode, task="chief", hooks="train_spec", meet=None):
    """Starts `task` of `spec` (tests/ps_estimator.py); returns (process, dir)."""
    out_dir = os.path.join(self.get_temp_dir(), task)
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    args = [json.dumps(spec), mode, out_dir, task, hooks] + (
      [meet] if meet else []
    )
    proc = subprocess.Popen(
      [sys.executable, "-m", "tests.ps_estimator"] + args,
      cwd=_ROOT,
      env=env,
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
    )
    self.addCleanup(_stop, proc)
    return proc, out_dir

  def _finish(self, proc, timeout=120):
    """Waits for `proc` (never past `timeout`); returns (status, stderr)."""
    try:
      _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      _stop(proc)
      self.fail("a task did not finish within %d s" % timeout)
    return proc.returncode, err.decode(errors="replace")

  def _report(self, out_dir):
    with open(os.path.join(out_dir, "report.json")) as f:
      report = json.load(f)
    with np.load(os.path.join(out_dir, "steps.npz")) as recorded:
      steps = {}
      for name in recorded.files:
        step, var = name.split("/", 1)
        steps.setdefault(step, {})[var] = recorded[name]
    return report, steps

  def _train(self, mode):
    """Runs the chief against two fresh ps tasks; returns (report, steps)."""
    cluster = self._cluster({"chief": 1})
    proc, out_dir = self._start(cluster.spec, mode)
    status, err = self._finish(proc)
    self.assertEqual(status, 0, "the chief failed:\n" + err[-3000:])
    return self._report(out_dir)

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_rolls_back_bit_exactly_on_the_ps_tasks(self, mode):
    report, steps = self._train(mode)
    self.assertEqual(report["strategy"], "ParameterServerStrategyV1")
    self.assertEqual(sorted(report["keys"]), _KEYS)
    self.assertEqual(report["rollbacks"], 1)
    # Every variable on a ps task, round-robin; the shards on both tasks.
    devices = report["devices"]
    self.assertEqual(sorted(devices), _KEYS)
    self.assertEqual(
      set(devices.values()), {"/job:ps/task:0", "/job:ps/task:1"}
    )
    self.assertNotEqual(devices["net/w/part_0"], devices["net/w/part_1"])
    if mode == "device":  # two slots and the scratch per variable
      self.assertLen(report["shadows"], 3 * len(_KEYS))
      for shadow, device in report["shadows"].items():
        self.assertEqual(device, devices[shadow.rsplit("/", 2)[0]], shadow)
    else:
      self.assertEqual(report["shadows"], {})

    x, y = chief.data()
    self.assertLen(steps, chief.BATCHES + 1)  # the start and 16 steps
    before = steps["start"]
    for step in range(chief.BATCHES):
      after = steps[str(step)]
      if step == chief.BAD_BATCH:
        # Rolled back to the trusted snapshot: the one taken before step 4
        # (every 2 steps), trusted after step 4's finite loss.
        helpers.assert_state(after, steps[str(step - 2)], "rollback")
        helpers.assert_state_differs(after, before)
      else:
        rows = slice(step * chief.BATCH, (step + 1) * chief.BATCH)
        expected = _momentum_step(before, x[rows], y[rows])
        self.assertEqual(sorted(after), sorted(expected))
        for name in expected:
          self.assertAllClose(
            after[name], expected[name], rtol=1e-5, atol=1e-6, msg=name
          )
      before = after
    self.assertEqual(steps[str(chief.BATCHES - 1)]["global_step"], 14)

  def test_refused_on_a_worker_that_is_not_the_chief(self):
    # Every worker's store keeps its shadows in the same ps variables: a
    # worker's snapshots would overwrite the chief's.
    cluster = self._cluster({"chief": 1, "worker": 1})
    proc, _ = self._start(cluster.spec, "device", task="worker")
    status, err = self._finish(proc, timeout=60)
    self.assertNotEqual(status, 0)
    for fragment in (
      "SnapshotHook runs on task worker:0",
      "not the chief",
      "overwrite the chief's",
      "EstimatorSpec(training_chief_hooks=[hook])",
    ):
      self.assertIn(fragment, err)

  def test_chief_only_hook_with_a_worker_training_alongside(self):
    # The fix the refusal names: the hook in the chief's hooks only. The
    # worker trains asynchronously on clean data; the chief rolls back its
    # bad step. (Not bit-exact: the worker's updates land in between.)
    cluster = self._cluster({"chief": 1, "worker": 1})
    meet = os.path.join(self.get_temp_dir(), "meet")
    os.makedirs(meet)
    chief_proc, out_dir = self._start(
      cluster.spec, "device", hooks="chief_only", meet=meet
    )
    deadline = time.time() + 60  # the chief has initialized the variables
    while not os.path.exists(os.path.join(meet, "chief")):
      self.assertIsNone(chief_proc.poll(), "the chief exited early")
      self.assertLess(time.time(), deadline, "the chief did not start")
      time.sleep(0.05)
    worker_proc, worker_dir = self._start(
      cluster.spec, "device", task="worker", hooks="chief_only", meet=meet
    )
    for proc, task in ((chief_proc, "chief"), (worker_proc, "worker")):
      status, err = self._finish(proc)
      self.assertEqual(status, 0, "the %s failed:\n%s" % (task, err[-3000:]))
    self.assertFalse(os.path.exists(os.path.join(worker_dir, "report.json")))
    report, steps = self._report(out_dir)
    self.assertEqual(sorted(report["keys"]), _KEYS)
    self.assertEqual(report["rollbacks"], 1)
    for name, value in steps[str(len(steps) - 2)].items():
      self.assertTrue(np.all(np.isfinite(value)), name)
