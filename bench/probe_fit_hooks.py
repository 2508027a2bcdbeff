#!/usr/bin/env python
"""Probe: where a per-batch SnapshotCallback's cost in `fit` goes (TF 2.x).

On an MLP of the size of Keras's MNIST example (784-128-10, Adam, batch 128,
0.1 M parameters, 1.2 MiB of state with Adam's moments), `fit` per batch (the
second epoch of a 2-epoch fit), interleaved round by round:

- bare, twice (two models: the noise between identical runs);
- a batch-end hook that does nothing, plain and marked `async_safe` (a
  callback with `on_train_batch_end` makes Keras 3 run the batch-end hooks
  in the loop's thread instead of its thread pool);
- an empty traced function called from the batch-begin hook (what any hook
  that runs TensorFlow work cannot cost less than);
- the store's snapshot function called from that hook (the copy alone,
  without the store's Python layer);
- `SnapshotCallback(every_n_batches=1)`, `SnapshotCallback(in_step=True)`
  (a copy of the state in every step) and `SnapshotCallback(in_step=True,
  in_step_undo="skip")` (the update skipped when the loss is not finite).

Medians and minimums per batch, and their ratios to the first bare row.
Not run by `make bench`.

    TF_USE_LEGACY_KERAS=0 .venv-tf2/bin/python bench/probe_fit_hooks.py --rounds 10
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

BATCH = 128


def hooks(tf, keras, store):
  """Callback factories per variant (None: no callback of the probe's)."""
  empty = tf.function(lambda: tf.constant(0), autograph=False)
  empty = empty.get_concrete_function()
  # The concrete function the store's snapshot into slot 0 calls.
  take = store._h.mode._takes[0]  # pylint: disable=protected-access

  class EndHook(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      pass

  class AsyncEndHook(EndHook):
    async_safe = True

  class EmptyCall(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      empty()

  class CopyCall(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      take()

  return {
    "batch-end hook doing nothing": EndHook,
    "the same, async_safe": AsyncEndHook,
    "empty traced call per batch": EmptyCall,
    "the store's copy function per batch": CopyCall,
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--batches", type=int, default=200)
  args = p.parse_args(argv)
  tf = _tf.tf2
  keras = tf.keras
  stack = _tf.stack()
  print("stack: %s; load average %.2f %.2f %.2f" % ((stack,) + os.getloadavg()))

  rng = np.random.RandomState(0)
  x = rng.rand(BATCH * args.batches, 784).astype(np.float32)
  y = rng.rand(BATCH * args.batches, 10).astype(np.float32)

  def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
      [
        keras.Input((784,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
      ]
    )
    m.compile(
      optimizer=keras.optimizers.Adam(1e-4), loss="mse", metrics=["mae"]
    )
    m.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)  # built
    return m

  setups = {"bare": (model(), list), "bare again": (model(), list)}
  for name in [
    "batch-end hook doing nothing",
    "the same, async_safe",
    "empty traced call per batch",
    "the store's copy function per batch",
  ]:
    m = model()
    store = snapstore.SnapshotStore(
      var_list=m, optimizer=m.optimizer, mode="device", max_to_keep=1
    )
    store.snapshot()  # slot 0 written once: the copy function is traced
    setups[name] = (m, lambda c=hooks(tf, keras, store)[name]: [c()])
  setups["SnapshotCallback(every_n_batches=1)"] = (
    model(),
    lambda: [snapstore.SnapshotCallback(every_n_batches=1)],
  )
  setups["SnapshotCallback(in_step=True)"] = (
    model(),
    lambda: [snapstore.SnapshotCallback(in_step=True)],
  )
  setups["in_step=True, in_step_undo='skip'"] = (
    model(),
    lambda: [snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")],
  )
  names = list(setups)
  times = dict((n, []) for n in names)
  for r in range(args.warmup + args.rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      m, callbacks = setups[name]
      timer = bench_eager.EpochTimer.make(keras, args.batches)
      m.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks() + [timer],
      )
      if r >= args.warmup:
        times[name].extend(timer.per_batch)
  base_med = np.median(times["bare"])
  base_min = min(times["bare"])
  print(
    "%d batches of %d, %d rounds after %d warm-up"
    % (args.batches, BATCH, args.rounds, args.warmup)
  )
  print(
    "%-40s %9s %9s %9s %8s %8s"
    % ("variant", "median ms", "min ms", "+ms", "/bare", "min/min")
  )
  for name in names:
    med, low = np.median(times[name]), min(times[name])
    print(
      "%-40s %9.3f %9.3f %+9.3f %8.3f %8.3f"
      % (
        name,
        med * 1e3,
        low * 1e3,
        (med - base_med) * 1e3,
        med / base_med,
        low / base_min,
      )
    )
  print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
  main()
