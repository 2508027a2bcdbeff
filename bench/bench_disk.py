#!/usr/bin/env python
"""Disk mode: spill throughput against raw h5py, and the training-thread stall.

1. Spill throughput. The same six snapshots (arrays in host memory) are
   written into one file, `flush()`ed after each, by: plain h5py
   (`create_dataset(data=...)` per variable, one group per snapshot; the
   baseline), the spill file layer alone (`SpillFile.write`: journal, two
   commits, checksums), and a disk-mode store (`spill(tag)` + `flush()`: the
   writer thread too). Into a fresh file, and in steady state, where each new
   snapshot replaces the one two back (as `max_to_keep` eviction does, so space
   is reused). Timed to the page cache, and again including a final `fsync`.
   Target: spill time within 1.2x of h5py.

2. Training-thread stall. A loop runs `--every` train steps, then
   `snapshot()`, for a host-mode store and a disk-mode store whose budget sends
   every snapshot to the file. Reported: the time of `snapshot()` on the
   training thread, and of the train steps (which share the CPUs with the
   background writer). Target: disk-mode `snapshot()` no slower than host mode.
   With `--every 1` the writer cannot keep up on this machine and `snapshot()`
   waits for it (back-pressure, by design).

Each run starts after `os.sync()`; runs alternate between the contenders, and
medians and minima are reported, because this machine's page-cache writeback
makes single runs vary by 2x or more.

    .venv/bin/python bench/bench_disk.py [--mib 64] [--reps 9] [--json out.json]
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import snapstore  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore.engines.graph.variables import variable_set  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore.spill import file as spill_file  # pylint: disable=g-import-not-at-top,wrong-import-position

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)


def _model(total_bytes, num_vars=16):
  """Float32 variables under scope "net", `total_bytes` in all, plus a train op."""
  per = total_bytes // num_vars // 4
  cols = 1024
  rows = max(1, per // cols)
  with tf.variable_scope("net"):
    variables = [
      tf.get_variable(
        "layer_%02d/kernel" % i,
        [rows, cols],
        initializer=tf.random_normal_initializer(seed=i),
      )
      for i in range(num_vars)
    ]
  x = tf.random.normal([256, 1024], seed=1)
  compute = x
  for _ in range(2):  # tens of milliseconds of CPU work
    compute = tf.tanh(
      tf.matmul(compute, tf.random.normal([1024, 1024], seed=2))
    )
  update = [
    tf.assign_add(v, tf.fill(v.shape, tf.reduce_mean(compute) * 1e-6))
    for v in variables
  ]
  return variables, tf.group(*update)


def _raw_h5py(path, snapshots, keys, replace):
  os.sync()  # start with no dirty pages, whoever ran before
  start = time.perf_counter()
  with h5py.File(path, "w") as h5:
    for i, arrays in enumerate(snapshots):
      if replace and i >= replace:
        del h5["s%d" % (i - replace)]
      group = h5.create_group("s%d" % i)
      for key, array in zip(keys, arrays):
        group.create_dataset(key, data=array)
      h5.flush()
  written = time.perf_counter() - start
  _fsync(path)
  return written, time.perf_counter() - start


def _fsync(path):
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _file_layer(path, varset, snapshots, keys, keep):
  """SpillFile.write on this thread: the spill file without the store."""
  f = spill_file.SpillFile.open_for_writing(path, varset)
  os.sync()
  start = time.perf_counter()
  for i, arrays in enumerate(snapshots):
    if keep and i >= keep:
      f.delete(i - keep)
    f.write(i, time.time(), None, keys, arrays)
  written = time.perf_counter() - start
  _fsync(path)
  synced = time.perf_counter() - start
  f.close()
  return written, synced


def _store(path, graph, name, snapshots, keys, keep):
  """A disk-mode store spills each snapshot (deleting the one `keep` back)."""
  with graph.as_default():
    store = snapstore.SnapshotStore(
      scope="net", mode="disk", spill_path=path, memory_budget=10**12, name=name
    )
  for i, arrays in enumerate(snapshots):  # into host memory, not timed
    store.load_arrays(dict(zip(keys, arrays)), tag=i)
  os.sync()
  start = time.perf_counter()
  for i in range(len(snapshots)):
    if keep and i >= keep:
      store.delete(i - keep)
    store.files.spill(i)
    store.files.flush()  # as the h5py baseline flushes after each snapshot
  written = time.perf_counter() - start
  _fsync(path)
  synced = time.perf_counter() - start
  store.close()
  return written, synced


def bench_throughput(mib, reps, workdir):
  graph = tf.Graph()
  with graph.as_default():
    variables, _ = _model(mib << 20)
    varset = variable_set(scope="net")
  keys = list(varset.keys)
  rng = np.random.RandomState(0)
  snapshots = [
    [
      rng.standard_normal(v.shape.as_list()).astype(np.float32)
      for v in variables
    ]
    for _ in range(6)
  ]
  nbytes = sum(a.nbytes for a in snapshots[0]) * len(snapshots)
  names = iter(range(10**6))
  contenders = (
    ("raw h5py", lambda path, keep: _raw_h5py(path, snapshots, keys, keep)),
    (
      "spill file",
      lambda path, keep: _file_layer(path, varset, snapshots, keys, keep),
    ),
    (
      "store spill()",
      lambda path, keep: _store(
        path, graph, "bench_%d" % next(names), snapshots, keys, keep
      ),
    ),
  )
  results = {}
  for label, keep in (("fresh file", 0), ("steady state", 2)):
    times = dict((name, []) for name, _ in contenders)
    for rep in range(reps):
      for name, run in contenders if rep % 2 == 0 else contenders[::-1]:
        path = os.path.join(workdir, "bench.h5")
        times[name].append(run(path, keep))
        os.remove(path)
    for phase, index in (("page cache", 0), ("with fsync", 1)):
      row = {"bytes": nbytes}
      for name, _ in contenders:
        samples = [t[index] for t in times[name]]
        row[name] = {
          "median_s": float(np.median(samples)),
          "min_s": float(np.min(samples)),
          "max_s": float(np.max(samples)),
          "samples_s": samples,
        }
      base = row["raw h5py"]
      for name in ("spill file", "store spill()"):
        row[name]["ratio_median"] = row[name]["median_s"] / base["median_s"]
        row[name]["ratio_min"] = row[name]["min_s"] / base["min_s"]
      results["%s, %s" % (label, phase)] = row
  return results


def _time_calls(obj, names, out):
  """Adds the duration of every call of `obj.<name>` to the list `out`."""
  for name in names:
    method = getattr(obj, name)

    def timed(*args, _method=method, **kwargs):
      start = time.perf_counter()
      try:
        return _method(*args, **kwargs)
      finally:
        out.append(time.perf_counter() - start)

    setattr(obj, name, timed)


def bench_stall(mib, steps, every, reps, workdir):
  results = {}
  samples = {
    "host": {"snapshot": [], "step": []},
    "disk": {"snapshot": [], "step": []},
  }
  extra = []  # seconds of disk-mode-only work on the training thread
  for rep in range(reps):
    for mode in ("host", "disk") if rep % 2 == 0 else ("disk", "host"):
      graph = tf.Graph()
      with graph.as_default():
        _, train = _model(mib << 20)
        options = {}
        if mode == "disk":
          options = dict(
            spill_path=os.path.join(workdir, "stall_%d.h5" % rep),
            memory_budget=0,
            max_to_keep=4,
          )
        else:
          options = dict(max_to_keep=4)
        store = snapstore.SnapshotStore(scope="net", mode=mode, **options)
        init = tf.global_variables_initializer()
      if mode == "disk":
        _time_calls(store._h.mode, ("check", "settle"), extra)  # pylint: disable=protected-access
      with tf.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(train)
        store.snapshot(session=sess)  # warm up: callables made once
        for _ in range(steps):
          for _ in range(every):
            t0 = time.perf_counter()
            sess.run(train)
            samples[mode]["step"].append(time.perf_counter() - t0)
          t1 = time.perf_counter()
          store.snapshot(session=sess)
          samples[mode]["snapshot"].append(time.perf_counter() - t1)
        store.close()
  for mode, s in samples.items():
    runs = [
      s["snapshot"][i : i + steps] for i in range(0, len(s["snapshot"]), steps)
    ]
    results[mode] = {
      "per_run_ms": [1e3 * float(np.median(r)) for r in runs],
      "snapshot_median_ms": 1e3 * float(np.median(s["snapshot"])),
      "snapshot_p90_ms": 1e3 * float(np.percentile(s["snapshot"], 90)),
      "step_median_ms": 1e3 * float(np.median(s["step"])),
      "samples": len(s["snapshot"]),
    }
  snapshots = len(samples["disk"]["snapshot"]) + reps  # + one warm-up each
  results["disk"]["own_work_per_snapshot_ms"] = 1e3 * sum(extra) / snapshots
  results["ratio_snapshot_median"] = (
    results["disk"]["snapshot_median_ms"]
    / results["host"]["snapshot_median_ms"]
  )
  results["ratio_step_median"] = (
    results["disk"]["step_median_ms"] / results["host"]["step_median_ms"]
  )
  return results


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
    "--mib",
    type=int,
    default=64,
    help="MiB per snapshot for the throughput benchmark",
  )
  p.add_argument(
    "--stall-mib",
    type=int,
    default=64,
    help="MiB per snapshot for the stall benchmark",
  )
  p.add_argument("--reps", type=int, default=9)
  p.add_argument("--steps", type=int, default=20, help="snapshots per run")
  p.add_argument(
    "--every",
    type=int,
    default=4,
    help="train steps per snapshot in the stall benchmark",
  )
  p.add_argument(
    "--dir", default=None, help="where to write (default: a temp dir)"
  )
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  workdir = tempfile.mkdtemp(prefix="bench_disk_", dir=args.dir)
  try:
    throughput = bench_throughput(args.mib, args.reps, workdir)
    stall = bench_stall(
      args.stall_mib, args.steps, args.every, args.reps, workdir
    )
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  print(
    "Spill throughput, 6 snapshots of %d MiB, %d runs each; times are "
    "median / min (max):" % (args.mib, args.reps)
  )
  for label, row in throughput.items():
    raw = row["raw h5py"]
    print(
      "  %s: raw h5py %.3f / %.3f (%.3f) s"
      % (label, raw["median_s"], raw["min_s"], raw["max_s"])
    )
    for name in ("spill file", "store spill()"):
      r = row[name]
      print(
        "    %-14s %.3f / %.3f (%.3f) s  ratio %.2fx / %.2fx  "
        "[target <= 1.2x: %s]"
        % (
          name,
          r["median_s"],
          r["min_s"],
          r["max_s"],
          r["ratio_median"],
          r["ratio_min"],
          "met" if r["ratio_median"] <= 1.2 else "MISSED",
        )
      )
  print(
    "Training-thread stall, %d MiB snapshots every %d train steps "
    "(%d x %d samples):" % (args.stall_mib, args.every, args.reps, args.steps)
  )
  for mode in ("host", "disk"):
    r = stall[mode]
    print(
      "  %-5s snapshot median %.1f ms  p90 %.1f ms  train step median %.1f ms"
      % (
        mode,
        r["snapshot_median_ms"],
        r["snapshot_p90_ms"],
        r["step_median_ms"],
      )
    )
  print(
    "  per run (median snapshot ms, host/disk): %s"
    % ", ".join(
      "%.1f/%.1f" % pair
      for pair in zip(stall["host"]["per_run_ms"], stall["disk"]["per_run_ms"])
    )
  )
  print(
    "  disk mode's own work on the training thread (writer bookkeeping and "
    "handing snapshots over): %.2f ms per snapshot"
    % stall["disk"]["own_work_per_snapshot_ms"]
  )
  print(
    "  disk/host snapshot %.2fx [target <= 1.0x: %s], train step %.2fx"
    % (
      stall["ratio_snapshot_median"],
      "met" if stall["ratio_snapshot_median"] <= 1.0 else "MISSED",
      stall["ratio_step_median"],
    )
  )
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"throughput": throughput, "stall": stall}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
