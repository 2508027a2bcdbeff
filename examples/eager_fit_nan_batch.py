"""Keras `fit` on data with one corrupt batch, rolled back by SnapshotCallback.

    python examples/eager_fit_nan_batch.py [--epochs 3] [--bad-batch 3]

Eager execution (TensorFlow 2.15+; Keras 3, or tf-keras with
TF_USE_LEGACY_KERAS=1). A regression model is trained with Adam on 8 batches
an epoch; one batch has NaN labels, so its loss is NaN. Without snapstore that
batch's update makes every weight NaN and the rest of the fit trains NaNs.
With `snapstore.SnapshotCallback` the batch is undone (weights, Adam's moments
and `iterations`, the metrics) and the fit goes on. The script runs each of the
callback's ways that undo exactly one batch, and checks that each ends bit for
bit where the same fit on the data without the bad batch ends:

- `every_n_batches=1`: a snapshot before every batch, from the batch hook;
- `in_step=True`: the copy and the check inside the compiled train step;
- `in_step=True, in_step_undo="skip"`: nothing copied, the bad step's update
  not applied.
"""

import argparse
import os
import sys

import numpy as np

# Before TensorFlow is imported: without its start-up notices (no GPU,
# oneDNN, CPU build options) and warnings; see snapstore/_tf_startup.py.
os.environ.setdefault("SNAPSTORE_QUIET_TF", "1")

import snapstore  # noqa: E402
import tensorflow as tf  # noqa: E402

BATCH = 32
BATCHES = 8  # an epoch
WAYS = {
  "every_n_batches=1": dict(every_n_batches=1),
  "in_step=True": dict(in_step=True),
  'in_step=True, in_step_undo="skip"': dict(in_step=True, in_step_undo="skip"),
}


def make_model():
  """The same initial weights at every call."""
  keras = tf.keras
  keras.utils.set_random_seed(0)
  model = keras.Sequential(
    [
      keras.Input((4,)),
      keras.layers.Dense(32, activation="relu"),
      keras.layers.Dense(1),
    ]
  )
  model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
  return model


def fit(x, y, epochs, callbacks=()):
  """A model fit on (x, y) in order, and its final weights' bytes."""
  model = make_model()
  model.fit(
    x,
    y,
    batch_size=BATCH,
    epochs=epochs,
    shuffle=False,
    verbose=0,
    callbacks=list(callbacks),
  )
  return model, [v.numpy().tobytes() for v in model.weights]


def mse(model, x, y):
  return float(np.mean((model.predict(x, verbose=0) - y) ** 2))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--bad-batch", type=int, default=3)
  args = parser.parse_args(argv)
  if not 0 <= args.bad_batch < BATCHES:
    parser.error("--bad-batch must be in [0, %d)" % BATCHES)

  rng = np.random.RandomState(0)
  x = rng.rand(BATCH * BATCHES, 4).astype(np.float32)
  y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
  bad = slice(args.bad_batch * BATCH, (args.bad_batch + 1) * BATCH)
  bad_y = y.copy()
  bad_y[bad] = np.nan
  good = np.r_[0 : bad.start, bad.stop : len(x)]
  print(
    "TensorFlow %s; batch %d of each epoch has NaN labels"
    % (tf.__version__, args.bad_batch)
  )

  plain, _ = fit(x, bad_y, args.epochs)
  print("%-36s MSE %s" % ("no callback", mse(plain, x[good], y[good])))
  ok = True
  for name, options in WAYS.items():
    model, weights = fit(
      x, bad_y, args.epochs, [snapstore.SnapshotCallback(**options)]
    )
    _, expect = fit(
      x[good], y[good], args.epochs, [snapstore.SnapshotCallback(**options)]
    )
    same = weights == expect
    steps = int(model.optimizer.iterations.numpy())
    print(
      "%-36s MSE %.6f, %d steps, bit for bit as without the bad batch: %s"
      % (name, mse(model, x[good], y[good]), steps, same)
    )
    ok = ok and same and steps == args.epochs * (BATCHES - 1)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
