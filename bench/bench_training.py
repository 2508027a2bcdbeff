#!/usr/bin/env python
"""Benchmark: training-loop overhead of taking snapshots, per copy mode.

The model is the demo's (`snapstore.demo.Classifier` on `make_data()`: a
two-layer MLP with Adam, batches of 64 by default). The store covers what an
exact rollback needs: the model, Adam's slots and beta powers, and the global
step. Measured, as time per training step:

  baseline                      sess.run(train_op, feed)
  device, every step            store.snapshot() before each sess.run(train_op)
  device, every 10 steps        the same before every 10th step
  host, every step / 10 steps   the same with a host-mode store
  device in-graph, every step   one sess.run of a train op built under
                                tf.control_dependencies([store.snapshot_op(0)])
                                (the gradients are computed in parallel with the
                                copy; only the update waits for it)
  device in-graph, every 10     that train op every 10th step, train_op otherwise
  guard, every step             `with store.guard(watch=loss) as g:
                                g.run(train_op, feed)` (device store): the
                                snapshot, the run, the loss check
  extra no_op run, every step   a callable of tf.no_op() run before each step:
                                the floor of any snapshot that is a session.run
                                of its own (a reference, not a snapstore path)

To explain the figures, the script also times single calls (median of
`--calls` calls each): `store.snapshot()` in device mode, the same grouped op
run through a `make_callable` (no snapstore Python), and a `tf.no_op()` run
through a `make_callable` (the fixed cost of any `session.run`).

Every variant runs in one graph and one session. Rounds of `--steps` steps
are interleaved (each round runs every variant once, starting at the next
variant) after warm-up rounds. A variant's overhead is the median, over
rounds, of its time divided by the baseline's time in the same round, minus
one. Target (issue 6): device mode, a snapshot every step, at most 5%.

    .venv/bin/python bench/bench_training.py
    .venv/bin/python bench/bench_training.py --batch 512 --rounds 30
    .venv/bin/python bench/bench_training.py --json bench/results/training.json
"""
import argparse
import importlib.util
import json
import os
import platform
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
from snapstore.demo import Classifier  # pylint: disable=g-import-not-at-top
from snapstore.demo import make_data  # pylint: disable=g-import-not-at-top

TARGET_VARIANT = "device, every step"
TARGET = 0.05


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=64, help="batch size (demo: 64)")
  p.add_argument("--steps", type=int, default=200,
                 help="training steps per variant per round (default 200)")
  p.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
  p.add_argument("--warmup", type=int, default=2, help="untimed rounds (default 2)")
  p.add_argument("--calls", type=int, default=2000,
                 help="calls per single-call timing (default 2000)")
  p.add_argument("--json", metavar="PATH", default=None,
                 help="write the configuration and raw timings to PATH")
  args = p.parse_args(argv)
  if min(args.batch, args.steps, args.rounds) < 1 or args.warmup < 0:
    p.error("--batch, --steps and --rounds must be positive, --warmup >= 0")
  return args


class Loop(object):
  """The demo model, both stores and every variant's step function."""

  def __init__(self, batch):
    (train_x, train_y), _ = make_data()
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(0)
      model = Classifier(train_x.shape[1], int(train_y.max()) + 1)
      common = dict(scope="classifier", max_to_keep=1, optimizer=model.optimizer,
                    include_global_step=True)
      self.device = snapstore.SnapshotStore(mode="device", name="device_store",
                                            **common)
      self.host = snapstore.SnapshotStore(mode="host", name="host_store", **common)
      grads = model.optimizer.compute_gradients(model.loss)
      with tf.control_dependencies([self.device.snapshot_op(0)]):
        self.train_with_snapshot = model.optimizer.apply_gradients(
            grads, global_step=model.global_step)
      init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
      no_op = tf.no_op()
    self.graph.finalize()
    self.snapshot_op = self.device.snapshot_op(0)
    self.model = model
    self.sess = tf.Session(graph=self.graph)
    self.sess.run(init)
    self.no_op = self.sess.make_callable(no_op)
    rng = np.random.RandomState(0)
    self.feeds = []
    for _ in range(64):
      idx = rng.randint(0, len(train_x), batch)
      self.feeds.append({model.x: train_x[idx], model.y: train_y[idx]})
    self.param_nbytes = self.device.param_nbytes
    self.num_variables = len(self.device.keys)

  def variants(self):
    sess, train = self.sess, self.model.train_op
    loss = self.model.loss
    in_graph = self.train_with_snapshot

    def baseline(feed, i):
      del i
      sess.run(train, feed)

    def every(store, n):
      def step(feed, i):
        if i % n == 0:
          store.snapshot(0, session=sess)
        sess.run(train, feed)
      return step

    def in_graph_every(n):
      def step(feed, i):
        sess.run(in_graph if i % n == 0 else train, feed)
      return step

    def extra_run(feed, i):
      del i
      self.no_op()
      sess.run(train, feed)

    def guarded(feed, i):
      del i
      with self.device.guard(watch=loss, session=sess) as guard:
        guard.run(train, feed)

    return [
        ("baseline", baseline),
        ("device, every step", every(self.device, 1)),
        ("device, every 10 steps", every(self.device, 10)),
        ("host, every step", every(self.host, 1)),
        ("host, every 10 steps", every(self.host, 10)),
        ("device in-graph, every step", in_graph_every(1)),
        ("device in-graph, every 10 steps", in_graph_every(10)),
        ("guard, every step", guarded),
        ("extra no_op run, every step", extra_run),
    ]

  def single_calls(self, calls):
    """Median microseconds per call of the pieces a snapshot call is made of."""
    sess = self.sess
    snapshot_op = sess.make_callable(self.snapshot_op)
    pieces = [("store.snapshot() (device)",
               lambda: self.device.snapshot(0, session=sess)),
              ("callable(store.snapshot_op(0))", snapshot_op),
              ("callable(tf.no_op())", self.no_op)]
    result = []
    for name, fn in pieces:
      for _ in range(100):
        fn()
      times = []
      for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
      result.append((name, 1e6 * statistics.median(times)))
    return result

  def time_round(self, step, steps):
    feeds = self.feeds
    start = time.perf_counter()
    for i in range(steps):
      step(feeds[i % len(feeds)], i)
    return (time.perf_counter() - start) / steps


def run(args):
  loop = Loop(args.batch)
  variants = loop.variants()
  samples = {name: [] for name, _ in variants}
  for r in range(args.warmup + args.rounds):
    order = variants[r % len(variants):] + variants[:r % len(variants)]
    for name, step in order:
      seconds = loop.time_round(step, args.steps)
      if r >= args.warmup:
        samples[name].append(seconds)
  calls = loop.single_calls(args.calls)
  loop.sess.close()
  base = samples["baseline"]
  rows = []
  for name, _ in variants:
    ratios = [s / b for s, b in zip(samples[name], base)]
    rows.append({
        "variant": name,
        "median_us_per_step": 1e6 * statistics.median(samples[name]),
        "min_us_per_step": 1e6 * min(samples[name]),
        "overhead": statistics.median(ratios) - 1.0,
        "overhead_q1": _quantile(ratios, 0.25) - 1.0,
        "overhead_q3": _quantile(ratios, 0.75) - 1.0,
    })
  return loop, samples, rows, calls


def _quantile(values, q):
  return float(np.quantile(values, q))


def main(argv=None):
  args = parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  tf.logging.set_verbosity(tf.logging.ERROR)
  info = {"python": platform.python_version(), "tensorflow": tf.__version__,
          "numpy": np.__version__, "platform": platform.platform(),
          "cpus": os.cpu_count(), "snapstore": snapstore.__version__}
  print("bench_training: demo classifier, batch %d, %d steps x %d rounds "
        "(+%d warm-up), interleaved" % (args.batch, args.steps, args.rounds,
                                         args.warmup))
  print("%(platform)s, %(cpus)s CPUs, Python %(python)s, TensorFlow "
        "%(tensorflow)s" % info)
  info["load_before"] = os.getloadavg()
  loop, samples, rows, calls = run(args)
  info["load_after"] = os.getloadavg()
  # Other processes on the machine show up as noise in every row.
  print("load average (1, 5, 15 min): before %s, after %s" % (
      " ".join("%.2f" % v for v in info["load_before"]),
      " ".join("%.2f" % v for v in info["load_after"])))
  print("store: %d variables (model + Adam slots and beta powers + global_step), "
        "%.1f KiB per snapshot" % (loop.num_variables, loop.param_nbytes / 1024.0))
  print()
  print("%-34s %12s %12s %22s" % ("variant", "median us", "min us",
                                  "overhead (q1..q3)"))
  for row in rows:
    print("%-34s %12.1f %12.1f %8.1f%% (%5.1f..%5.1f)" % (
        row["variant"], row["median_us_per_step"], row["min_us_per_step"],
        100 * row["overhead"], 100 * row["overhead_q1"], 100 * row["overhead_q3"]))
  print()
  print("single calls (median us): " + ", ".join("%s %.1f" % c for c in calls))
  target = next(r for r in rows if r["variant"] == TARGET_VARIANT)
  met = target["overhead"] <= TARGET
  print()
  print("target: %s overhead <= %.0f%%: %s (%.1f%%)" % (
      TARGET_VARIANT, 100 * TARGET, "met" if met else "MISSED",
      100 * target["overhead"]))
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"config": vars(args), "environment": info, "rows": rows,
                 "single_calls_us": dict(calls),
                 "samples_seconds_per_step": samples,
                 "target": {"variant": TARGET_VARIANT, "bound": TARGET, "met": met}},
                f, indent=1, sort_keys=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
