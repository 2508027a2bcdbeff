"""A parameter server restarting under eager `ParameterServerStrategy`.

Run by tests/eager/test_parameter_server.py as a script of its own (the
strategy connects this process's eager context to the cluster). Two
parameter servers in processes of their own (`tests/cluster.py`, so that
one can be restarted), a worker in this process; `w` sharded across both
servers, `b` on ps 0, `c` on ps 1. After ps 0 restarts (it comes back
empty, without this program's eager context):

- a device store over `w` and `b`: `restore` raises `SessionMismatchError`
  saying the snapshot's server restarted, and drops every device snapshot
  of the store; calling again, and `evaluate_with` and `arrays` of the
  other snapshot, are refused with the reason before anything runs (the
  function passed to `evaluate_with` is not called);
- a device store over `c` alone (on ps 1) restores bit for bit;
- a host store over `w` and `b`: `restore` raises `RestoreError` saying the
  server restarted (not "call restore again"), the snapshot stays, and
  `arrays` gives it bit for bit, to carry over.

Each check raises on failure; on success the script prints one line per
check and "ALL OK".

    python tests/eager/ps_restart.py
"""

import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import snapstore  # noqa: E402
from tests import cluster as cluster_lib  # noqa: E402

PS0 = "/job:ps/replica:0/task:0"


def _strategy(cluster):
  """A `ParameterServerStrategy` over `cluster`'s two servers and a worker
  served here, sharding variables into parts of at most 16 bytes."""
  spec = tf.train.ClusterSpec(cluster.spec)
  worker = tf.distribute.Server(spec, job_name="worker", task_index=0)
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    spec, rpc_layer="grpc"
  )
  partitioner = tf.distribute.experimental.partitioners.MaxSizePartitioner(
    max_shard_bytes=16
  )
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=partitioner
  )
  return worker, strategy


def _parts(variables):
  return [
    np.array(part.numpy(), copy=True)
    for v in variables
    for part in getattr(v, "variables", [v])
  ]


def _same(expected, actual, what):
  if [a.tobytes() for a in expected] != [a.tobytes() for a in actual]:
    raise AssertionError("%s: %s != %s" % (what, expected, actual))


def _raises(error, pattern, call, what):
  """Asserts that `call()` raises `error` with a message matching `pattern`
  (a regular expression, matched in full); returns the message."""
  try:
    call()
  except error as e:
    if not re.fullmatch(pattern, str(e), re.S):
      raise AssertionError("%s: %r does not match %r" % (what, str(e), pattern))
    return str(e)
  raise AssertionError("%s: no %s" % (what, error.__name__))


def _lost(tag):
  """The reason device snapshot `tag` was dropped (its server restarted)."""
  return re.escape(
    "Snapshot %r was a device snapshot, its copies on the parameter "
    "servers of its variables, and the parameter server %s has restarted "
    "since (TensorFlow: 'Unable to find a context_id'): the variables this "
    "program made there are gone, the snapshot's copies among them, so the "
    "store dropped it. The variables on that server are gone too: restart "
    "training from a checkpoint, as after any parameter server failure "
    "under ParameterServerStrategy. To keep snapshots through a server "
    "restart, use host or disk mode, or save_npz() or spill() them."
    % (tag, PS0)
  )


def main():
  cluster = cluster_lib.LoopbackCluster({"ps": 2}, unserved={"worker": 1})
  worker, strategy = _strategy(cluster)
  with strategy.scope():
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    b = tf.Variable(np.array([1.0, -0.0, np.nan], np.float32), name="b")
    c = tf.Variable(np.array([0.5, -2.0], np.float32), name="c")
  devices = [p.device for p in w.variables] + [b.device, c.device]
  if [d.split("/device:")[0] for d in devices] != [
    PS0,
    "/job:ps/replica:0/task:1",
    PS0,
    "/job:ps/replica:0/task:1",
  ]:
    raise AssertionError("placement: %s" % devices)
  device = snapstore.SnapshotStore(var_list=[w, b], max_to_keep=2, name="dev")
  beside = snapstore.SnapshotStore(var_list=[c], name="beside")
  host = snapstore.SnapshotStore(var_list=[w, b], mode="host", name="host")
  saved = dict(zip(["w/part_0", "w/part_1", "b"], _parts([w, b])))
  for store in (device, host):
    store.snapshot("a")
  beside.snapshot("a")
  saved_c = _parts([c])
  w.assign_add(tf.ones([2, 3]))
  c.assign([7.0, 8.0])
  device.snapshot("b")

  cluster.restart("ps", 0)

  _raises(
    snapstore.SessionMismatchError,
    _lost("a")
    + re.escape(
      " It dropped its other device snapshots too: 'b'. This restore may "
      "have written the variables on the other servers."
    ),
    lambda: device.restore("a"),
    "restore",
  )
  if device.tags() != [] or "a" in device or len(device):
    raise AssertionError("still listed: %s" % device.tags())
  # Refused before anything runs: the reason, not a TensorFlow error.
  _raises(
    snapstore.SessionMismatchError,
    _lost("a"),
    lambda: device.restore("a"),
    "restore again",
  )
  called = []
  _raises(
    snapstore.SessionMismatchError,
    _lost("b"),
    lambda: device.evaluate_with(lambda: called.append(1), tag="b"),
    "evaluate_with",
  )
  _raises(
    snapstore.SessionMismatchError,
    _lost("b"),
    lambda: device.arrays("b"),
    "arrays",
  )
  if called:
    raise AssertionError("evaluate_with called its function")
  print("device snapshots dropped: OK")

  beside.restore("a")
  _same(saved_c, _parts([c]), "the store on the other server")
  print("other server's store: OK")

  _raises(
    snapstore.RestoreError,
    re.escape(
      "restore of snapshot 'a' failed: the parameter server %s has "
      "restarted (TensorFlow: 'Unable to find a context_id'), so the "
      "variables this program made there are gone and nothing can be "
      "written into them or read from them. Snapshot 'a' is intact, in host "
      "memory or its file: after restarting training from a checkpoint, "
      "carry it over with new_store.load_arrays(store.arrays('a')). This "
      "restore may have written the variables on the other servers." % PS0
    ),
    lambda: host.restore("a"),
    "host restore",
  )
  if host.tags() != ["a"]:
    raise AssertionError("host tags: %s" % host.tags())
  _same(
    [saved[k] for k in host.keys], list(host.arrays("a").values()), "arrays"
  )
  print("host snapshot kept: OK")
  print("ALL OK")
  sys.stdout.flush()
  del worker
  cluster.close()
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
