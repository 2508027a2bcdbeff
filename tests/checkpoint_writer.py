"""Writes the ensemble tests' checkpoints, as a separate training run would.

    python -m tests.checkpoint_writer --dir D --w 2 --seed 1 --scope member_1 --format v1

Builds, in this process, (1) the model `y = x + w` with the given `w` and (2) a
small classifier (an MLP on `snapstore.demo.make_data`) trained with Adam from
`seed`, each under `scope`, and saves each with `tf.train.Saver` in the given
format: `D/linear/model.ckpt` and `D/classifier/model.ckpt-<steps>` (with a
`checkpoint` state file, as training loops write them). Prints the two paths
as JSON. The test modules import the model builders from here, so the
evaluating graph builds the same models.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top

from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

from snapstore.demo import make_data  # pylint: disable=g-import-not-at-top
from tests import helpers  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x

FEATURES = 20
CLASSES = 4
HIDDEN = 32
STEPS = 150


def build_linear(scope, use_resource=False):
  """`y = x + w` with `w` a scalar variable under `scope`; returns (x, y, w)."""
  x = tf.placeholder(tf.float32, [None], name="x")
  with tf.variable_scope(scope, use_resource=use_resource):
    w = tf.get_variable("w", [], initializer=tf.zeros_initializer())
  return x, x + w, w


def build_classifier(scope, use_resource=False):
  """The MLP under `scope`; returns (x, logits, probabilities)."""
  x = tf.placeholder(tf.float32, [None, FEATURES], name="x")
  logits = helpers.dense_net(
    x, scope=scope, use_resource=use_resource, hidden=HIDDEN, outputs=CLASSES
  )
  return x, logits, tf.nn.softmax(logits)


def write_linear(path, w, scope, version):
  graph = tf.Graph()
  with graph.as_default():
    _, _, var = build_linear(scope)
    saver = tf.train.Saver(write_version=version)
  with tf.Session(graph=graph) as sess:
    var.load(w, sess)
    return saver.save(sess, path)


def write_classifier(path, seed, scope, version):
  (train_x, train_y), _ = make_data()
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(seed)
    x, logits, _ = build_classifier(scope)
    y = tf.placeholder(tf.int64, [None])
    loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    step = tf.train.get_or_create_global_step()
    train = tf.train.AdamOptimizer(1e-2).minimize(loss, global_step=step)
    saver = tf.train.Saver(write_version=version)
  rng = np.random.RandomState(seed)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(STEPS):
      batch = rng.randint(0, len(train_x), 64)
      sess.run(train, {x: train_x[batch], y: train_y[batch]})
    return saver.save(sess, path, global_step=step)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dir", required=True)
  parser.add_argument("--w", type=float, required=True)
  parser.add_argument("--seed", type=int, required=True)
  parser.add_argument("--scope", default="net")
  parser.add_argument("--format", choices=["v1", "v2"], default="v2")
  args = parser.parse_args(argv)
  tf.logging.set_verbosity(tf.logging.ERROR)
  version = (
    tf.train.SaverDef.V1 if args.format == "v1" else tf.train.SaverDef.V2
  )
  for sub in ("linear", "classifier"):
    os.makedirs(os.path.join(args.dir, sub))  # V1 does not create it
  print(
    json.dumps(
      {
        "linear": write_linear(
          os.path.join(args.dir, "linear", "model.ckpt"),
          args.w,
          args.scope,
          version,
        ),
        "classifier": write_classifier(
          os.path.join(args.dir, "classifier", "model.ckpt"),
          args.seed,
          args.scope,
          version,
        ),
      }
    )
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
