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
  in-step, every step           one sess.run of the train op from
                                store.slots.snapshot_before(lambda:
                                opt.apply_gradients(grads, ...)) (issue 14): the
                                copy, then the update, in the step's run; the
                                gradients, computed outside, run in parallel
                                with the copy, only the update waits for it
  in-step, every 10 steps       that train op every 10th step, train_op otherwise
  in-step packed, every step    the same with a store built with pack=True:
                                one concatenation and assign per dtype
  in-step if finite, every step snapshot_before(..., if_finite=loss), what
                                SnapshotHook(in_step_tag=...) runs: the copy only
                                after a finite loss
  in-step, minimize inside      store.slots.snapshot_before(lambda: opt.minimize(loss)):
                                the gradients are built inside, so they wait
                                for the copy too (what not to do)
  guard, every step             `with snapstore.Guard(store, watch_tensors=loss) as g:
                                g.run(train_op, feed)` (device store): the
                                snapshot, the run, the loss check
  guard, in-step, every step    the same with the in-step train op and the
                                guard's tag its slot's: no snapshot() call
  extra no_op run, every step   a callable of tf.no_op() run before each step:
                                the floor of any snapshot that is a session.run
                                of its own (a reference, not a snapstore path)

The same rounds run on a large model (`--large-hidden` wide hidden layers,
batches of `--large-batch`; a step of 20 ms or more), with only the baseline,
`store.snapshot()` every step and in-step every step.

To explain the figures, the script also times single calls (median of
`--calls` calls each): `store.snapshot()` in device mode, the same grouped op
run through a `make_callable` (no snapstore Python), a `tf.no_op()` run
through a `make_callable` (the fixed cost of any `session.run`), and one
assign of a single variable holding as many bytes as the store (the copy
without the per-variable ops).

Every variant runs in one graph and one session. Rounds of `--steps` steps
are interleaved (each round runs every variant once, starting at the next
variant) after warm-up rounds. A variant's overhead is the median, over
rounds, of its time divided by the baseline's time in the same round, minus
one. Targets: issue 6, device mode, a snapshot every step, at most 5%;
issue 14, in-step every step, at most 5% on the demo model and at most 2% on
the large one.

    .venv/bin/python bench/bench_training.py
    .venv/bin/python bench/bench_training.py --batch 512 --rounds 30
    .venv/bin/python bench/bench_training.py --large-batch 0    # demo model only
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

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

# (model, variant, bound on the overhead)
TARGETS = (
  ("demo", "device, every step", 0.05),
  ("demo", "in-step, every step", 0.05),
  ("demo", "in-step packed, every step", 0.05),
  ("large", "in-step, every step", 0.02),
  ("large", "in-step packed, every step", 0.02),
)


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--batch", type=int, default=64, help="batch size (demo: 64)")
  p.add_argument(
    "--steps",
    type=int,
    default=200,
    help="training steps per variant per round (default 200)",
  )
  p.add_argument(
    "--rounds", type=int, default=20, help="timed rounds (default 20)"
  )
  p.add_argument(
    "--warmup", type=int, default=2, help="untimed rounds (default 2)"
  )
  p.add_argument(
    "--calls",
    type=int,
    default=2000,
    help="calls per single-call timing (default 2000)",
  )
  p.add_argument(
    "--large-batch",
    type=int,
    default=2048,
    help="batch size of the large model (default 2048; 0: skip it)",
  )
  p.add_argument(
    "--large-hidden",
    type=int,
    default=512,
    help="hidden width of the large model (default 512)",
  )
  p.add_argument(
    "--large-steps",
    type=int,
    default=10,
    help="large-model steps per variant per round (default 10)",
  )
  p.add_argument(
    "--json",
    metavar="PATH",
    default=None,
    help="write the configuration and raw timings to PATH",
  )
  args = p.parse_args(argv)
  if (
    min(
      args.batch, args.steps, args.rounds, args.large_hidden, args.large_steps
    )
    < 1
    or min(args.warmup, args.large_batch) < 0
  ):
    p.error(
      "--batch, --steps, --rounds, --large-hidden and --large-steps must "
      "be positive, --warmup and --large-batch >= 0"
    )
  return args


class Loop(object):
  """The demo model, both stores and every variant's step function."""

  def __init__(self, batch, hidden=64, large=False):
    (train_x, train_y), _ = make_data()
    self.large = large
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(0)
      model = Classifier(train_x.shape[1], int(train_y.max()) + 1, hidden)
      common = dict(
        scope="classifier",
        max_to_keep=1,
        optimizer=model.optimizer,
        include_global_step=True,
      )
      self.device = snapstore.SnapshotStore(
        mode="device", name="device_store", **common
      )
      self.host = snapstore.SnapshotStore(
        mode="host", name="host_store", **common
      )
      # The train op a user builds with snapstore (the model's own train_op
      # made the optimizer's slots, which a store with optimizer= needs).
      self.in_step = snapstore.SnapshotStore(
        mode="device", name="in_step_store", **common
      )
      grads = model.optimizer.compute_gradients(model.loss)
      self.train_in_step = self.in_step.slots.snapshot_before(
        lambda: model.optimizer.apply_gradients(
          grads, global_step=model.global_step
        )
      )
      self.packed = snapstore.SnapshotStore(
        mode="device", name="packed_store", pack=True, **common
      )
      self.train_packed = self.packed.slots.snapshot_before(
        lambda: model.optimizer.apply_gradients(
          grads, global_step=model.global_step
        )
      )
      self.guarded_store = snapstore.SnapshotStore(
        mode="device", name="if_finite_store", **common
      )
      self.train_if_finite = self.guarded_store.slots.snapshot_before(
        lambda: model.optimizer.apply_gradients(
          grads, global_step=model.global_step
        ),
        if_finite=model.loss,
      )
      self.inside = snapstore.SnapshotStore(
        mode="device", name="inside_store", **common
      )
      self.train_minimize_inside = self.inside.slots.snapshot_before(
        lambda: model.optimizer.minimize(
          model.loss, global_step=model.global_step
        )
      )
      # The same bytes in one variable: one assign instead of one per variable.
      flat = tf.Variable(
        tf.zeros([self.device.param_nbytes // 4]),
        trainable=False,
        collections=[],
        name="flat",
      )
      flat_shadow = tf.Variable(
        tf.zeros_like(flat.initialized_value()),
        trainable=False,
        collections=[],
        name="flat_shadow",
      )
      self.flat_copy = tf.assign(flat_shadow, flat).op
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
        flat.initializer,
        flat_shadow.initializer,
      ]
      no_op = tf.no_op()
    self.graph.finalize()
    self.snapshot_op = self.device.slots.snapshot_op(0)
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

    def baseline(feed, i):
      del i
      sess.run(train, feed)

    def every(store, n):
      def step(feed, i):
        if i % n == 0:
          store.snapshot(0, session=sess)
        sess.run(train, feed)

      return step

    def in_step_every(n, train_in_step=self.train_in_step):
      def step(feed, i):
        sess.run(train_in_step if i % n == 0 else train, feed)

      return step

    def extra_run(feed, i):
      del i
      self.no_op()
      sess.run(train, feed)

    def guarded(feed, i):
      del i
      with snapstore.Guard(
        self.device, watch_tensors=loss, session=sess
      ) as guard:
        guard.run(train, feed)

    def guarded_in_step(feed, i):
      del i
      with snapstore.Guard(
        self.in_step, watch_tensors=loss, tag="before_step", session=sess
      ) as guard:
        guard.run(self.train_in_step, feed)

    if self.large:
      return [
        ("baseline", baseline),
        ("device, every step", every(self.device, 1)),
        ("in-step, every step", in_step_every(1)),
        ("in-step packed, every step", in_step_every(1, self.train_packed)),
        (
          "in-step if finite, every step",
          in_step_every(1, self.train_if_finite),
        ),
      ]
    return [
      ("baseline", baseline),
      ("device, every step", every(self.device, 1)),
      ("device, every 10 steps", every(self.device, 10)),
      ("host, every step", every(self.host, 1)),
      ("host, every 10 steps", every(self.host, 10)),
      ("in-step, every step", in_step_every(1)),
      ("in-step, every 10 steps", in_step_every(10)),
      ("in-step packed, every step", in_step_every(1, self.train_packed)),
      ("in-step if finite, every step", in_step_every(1, self.train_if_finite)),
      (
        "in-step, minimize inside",
        in_step_every(1, self.train_minimize_inside),
      ),
      ("guard, every step", guarded),
      ("guard, in-step, every step", guarded_in_step),
      ("extra no_op run, every step", extra_run),
    ]

  def single_calls(self, calls):
    """Median microseconds per call of the pieces a snapshot call is made of."""
    sess = self.sess
    snapshot_op = sess.make_callable(self.snapshot_op)
    pieces = [
      (
        "store.snapshot() (device)",
        lambda: self.device.snapshot(0, session=sess),
      ),
      ("callable(store.slots.snapshot_op(0))", snapshot_op),
      (
        "callable(one assign of the same bytes)",
        sess.make_callable(self.flat_copy),
      ),
      ("callable(tf.no_op())", self.no_op),
    ]
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
  """Measures the demo model, then the large one (unless --large-batch 0)."""
  results = {"demo": measure(Loop(args.batch), args.steps, args)}
  if args.large_batch:
    results["large"] = measure(
      Loop(args.large_batch, args.large_hidden, large=True),
      args.large_steps,
      args,
    )
  return results


def measure(loop, steps, args):
  """Interleaved rounds of every variant of `loop`: rows, samples, single calls."""
  variants = loop.variants()
  samples = {name: [] for name, _ in variants}
  for r in range(args.warmup + args.rounds):
    order = variants[r % len(variants) :] + variants[: r % len(variants)]
    for name, step in order:
      seconds = loop.time_round(step, steps)
      if r >= args.warmup:
        samples[name].append(seconds)
  calls = loop.single_calls(args.calls) if not loop.large else []
  loop.sess.close()
  base = samples["baseline"]
  rows = []
  for name, _ in variants:
    ratios = [s / b for s, b in zip(samples[name], base)]
    rows.append(
      {
        "variant": name,
        "median_us_per_step": 1e6 * statistics.median(samples[name]),
        "min_us_per_step": 1e6 * min(samples[name]),
        "overhead": statistics.median(ratios) - 1.0,
        "overhead_q1": _quantile(ratios, 0.25) - 1.0,
        "overhead_q3": _quantile(ratios, 0.75) - 1.0,
      }
    )
  return {
    "batch": len(next(iter(loop.feeds[0].values()))),
    "variables": loop.num_variables,
    "param_nbytes": loop.param_nbytes,
    "rows": rows,
    "samples_seconds_per_step": samples,
    "single_calls_us": calls,
  }


def _quantile(values, q):
  return float(np.quantile(values, q))


def main(argv=None):
  args = parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  tf.logging.set_verbosity(tf.logging.ERROR)
  info = {
    "python": platform.python_version(),
    "tensorflow": tf.__version__,
    "numpy": np.__version__,
    "platform": platform.platform(),
    "cpus": os.cpu_count(),
    "snapstore": snapstore.__version__,
  }
  print(
    "bench_training: demo classifier, batch %d, %d steps x %d rounds "
    "(+%d warm-up), interleaved"
    % (args.batch, args.steps, args.rounds, args.warmup)
  )
  if args.large_batch:
    print(
      "large model: hidden width %d, batch %d, %d steps x %d rounds"
      % (args.large_hidden, args.large_batch, args.large_steps, args.rounds)
    )
  print(
    "%(platform)s, %(cpus)s CPUs, Python %(python)s, TensorFlow "
    "%(tensorflow)s" % info
  )
  info["load_before"] = os.getloadavg()
  results = run(args)
  info["load_after"] = os.getloadavg()
  # Other processes on the machine show up as noise in every row.
  print(
    "load average (1, 5, 15 min): before %s, after %s"
    % (
      " ".join("%.2f" % v for v in info["load_before"]),
      " ".join("%.2f" % v for v in info["load_after"]),
    )
  )
  for model, result in results.items():
    print()
    print(
      "%s model, batch %d: %d variables (model + Adam slots and beta powers "
      "+ global_step), %.1f KiB per snapshot"
      % (
        model,
        result["batch"],
        result["variables"],
        result["param_nbytes"] / 1024.0,
      )
    )
    print(
      "%-34s %12s %12s %22s"
      % ("variant", "median us", "min us", "overhead (q1..q3)")
    )
    for row in result["rows"]:
      print(
        "%-34s %12.1f %12.1f %8.1f%% (%5.1f..%5.1f)"
        % (
          row["variant"],
          row["median_us_per_step"],
          row["min_us_per_step"],
          100 * row["overhead"],
          100 * row["overhead_q1"],
          100 * row["overhead_q3"],
        )
      )
    if result["single_calls_us"]:
      print(
        "single calls (median us): "
        + ", ".join("%s %.1f" % c for c in result["single_calls_us"])
      )
  print()
  targets = []
  for model, variant, bound in TARGETS:
    if model not in results:
      continue
    row = next(r for r in results[model]["rows"] if r["variant"] == variant)
    met = row["overhead"] <= bound
    targets.append(
      {
        "model": model,
        "variant": variant,
        "bound": bound,
        "overhead": row["overhead"],
        "met": met,
      }
    )
    print(
      "target: %s model, %s, overhead <= %.0f%%: %s (%.1f%%, q1..q3 "
      "%.1f..%.1f%%)"
      % (
        model,
        variant,
        100 * bound,
        "met" if met else "MISSED",
        100 * row["overhead"],
        100 * row["overhead_q1"],
        100 * row["overhead_q3"],
      )
    )
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump(
        {
          "config": vars(args),
          "environment": info,
          "models": results,
          "targets": targets,
        },
        f,
        indent=1,
        sort_keys=True,
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
