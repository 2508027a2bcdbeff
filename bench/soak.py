#!/usr/bin/env python
"""Soak: many snapshot/restore cycles per mode, with the graph finalized.

Each cycle is what a long training job does: a train step, `snapshot()`, a
second step, `restore()` of the snapshot; every 10th cycle also runs
`evaluate_with` on the oldest snapshot, and every `--check-every` cycles the
restored values are compared bit for bit with the values snapshotted. The
store keeps 4 snapshots (device and host modes) or 8 with a host budget of 2
(disk mode: every snapshot sends the oldest in memory to the file, and
eviction deletes from the file), so every cycle evicts.

Measured per mode: the graph's op count (must not change: the graph is
finalized, so a new op would raise), resident memory (RSS, psutil) after a
warm-up and at the end, its peak, the growth per 1000 cycles, the number of
Python objects (a leak of one small object per cycle shows there long before
it shows in RSS), and open files and threads (must not change). A leak of one
snapshot per cycle would grow RSS by `cycles * param bytes`; the bounds
checked are a few MiB of RSS and a few hundred objects in all.

    .venv/bin/python bench/soak.py [--cycles 10000] [--modes device,host,disk]
        [--kib 256] [--check-every 100] [--max-growth-mib 16]
        [--max-new-objects 500] [--json out.json]

Exit status 1 if a check fails (values, ops, files, threads, RSS bound).
`tests/test_soak.py` runs the same loop, shorter, in the test suite.
"""

import argparse
import gc
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import psutil

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

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

MODES = ("device", "host", "disk")
_MIB = float(1 << 20)


def _rss():
  return psutil.Process().memory_info().rss


def _fds():
  return len(os.listdir("/proc/self/fd"))


def build(mode, kib, workdir, use_resource=False):
  """(graph, store, variables, train op, initializers) for a soak of `mode`."""
  graph = tf.Graph()
  per = max(1, kib * 1024 // 4 // 4)  # four float32 variables
  with graph.as_default():
    with tf.variable_scope("net", use_resource=use_resource):
      variables = [
        tf.get_variable(
          "v%d" % i,
          [per],
          dtype=tf.float32,
          initializer=tf.random_normal_initializer(seed=i),
        )
        for i in range(4)
      ]
      variables.append(
        tf.get_variable(
          "count", [], dtype=tf.int64, initializer=tf.zeros_initializer()
        )
      )
    # A step that changes every value and depends on the previous ones.
    updates = [
      v.assign(v * 0.5 + tf.sin(v), read_value=False)
      if use_resource
      else tf.assign(v, v * 0.5 + tf.sin(v)).op
      for v in variables[:4]
    ]
    updates.append(
      variables[4].assign_add(1, read_value=False)
      if use_resource
      else tf.assign_add(variables[4], 1).op
    )
    train = tf.group(*updates)
    options = {}
    if mode == "disk":
      options = {
        "spill_path": os.path.join(workdir, "soak.h5"),
        "memory_budget": 2 * (4 * per * 4 + 8),
      }
    store = snapstore.SnapshotStore(
      scope="net", mode=mode, max_to_keep=8 if mode == "disk" else 4, **options
    )
    check = tf.add_n([tf.reduce_sum(v) for v in variables[:4]])
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  return graph, store, variables, train, check, init


def soak(
  mode,
  cycles,
  kib=256,
  workdir=None,
  check_every=100,
  use_resource=False,
  samples=10,
):
  """Runs `cycles` soak cycles of `mode`; returns a dict of measurements.

  Raises:
    AssertionError: A restore was not bit-exact, or evaluate_with changed the
      variables.
  """
  own_dir = workdir is None
  workdir = workdir or tempfile.mkdtemp(prefix="soak_")
  graph, store, variables, train, check, init = build(
    mode, kib, workdir, use_resource
  )
  try:
    graph.finalize()
    ops = len(graph.get_operations())
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      warmup = min(cycles // 2, max(200, cycles // 10))
      trace = []
      start = None
      for i in range(cycles):
        if i == warmup:
          store.files.flush()  # no write in progress: its journal is closed
          gc.collect()
          baseline = (
            _rss(),
            _fds(),
            threading.active_count(),
            len(gc.get_objects()),
          )
          start = time.perf_counter()
        sess.run(train)
        tag = store.snapshot(session=sess)
        checking = i % check_every == 0
        if checking:
          expected = sess.run(variables)
        sess.run(train)
        store.restore(tag, session=sess)
        if checking:
          for got, want in zip(sess.run(variables), expected):
            if got.tobytes() != want.tobytes():
              raise AssertionError(
                "cycle %d: restore of %r is not exact" % (i, tag)
              )
        if i % 10 == 0:
          current = sess.run(variables)
          store.evaluate_with(check, tag=store.tags()[0], session=sess)
          if any(
            a.tobytes() != b.tobytes()
            for a, b in zip(sess.run(variables), current)
          ):
            raise AssertionError(
              "cycle %d: evaluate_with changed the variables" % i
            )
        if (
          i >= warmup
          and (i - warmup) % max(1, (cycles - warmup) // samples) == 0
        ):
          trace.append((i, _rss()))
      store.files.flush()
      seconds = time.perf_counter() - start
      gc.collect()
      end = (_rss(), _fds(), threading.active_count(), len(gc.get_objects()))
      trace.append((cycles, end[0]))
    measured = cycles - warmup
    # From the first sample, taken after the first measured cycle: that cycle
    # can still raise malloc's high-water mark once (an evaluate_with's first
    # set-aside after gc.collect(), seen as one 9 MiB step in a 700 MiB process
    # on TF 2.x, flat afterwards), which is not a leak; a leak grows with
    # every cycle after it.
    growth = end[0] - trace[0][1]
    return {
      "mode": mode,
      "kind": "resource" if use_resource else "ref",
      "cycles": cycles,
      "warmup": warmup,
      "param_bytes": store.param_nbytes,
      "cycles_per_s": measured / seconds,
      "ops_before": ops,
      "ops_after": len(graph.get_operations()),
      "rss_start_mib": trace[0][1] / _MIB,
      "rss_end_mib": end[0] / _MIB,
      "rss_max_mib": max(r for _, r in trace) / _MIB,
      "rss_growth_mib": growth / _MIB,
      "rss_growth_mib_per_1000": growth / _MIB * 1000.0 / measured,
      "leak_of_one_copy_per_cycle_mib": measured * store.param_nbytes / _MIB,
      "fds": (baseline[1], end[1]),
      "threads": (baseline[2], end[2]),
      "new_objects": end[3] - baseline[3],
      "trace_mib": [(i, round(r / _MIB, 1)) for i, r in trace],
    }
  finally:
    store.close()
    if own_dir:
      shutil.rmtree(workdir, ignore_errors=True)


def problems(result, max_growth_mib, max_new_objects):
  """What in `result` breaks the soak's checks (an empty list if nothing)."""
  out = []
  if result["ops_after"] != result["ops_before"]:
    out.append(
      "op count %d -> %d" % (result["ops_before"], result["ops_after"])
    )
  if result["fds"][0] != result["fds"][1]:
    out.append("open files %d -> %d" % result["fds"])
  if result["threads"][0] != result["threads"][1]:
    out.append("threads %d -> %d" % result["threads"])
  if result["rss_growth_mib"] > max_growth_mib:
    out.append(
      "RSS grew %.1f MiB > %.1f MiB"
      % (result["rss_growth_mib"], max_growth_mib)
    )
  if result["new_objects"] > max_new_objects:
    out.append(
      "%d more Python objects > %d" % (result["new_objects"], max_new_objects)
    )
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cycles", type=int, default=10000)
  parser.add_argument("--modes", default=",".join(MODES))
  parser.add_argument(
    "--kib", type=int, default=256, help="parameter size in KiB (default 256)"
  )
  parser.add_argument(
    "--resource",
    action="store_true",
    help="resource variables (default: ref variables)",
  )
  parser.add_argument(
    "--check-every",
    type=int,
    default=100,
    help="compare a restore bit for bit every N cycles (default 100)",
  )
  parser.add_argument("--max-growth-mib", type=float, default=16.0)
  parser.add_argument("--max-new-objects", type=int, default=500)
  parser.add_argument("--json", help="also write the results to this file")
  args = parser.parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  results, failed = [], False
  for mode in args.modes.split(","):
    result = soak(
      mode,
      args.cycles,
      kib=args.kib,
      check_every=args.check_every,
      use_resource=args.resource,
    )
    results.append(result)
    bad = problems(result, args.max_growth_mib, args.max_new_objects)
    failed = failed or bool(bad)
    print(
      "%-6s %-8s %6d cycles  %7.0f cycles/s  ops %d -> %d  RSS %.1f -> %.1f "
      "MiB (max %.1f, growth %+.2f MiB, %+.3f MiB/1000 cycles; one leaked copy "
      "per cycle: %.0f MiB)  objects %+d  files %d -> %d  threads %d -> %d  %s"
      % (
        result["mode"],
        result["kind"],
        result["cycles"],
        result["cycles_per_s"],
        result["ops_before"],
        result["ops_after"],
        result["rss_start_mib"],
        result["rss_end_mib"],
        result["rss_max_mib"],
        result["rss_growth_mib"],
        result["rss_growth_mib_per_1000"],
        result["leak_of_one_copy_per_cycle_mib"],
        result["new_objects"],
        result["fds"][0],
        result["fds"][1],
        result["threads"][0],
        result["threads"][1],
        "FAILED: " + "; ".join(bad) if bad else "ok",
      )
    )
    sys.stdout.flush()
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
