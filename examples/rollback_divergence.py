"""Rolling back divergent steps of a learning rate that is too high.

    python examples/rollback_divergence.py [--steps 300] [--lr 2.0]

A regression network trained with momentum SGD at a learning rate far too
high diverges: the loss grows and becomes NaN within a few steps. Two ways
to survive it with snapstore:

- `snapstore.RollbackOptimizer`: after each step, a check run evaluates the
  loss on the same batch; a step that made it rise is undone in the graph
  (parameters and momentum, bit for bit) and the learning rate variable is
  halved. A step may raise the loss by `RELATIVE_TOLERANCE` of it.
- `snapstore.Trial(store, metric=loss, feed_dict=batch)`: the same decision made in
  Python: the store snapshots the model and the optimizer's state, the step
  runs, and the snapshot is restored (and the learning rate halved) when the
  loss on the batch rose by more than the tolerance.

Watching only for a non-finite loss (`snapstore.Guard(store, watch_tensors=loss)`) would not be
enough here: a diverging loss grows through large finite values for several
steps before it overflows, and by then the state the guard took at the start
of the step is already ruined. For that, roll back further, to a snapshot from
before the loss started to grow (as `python -m snapstore.demo` does).

The script trains all three from the same initial weights on the same
batches and prints what happened.
"""

import argparse
import importlib.util
import os
import sys

import numpy as np

# Before TensorFlow is imported: without its start-up notices (no GPU,
# oneDNN, CPU build options) and warnings; see snapstore/_tf_startup.py.
os.environ.setdefault("SNAPSTORE_QUIET_TF", "1")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import snapstore  # pylint: disable=g-import-not-at-top
import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x (1.15's default)

# A step may raise the loss on its batch by this fraction (momentum carries
# earlier batches' directions); a diverging step raises it far more.
RELATIVE_TOLERANCE = 0.25


def make_data(seed=0, n=2000, features=8):
  rng = np.random.RandomState(seed)
  x = rng.randn(n, features).astype(np.float32)
  y = (np.sin(x.dot(rng.randn(features))) + 0.1 * rng.randn(n)).astype(
    np.float32
  )
  return x, y


class Model(object):
  def __init__(self, features, lr, rollback):
    self.x = tf.placeholder(tf.float32, [None, features])
    self.y = tf.placeholder(tf.float32, [None])
    self.lr = tf.Variable(lr, trainable=False, name="learning_rate")
    with tf.variable_scope("net"):
      hidden = tf.layers.dense(self.x, 64, tf.nn.tanh)
      out = tf.squeeze(tf.layers.dense(hidden, 1), 1)
    self.loss = tf.reduce_mean(tf.square(out - self.y))
    self.step = tf.train.get_or_create_global_step()
    self.optimizer = tf.train.MomentumOptimizer(self.lr, 0.9)
    if rollback:
      self.optimizer = snapstore.RollbackOptimizer(
        self.optimizer,
        learning_rate=self.lr,
        backoff=0.5,
        relative_tolerance=RELATIVE_TOLERANCE,
      )
    self.train_op = self.optimizer.minimize(self.loss, global_step=self.step)


def not_worse(before, after):
  """RollbackOptimizer's criterion, for snapstore.Trial."""
  return np.isfinite(after) and after - before <= RELATIVE_TOLERANCE * abs(
    before
  )


def run(mode, data, steps, lr, out):
  """Trains in `mode` ("plain", "rollback" or "trial"); returns a summary."""
  x, y = data
  held_out = slice(1500, None)
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    model = Model(x.shape[1], lr, rollback=mode == "rollback")
    if mode == "trial":
      store = snapstore.SnapshotStore(
        scope="net", optimizer=model.optimizer, include_global_step=True
      )
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()
  rng = np.random.RandomState(1)
  summary = {"rollbacks": 0, "diverged_at": None}
  with tf.Session(graph=graph) as sess:
    sess.run(init)
    summary["start"] = sess.run(
      model.loss, {model.x: x[held_out], model.y: y[held_out]}
    )
    for step in range(steps):
      batch = rng.randint(0, 1500, 32)
      feed = {model.x: x[batch], model.y: y[batch]}
      if mode == "plain":
        sess.run(model.train_op, feed)
        if not np.isfinite(sess.run(model.loss, feed)):
          summary["diverged_at"] = step
          break
      elif mode == "rollback":
        sess.run(model.train_op, feed)
        summary["rollbacks"] += int(sess.run(model.optimizer.check, feed))
      else:
        with snapstore.Trial(
          store,
          metric=model.loss,
          feed_dict=feed,
          accept=not_worse,
          session=sess,
        ) as trial:
          sess.run(model.train_op, feed)
        if not trial.kept:  # the store restored the snapshot: go slower
          model.lr.load(sess.run(model.lr) * 0.5, sess)
          summary["rollbacks"] += 1
    summary["end"] = sess.run(
      model.loss, {model.x: x[held_out], model.y: y[held_out]}
    )
    summary["lr"] = sess.run(model.lr)
  if summary["diverged_at"] is not None:
    out("%-9s loss NaN after step %d" % (mode, summary["diverged_at"]))
  else:
    out(
      "%-9s held-out loss %.4f -> %.4f, %d rollbacks, learning rate now %g"
      % (
        mode,
        summary["start"],
        summary["end"],
        summary["rollbacks"],
        summary["lr"],
      )
    )
  return summary


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--lr", type=float, default=2.0)
  args = parser.parse_args(argv)
  tf.logging.set_verbosity(tf.logging.ERROR)
  data = make_data()
  print("momentum SGD at learning rate %g, %d steps" % (args.lr, args.steps))
  results = {
    mode: run(mode, data, args.steps, args.lr, print)
    for mode in ("plain", "rollback", "trial")
  }
  ok = results["plain"]["diverged_at"] is not None
  for mode in ("rollback", "trial"):
    r = results[mode]
    ok = (
      ok
      and r["rollbacks"] > 0
      and np.isfinite(r["end"])
      and r["end"] < r["start"]
    )
  if not ok:
    print(
      "FAILED: expected the plain run to diverge and both rollbacks to learn"
    )
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
