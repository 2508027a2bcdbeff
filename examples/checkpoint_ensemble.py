"""An ensemble of separately trained checkpoints, evaluated through one store.

    python examples/checkpoint_ensemble.py [--members 3] [--steps 400]

Trains N members of one classifier on the demo data (`snapstore.demo`), each
from its own seed in its own graph, and saves each with `tf.train.Saver`, as
N separate training runs would. Then, in one evaluation graph holding a single
copy of the model:

- a device-mode store with one slot per member, and a `snapstore.Ensemble`
  over the classifier's probabilities (mean) and labels (majority vote),
  built with the graph: it rewires the outputs to every slot;
- each checkpoint is loaded into a slot with `store.files.load_checkpoint` (TF's
  checkpoint reader: no graph is built for it, no op added; the Adam slots and
  global step it also holds are skipped with `allow_extra=True`);
- `ensemble.evaluate` runs every member in one `session.run` and leaves the
  graph's own parameters exactly as they were.

The script checks every member's probabilities against a numpy forward pass
with the weights read from its checkpoint.
"""

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile

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

SCOPE = "classifier"


def build(features, classes):
  """The classifier under SCOPE; returns its placeholders and outputs."""
  x = tf.placeholder(tf.float32, [None, features], name="x")
  y = tf.placeholder(tf.int64, [None], name="y")
  with tf.variable_scope(SCOPE):
    hidden = tf.layers.dense(x, 64, tf.nn.relu)
    logits = tf.layers.dense(hidden, classes)
  return x, y, logits, tf.nn.softmax(logits)


def numpy_probabilities(x, weights):
  hidden = np.maximum(
    0.0, x.dot(weights["dense/kernel"]) + weights["dense/bias"]
  )
  logits = hidden.dot(weights["dense_1/kernel"]) + weights["dense_1/bias"]
  e = np.exp(logits - logits.max(axis=1, keepdims=True))
  return e / e.sum(axis=1, keepdims=True)


def train_member(seed, data, classes, steps, path):
  (train_x, train_y), _ = data
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(seed)
    x, y, logits, _ = build(train_x.shape[1], classes)
    loss = tf.losses.sparse_softmax_cross_entropy(y, logits)
    train_op = tf.train.AdamOptimizer(1e-2).minimize(
      loss, global_step=tf.train.get_or_create_global_step()
    )
    saver = tf.train.Saver()
  rng = np.random.RandomState(seed)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    for _ in range(steps):
      batch = rng.randint(0, len(train_x), 64)
      sess.run(train_op, {x: train_x[batch], y: train_y[batch]})
    return saver.save(sess, path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--members", type=int, default=3)
  parser.add_argument("--steps", type=int, default=400)
  args = parser.parse_args(argv)
  tf.logging.set_verbosity(tf.logging.ERROR)
  data = make_data()
  (train_x, train_y), (test_x, test_y) = data
  classes = int(train_y.max()) + 1
  workdir = tempfile.mkdtemp(prefix="snapstore_ensemble_")
  try:
    checkpoints = [
      train_member(
        seed,
        data,
        classes,
        args.steps,
        os.path.join(workdir, "member_%d" % seed, "model.ckpt"),
      )
      for seed in range(args.members)
    ]

    graph = tf.Graph()
    with graph.as_default():
      x, _, logits, probabilities = build(train_x.shape[1], classes)
      store = snapstore.SnapshotStore(
        scope=SCOPE, mode="device", max_to_keep=args.members
      )
      tags = ["member_%d" % i for i in range(args.members)]
      ensemble = snapstore.Ensemble(
        store,
        {"probabilities": probabilities, "label": tf.argmax(logits, 1)},
        tags=tags,
        combine={"probabilities": "mean", "label": "vote"},
      )
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      own = sess.run(list(store.variables.values()))
      for tag, path in zip(tags, checkpoints):
        store.files.load_checkpoint(
          path, tag=tag, allow_extra=True, session=sess
        )
      result = ensemble.evaluate({x: test_x}, session=sess)
      # The ensemble left the graph's own parameters as they were.
      for before, after in zip(own, sess.run(list(store.variables.values()))):
        assert before.tobytes() == after.tobytes()
    for tag, path in zip(tags, checkpoints):
      reader = tf.train.load_checkpoint(path)
      weights = {
        key: reader.get_tensor(SCOPE + "/" + key) for key in store.keys
      }
      np.testing.assert_allclose(
        result.members[tag]["probabilities"],
        numpy_probabilities(test_x, weights),
        rtol=1e-4,
        atol=1e-6,
      )
  finally:
    shutil.rmtree(workdir)

  members = np.stack([result.members[tag]["probabilities"] for tag in tags])

  def accuracy(labels):
    return float(np.mean(labels == test_y))

  for i, probs in enumerate(members):
    print(
      "member %d (seed %d):        held-out accuracy %.3f"
      % (i, i, accuracy(probs.argmax(axis=1)))
    )
  mean_vote = result.combined["probabilities"].argmax(axis=1)
  print(
    "ensemble, mean probability:  held-out accuracy %.3f" % accuracy(mean_vote)
  )
  print(
    "ensemble, majority vote:     held-out accuracy %.3f"
    % accuracy(result.combined["label"])
  )
  print(
    "device memory of the members: %d x %d bytes = %d bytes"
    % (len(tags), store.param_nbytes, ensemble.device_nbytes)
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
