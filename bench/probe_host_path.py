#!/usr/bin/env python
"""Probe: where a host snapshot and restore spend their time (issue 25).

Not part of `make bench`. Builds the held-out check's model (default 256 MiB in
64 float32 variables) and a host store, and times, interleaved in rounds (each
round starts at the next stage, so drift hits every stage alike):

  snapshot stages
    store.snapshot()            the store as it is
    callable: fetch copies      the store's own `Snapshot` ops fetched through
                                `make_callable` (its path without the Python
                                layer); the arrays kept until the next call
    callable: fetch reads       the plain reads fetched (TF copies each
                                variable's buffer into a new numpy array)
    callable: no_op             the fixed cost of one call
  restore stages
    store.restore()             the store as it is
    callable: feed only         the store's arrays fed into its placeholders,
                                running only an op that depends on them (no
                                assign): the feed's own cost (alias or copy)
    callable: feed + assign     the store's assign op, through the store's
                                own cached callable
    update after restore        one in-place update of every variable after
                                a restore (a deferred, copy-on-write copy
                                lands here)
  references
    numpy warm copy, 1 thread   np.copyto into preallocated arrays
    numpy warm copy, N threads  the same, the variables split over one
                                thread per CPU
    numpy fresh copy            [a.copy() for a in arrays]

Ratios: /warm1 and /warmN divide medians by the 1-thread and N-thread warm
copies' medians; paired1 is the median over rounds of each round's ratio to the
1-thread warm copy of the same round.

It also runs one traced call (`RunOptions.FULL_TRACE`) of the copies and of
the restore and prints the executor's view: how long the executor took from
the first op's start to the last op's end (the rest of the call is Python,
feed and fetch conversion) and how many copy ops ran at once, and whether the fetched arrays alias TF's buffers (`owndata`) and are 64-byte
aligned.

    python bench/probe_host_path.py                       # ref and resource
    python bench/probe_host_path.py --load 2              # 2 busy processes
    python bench/probe_host_path.py --intra 1 --inter 2   # session config
    TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python bench/probe_host_path.py
"""

import argparse
import concurrent.futures
import importlib.util
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # pylint: disable=g-import-not-at-top

import bench_core  # pylint: disable=g-import-not-at-top
import busy_load  # pylint: disable=g-import-not-at-top
import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()
tf.logging.set_verbosity(tf.logging.ERROR)

THREADS = os.cpu_count() or 1


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size-mb", type=float, default=256.0)
  p.add_argument("--num-vars", type=int, default=64)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument(
    "--kinds", default="ref,resource", help="comma-separated: ref,resource"
  )
  p.add_argument(
    "--inter",
    type=int,
    default=0,
    help="inter_op_parallelism_threads (0: TF's default)",
  )
  p.add_argument(
    "--intra",
    type=int,
    default=0,
    help="intra_op_parallelism_threads (0: TF's default)",
  )
  busy_load.add_arguments(p)
  return p.parse_args(argv)


class Probe(object):
  """One graph, session and host store of one variable kind."""

  def __init__(self, kind, shape, num_vars, config):
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(0)
      self.vars = [
        tf.Variable(
          tf.random.uniform(shape),
          name="w%02d" % i,
          use_resource=kind == "resource",
        )
        for i in range(num_vars)
      ]
      self.store = snapstore.SnapshotStore(
        var_list=self.vars, mode="host", max_to_keep=1
      )
      mode = self.store._h.mode  # pylint: disable=protected-access
      self.copies = mode._copies  # pylint: disable=protected-access
      self.reads = mode._reads  # pylint: disable=protected-access
      writer = mode._load  # pylint: disable=protected-access
      self.placeholders = writer._feeder.placeholders  # pylint: disable=protected-access
      self.load_op = writer._op  # pylint: disable=protected-access
      # Consumes every placeholder without writing anything.
      self.feed_only = tf.group(*[tf.identity(p).op for p in self.placeholders])
      zero = tf.Variable(
        tf.zeros(shape),
        trainable=False,
        collections=[tf.GraphKeys.LOCAL_VARIABLES],
        use_resource=kind == "resource",
      )
      self.update = tf.group(*[tf.assign_add(v, zero) for v in self.vars])
      self.no_op = tf.no_op()
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.graph.finalize()
    self.sess = tf.Session(graph=self.graph, config=config)
    self.sess.run(init)
    self.initial = self.sess.run(self.vars)
    self.tag = self.store.snapshot(session=self.sess)
    s = self.sess
    self.fetch_copies = s.make_callable(self.copies)
    self.fetch_reads = s.make_callable(self.reads)
    self.run_no_op = s.make_callable(self.no_op)
    self.run_update = s.make_callable(self.update)
    self.np_src = [a.copy() for a in self.initial]
    self.np_warm = [np.empty_like(a) for a in self.initial]
    self.pool = concurrent.futures.ThreadPoolExecutor(THREADS)
    self.held = {}

  def feed(self, op):
    from snapstore.engines.graph import sessions  # pylint: disable=g-import-not-at-top

    arrays = list(self.store.arrays(self.tag).values())
    return sessions.run_cached(self.sess, op, self.placeholders, arrays)

  def groups(self):
    def keep(name, fn):
      def run():
        self.held[name] = fn()

      return run

    def snapshot():
      self.tag = self.store.snapshot(session=self.sess)

    def warm_mt():
      n = THREADS
      list(
        self.pool.map(
          lambda k: [
            np.copyto(d, a)
            for d, a in zip(self.np_warm[k::n], self.np_src[k::n])
          ],
          range(n),
        )
      )

    return [
      [("store.snapshot()", snapshot)],
      [("callable: fetch copies", keep("copies", self.fetch_copies))],
      [("callable: fetch reads", keep("reads", self.fetch_reads))],
      [("callable: no_op", self.run_no_op)],
      [
        (
          "store.restore()",
          lambda: self.store.restore(self.tag, session=self.sess),
        ),
        ("update after restore", self.run_update),
      ],
      [("callable: feed only", lambda: self.feed(self.feed_only))],
      [
        ("callable: feed + assign", lambda: self.feed(self.load_op)),
        (None, self.run_update),
      ],
      [("update (steady)", self.run_update)],
      [
        (
          "numpy warm copy, 1 thread",
          lambda: [np.copyto(d, a) for d, a in zip(self.np_warm, self.np_src)],
        )
      ],
      [("numpy warm copy, %d threads" % THREADS, warm_mt)],
      [
        (
          "numpy fresh copy",
          keep("fresh", lambda: [a.copy() for a in self.np_src]),
        )
      ],
    ]

  def trace(self, fetches, feeds=None):
    """One traced run: (call ms, executor span ms, mean and peak overlap).

    The span runs from the first op's start to the last op's end over every
    op TF ran. The step stats give no thread ids for CPU ops here (all 0), so
    how many copies ran at once is computed from their intervals: the mean
    (the copy ops' summed durations over their own span) and the peak.
    """
    meta = tf.RunMetadata()
    t0 = time.perf_counter()
    self.sess.run(
      fetches,
      feed_dict=feeds,
      options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
      run_metadata=meta,
    )
    call = 1e3 * (time.perf_counter() - t0)
    starts, ends, copies = [], [], []
    for dev in meta.step_stats.dev_stats:
      for n in dev.node_stats:
        if n.node_name == "_SOURCE":
          continue
        start, end = (
          n.all_start_micros,
          n.all_start_micros + n.all_end_rel_micros,
        )
        starts.append(start)
        ends.append(end)
        label = n.timeline_label
        if "Snapshot(" in label or "Assign" in label:
          copies.append((start, end))
    if not copies:
      return call, float("nan"), float("nan"), 0
    span = (max(ends) - min(starts)) / 1e3
    copy_span = max(e for _, e in copies) - min(s for s, _ in copies)
    mean = sum(e - s for s, e in copies) / max(copy_span, 1)
    events = sorted([(s, 1) for s, _ in copies] + [(e, -1) for _, e in copies])
    now = peak = 0
    for _, step in events:
      now += step
      peak = max(peak, now)
    return call, span, mean, peak

  def close(self):
    self.pool.shutdown()
    self.sess.close()
    self.store.close()


def run(probe, repeats, warmup):
  """bench_core's interleaved rounds over the probe's stages, in ms."""
  res = bench_core.run_rounds(probe, repeats, warmup, log=lambda line: None)
  return {n: [(1e3 * t, f) for t, f in v] for n, v in res.items()}


def main(argv=None):
  args = parse_args(argv)
  elems = int(args.size_mb * (1 << 20)) // 4 // args.num_vars
  shape = (elems // 1024, 1024) if elems % 1024 == 0 else (elems,)
  config = tf.ConfigProto(
    inter_op_parallelism_threads=args.inter,
    intra_op_parallelism_threads=args.intra,
  )
  print(
    "probe_host_path  %s UTC"
    % time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
  )
  print("command: %s" % " ".join([sys.executable] + sys.argv))
  print("stack: %s" % stack())
  print(
    "model: %d x %s float32 = %.1f MiB; session config inter_op=%d "
    "intra_op=%d (0: TF default); %d warm-up + %d rounds, interleaved"
    % (
      args.num_vars,
      list(shape),
      args.num_vars * elems * 4 / 2**20,
      args.inter,
      args.intra,
      args.warmup,
      args.repeats,
    )
  )
  with busy_load.Load(args.load, args.load_kind, args.load_pin) as load:
    print(load.describe() + " (at start)", flush=True)
    for kind in args.kinds.split(","):
      probe = Probe(kind, shape, args.num_vars, config)
      try:
        res = run(probe, args.repeats, args.warmup)
        held = probe.held["copies"]
        aligned = sum(a.ctypes.data % 64 == 0 for a in held)
        owns = sum(a.flags.owndata for a in held)
        snap_arrays = list(probe.store.arrays(probe.tag).values())
        s_aligned = sum(a.ctypes.data % 64 == 0 for a in snap_arrays)
        reads = probe.held["reads"]
        r_aligned = sum(a.ctypes.data % 64 == 0 for a in reads)
        tr_copy = probe.trace(probe.copies)
        tr_rest = probe.trace(
          probe.load_op,
          dict(zip(probe.placeholders, snap_arrays)),
        )
        now = probe.sess.run(probe.vars)
        exact = all(
          a.tobytes() == b.tobytes() for a, b in zip(now, probe.initial)
        )
      finally:
        probe.close()
      warm = statistics.median(t for t, _ in res["numpy warm copy, 1 thread"])
      warm_mt = statistics.median(
        t for t, _ in res["numpy warm copy, %d threads" % THREADS]
      )
      print()
      print("== %s variables ==" % kind)
      print(
        "%-34s %9s %8s %8s %7s %7s %8s %9s"
        % (
          "stage",
          "median ms",
          "min ms",
          "max ms",
          "/warm1",
          "/warmN",
          "paired1",
          "minflt",
        )
      )
      for name, samples in res.items():
        ts = [t for t, _ in samples]
        med = statistics.median(ts)
        paired = statistics.median(
          t / w for t, (w, _) in zip(ts, res["numpy warm copy, 1 thread"])
        )
        print(
          "%-34s %9.2f %8.2f %8.2f %6.2fx %6.2fx %7.2fx %9d"
          % (
            name,
            med,
            min(ts),
            max(ts),
            med / warm,
            med / warm_mt,
            paired,
            statistics.median(f for _, f in samples),
          )
        )
      for label, tr in (
        ("traced fetch of the copies", tr_copy),
        ("traced restore (Session.run, store arrays fed)", tr_rest),
      ):
        print(
          "%s: call %.2f ms, executor span %.2f ms, copies running at "
          "once: %.2f on average, %d at most" % ((label,) + tr)
        )
      print(
        "fetched copies: %d of %d 64-byte aligned, %d own their data "
        "(0: numpy wraps TF's buffer); store's arrays aligned: %d of %d; "
        "fetched reads aligned: %d of %d"
        % (
          aligned,
          len(held),
          owns,
          s_aligned,
          len(snap_arrays),
          r_aligned,
          len(reads),
        )
      )
      print("variables bit-identical after all rounds: %s" % exact)
      print(load.describe(), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
