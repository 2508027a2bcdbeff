#!/usr/bin/env python
"""The in-step train op's copy count, old and new, in one process (kept as run).

A one-off comparison for bench/README.md ("Before and after issues 21 and
22"): one graph holds the demo model and in-step train ops
(`store.slots.snapshot_before`) that differ only in how they count their
copies, built by replacing `snapstore.graph.in_step._count_copies`:

  none        no count (the train op before issue 21)
  old         the count of commit 3bac201: read through value_at_init, add,
              assign (copied below)
  new         the count of the tree on PYTHONPATH
  assign_add  one AssignAddVariableOp, unconditional: the floor, which fails
              where the local initializer never ran (not a candidate)

Rounds of `steps` steps interleave every variant and `sess.run(train_op)`
(the baseline), starting at the next variant each round, as
bench_training.py does. Printed: each variant's overhead over the baseline
(median of per-round ratios, q1..q3) and its extra time per step over
`none` (median of per-round differences). `--micro`: each count's bump
alone, run as a callable after a `tf.no_op()`, against the no_op.

  PYTHONPATH=. .venv/bin/python \
    bench/results/2026-11-25_instep-count/in_step_count.py --rounds 40
"""

import argparse
import importlib.util
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402

import snapstore  # noqa: E402
from snapstore._tf import ops  # noqa: E402
from snapstore._tf import tf  # noqa: E402
from snapstore.core import copies  # noqa: E402
from snapstore.core import shadows  # noqa: E402
from snapstore.core.variables import SHADOW_VARIABLES  # noqa: E402
from snapstore.demo import Classifier  # noqa: E402
from snapstore.demo import make_data  # noqa: E402
from snapstore.graph import in_step  # noqa: E402

NEW = in_step._count_copies


def _counter(anchor, name):
  with ops.init_scope(), ops.colocate_with(anchor), tf.name_scope(name):
    return tf.Variable(
      np.int64(0),
      trainable=False,
      use_resource=True,
      collections=[tf.GraphKeys.LOCAL_VARIABLES, SHADOW_VARIABLES],
      name="count",
    )


def none(copy, anchor, name):
  del copy, anchor, name
  return None, None, None


def old(copy, anchor, name):
  """`_count_copies` at commit 3bac201."""
  counter = _counter(anchor, name)
  with ops.init_scope(), ops.colocate_with(anchor), tf.name_scope(name):
    count = shadows.value_at_init(counter)
    counted = tf.add(count, np.int64(1), name="counted")
    with tf.control_dependencies([copy]):
      bump = copies.assign(counter, counted)
  return count, counted, bump


def assign_add(copy, anchor, name):
  counter = _counter(anchor, name)
  with ops.init_scope(), ops.colocate_with(anchor), tf.name_scope(name):
    with tf.control_dependencies([copy]):
      bump = counter.assign_add(np.int64(1), read_value=False)
  return None, None, bump


VARIANTS = (
  ("none", none),
  ("old", old),
  ("new", NEW),
  ("assign_add", assign_add),
)


def _interleave(fns, rounds, time_one):
  samples = {name: [] for name, _ in fns}
  for r in range(2 + rounds):
    k = r % len(fns)
    for name, fn in fns[k:] + fns[:k]:
      seconds = time_one(fn)
      if r >= 2:
        samples[name].append(seconds)
  return samples


def in_context(steps, rounds):
  (train_x, train_y), _ = make_data()
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    model = Classifier(train_x.shape[1], int(train_y.max()) + 1, 64)
    grads = model.optimizer.compute_gradients(model.loss)
    trains = [("baseline", model.train_op)]
    for name, count in VARIANTS:
      store = snapstore.SnapshotStore(
        mode="device",
        name=name + "_store",
        scope="classifier",
        max_to_keep=1,
        optimizer=model.optimizer,
        include_global_step=True,
      )
      in_step._count_copies = count
      try:
        trains.append(
          (
            name,
            store.slots.snapshot_before(
              lambda: model.optimizer.apply_gradients(
                grads, global_step=model.global_step
              )
            ),
          )
        )
      finally:
        in_step._count_copies = NEW
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()
  sess = tf.Session(graph=graph)
  sess.run(init)
  rng = np.random.RandomState(0)
  feeds = []
  for _ in range(64):
    idx = rng.randint(0, len(train_x), 64)
    feeds.append({model.x: train_x[idx], model.y: train_y[idx]})

  def time_one(op):
    start = time.perf_counter()
    for i in range(steps):
      sess.run(op, feeds[i % len(feeds)])
    return (time.perf_counter() - start) / steps

  samples = _interleave(trains, rounds, time_one)
  base = samples["baseline"]
  print(
    "%-12s %10s %22s %22s"
    % ("variant", "median us", "overhead (q1..q3)", "minus none, us (q1..q3)")
  )
  for name, _ in trains:
    ratios = [s / b for s, b in zip(samples[name], base)]
    diffs = [1e6 * (s - n) for s, n in zip(samples[name], samples["none"])]
    print(
      "%-12s %10.1f %8.1f%% (%5.1f..%5.1f) %8.1f (%5.1f..%5.1f)"
      % (
        name,
        1e6 * statistics.median(samples[name]),
        100 * (statistics.median(ratios) - 1),
        100 * (np.quantile(ratios, 0.25) - 1),
        100 * (np.quantile(ratios, 0.75) - 1),
        statistics.median(diffs),
        np.quantile(diffs, 0.25),
        np.quantile(diffs, 0.75),
      )
    )


def micro(calls, rounds):
  graph = tf.Graph()
  with graph.as_default():
    anchor = tf.Variable(1.0, use_resource=True)
    copy = tf.no_op(name="copy")
    targets = [("no_op", copy)]
    for name, count in VARIANTS[1:]:
      targets.append((name, count(copy, anchor, name)[2]))
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()
  sess = tf.Session(graph=graph)
  sess.run(init)
  fns = [(name, sess.make_callable(op)) for name, op in targets]

  def time_one(fn):
    start = time.perf_counter()
    for _ in range(calls):
      fn()
    return (time.perf_counter() - start) / calls

  samples = _interleave(fns, rounds, time_one)
  for name, _ in fns:
    diffs = [1e6 * (s - n) for s, n in zip(samples[name], samples["no_op"])]
    print(
      "%-12s median %6.1f us, minus no_op %5.1f us"
      % (name, 1e6 * statistics.median(samples[name]), statistics.median(diffs))
    )


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--rounds", type=int, default=40)
  p.add_argument("--micro", action="store_true")
  p.add_argument("--calls", type=int, default=3000)
  args = p.parse_args()
  tf.logging.set_verbosity(tf.logging.ERROR)
  print("TensorFlow %s; load average before %s" % (tf.__version__, _load()))
  if args.micro:
    micro(args.calls, args.rounds)
  else:
    in_context(args.steps, args.rounds)
  print("load average after %s" % _load())


def _load():
  return " ".join("%.2f" % v for v in os.getloadavg())


if __name__ == "__main__":
  main()
