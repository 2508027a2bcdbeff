#!/usr/bin/env python
"""Probe: the cost of SnapshotCallback(in_step=True)'s rollback tf.cond,
lowered into the step or kept a function call (TF 2.x, Keras 3 or tf-keras).

On the tests' small model (Dense 8 - BatchNorm - Dense 1, Adam, batch 32),
`fit` per batch (the second epoch of a 2-epoch fit, 100 batches), bare, with
the in-step callback as it is (the cond kept a call: `_tf.keep_cond_as_call`)
and with the cond left to TensorFlow's lowering (that call made a no-op),
interleaved round by round; medians and minimums. Not run by `make bench`.

    .venv-tf2/bin/python bench/probe_in_step_cond.py --rounds 10
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import bench_eager  # noqa: E402  (this folder: the fit timer)

import snapstore  # noqa: E402
from snapstore import _tf  # noqa: E402
from snapstore.training import in_step_undo  # noqa: E402

BATCHES = 100


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--warmup", type=int, default=2)
  args = p.parse_args(argv)
  tf = _tf.tf2
  keras = tf.keras
  stack = _tf.stack()
  print("stack: %s; load average %.2f %.2f %.2f" % ((stack,) + os.getloadavg()))
  kept = in_step_undo.keep_cond_as_call

  def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
      [
        keras.Input((3,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1),
      ]
    )
    m.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    return m

  rng = np.random.RandomState(0)
  x = rng.rand(32 * BATCHES, 3).astype(np.float32)
  y = rng.rand(32 * BATCHES, 1).astype(np.float32)
  variants = ["bare", "in-step, cond kept a call", "in-step, cond lowered"]
  models = dict((v, model()) for v in variants)
  times = dict((v, []) for v in variants)
  for r in range(args.warmup + args.rounds):
    for v in variants[r % 3 :] + variants[: r % 3]:
      # The wrapped step is traced in each fit: the switch takes effect there.
      in_step_undo.keep_cond_as_call = (
        (lambda output: None) if v.endswith("lowered") else kept
      )
      timer = bench_eager.EpochTimer.make(keras, BATCHES)
      callbacks = (
        [] if v == "bare" else [snapstore.SnapshotCallback(in_step=True)]
      )
      models[v].fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks + [timer],
      )
      if r >= args.warmup:
        times[v] += timer.per_batch
  in_step_undo.keep_cond_as_call = kept
  bare_med, bare_min = np.median(times["bare"]), np.min(times["bare"])
  print(
    "%-28s %10s %10s %8s %8s" % ("", "median ms", "min ms", "x med", "x min")
  )
  for v in variants:
    med, low = np.median(times[v]), np.min(times[v])
    print(
      "%-28s %10.3f %10.3f %8.3f %8.3f"
      % (v, 1e3 * med, 1e3 * low, med / bare_med, low / bare_min)
    )
  print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
  return 0


if __name__ == "__main__":
  sys.exit(main())
