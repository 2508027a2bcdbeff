#!/usr/bin/env python
"""Benchmark: a target network's forward pass read from a store slot.

Three ways to compute a network's output with its past (target) parameters,
on a Keras MLP (`--layers` Dense(`--width`) layers, batch `--batch`) and a
small CNN, each against the others in the same process, interleaved round
by round after warm-up; medians over rounds:

  target model     a separate model holding the target's values (what
                   keras-io's DQN and DDPG keep): its plain forward pass
  past             store.slots.past(lambda x: online(x), slot): the online
                   model's function reading the slot's shadows, no copy
  swap             store.evaluate_with(lambda: online(x), tag=...): the
                   current values set aside, the slot's loaded, the forward,
                   the current values put back (three copies), eagerly

each eagerly (one call per forward) and inside a `tf.function` step that
computes the forward `--inner` times (so that the step, not the dispatch,
is timed). The target: past within 1.05x of the target model's forward.

    .venv-tf2/bin/python bench/bench_past.py
    .venv-tf2/bin/python bench/bench_past.py --width 1024 --repeats 30
    .venv-tf2/bin/python bench/bench_past.py --json bench/results/past.json

On TensorFlow 1.15 (no eager engine) it prints that and exits 0.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--width", type=int, default=512)
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--inner", type=int, default=10)
  p.add_argument("--repeats", type=int, default=40)
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--json", default=None, help="write the figures here")
  return p.parse_args(argv)


def rounds(methods, repeats, warmup):
  """{name: [seconds]}: every method once per round, rotating the start."""
  names = list(methods)
  out = dict((n, []) for n in names)
  for r in range(warmup + repeats):
    order = names[r % len(names) :] + names[: r % len(names)]
    for name in order:
      start = time.perf_counter()
      methods[name]()
      if r >= warmup:
        out[name].append(time.perf_counter() - start)
  return out


def bench_model(label, make, x, args, tf, snapstore):
  online, target = make(1), make(2)
  store = snapstore.SnapshotStore(var_list=online, name=label)
  store.slots.pin(0, "target")
  store.load_arrays(target, tag="target")
  past = store.slots.past(lambda x: online(x), 0)

  def swap():
    return store.evaluate_with(lambda: online(x), tag="target")

  def inner(fn):
    @tf.function
    def step(x):
      total = 0.0
      for i in range(args.inner):  # inputs that differ: no forward is shared
        total += tf.reduce_sum(fn(x + float(i)))
      return total

    return step

  in_step = {
    "target model": inner(lambda x: target(x)),
    "past": inner(past),
    "swap (traced: reads the slot)": inner(
      lambda x: store.evaluate_with(lambda: online(x), tag="target")
    ),
  }
  eager = {
    "target model": lambda: target(x).numpy(),
    "past": lambda: past(x).numpy(),
    "swap": lambda: swap().numpy(),
  }
  out = {}
  for where, methods in (
    ("eager", eager),
    ("tf.function x%d" % args.inner, in_step),
  ):
    calls = dict(
      (n, (lambda f=f: f(x).numpy()) if where != "eager" else f)
      for n, f in methods.items()
    )
    times = rounds(calls, args.repeats, args.warmup)
    base = statistics.median(times["target model"])
    out[where] = dict(
      (n, {"median_s": statistics.median(t), "min_s": min(t)})
      for n, t in times.items()
    )
    for n, t in times.items():
      paired = statistics.median(
        [a / b for a, b in zip(t, times["target model"])]
      )
      out[where][n]["ratio"] = statistics.median(t) / base
      out[where][n]["paired"] = paired
      print(
        "%-5s %-22s %-32s %9.3f ms  %5.2fx (paired %5.2fx)"
        % (
          label,
          where,
          n,
          statistics.median(t) * 1e3,
          out[where][n]["ratio"],
          paired,
        )
      )
  store.close()
  return out


def main(argv=None):
  args = parse_args(argv)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore import _tf  # pylint: disable=g-import-not-at-top

  if _tf.VERSION < (2, 15):
    print("bench_past: the eager engine needs TensorFlow 2.15+; skipped.")
    return 0
  keras = tf.keras
  print(_tf.stack(), "Keras", getattr(keras, "__version__", "(tf.keras)"))

  def mlp(seed):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((args.width,))]
    for _ in range(args.layers - 1):
      layers.append(keras.layers.Dense(args.width, activation="relu"))
    layers.append(keras.layers.Dense(10))
    return keras.Sequential(layers)

  def cnn(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
      [
        keras.Input((24, 24, 3)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(48, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
      ]
    )

  rng = __import__("numpy").random.RandomState(0)
  results = {
    "mlp": bench_model(
      "mlp",
      mlp,
      tf.constant(rng.randn(args.batch, args.width).astype("float32")),
      args,
      tf,
      snapstore,
    ),
    "cnn": bench_model(
      "cnn",
      cnn,
      tf.constant(rng.randn(64, 24, 24, 3).astype("float32")),
      args,
      tf,
      snapstore,
    ),
  }
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "results": results}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
