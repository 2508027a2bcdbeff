#!/usr/bin/env python
"""Probe: what an in-step undo adds to Keras's compiled train function, per step.

`fit`'s per-batch times on this 2-core machine swing by 10-50% between
rounds (bench/README.md, "The eager engine"), more than
the few tens of microseconds an in-step undo adds to a 1-2 ms step. This
probe times the part that the in-step modes change, Keras's train function
(`model.train_function`, one compiled step; the batch hooks do no TensorFlow
work after a step whose logged loss is finite), called directly in blocks of
`--steps` steps, every variant's block one after the other, `--blocks` times,
rotating the order. Variants: bare (twice: the noise between identical
models), `SnapshotCallback(in_step=True)` (copy) and `SnapshotCallback(in_step=
True, in_step_undo="skip")`, each on its own model with the same weights, the
callback's wrapped train function made by its `on_train_begin`.

Per step: the median and minimum over blocks, the median of the per-block
ratios to the first bare model's block ("paired"), and the added
microseconds. Models: the tests' Dense 8 - BatchNorm - Dense 1 (batch 32) and
an MLP the size of Keras's MNIST example (784-128-10, batch 128), Adam;
`--jit-compile` compiles every variant's step with XLA. Not run by
`make bench`.

    TF_USE_LEGACY_KERAS=0 .venv-tf2/bin/python bench/probe_in_step_micro.py
    TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python bench/probe_in_step_micro.py --model mnist
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import snapstore  # noqa: E402
from snapstore import _tf  # noqa: E402
from snapstore import _keras


def _model(keras, name, jit_compile=False):
  keras.utils.set_random_seed(0)
  if name == "mnist":
    layers = [
      keras.Input((784,)),
      keras.layers.Dense(128, activation="relu"),
      keras.layers.Dense(10),
    ]
  else:  # the tests' model
    layers = [
      keras.Input((3,)),
      keras.layers.Dense(8, activation="relu"),
      keras.layers.BatchNormalization(),
      keras.layers.Dense(1),
    ]
  model = keras.Sequential(layers)
  model.compile(
    optimizer=keras.optimizers.Adam(1e-4),
    loss="mse",
    metrics=["mae"],
    jit_compile=jit_compile,
  )
  return model


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", choices=["tests", "mnist"], default="tests")
  p.add_argument("--blocks", type=int, default=200)
  p.add_argument("--steps", type=int, default=100)
  p.add_argument(
    "--jit-compile",
    action="store_true",
    help="compile every variant's step with XLA (compile(jit_compile=True))",
  )
  args = p.parse_args(argv)
  tf = _tf.tf2
  keras = tf.keras
  stack = _tf.stack()
  print(
    "stack: %s, Keras %s; load average %.2f %.2f %.2f"
    % (
      (stack, "3" if _keras.uses_keras_3() else "2 (tf-keras)")
      + os.getloadavg()
    )
  )
  batch = 128 if args.model == "mnist" else 32
  rng = np.random.RandomState(0)
  x = rng.rand(batch, 784 if args.model == "mnist" else 3).astype(np.float32)
  y = rng.rand(batch, 10 if args.model == "mnist" else 1).astype(np.float32)
  data = tf.data.Dataset.from_tensors((x, y)).repeat()

  functions = {}
  for name, undo in [
    ("bare", None),
    ("bare again", None),
    ("in-step copy", "copy"),
    ("in-step skip", "skip"),
  ]:
    model = _model(keras, args.model, args.jit_compile)
    model.fit(x, y, batch_size=batch, verbose=0)  # built: optimizer, metrics
    if undo is None:
      model.make_train_function(force=True)
    else:
      callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
      callback.set_model(model)
      callback.set_params({"verbose": 0, "epochs": 1, "steps": None})  # as fit
      callback.on_train_begin()  # wraps the step, makes the train function
    iterator = iter(data)
    for _ in range(50):  # traced and warm
      model.train_function(iterator)
    functions[name] = (model.train_function, iterator)

  names = list(functions)
  times = dict((n, []) for n in names)
  for b in range(args.blocks):
    for name in names[b % len(names) :] + names[: b % len(names)]:
      function, iterator = functions[name]
      start = time.perf_counter()
      for _ in range(args.steps):
        logs = function(iterator)
      np.asarray(logs["loss"])  # the last step done
      times[name].append((time.perf_counter() - start) / args.steps)
  base = np.array(times["bare"])
  print(
    "%s model, batch %d%s: %d blocks of %d steps"
    % (
      args.model,
      batch,
      ", jit_compile=True" if args.jit_compile else "",
      args.blocks,
      args.steps,
    )
  )
  print(
    "%-14s %10s %10s %8s %9s"
    % ("variant", "median us", "min us", "paired", "+us")
  )
  for name in names:
    t = np.array(times[name])
    print(
      "%-14s %10.1f %10.1f %8.3f %+9.1f"
      % (
        name,
        np.median(t) * 1e6,
        t.min() * 1e6,
        np.median(t / base),
        (np.median(t) - np.median(base)) * 1e6,
      )
    )
  print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
  main()
