"""Lookahead around SGD with momentum on a classification task.

    python examples/lookahead_classification.py [--steps 1002] [--lr 0.5]

Trains the same two-layer classifier on the demo data (`snapstore.demo`)
twice, from the same initial weights and on the same batches: with
momentum SGD alone, and with `snapstore.Lookahead(momentum SGD, k=5,
alpha=0.5)`, at a learning rate on the high side for momentum SGD (where the
paper reports Lookahead's stabilizing effect); the script prints what it
measures. The default step count is not a multiple of k, so the run ends
mid-cycle, with fast and slow weights apart. Lookahead's slow weights are device shadows; the held-out
accuracy of the slow weights is measured with `evaluate_with`, which leaves
the fast weights as they were. One `session.run(train_op)` is one step: the
synchronization every k steps happens in the graph.
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

from snapstore.demo import make_data  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x (1.15's default)


def train(data, steps, lr, lookahead, k, alpha):
  """Returns held-out accuracies: {"fast": ..., "slow": ... (Lookahead only)}."""
  (train_x, train_y), (test_x, test_y) = data
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    x = tf.placeholder(tf.float32, [None, train_x.shape[1]])
    y = tf.placeholder(tf.int64, [None])
    with tf.variable_scope("classifier"):
      hidden = tf.layers.dense(x, 64, tf.nn.relu)
      logits = tf.layers.dense(hidden, int(train_y.max()) + 1)
    loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    accuracy = tf.reduce_mean(
      tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32)
    )
    opt = tf.train.MomentumOptimizer(lr, 0.9)
    if lookahead:
      opt = snapstore.Lookahead(opt, k=k, alpha=alpha)
    train_op = opt.minimize(
      loss, global_step=tf.train.get_or_create_global_step()
    )
    init = tf.global_variables_initializer()  # initializes the slow weights too
  graph.finalize()
  rng = np.random.RandomState(1)
  test = {x: test_x, y: test_y}
  with tf.Session(graph=graph) as sess:
    sess.run(init)
    for step in range(steps):
      batch = rng.randint(0, len(train_x), 64)
      sess.run(train_op, {x: train_x[batch], y: train_y[batch]})
    result = {"fast": sess.run(accuracy, test)}
    if lookahead:
      result["slow"] = opt.evaluate_with(accuracy, test, session=sess)
      assert (
        sess.run(accuracy, test) == result["fast"]
      )  # fast weights untouched
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=1002)
  parser.add_argument("--lr", type=float, default=0.5)
  parser.add_argument("--k", type=int, default=5)
  parser.add_argument("--alpha", type=float, default=0.5)
  args = parser.parse_args(argv)
  tf.logging.set_verbosity(tf.logging.ERROR)
  data = make_data()
  plain = train(data, args.steps, args.lr, False, args.k, args.alpha)
  ahead = train(data, args.steps, args.lr, True, args.k, args.alpha)
  print(
    "%d steps of momentum SGD (lr %g), held-out accuracy:"
    % (args.steps, args.lr)
  )
  print("  momentum alone:                      %.3f" % plain["fast"])
  print(
    "  Lookahead(k=%d, alpha=%g), fast weights: %.3f"
    % (args.k, args.alpha, ahead["fast"])
  )
  print(
    "  Lookahead(k=%d, alpha=%g), slow weights: %.3f"
    % (args.k, args.alpha, ahead["slow"])
  )
  if min(ahead.values()) < 0.6:
    print("FAILED: Lookahead did not learn the task")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
