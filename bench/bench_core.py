#!/usr/bin/env python
"""Benchmark: snapshot and restore in snapstore's device and host modes vs baselines.

Measured on one model (default: 256 MiB of float32 in 64 variables), in one
process, one graph and one session per variable kind (RefVariable, then
ResourceVariable):

  device snapshot / restore      SnapshotStore(mode="device", max_to_keep=1):
                                 store.snapshot() / store.restore(tag)
  hand-written snapshot / restore  what a user writes without snapstore: one
                                 non-trainable shadow per variable, created in
                                 colocate_with(var), and
                                 sess.run(tf.group(*[tf.assign(s, v)...])) and
                                 the reverse, both ops built once
  host snapshot / restore        SnapshotStore(mode="host", max_to_keep=1)
  naive fetch / naive load       snap = sess.run(var_list), and
                                 v.load(value, sess) for every variable
  Saver save / restore           tf.train.Saver(var_list) save (without meta
                                 graph) and restore, to a temporary directory

and, as references that explain the figures (no targets):

  sess.run(store.slots.snapshot_op(0)) / sess.run(store.slots.restore_op(0))
                                 snapstore's device ops run by hand: device
                                 mode without its Python layer
  update (steady)                one in-place write of every variable
                                 (assign_add of a zero variable), as a training
                                 step does
  update after ...               the same write right after a snapshot/restore
                                 method. With ResourceVariables an assign of a
                                 whole tensor can share the source's buffer
                                 (copy on write), so the copy moves into this
                                 first write; its extra cost over the steady
                                 update is reported next to the targets
  numpy copy ...                 a plain numpy copy of the same 64 arrays: into
                                 preallocated buffers (1 thread, and one thread
                                 per CPU) and into new arrays (the previous
                                 copy kept alive until replaced, like a fetch)
  session.run(no_op)             the fixed cost of one session.run

Methods are interleaved (every round runs every method once, each round starting
at the next group of methods) after warm-up rounds; median, min and max over
rounds are reported, with the process's minor page faults per call (getrusage).
Snapshots are kept as a user keeps them: the naive fetch's arrays replace the
previous fetch's arrays once the new fetch is complete, and both stores use
max_to_keep=1, so each new snapshot is taken while the previous one is alive
and then replaces it.

The cost of a fetch depends on whether malloc hands out memory it already has
(warm) or new pages from the kernel (page faults). Inside the interleaved loop
the heap is large and warm. `--fresh-process N` therefore also runs host
snapshot, naive fetch and a numpy copy N times in a row, each in a new process
that holds only the model, and prints every call's time and page faults.

    .venv/bin/python bench/bench_core.py                  # both kinds
    .venv/bin/python bench/bench_core.py --resource       # ResourceVariable only
    .venv/bin/python bench/bench_core.py --size-mb 64 --num-vars 16 --repeats 5
    .venv/bin/python bench/bench_core.py --json bench/results/core.json
    .venv-tf2/bin/python bench/bench_core.py --gpu   # variables on /gpu:0

`--load N` runs N busy processes (`bench/busy_load.py`; `--load-kind spin`,
`matmul` or `memcpy`) for the whole run, so that "busy" is a defined load;
the output says what ran and the load average at the start and the end:

    .venv/bin/python bench/bench_core.py --load 2         # 2 busy loops

`--gpu` puts the model's variables (and so the device shadows, colocated with
them) on /gpu:0, checks in a traced run that device mode's copies ran there,
and measures the same table; fresh processes are not run. Where TensorFlow sees
no GPU it prints that it skipped and why, and measures nothing.
"""

import argparse
import collections
import concurrent.futures
import datetime
import gc
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top

import busy_load  # pylint: disable=g-import-not-at-top
import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

tf.logging.set_verbosity(tf.logging.ERROR)

MiB = 1 << 20
THREADS = os.cpu_count() or 1

# Row names.
DEVICE_SNAPSHOT = "device snapshot"
DEVICE_RESTORE = "device restore"
HAND_SNAPSHOT = "hand-written snapshot"
HAND_RESTORE = "hand-written restore"
HOST_SNAPSHOT = "host snapshot"
HOST_RESTORE = "host restore"
NAIVE_FETCH = "naive fetch (sess.run)"
NAIVE_LOAD = "naive load (Variable.load)"
SAVER_SAVE = "Saver save"
SAVER_RESTORE = "Saver restore"
RAW_SNAPSHOT = "sess.run(store.slots.snapshot_op(0))"
RAW_RESTORE = "sess.run(store.slots.restore_op(0))"
UPDATE = "update (steady)"
UPDATE_AFTER_DEV_SNAP = "update after device snapshot"
UPDATE_AFTER_DEV_REST = "update after device restore"
UPDATE_AFTER_HAND_SNAP = "update after hand-written snapshot"
UPDATE_AFTER_HAND_REST = "update after hand-written restore"
UPDATE_AFTER_HOST_REST = "update after host restore"
UPDATE_AFTER_NAIVE_LOAD = "update after naive load"
UPDATE_AFTER_SAVER_REST = "update after Saver restore"
NUMPY_WARM = "numpy copy into warm buffers"
NUMPY_WARM_MT = "numpy copy into warm buffers, %d threads" % THREADS
NUMPY_FRESH = "numpy copy into fresh arrays"
NO_OP = "session.run(no_op)"

# Methods run again in fresh processes (--fresh-process), and their rows.
CHILD_METHODS = ("host", "naive", "numpy")
CHILD_ROWS = {"host": HOST_SNAPSHOT, "naive": NAIVE_FETCH, "numpy": NUMPY_FRESH}

# Rows that copy the whole model once (GiB/s is shown for them).
COPY_ROWS = {
  DEVICE_SNAPSHOT,
  DEVICE_RESTORE,
  HAND_SNAPSHOT,
  HAND_RESTORE,
  HOST_SNAPSHOT,
  HOST_RESTORE,
  NAIVE_FETCH,
  NAIVE_LOAD,
  SAVER_SAVE,
  SAVER_RESTORE,
  RAW_SNAPSHOT,
  RAW_RESTORE,
  NUMPY_WARM,
  NUMPY_WARM_MT,
  NUMPY_FRESH,
}


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument(
    "--size-mb",
    type=float,
    default=256.0,
    help="model size in MiB (default 256)",
  )
  p.add_argument(
    "--num-vars",
    type=int,
    default=64,
    help="number of float32 variables of equal size (default 64)",
  )
  p.add_argument(
    "--repeats",
    type=int,
    default=25,
    help="timed rounds per variable kind (default 25)",
  )
  p.add_argument(
    "--warmup",
    type=int,
    default=2,
    help="untimed rounds before timing (default 2)",
  )
  kind = p.add_mutually_exclusive_group()
  kind.add_argument(
    "--resource",
    dest="kinds",
    action="store_const",
    const=["resource"],
    help="ResourceVariables only",
  )
  kind.add_argument(
    "--ref",
    dest="kinds",
    action="store_const",
    const=["ref"],
    help="RefVariables only",
  )
  p.add_argument(
    "--fresh-process",
    type=int,
    default=8,
    metavar="N",
    help="also run host snapshot, naive fetch and the numpy copy "
    "into fresh arrays N times in a row, each in a new "
    "process holding only the model (default 8; 0 skips)",
  )
  p.add_argument("--child", choices=CHILD_METHODS, help=argparse.SUPPRESS)
  p.add_argument(
    "--child-kind", choices=["ref", "resource"], help=argparse.SUPPRESS
  )
  p.add_argument(
    "--ckpt-dir",
    default=None,
    help="parent directory of the Saver's temporary checkpoint "
    "directory (default: the system temp dir)",
  )
  p.add_argument(
    "--json",
    metavar="PATH",
    default=None,
    help="write raw timings, configuration and ratios to PATH",
  )
  p.add_argument(
    "--gpu",
    action="store_true",
    help="put the variables on /gpu:0 (skips, saying so, where "
    "TensorFlow sees no GPU)",
  )
  busy_load.add_arguments(p)
  args = p.parse_args(argv)
  if not args.kinds:
    args.kinds = ["ref", "resource"]
  if (
    args.size_mb <= 0
    or args.num_vars < 1
    or args.repeats < 1
    or args.warmup < 0
  ):
    p.error("--size-mb, --num-vars, --repeats must be positive, --warmup >= 0")
  return args


def var_shape(total_bytes, num_vars):
  elems = int(total_bytes) // 4 // num_vars
  if elems < 1:
    raise SystemExit("--size-mb too small for --num-vars")
  if elems % 1024 == 0:
    return (elems // 1024, 1024)
  return (elems,)


def fs_of(path):
  """(mount point, fs type) holding `path`, from /proc/mounts (Linux)."""
  best = ("?", "?")
  try:
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
      for line in f:
        parts = line.split()
        mnt, fstype = parts[1], parts[2]
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(
          mnt
        ) >= len(best[0] if best[0] != "?" else ""):
          best = (mnt, fstype)
  except OSError:
    pass
  return best


class Bench(object):
  """One graph, one session, every method for one variable kind."""

  def __init__(self, kind, shape, num_vars, ckpt_parent, device=None):
    self.kind = kind
    use_resource = kind == "resource"
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(0)
      with tf.device(device):  # shadows and copies follow by colocation
        self.vars = [
          tf.Variable(
            tf.random.uniform(shape),
            name="w%02d" % i,
            use_resource=use_resource,
          )
          for i in range(num_vars)
        ]
      # snapstore, as the issue describes: built with the model.
      self.dev = snapstore.SnapshotStore(
        var_list=self.vars, mode="device", max_to_keep=1, name="dev_store"
      )
      self.host = snapstore.SnapshotStore(
        var_list=self.vars, mode="host", max_to_keep=1, name="host_store"
      )
      # Hand-written baseline: non-trainable colocated shadows, grouped assigns.
      shadows = []
      for v in self.vars:
        with tf.colocate_with(v):
          shadows.append(
            tf.Variable(
              tf.zeros(shape),
              trainable=False,
              name=v.op.name + "_shadow",
              collections=[tf.GraphKeys.LOCAL_VARIABLES],
              use_resource=use_resource,
            )
          )
      self.hand_snapshot = tf.group(
        *[tf.assign(s, v) for s, v in zip(shadows, self.vars)],
        name="hand_snapshot",
      )
      self.hand_restore = tf.group(
        *[tf.assign(v, s) for s, v in zip(shadows, self.vars)],
        name="hand_restore",
      )
      # An in-place write of every variable (values unchanged), like a train step.
      with tf.device(device):
        zero = tf.Variable(
          tf.zeros(shape),
          trainable=False,
          name="zero",
          collections=[tf.GraphKeys.LOCAL_VARIABLES],
          use_resource=use_resource,
        )
      self.update = tf.group(
        *[tf.assign_add(v, zero) for v in self.vars], name="update"
      )
      self.saver = tf.train.Saver(
        var_list=self.vars, max_to_keep=1, name="bench_saver"
      )
      self.no_op = tf.no_op(name="bench_no_op")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
      self.dev_snapshot_op = self.dev.slots.snapshot_op(0)
      self.dev_restore_op = self.dev.slots.restore_op(0)
    self.graph.finalize()
    self.sess = tf.Session(graph=self.graph)
    self.sess.run(init)
    self.initial = self.sess.run(self.vars)  # for the final bit-exact check
    self.nbytes = self.dev.param_nbytes
    self.ckpt_dir = tempfile.mkdtemp(prefix="snapstore-bench-", dir=ckpt_parent)
    self.ckpt_prefix = os.path.join(self.ckpt_dir, "model.ckpt")
    # State a user would hold between calls.
    self.dev_tag = None
    self.host_tag = None
    self.naive = None
    self.np_fresh = None
    self.np_src = [a.copy() for a in self.initial]
    self.np_warm = [np.empty_like(a) for a in self.initial]
    self.threads = THREADS
    self.pool = concurrent.futures.ThreadPoolExecutor(self.threads)

  # Each group is a list of (row name, callable); groups keep their order (a
  # restore needs its snapshot), groups rotate from round to round.
  def groups(self):
    s = self.sess
    return [
      [
        (DEVICE_SNAPSHOT, self._dev_snapshot),
        (UPDATE_AFTER_DEV_SNAP, lambda: s.run(self.update)),
        (DEVICE_RESTORE, self._dev_restore),
        (UPDATE_AFTER_DEV_REST, lambda: s.run(self.update)),
      ],
      [
        (HAND_SNAPSHOT, lambda: s.run(self.hand_snapshot)),
        (UPDATE_AFTER_HAND_SNAP, lambda: s.run(self.update)),
        (HAND_RESTORE, lambda: s.run(self.hand_restore)),
        (UPDATE_AFTER_HAND_REST, lambda: s.run(self.update)),
      ],
      [
        (HOST_SNAPSHOT, self._host_snapshot),
        (HOST_RESTORE, self._host_restore),
        (UPDATE_AFTER_HOST_REST, lambda: s.run(self.update)),
      ],
      [
        (NAIVE_FETCH, self._naive_fetch),
        (NAIVE_LOAD, self._naive_load),
        (UPDATE_AFTER_NAIVE_LOAD, lambda: s.run(self.update)),
      ],
      [
        (SAVER_SAVE, self._saver_save),
        (SAVER_RESTORE, self._saver_restore),
        (UPDATE_AFTER_SAVER_REST, lambda: s.run(self.update)),
      ],
      [
        (RAW_SNAPSHOT, lambda: s.run(self.dev_snapshot_op)),
        (RAW_RESTORE, lambda: s.run(self.dev_restore_op)),
        (None, lambda: s.run(self.update)),
      ],  # untimed: unshare buffers
      [(UPDATE, lambda: s.run(self.update))],
      [(NUMPY_WARM, self._numpy_warm)],
      [(NUMPY_WARM_MT, self._numpy_warm_mt)],
      [(NUMPY_FRESH, self._numpy_fresh)],
      [(NO_OP, lambda: s.run(self.no_op))],
    ]

  def _dev_snapshot(self):
    self.dev_tag = self.dev.snapshot(session=self.sess)

  def _dev_restore(self):
    self.dev.restore(self.dev_tag, session=self.sess)

  def _host_snapshot(self):
    self.host_tag = self.host.snapshot(session=self.sess)

  def _host_restore(self):
    self.host.restore(self.host_tag, session=self.sess)

  def _naive_fetch(self):
    # Replaces the previous fetch only once the new one is complete, as
    # `snap = sess.run(var_list)` does.
    self.naive = self.sess.run(self.vars)

  def _naive_load(self):
    for v, value in zip(self.vars, self.naive):
      v.load(value, self.sess)

  def _saver_save(self):
    self.saver.save(
      self.sess, self.ckpt_prefix, write_meta_graph=False, write_state=False
    )

  def _saver_restore(self):
    self.saver.restore(self.sess, self.ckpt_prefix)

  def _numpy_warm(self):
    for dst, src in zip(self.np_warm, self.np_src):
      np.copyto(dst, src)

  def _numpy_warm_mt(self):
    # np.copyto releases the GIL; one slice of the variables per thread.
    n = self.threads
    list(
      self.pool.map(
        lambda k: [
          np.copyto(d, src)
          for d, src in zip(self.np_warm[k::n], self.np_src[k::n])
        ],
        range(n),
      )
    )

  def _numpy_fresh(self):
    self.np_fresh = [a.copy() for a in self.np_src]

  def copy_devices(self):
    """{device: number of copies} of device mode's snapshot and restore assigns.

    From one traced run of each op: where the placer really ran them.
    """
    counts = collections.Counter()
    for op in (self.dev_snapshot_op, self.dev_restore_op):
      metadata = tf.RunMetadata()
      self.sess.run(
        op,
        options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
        run_metadata=metadata,
      )
      copies = set(c.name for c in op.control_inputs)
      for dev in metadata.step_stats.dev_stats:
        counts.update(
          dev.device for n in dev.node_stats if n.node_name in copies
        )
    return dict(counts)

  def check_unchanged(self):
    now = self.sess.run(self.vars)
    return all(a.tobytes() == b.tobytes() for a, b in zip(now, self.initial))

  def close(self):
    self.pool.shutdown()
    self.sess.close()
    self.dev.close()
    self.host.close()
    shutil.rmtree(self.ckpt_dir, ignore_errors=True)


def run_rounds(bench, repeats, warmup, log):
  """Times every method `repeats` times, interleaved. Returns {row: [(s, minflt)]}."""
  groups = bench.groups()
  results = {name: [] for g in groups for name, _ in g if name is not None}
  for r in range(warmup + repeats):
    timed = r >= warmup
    k = r % len(groups)
    for group in groups[k:] + groups[:k]:
      for name, fn in group:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        if timed and name is not None:
          results[name].append((dt, faults))
    log(
      "  round %d/%d%s"
      % (r + 1, warmup + repeats, "" if timed else " (warm-up)")
    )
  return results


def summarize(results, nbytes):
  rows = {}
  for name, samples in results.items():
    times = [t for t, _ in samples]
    faults = [f for _, f in samples]
    med = statistics.median(times)
    rows[name] = {
      "_samples": samples,
      "median_ms": 1e3 * med,
      "min_ms": 1e3 * min(times),
      "max_ms": 1e3 * max(times),
      "median_minflt": statistics.median(faults),
      "gib_per_s": (nbytes / med / (1 << 30))
      if name in COPY_ROWS and med > 0
      else None,
    }
  return rows


def _public(rows):
  return {
    n: {k: v for k, v in r.items() if not k.startswith("_")}
    for n, r in rows.items()
  }


def paired_median(results, names):
  """Median over rounds of the per-round sum of `names` (same round, same order)."""
  sums = [
    sum(results[n][i][0] for n in names) for i in range(len(results[names[0]]))
  ]
  return 1e3 * statistics.median(sums)


def paired_min(results, names):
  sums = [
    sum(results[n][i][0] for n in names) for i in range(len(results[names[0]]))
  ]
  return 1e3 * min(sums)


def ratios(results, rows):
  """The issue's targets: (label, value from medians, value from mins, bound, ok)."""
  med = lambda n: rows[n]["median_ms"]
  mn = lambda n: rows[n]["min_ms"]
  saver = [SAVER_SAVE, SAVER_RESTORE]
  dev = [DEVICE_SNAPSHOT, DEVICE_RESTORE]
  host = [HOST_SNAPSHOT, HOST_RESTORE]
  out = []

  def add(label, value, value_min, op, bound):
    ok = value <= bound if op == "<=" else value >= bound
    out.append(
      {
        "target": label,
        "ratio_median": value,
        "ratio_min": value_min,
        "bound": "%s %gx" % (op, bound),
        "pass": ok,
      }
    )

  add(
    "device snapshot / hand-written snapshot",
    med(DEVICE_SNAPSHOT) / med(HAND_SNAPSHOT),
    mn(DEVICE_SNAPSHOT) / mn(HAND_SNAPSHOT),
    "<=",
    1.1,
  )
  add(
    "device restore / hand-written restore",
    med(DEVICE_RESTORE) / med(HAND_RESTORE),
    mn(DEVICE_RESTORE) / mn(HAND_RESTORE),
    "<=",
    1.1,
  )
  add(
    "naive fetch / host snapshot",
    med(NAIVE_FETCH) / med(HOST_SNAPSHOT),
    mn(NAIVE_FETCH) / mn(HOST_SNAPSHOT),
    ">=",
    2,
  )
  add(
    "Saver save+restore / device snapshot+restore",
    paired_median(results, saver) / paired_median(results, dev),
    paired_min(results, saver) / paired_min(results, dev),
    ">=",
    30,
  )
  add(
    "Saver save+restore / host snapshot+restore",
    paired_median(results, saver) / paired_median(results, host),
    paired_min(results, saver) / paired_min(results, host),
    ">=",
    5,
  )
  return out


def extras(results, rows):
  """Figures that explain the targets (no bounds)."""
  med = lambda n: rows[n]["median_ms"]
  pen = lambda n: med(n) - med(UPDATE)
  deferred = {
    "device": pen(UPDATE_AFTER_DEV_SNAP) + pen(UPDATE_AFTER_DEV_REST),
    "hand-written": pen(UPDATE_AFTER_HAND_SNAP) + pen(UPDATE_AFTER_HAND_REST),
    "host": pen(UPDATE_AFTER_HOST_REST),
    "naive": pen(UPDATE_AFTER_NAIVE_LOAD),
    "Saver": pen(UPDATE_AFTER_SAVER_REST),
  }
  saver = (
    paired_median(results, [SAVER_SAVE, SAVER_RESTORE]) + deferred["Saver"]
  )
  dev = (
    paired_median(results, [DEVICE_SNAPSHOT, DEVICE_RESTORE])
    + deferred["device"]
  )
  hand = (
    paired_median(results, [HAND_SNAPSHOT, HAND_RESTORE])
    + deferred["hand-written"]
  )
  host = (
    paired_median(results, [HOST_SNAPSHOT, HOST_RESTORE]) + deferred["host"]
  )
  out = collections.OrderedDict()
  out["naive load / host restore"] = med(NAIVE_LOAD) / med(HOST_RESTORE)
  out["host snapshot / numpy copy into fresh arrays"] = med(
    HOST_SNAPSHOT
  ) / med(NUMPY_FRESH)
  out["host snapshot / numpy copy into warm buffers"] = med(
    HOST_SNAPSHOT
  ) / med(NUMPY_WARM)
  out["host restore / numpy copy into warm buffers"] = med(HOST_RESTORE) / med(
    NUMPY_WARM
  )
  # A ResourceVariable restore may adopt the fed buffer and leave its copy
  # to the next write: counted here, the restore's whole cost.
  out["host restore + its deferred copy / numpy copy into warm buffers"] = (
    med(HOST_RESTORE) + max(0.0, deferred["host"])
  ) / med(NUMPY_WARM)
  # The same ratios per round (each round runs both), then the median: less
  # exposed to a burst of load that hits one method's calls only.
  for row in (HOST_SNAPSHOT, HOST_RESTORE):
    out[
      "%s / numpy copy into warm buffers, median of per-round ratios" % row
    ] = statistics.median(
      a[0] / b[0] for a, b in zip(results[row], results[NUMPY_WARM])
    )
  out["device snapshot - sess.run(snapshot_op) [ms]"] = med(
    DEVICE_SNAPSHOT
  ) - med(RAW_SNAPSHOT)
  out["device restore - sess.run(restore_op) [ms]"] = med(DEVICE_RESTORE) - med(
    RAW_RESTORE
  )
  for who, cost in deferred.items():
    out[
      "first update's extra cost after %s [ms]"
      % {
        "device": "device snapshot+restore",
        "hand-written": "hand-written snapshot+restore",
        "host": "host restore",
        "naive": "naive load",
        "Saver": "Saver restore",
      }[who]
    ] = cost
  out["with those costs: device / hand-written (snapshot+restore)"] = dev / hand
  out["with those costs: Saver / device (snapshot+restore)"] = saver / dev
  out["with those costs: Saver / host (snapshot+restore)"] = saver / host
  return out


def child_main(args):
  """Runs one fetch-like method --fresh-process times in a new process.

  The process holds only the model (and, for "host", a host-mode store), so the
  allocator starts from a heap that nothing else has grown: the situation of a
  program that does little besides taking snapshots.
  """
  shape = var_shape(int(args.size_mb * MiB), args.num_vars)
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    variables = [
      tf.Variable(
        tf.random.uniform(shape),
        name="w%02d" % i,
        use_resource=args.child_kind == "resource",
      )
      for i in range(args.num_vars)
    ]
    store = (
      snapstore.SnapshotStore(var_list=variables, mode="host", max_to_keep=1)
      if args.child == "host"
      else None
    )
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()
  state = {}
  with tf.Session(graph=graph) as sess:
    sess.run(init)
    if args.child == "host":
      fn = lambda: store.snapshot(session=sess)
    elif args.child == "naive":

      def fn():
        state["snap"] = sess.run(variables)
    else:
      src = sess.run(variables)

      def fn():
        state["snap"] = [a.copy() for a in src]

    samples = []
    for _ in range(args.fresh_process):
      f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      t0 = time.perf_counter()
      fn()
      dt = time.perf_counter() - t0
      samples.append(
        (dt, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
      )
  print("CHILD_RESULT " + json.dumps(samples))
  return 0


def run_fresh_processes(kind, args, log):
  """{row: [(s, minflt)]}: every call of each method, from its own process."""
  results = {}
  for method in CHILD_METHODS:
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      "--child",
      method,
      "--child-kind",
      kind,
      "--size-mb",
      repr(args.size_mb),
      "--num-vars",
      str(args.num_vars),
      "--fresh-process",
      str(args.fresh_process),
    ]
    out = subprocess.run(
      cmd, stdout=subprocess.PIPE, check=True, universal_newlines=True
    ).stdout
    line = [l for l in out.splitlines() if l.startswith("CHILD_RESULT ")][-1]
    results[CHILD_ROWS[method]] = [
      tuple(x) for x in json.loads(line[len("CHILD_RESULT ") :])
    ]
    log("  fresh process: %s x%d" % (CHILD_ROWS[method], args.fresh_process))
  return results


KIND_TITLES = {
  "ref": "RefVariable (tf.Variable(use_resource=False))",
  "resource": "ResourceVariable (tf.Variable(use_resource=True))",
}

ROW_ORDER = [
  DEVICE_SNAPSHOT,
  HAND_SNAPSHOT,
  DEVICE_RESTORE,
  HAND_RESTORE,
  HOST_SNAPSHOT,
  NAIVE_FETCH,
  HOST_RESTORE,
  NAIVE_LOAD,
  SAVER_SAVE,
  SAVER_RESTORE,
  None,
  RAW_SNAPSHOT,
  RAW_RESTORE,
  UPDATE,
  UPDATE_AFTER_DEV_SNAP,
  UPDATE_AFTER_DEV_REST,
  UPDATE_AFTER_HAND_SNAP,
  UPDATE_AFTER_HAND_REST,
  UPDATE_AFTER_HOST_REST,
  UPDATE_AFTER_NAIVE_LOAD,
  UPDATE_AFTER_SAVER_REST,
  NUMPY_WARM,
  NUMPY_WARM_MT,
  NUMPY_FRESH,
  NO_OP,
]


def _row_line(name, r):
  return "%-40s %9.2f %9.2f %9.2f %7s %11d" % (
    name,
    r["median_ms"],
    r["min_ms"],
    r["max_ms"],
    "%.2f" % r["gib_per_s"] if r["gib_per_s"] is not None else "-",
    r["median_minflt"],
  )


def format_kind(rows, targets, extra, fresh_rows):
  lines = []
  header = "%-40s %9s %9s %9s %7s %11s" % (
    "method",
    "median ms",
    "min ms",
    "max ms",
    "GiB/s",
    "minflt/call",
  )
  lines.append(header)
  for name in ROW_ORDER:
    if name is None:
      lines.append("  -- references (no targets) --")
      continue
    lines.append(_row_line(name, rows[name]))
  lines.append("")
  lines.append(
    "%-46s %9s %9s %8s  %s"
    % (
      "target (ratio of medians; of mins)",
      "median",
      "min",
      "target",
      "result",
    )
  )
  for t in targets:
    lines.append(
      "%-46s %8.2fx %8.2fx %8s  %s"
      % (
        t["target"],
        t["ratio_median"],
        t["ratio_min"],
        t["bound"],
        "PASS" if t["pass"] else "MISS",
      )
    )
  lines.append("")
  lines.append("explanatory figures (from medians):")
  for label, value in extra.items():
    unit = "" if "[ms]" in label else "x"
    lines.append("  %-66s %9.2f%s" % (label, value, unit))
  if fresh_rows:
    n = len(fresh_rows[HOST_SNAPSHOT]["_samples"])
    lines.append("")
    lines.append(
      "fresh processes (each method %d times in a row, in its own new "
      "process; ms/minflt of every call in order):" % n
    )
    lines.append(header)
    for name in (HOST_SNAPSHOT, NAIVE_FETCH, NUMPY_FRESH):
      lines.append(_row_line(name, fresh_rows[name]))
    for name in (HOST_SNAPSHOT, NAIVE_FETCH, NUMPY_FRESH):
      lines.append(
        "  %-28s %s"
        % (
          name + ":",
          " ".join(
            "%.0f/%d" % (1e3 * t, f) for t, f in fresh_rows[name]["_samples"]
          ),
        )
      )
    lines.append(
      "  naive fetch / host snapshot (fresh processes): %.2fx median, "
      "%.2fx min"
      % (
        fresh_rows[NAIVE_FETCH]["median_ms"]
        / fresh_rows[HOST_SNAPSHOT]["median_ms"],
        fresh_rows[NAIVE_FETCH]["min_ms"] / fresh_rows[HOST_SNAPSHOT]["min_ms"],
      )
    )
  return "\n".join(lines)


def format_summary(kinds):
  """One table of the targets, a column per variable kind."""
  names = list(kinds)
  lines = ["== targets (ratios of medians) =="]
  lines.append(
    "%-46s %8s " % ("target", "bound") + " ".join("%16s" % n for n in names)
  )
  for i, t in enumerate(kinds[names[0]]["targets"]):
    cells = []
    for n in names:
      ti = kinds[n]["targets"][i]
      cells.append(
        "%16s"
        % ("%.2fx %s" % (ti["ratio_median"], "PASS" if ti["pass"] else "MISS"))
      )
    lines.append("%-46s %8s " % (t["target"], t["bound"]) + " ".join(cells))
  return "\n".join(lines)


def _loadavg():
  try:
    return " ".join("%.2f" % x for x in os.getloadavg())
  except OSError:
    return "?"


def _libc():
  try:
    return os.confstr("CS_GNU_LIBC_VERSION")
  except (AttributeError, ValueError, OSError):
    return " ".join(platform.libc_ver())


def machine_info():
  info = {
    "python": platform.python_version(),
    "tensorflow": tf.__version__,
    "numpy": np.__version__,
    "snapstore": snapstore.__version__,
    "platform": platform.platform(),
    "cpus": os.cpu_count(),
    "libc": _libc(),
  }
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          info["cpu"] = line.split(":", 1)[1].strip()
          break
    with open("/proc/meminfo") as f:
      info["mem_total"] = f.readline().split(":", 1)[1].strip()
  except OSError:
    pass
  try:
    import psutil  # pylint: disable=g-import-not-at-top

    info["mem_total_gib"] = round(psutil.virtual_memory().total / (1 << 30), 1)
  except ImportError:
    pass
  malloc_env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
  if malloc_env:
    info["malloc_env"] = malloc_env
  return info


def main(argv=None):
  args = parse_args(argv)
  if args.child:
    return child_main(args)
  # The load runs for the whole measurement, fresh processes included.
  with busy_load.Load(args.load, args.load_kind, args.load_pin) as load:
    return _main(args, load)


def _main(args, load):
  log = lambda msg: print(msg, file=sys.stderr, flush=True)
  total_bytes = int(args.size_mb * MiB)
  shape = var_shape(total_bytes, args.num_vars)
  info = machine_info()
  started = datetime.datetime.now().astimezone()
  ckpt_parent = args.ckpt_dir or tempfile.gettempdir()
  mnt, fstype = fs_of(ckpt_parent)
  print("snapstore bench_core  %s" % started.strftime("%Y-%m-%d %H:%M:%S %Z"))
  print("command: %s" % " ".join([sys.executable] + sys.argv))
  print("stack: %s" % stack())
  device = None
  if args.gpu:
    gpus = tf.config.experimental.list_physical_devices("GPU")
    if not gpus:
      print(
        "gpu: skipped: TensorFlow %s (built with CUDA: %s) sees no GPU "
        "on this machine (CUDA_VISIBLE_DEVICES: %s); nothing was measured."
        % (
          tf.__version__,
          tf.test.is_built_with_cuda(),
          os.environ.get("CUDA_VISIBLE_DEVICES", "not set"),
        )
      )
      return 0
    device = "/gpu:0"
    args.fresh_process = 0
    print("gpu: variables on /gpu:0 of %s" % ", ".join(g.name for g in gpus))
  print(
    "machine: %s, %s CPUs, %s RAM, %s; Python %s, TensorFlow %s, numpy %s, "
    "%s"
    % (
      info.get("cpu", "?"),
      info["cpus"],
      info.get("mem_total", "?"),
      info["platform"],
      info["python"],
      info["tensorflow"],
      info["numpy"],
      info["libc"],
    )
  )
  if "malloc_env" in info:
    print("malloc environment: %s" % info["malloc_env"])
  print("load average at start: %s" % _loadavg())
  print(load.describe())
  print(
    "model: %d float32 variables of shape %s = %.1f MiB; session: default "
    "tf.Session() config; %d warm-up + %d timed rounds, methods interleaved"
    % (
      args.num_vars,
      list(shape),
      args.num_vars * int(np.prod(shape)) * 4 / MiB,
      args.warmup,
      args.repeats,
    )
  )
  print(
    "Saver checkpoints: %s/snapstore-bench-*/ on %s (%s); the files stay in "
    "the page cache, so Saver is measured at its best (no disk reads, no fsync)"
    % (ckpt_parent, mnt, fstype)
  )
  info["stack"] = stack()
  info["device"] = device or "default"
  report = {
    "started": started.isoformat(),
    "argv": sys.argv,
    "machine": info,
    "config": {
      "size_mb": args.size_mb,
      "num_vars": args.num_vars,
      "shape": list(shape),
      "repeats": args.repeats,
      "warmup": args.warmup,
      "ckpt_parent": ckpt_parent,
      "ckpt_fs": fstype,
      "load": args.load,
      "load_kind": args.load_kind,
      "load_pin": args.load_pin,
    },
    "kinds": {},
  }
  all_pass = True
  for kind in args.kinds:
    log("[%s] building the graph and initializing..." % kind)
    t0 = time.perf_counter()
    bench = Bench(kind, shape, args.num_vars, ckpt_parent, device)
    log(
      "[%s] ready in %.1f s; Saver writes to %s"
      % (kind, time.perf_counter() - t0, bench.ckpt_dir)
    )
    if device:
      placed = bench.copy_devices()
      print(
        "[%s] device mode's snapshot and restore copies ran on: %s"
        % (kind, ", ".join("%s (%d)" % d for d in sorted(placed.items())))
      )
    gc.collect()
    try:
      results = run_rounds(bench, args.repeats, args.warmup, log)
      unchanged = bench.check_unchanged()
    finally:
      bench.close()
    del bench.initial, bench.naive, bench.np_src, bench.np_warm, bench.np_fresh
    gc.collect()
    fresh = (
      run_fresh_processes(kind, args, log) if args.fresh_process > 0 else None
    )
    rows = summarize(results, bench.nbytes)
    targets = ratios(results, rows)
    extra = extras(results, rows)
    fresh_rows = summarize(fresh, bench.nbytes) if fresh else None
    all_pass = all_pass and all(t["pass"] for t in targets)
    print()
    print(
      "== %s: %d x %s float32, %.1f MiB =="
      % (KIND_TITLES[kind], args.num_vars, list(shape), bench.nbytes / MiB)
    )
    print(format_kind(rows, targets, extra, fresh_rows))
    print(
      "variables bit-identical to their initial values after all rounds: %s"
      % unchanged
    )
    report["kinds"][kind] = {
      "raw": {
        n: {"seconds": [t for t, _ in s], "minflt": [f for _, f in s]}
        for n, s in results.items()
      },
      "summary": _public(rows),
      "targets": targets,
      "explanatory": extra,
      "fresh_process": (
        {
          n: {"seconds": [t for t, _ in s_], "minflt": [f for _, f in s_]}
          for n, s_ in fresh.items()
        }
        if fresh
        else None
      ),
      "fresh_process_summary": _public(fresh_rows) if fresh_rows else None,
      "values_unchanged": unchanged,
    }
    del bench
    gc.collect()
  elapsed = (datetime.datetime.now().astimezone() - started).total_seconds()
  print()
  print(format_summary(report["kinds"]))
  print(
    "load average at end: %s (1, 5, 15 min; this process counts as 1 "
    "while it runs)" % _loadavg()
  )
  print(load.describe())
  print(
    "all targets: %s  (total %.0f s)"
    % ("PASS" if all_pass else "MISS", elapsed)
  )
  report["elapsed_s"] = elapsed
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1, sort_keys=True)
    print("raw results written to %s" % args.json)
  return 0


if __name__ == "__main__":
  sys.exit(main())
