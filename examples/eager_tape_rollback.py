"""A GradientTape loop over plain variables, rolled back after a bad batch.

    python examples/eager_tape_rollback.py [--steps 60] [--bad-step 30]

Eager execution (TensorFlow 2.15+). A two-layer network written with plain
`tf.Variable`s is trained with Adam in a `tf.function` step; one batch has NaN
labels. The script trains three times from the same initial values:

- without snapstore: the bad step makes the weights and Adam's moments NaN,
  and every later step trains NaNs;
- with an in-step snapshot (`store.slots.snapshot_in_step()`): each step
  reads the values it starts from first and copies them into a device slot at
  its end, in the step's own function; after the bad step,
  `store.restore("before_step")` puts the weights, Adam's moments and its
  `iterations` back, bit for bit, and training goes on with the next batch;
- without the bad batch at all: the reference.

It checks that the second run ends bit for bit where the third does.
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


def batches(steps, bad_step):
  """`steps` batches of a regression task; `bad_step`'s labels are NaN."""
  rng = np.random.RandomState(0)
  out = []
  for step in range(steps):
    x = rng.rand(32, 4).astype(np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)
    if step == bad_step:
      y[:] = np.nan
    out.append((x, y))
  return out


def train(data, rollback):
  """Trains from the same initial values; returns the variables and Adam."""
  rng = np.random.RandomState(1)
  params = [
    tf.Variable(rng.randn(4, 16).astype(np.float32) * 0.5, name="w1"),
    tf.Variable(np.zeros(16, np.float32), name="b1"),
    tf.Variable(rng.randn(16, 1).astype(np.float32) * 0.5, name="w2"),
    tf.Variable(np.zeros(1, np.float32), name="b2"),
  ]
  opt = tf.keras.optimizers.Adam(0.01)
  opt.build(params)  # its moments exist now, so the store covers them
  store = snapstore.SnapshotStore(var_list=params, optimizer=opt)
  snap = store.slots.snapshot_in_step()  # slot 0, pinned as "before_step"
  w1, b1, w2, b2 = params

  @tf.function
  def step(x, y):
    start = snap.begin()  # first: the values this step starts from
    with tf.GradientTape() as tape:
      hidden = tf.nn.tanh(tf.matmul(x, w1) + b1)
      loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w2) + b2 - y))
    grads = tape.gradient(loss, params)
    opt.apply_gradients(zip(grads, params))
    start.commit()  # into the slot: where the next rollback goes back to
    return loss

  rollbacks = 0
  for x, y in data:
    loss = float(step(x, y))
    if rollback and not np.isfinite(loss):
      store.restore("before_step")  # the bad step undone, bit for bit
      rollbacks += 1
  return params, opt, rollbacks


def final_loss(params, data):
  w1, b1, w2, b2 = (p.numpy() for p in params)
  losses = []
  for x, y in data:
    out = np.tanh(x.dot(w1) + b1).dot(w2) + b2
    losses.append(np.mean((out - y) ** 2))
  return float(np.mean(losses))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--bad-step", type=int, default=30)
  args = parser.parse_args(argv)
  if not 0 <= args.bad_step < args.steps:
    parser.error("--bad-step must be in [0, --steps)")
  data = batches(args.steps, args.bad_step)
  good = [b for i, b in enumerate(data) if i != args.bad_step]

  plain, _, _ = train(data, rollback=False)
  print("no rollback     loss %s" % final_loss(plain, good))
  params, opt, rollbacks = train(data, rollback=True)
  ref, ref_opt, _ = train(good, rollback=False)
  same = all(
    a.numpy().tobytes() == b.numpy().tobytes()
    for a, b in zip(params + opt.variables, ref + ref_opt.variables)
  )
  print(
    "rollback        loss %.6f, %d rollback(s), Adam at step %d"
    % (final_loss(params, good), rollbacks, int(opt.iterations.numpy()))
  )
  print(
    "without the bad batch: bit for bit the same weights and Adam: %s" % same
  )
  return 0 if same and rollbacks == 1 else 1


if __name__ == "__main__":
  sys.exit(main())
