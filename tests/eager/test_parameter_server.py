"""Parameter-server training (v2): a store over a `ClusterCoordinator` job.

The cluster runs in a process of its own (tests/eager/ps_cluster.py, which
says what it checks): a `ParameterServerStrategy` connects the eager context
of its process to the cluster, which the other tests must not see.
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.eager import common

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_NO_PSS = not hasattr(tf.distribute.experimental, "ParameterServerStrategy")


def _run(script, *args):
  """Runs `script` in a process of its own; returns its stdout, checked."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
    [_ROOT] + [p for p in [env.get("PYTHONPATH")] if p]
  )
  proc = subprocess.run(
    [sys.executable, os.path.join(_HERE, script)] + list(args),
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0 and "ALL OK" in proc.stdout, (
    proc.stdout + proc.stderr[-4000:]
  )
  return proc.stdout


@pytest.mark.skipif(_NO_PSS, reason="no ParameterServerStrategy (v2) here")
def test_shards_and_variables_on_parameter_servers_in_every_mode(tmp_path):
  out = _run("ps_cluster.py", str(tmp_path))
  for mode in ("device", "host", "disk"):
    assert "%s: OK" % mode in out
  # MovingAverage and Lookahead over a sharded variable equal numpy, and
  # refuse to update while scheduled steps may run.
  assert "averages: OK" in out
  # Guard and Trial roll a block's scheduled steps back bit for bit, waiting
  # for those still running, and refuse to enter while earlier ones may run.
  assert "guards: OK" in out
  # evaluate_with and restore inside a scheduled function find the tag's
  # slot when a worker runs it; a host store there is refused when traced.
  assert "traced: OK" in out
  if not common.KERAS_3:  # tf-keras's fit, SnapshotCallback on two workers
    assert "fit on two workers: OK" in out


@pytest.mark.skipif(_NO_PSS, reason="no ParameterServerStrategy (v2) here")
@pytest.mark.skipif(
  common.KERAS_3,
  reason="Keras 3's fit does not run under ParameterServerStrategy, "
  "without snapstore (ValueError: To use this dataset, you need to pass "
  "this dataset to ClusterCoordinator.create_per_worker_dataset); tf-keras "
  "and Keras 2 schedule fit's steps on a ClusterCoordinator",
)
def test_snapshot_callback_in_fit_rolls_back_exactly():
  # every_n_batches=1: a NaN batch rolled back bit for bit against a fit
  # without it; in_step=True refused with its message (ps_fit.py's doc).
  out = _run("ps_fit.py")
  assert "every_n_batches rollback: OK" in out
  assert "monitor=None snapshots: OK" in out
  assert "in_step refused: OK" in out


@pytest.mark.skipif(_NO_PSS, reason="no ParameterServerStrategy (v2) here")
def test_restarted_parameter_server_drops_its_device_snapshots():
  # ps_restart.py's doc: after ps 0 restarts, a device snapshot there is
  # dropped with SessionMismatchError and refused afterwards, before
  # anything runs; a store on ps 1 restores exactly; a host restore says
  # the server restarted, and the host snapshot stays, bit for bit.
  out = _run("ps_restart.py")
  assert "device snapshots dropped: OK" in out
  assert "other server's store: OK" in out
  assert "host snapshot kept: OK" in out
