#!/usr/bin/env python
"""Probe: where host-mode restore spends its time (not part of `make bench`).

Host mode restores by feeding the snapshot's numpy arrays into placeholders and
running one grouped assign, through `Session.make_callable(op, feed_list=...)`.
This probe times that path against two variants, on the same graph, with the
same values:

  store.restore()             snapstore as it is
  same op, fast callable      the same assign op and placeholders, through
                              `Session._make_callable_from_options` (TF 1.15's
                              `make_callable` with a feed_list just calls
                              `Session.run(fetches, feed_dict)`)
  same op, 64-byte aligned    the same values in 64-byte aligned arrays, fed
                              through store's own callable path

and reports how many of a host snapshot's arrays are 64-byte aligned, and the
fetch time and alignment of an alternative snapshot fetch (`array_ops.snapshot`
of each read, which makes TensorFlow hand its own buffer to numpy).

    .venv/bin/python bench/probe_host_restore.py                 # 256 MiB / 64 vars
    .venv/bin/python bench/probe_host_restore.py --size-mb 0.25  # per-call overhead
    .venv/bin/python bench/probe_host_restore.py --sharing-check # aligned feeds shared?
"""

import argparse
import importlib.util
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
from tensorflow.core.protobuf import config_pb2  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
from tensorflow.python.ops import array_ops  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

tf.logging.set_verbosity(tf.logging.ERROR)
ALIGN = 64  # TF 1.15 (CPU) feeds a numpy array without copying it only at this alignment (measured)


def aligned_copy(a, align=ALIGN):
  buf = np.empty(a.nbytes + align, np.uint8)
  off = (-buf.ctypes.data) % align
  out = buf[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
  out[...] = a
  return out


def timed(fn, n):
  out = []
  for _ in range(n):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    fn()
    out.append(
      (
        1e3 * (time.perf_counter() - t0),
        resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0,
      )
    )
  return out


def sharing_check():
  """Does a fed, 64-byte aligned array become a ResourceVariable's buffer?

  Feeds aligned and misaligned arrays into assigns of ResourceVariables, writes
  into the arrays afterwards (are they shared?), then runs an in-place update
  (does TensorFlow write into a shared array, or copy first?).
  """
  shape = (256, 1024)
  graph = tf.Graph()
  with graph.as_default():
    vs = [tf.Variable(tf.zeros(shape), use_resource=True) for _ in range(8)]
    phs = [tf.placeholder(tf.float32, shape) for _ in vs]
    assign = tf.group(*[v.assign(p) for v, p in zip(vs, phs)])
    bump = tf.group(*[v.assign_add(tf.ones(shape)) for v in vs])
    init = tf.global_variables_initializer()
  with tf.Session(graph=graph) as sess:
    sess.run(init)
    arrays = [aligned_copy(np.full(shape, 5.0, np.float32)) for _ in vs[:4]]
    for _ in vs[4:]:  # 16 bytes past a 64-byte boundary
      buf = np.empty(int(np.prod(shape)) * 4 + 128, np.uint8)
      off = (-buf.ctypes.data) % ALIGN + 16
      a = (
        buf[off : off + int(np.prod(shape)) * 4].view(np.float32).reshape(shape)
      )
      a[...] = 5.0
      arrays.append(a)
    sess.run(assign, dict(zip(phs, arrays)))
    for a in arrays:
      a[0, 0] = 7.0  # after the feed
    shared = [bool(v[0, 0] == 7.0) for v in sess.run(vs)]
    sess.run(bump)
    written = [bool(a[0, 1] != 5.0) for a in arrays]
  print(
    "ResourceVariable assign from fed arrays (4 aligned to 64 bytes, 4 not):"
  )
  print(
    "  array 64-byte aligned:          %s"
    % [a.ctypes.data % ALIGN == 0 for a in arrays]
  )
  print("  variable shares the array:      %s" % shared)
  print("  in-place update wrote the array: %s" % written)
  return 0


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size-mb", type=float, default=256.0)
  p.add_argument("--num-vars", type=int, default=64)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument(
    "--sharing-check",
    action="store_true",
    help="only check whether aligned feeds are shared (see sharing_check)",
  )
  args = p.parse_args()
  print("stack: %s" % stack(), flush=True)
  if args.sharing_check:
    return sharing_check()
  elems = int(args.size_mb * (1 << 20)) // 4 // args.num_vars
  shape = (elems // 1024, 1024) if elems % 1024 == 0 else (elems,)
  print(
    "probe_host_restore: %d x %s float32 (%.2f MiB), %d interleaved rounds, "
    "TF %s"
    % (
      args.num_vars,
      list(shape),
      args.num_vars * elems * 4 / 2**20,
      args.repeats,
      tf.__version__,
    )
  )
  for kind in ("ref", "resource"):
    graph = tf.Graph()
    with graph.as_default():
      tf.set_random_seed(0)
      vs = [
        tf.Variable(
          tf.random.uniform(shape),
          name="w%02d" % i,
          use_resource=kind == "resource",
        )
        for i in range(args.num_vars)
      ]
      store = snapstore.SnapshotStore(var_list=vs, mode="host", max_to_keep=1)
      zero = tf.Variable(
        tf.zeros(shape),
        trainable=False,
        collections=[tf.GraphKeys.LOCAL_VARIABLES],
        use_resource=kind == "resource",
      )
      update = tf.group(*[tf.assign_add(v, zero) for v in vs])
      snap_reads = [array_ops.snapshot(v.read_value()) for v in vs]
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    # The mode's own restore op and placeholders (read only, for this probe).
    mode = store._h.mode  # pylint: disable=protected-access
    load_op = mode._load_op  # pylint: disable=protected-access
    placeholders = mode._feeder.placeholders  # pylint: disable=protected-access
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      tag = store.snapshot(session=sess)
      arrays = list(store.arrays(tag).values())
      n_aligned = sum(a.ctypes.data % ALIGN == 0 for a in arrays)
      aligned = [aligned_copy(a) for a in arrays]
      for a in aligned:
        a.setflags(write=False)
      opts = config_pb2.CallableOptions(
        feed=[t.name for t in placeholders], target=[load_op.name]
      )
      fast = sess._make_callable_from_options(opts)  # pylint: disable=protected-access
      slow = sess.make_callable(load_op, feed_list=placeholders)
      fetch_snap = sess.make_callable(snap_reads)
      state = {}

      def fetch_with_snapshot_op():
        state["arrays"] = fetch_snap()

      methods = [
        ("store.restore()", lambda: store.restore(tag, session=sess)),
        ("same op, fast callable", lambda: fast(*arrays)),
        ("same op, 64-byte aligned arrays", lambda: slow(*aligned)),
        ("same op, aligned + fast callable", lambda: fast(*aligned)),
      ]
      results = {name: [] for name, _ in methods}
      upd = {name: [] for name, _ in methods}
      for r in range(args.repeats + 2):
        k = r % len(methods)
        for name, fn in methods[k:] + methods[:k]:
          t = timed(fn, 1)[0]
          u = timed(lambda: sess.run(update), 1)[0]  # pays any deferred copy
          if r >= 2:
            results[name].append(t)
            upd[name].append(u)
      steady = [t for t, _ in timed(lambda: sess.run(update), args.repeats)]
      host_fetch, snap_fetch = [], []
      for r in range(args.repeats + 2):  # interleaved, 2 warm-up rounds
        pair = [
          (host_fetch, lambda: store.snapshot(session=sess)),
          (snap_fetch, fetch_with_snapshot_op),
        ]
        for out, fn in pair if r % 2 == 0 else pair[::-1]:
          t = timed(fn, 1)[0]
          if r >= 2:
            out.append(t)
      n_snap_aligned = sum(a.ctypes.data % ALIGN == 0 for a in state["arrays"])
      owns = state["arrays"][0].flags.owndata
    print()
    print("== %s variables ==" % kind)
    print(
      "host snapshot arrays 64-byte aligned: %d of %d"
      % (n_aligned, len(arrays))
    )
    print(
      "%-36s %10s %8s %11s %18s"
      % ("restore path", "median ms", "min ms", "minflt/call", "next update ms")
    )
    for name, _ in methods:
      ts = [t for t, _ in results[name]]
      print(
        "%-36s %10.2f %8.2f %11d %18.2f"
        % (
          name,
          statistics.median(ts),
          min(ts),
          statistics.median([f for _, f in results[name]]),
          statistics.median([t for t, _ in upd[name]]),
        )
      )
    print(
      "%-36s %10s %8s %11s %18.2f"
      % ("(update alone, steady)", "", "", "", statistics.median(steady))
    )
    print(
      "%-36s %10s %8s %11s"
      % ("snapshot fetch (interleaved)", "median ms", "min ms", "minflt/call")
    )
    for label, samples in (
      ("store.snapshot()", host_fetch),
      ("fetch of array_ops.snapshot(read)", snap_fetch),
    ):
      ts = [t for t, _ in samples]
      print(
        "%-36s %10.2f %8.2f %11d"
        % (
          label,
          statistics.median(ts),
          min(ts),
          statistics.median([f for _, f in samples]),
        )
      )
    print(
      "arrays from array_ops.snapshot fetch: %d of %d 64-byte aligned, "
      "owndata=%s (numpy wraps TensorFlow's buffer)"
      % (n_snap_aligned, len(state["arrays"]), owns)
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
