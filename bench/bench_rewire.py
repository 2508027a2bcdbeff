"""Benchmark: past and current parameters in one run, rewired vs swapped.

A model whose forward pass dominates (an MLP of large matmuls on a batch) is
evaluated with its current parameters and with the parameters of a snapshot
in device slot 0, in seven ways:

  forward             current only: `sess.run(out)`; the unit of the ratios.
  rewired past        `sess.run(store.slots.past(out))`: reads the slot directly.
  rewired both        `sess.run([out, past])`: past and current in one run.
  evaluate_with       `store.evaluate_with(out)` when `out` has a rewired
                      version (the rewired path, one run).
  swap (store)        `store.evaluate_with` of a fetch without a rewired
                      version: set aside, restore, run, put back.
  swap (by hand)      what users write today: assign ops built once, run as
                      save current / load past / run / load current back.
  two graphs          the network built twice (current and past variables),
                      both evaluated in one run: what users do when they still
                      have the building function.

"+ current" rows add one forward run to the past-only ways, for comparison
with the one-run ways. The target is on the rewired evaluation: the past
costs at most 1.2 forward passes, measured both alone
(`rewired past / forward`) and as the extra cost of fetching it next to the
current outputs (`rewired both / forward - 1`), on medians (the minimums
are printed too, to tell contention on a shared machine from cost).

Usage: python bench/bench_rewire.py [--quick] [--batch N] [--width N]
[--depth N] [--json PATH]. A missed target is reported, not an exit status.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

tf.logging.set_verbosity(tf.logging.ERROR)

TARGET = 1.2


def _network(x, scope, width, depth):
  with tf.variable_scope(scope):
    h = x
    for i in range(depth):
      h = tf.layers.dense(h, width, activation=tf.nn.relu, name="dense_%d" % i)
    return tf.layers.dense(h, 10, name="logits")


def _seconds(timings, repeats, warmup=3):
  """Median and minimum seconds of each `(name, fn)`, in interleaved rounds.

  Interleaving spreads slow phases of the machine (another process, CPU
  frequency) over every way instead of penalizing whichever ran then. The
  median is the figure of record; the minimum, the least disturbed run, says
  how much of a difference is contention.
  """
  for _, fn in timings:
    for _ in range(warmup):
      fn()
  times = dict((name, []) for name, _ in timings)
  for _ in range(repeats):
    for name, fn in timings:
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return [
    (name, float(np.median(times[name])), float(np.min(times[name])))
    for name, _ in timings
  ]


def run(batch, width, depth, repeats):
  """Returns [(name, median seconds, min seconds)] and the parameter bytes."""
  graph = tf.Graph()
  with graph.as_default():
    x = tf.placeholder(tf.float32, [None, width])
    out = _network(x, "net", width, depth)
    store = snapstore.SnapshotStore(scope="net")
    past = store.slots.past(out)
    swap_fetch = tf.identity(out)  # no rewired version: evaluate_with swaps
    current_vars = list(store.variables.values())
    with tf.variable_scope("by_hand"):
      backup = [
        tf.Variable(tf.zeros_like(v.initialized_value()), trainable=False)
        for v in current_vars
      ]
      held = [
        tf.Variable(tf.zeros_like(v.initialized_value()), trainable=False)
        for v in current_vars
      ]
    save = tf.group(*[tf.assign(b, v) for b, v in zip(backup, current_vars)])
    load_past = tf.group(*[tf.assign(v, h) for v, h in zip(current_vars, held)])
    load_back = tf.group(
      *[tf.assign(v, b) for v, b in zip(current_vars, backup)]
    )
    keep_past = tf.group(*[tf.assign(h, v) for h, v in zip(held, current_vars)])
    twin = _network(x, "twin", width, depth)
    perturb = tf.group(
      *[tf.assign_add(v, tf.fill(v.shape, 0.01)) for v in current_vars]
    )
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()
  feed = {x: np.random.RandomState(0).randn(batch, width).astype(np.float32)}
  with tf.Session(graph=graph) as sess:
    sess.run(init)
    store.snapshot(session=sess)
    sess.run(keep_past)
    sess.run(perturb)  # past and current differ

    def by_hand():
      sess.run(save)
      sess.run(load_past)
      value = sess.run(out, feed)
      sess.run(load_back)
      return value

    np.testing.assert_array_equal(sess.run(past, feed), by_hand())
    np.testing.assert_array_equal(
      store.evaluate_with(out, feed, session=sess),
      store.evaluate_with(swap_fetch, feed, session=sess),
    )
    timings = [
      ("forward", lambda: sess.run(out, feed)),
      ("rewired past", lambda: sess.run(past, feed)),
      ("rewired both (one run)", lambda: sess.run([out, past], feed)),
      (
        "evaluate_with (rewired)",
        lambda: store.evaluate_with(out, feed, session=sess),
      ),
      (
        "swap (store)",
        lambda: store.evaluate_with(swap_fetch, feed, session=sess),
      ),
      ("swap (by hand)", by_hand),
      ("two graphs (one run)", lambda: sess.run([out, twin], feed)),
    ]
    results = _seconds(timings, repeats)
  by_name = dict((name, (median, least)) for name, median, least in results)
  for index, way in ((5, "swap (store)"), (7, "swap (by hand)")):
    results.insert(
      index,
      (
        way + " + current",
        by_name[way][0] + by_name["forward"][0],
        by_name[way][1] + by_name["forward"][1],
      ),
    )
  return results, store.param_nbytes


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer repeats")
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--width", type=int, default=1024)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--json", default=None, help="also write results here")
  args = parser.parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  repeats = 5 if args.quick else 30
  results, nbytes = run(args.batch, args.width, args.depth, repeats)
  median = dict((name, m) for name, m, _ in results)
  least = dict((name, m) for name, _, m in results)

  def target(seconds):
    alone = seconds["rewired past"] / seconds["forward"]
    extra = seconds["rewired both (one run)"] / seconds["forward"] - 1.0
    return alone, extra, max(alone, extra) <= TARGET

  alone, extra, met = target(median)
  min_alone, min_extra, min_met = target(least)
  print(
    "MLP %d x %d, depth %d, batch %d: %.1f MiB of parameters; %d "
    "interleaved runs"
    % (
      args.width,
      args.width,
      args.depth,
      args.batch,
      nbytes / 2.0**20,
      repeats,
    )
  )
  print("")
  print("| way | median ms | / forward | min ms | / forward |")
  print("| --- | ---: | ---: | ---: | ---: |")
  for name, m, l in results:
    print(
      "| %s | %.1f | %.2f | %.1f | %.2f |"
      % (name, 1e3 * m, m / median["forward"], 1e3 * l, l / least["forward"])
    )
  print("")
  for label, (a, e, ok) in (
    ("median", (alone, extra, met)),
    ("min", (min_alone, min_extra, min_met)),
  ):
    print(
      "%s: rewired past alone %.2f forward passes; next to the current "
      "outputs %.2f more (target <= %.1f): %s"
      % (label, a, e, TARGET, "met" if ok else "MISSED")
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {
          "batch": args.batch,
          "width": args.width,
          "depth": args.depth,
          "param_bytes": nbytes,
          "repeats": repeats,
          "median_ms": dict((k, 1e3 * v) for k, v in median.items()),
          "min_ms": dict((k, 1e3 * v) for k, v in least.items()),
          "past_alone_over_forward": alone,
          "past_extra_next_to_current_over_forward": extra,
          "target": TARGET,
          "met": met,
        },
        f,
        indent=2,
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
