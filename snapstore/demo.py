"""The snapstore demo: a small training run that snapshots, rolls back and compares.

    python -m snapstore.demo [--steps 300] [--modes device host disk]
                             [--engine graph|eager|both]

For each copy mode, trains a small classifier with Adam on generated data. Every
20 steps it takes a snapshot of the model, Adam's state and the global step. At
two steps the learning rate spikes, the loss explodes, and the run rolls back to
the newest snapshot and carries on. At the end it evaluates every held snapshot
next to the current parameters on held-out data, and prints timings per mode.
In disk mode the store keeps one snapshot in memory and spills the older ones to
an HDF5 file in a temporary directory, so the evaluations read from both tiers.

On TensorFlow 2.x the demo then runs again on the eager engine, with a Keras
model and a `tf.function` train step (`snapstore/demo_eager.py`), in a child
process: a program is either TF1-style (graph mode) or eager. `--engine`
chooses one of them.
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

# The two variables below take effect only if set before TensorFlow is
# imported. `python -m snapstore.demo` imports the package, and TensorFlow
# with it, before this module runs, so the Makefile's demo targets set both
# in the environment; set here, they reach the eager run's process (and a
# program that imports this module first).
#
# Without TensorFlow's start-up notices (no GPU, oneDNN, CPU build options)
# and warnings: snapstore/_tf_startup.py.
os.environ.setdefault("SNAPSTORE_QUIET_TF", "1")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore import _tf  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

LEARNING_RATE = 1e-2
SPIKE_LEARNING_RATE = 1e3
SNAPSHOT_EVERY = 20
DIVERGENCE_FACTOR = 5.0  # a loss this many times the recent median diverged


def make_data(seed=0, n=4000, features=20, classes=4):
  """A classification task labelled by a random teacher network."""
  rng = np.random.RandomState(seed)
  x = rng.randn(n, features).astype(np.float32)
  hidden = np.tanh(x.dot(rng.randn(features, 32)))
  labels = hidden.dot(rng.randn(32, classes)).argmax(axis=1).astype(np.int64)
  split = n * 3 // 4
  return (x[:split], labels[:split]), (x[split:], labels[split:])


class Classifier(object):
  """A two-layer MLP with Adam, built in the current default graph.

  Args:
    features: The input width.
    classes: The number of classes.
    hidden: The width of both hidden layers.
  """

  def __init__(self, features, classes, hidden=64):
    self.x = tf.placeholder(tf.float32, [None, features], name="x")
    self.y = tf.placeholder(tf.int64, [None], name="y")
    self.learning_rate = tf.placeholder_with_default(
      LEARNING_RATE, [], name="lr"
    )
    with tf.variable_scope("classifier"):
      out = tf.layers.dense(self.x, hidden, activation=tf.nn.relu)
      out = tf.layers.dense(out, hidden, activation=tf.nn.relu)
      logits = tf.layers.dense(out, classes)
    self.loss = tf.reduce_mean(
      tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=self.y, logits=logits
      )
    )
    self.accuracy = tf.reduce_mean(
      tf.cast(tf.equal(tf.argmax(logits, axis=1), self.y), tf.float32)
    )
    self.global_step = tf.train.get_or_create_global_step()
    self.optimizer = tf.train.AdamOptimizer(self.learning_rate)
    self.train_op = self.optimizer.minimize(
      self.loss, global_step=self.global_step
    )


class Timer(object):
  """Collects durations per label."""

  def __init__(self):
    self.samples = {}

  def time(self, label, fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    self.samples.setdefault(label, []).append(time.perf_counter() - start)
    return result

  def median_ms(self, label):
    values = self.samples.get(label)
    return 1e3 * float(np.median(values)) if values else float("nan")

  def count(self, label):
    return len(self.samples.get(label, ()))


def run_mode(mode, steps, data, spikes, out):
  """Trains with a store in `mode`; returns the Timer and a summary dict."""
  if mode != "disk":
    return _run_mode(mode, steps, data, spikes, out)
  with tempfile.TemporaryDirectory(prefix="snapstore-demo-") as tmp:
    return _run_mode(mode, steps, data, spikes, out, spill_dir=tmp)


def _run_mode(mode, steps, data, spikes, out, spill_dir=None):
  (train_x, train_y), (test_x, test_y) = data
  rng = np.random.RandomState(1)
  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    model = Classifier(train_x.shape[1], int(train_y.max()) + 1)
    disk_options = {}
    if spill_dir:
      # A budget of one snapshot (the store covers every variable of this
      # graph): each new snapshot sends the one before to the spill file.
      disk_options = {
        "spill_path": os.path.join(spill_dir, "spill.h5"),
        "memory_budget": sum(
          v.shape.num_elements() * v.dtype.base_dtype.size
          for v in tf.global_variables()
        ),
      }
    store = snapstore.SnapshotStore(
      scope="classifier",
      mode=mode,
      max_to_keep=3,
      optimizer=model.optimizer,
      include_global_step=True,
      **disk_options,
    )
  timer = Timer()
  test_feed = {model.x: test_x, model.y: test_y}
  rollbacks = 0
  step_of = {}  # tag -> global step it was taken at
  spikes = set(spikes)
  try:
    with tf.Session(graph=graph) as sess:
      sess.run(
        [tf.global_variables_initializer(), tf.local_variables_initializer()]
      )
      out(
        "[%s] store covers %d variables (%d KiB per snapshot): model, Adam slots and "
        "beta powers, global_step"
        % (mode, len(store.keys), store.param_nbytes // 1024)
      )
      recent = []
      for _ in range(steps):
        step = sess.run(model.global_step)
        if step % SNAPSHOT_EVERY == 0:
          step_of[timer.time("snapshot", store.snapshot, session=sess)] = step
        batch = rng.randint(0, len(train_x), 64)
        feed = {model.x: train_x[batch], model.y: train_y[batch]}
        if step in spikes:  # once: a replayed step after a rollback is normal
          spikes.discard(step)
          feed[model.learning_rate] = SPIKE_LEARNING_RATE
        _, loss = sess.run([model.train_op, model.loss], feed)
        check = sess.run(model.loss, feed)  # the same batch, after the step
        median = float(np.median(recent)) if recent else None
        if diverged(check, median):
          tag = store.tags()[-1]
          timer.time("restore", store.restore, tag, session=sess)
          rollbacks += 1
          out(
            rollback_line(
              mode, step, check, median, tag, sess.run(model.global_step)
            )
          )
          continue
        recent = (recent + [loss])[-20:]
      current_acc, current_loss = sess.run(
        [model.accuracy, model.loss], test_feed
      )
      for (
        tag
      ) in store.tags():  # every held snapshot next to the current parameters
        past_acc, past_loss = timer.time(
          "evaluate_with",
          store.evaluate_with,
          [model.accuracy, model.loss],
          test_feed,
          tag=tag,
          session=sess,
        )
        out(
          "[%s] held-out data: snapshot %r (step %d, %s) accuracy %.3f loss %.3f"
          % (
            mode,
            tag,
            step_of[tag],
            store.files.tier(tag),
            past_acc,
            past_loss,
          )
        )
      out(
        "[%s] held-out data: current (step %d)    accuracy %.3f loss %.3f"
        % (mode, sess.run(model.global_step), current_acc, current_loss)
      )
      # evaluate_with left the current parameters as they were.
      assert sess.run(model.loss, test_feed) == current_loss
      for _ in range(20):  # more timed calls, for steadier figures
        timer.time(
          "evaluate_with",
          store.evaluate_with,
          model.loss,
          test_feed,
          session=sess,
        )
        timer.time("restore", store.restore, session=sess)
  finally:
    store.close()  # waits for the disk writer; the spill file is then complete
  return timer, {"rollbacks": rollbacks, "accuracy": current_acc}


def diverged(loss, median):
  """Whether a step's loss is not finite or far above the recent median."""
  return not np.isfinite(loss) or bool(
    median and loss > DIVERGENCE_FACTOR * max(median, 0.1)
  )


def rollback_line(mode, step, loss, median, tag, back_at):
  """What the demo prints for a rollback."""
  return (
    "[%s] step %d: loss %.3g after a learning-rate spike (recent median "
    "%.3g) -> rolled back to snapshot %r taken at step %d"
    % (mode, step, loss, median or float("nan"), tag, back_at)
  )


def spike_steps(steps):
  """The two steps whose learning rate spikes, for a run of `steps` steps."""
  return {int(steps * 0.4) + 7, int(steps * 0.7) + 3}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument(
    "--modes",
    nargs="+",
    default=["device", "host", "disk"],
    choices=sorted(snapstore.MODES),
  )
  both = "both" if _tf.VERSION[0] >= 2 else "graph"
  parser.add_argument(
    "--engine", choices=["graph", "eager", "both"], default=both
  )
  args = parser.parse_args(argv)
  if args.engine == "eager":
    from snapstore import demo_eager  # pylint: disable=g-import-not-at-top

    return demo_eager.main(args.steps, args.modes)
  status = run_graph(args)
  if args.engine == "both":
    sys.stdout.flush()
    # A program is either TF1-style or eager: the eager run gets a process.
    env = dict(os.environ)
    env.setdefault("TF_USE_LEGACY_KERAS", "0")  # Keras 3 where it exists
    if env["TF_USE_LEGACY_KERAS"] == "1":
      env["TF_USE_LEGACY_KERAS"] = "0"
    child = subprocess.run(
      [
        sys.executable,
        "-m",
        "snapstore.demo",
        "--engine",
        "eager",
        "--steps",
        str(args.steps),
        "--modes",
      ]
      + list(args.modes),
      env=env,
    )
    status = status or child.returncode
  return status


def run_graph(args):
  """The graph-mode demo (module doc); 0 if every spike was rolled back."""
  # The demo is a TF1-style program: graph mode on TF 2.x (1.15's default).
  tf.disable_v2_behavior()
  tf.logging.set_verbosity(tf.logging.ERROR)
  data = make_data()
  spikes = spike_steps(args.steps)
  print(
    "snapstore %s demo: %d training steps per mode, learning-rate spikes at steps "
    "%s, snapshot every %d steps"
    % (snapstore.__version__, args.steps, sorted(spikes), SNAPSHOT_EVERY)
  )
  print("on %s" % stack())
  results = {}
  for mode in args.modes:
    start = time.perf_counter()
    results[mode] = run_mode(mode, args.steps, data, spikes, print) + (
      time.perf_counter() - start,
    )
  return report(results, spikes, "graph")


def report(results, spikes, engine):
  """Prints the table of `results` per mode; 1 if a spike was not rolled back."""
  print(
    "\nper mode, %s engine (median ms per call; model + optimizer state)"
    % engine
  )
  print(
    "%-8s %9s %9s %9s %14s %9s %9s %8s"
    % (
      "mode",
      "snapshot",
      "restore",
      "eval_with",
      "snapshots",
      "rollbacks",
      "accuracy",
      "total s",
    )
  )  # total: building (graph or traced functions) included
  for mode, (timer, summary, seconds) in results.items():
    print(
      "%-8s %9.3f %9.3f %9.3f %14d %9d %9.3f %8.1f"
      % (
        mode,
        timer.median_ms("snapshot"),
        timer.median_ms("restore"),
        timer.median_ms("evaluate_with"),
        timer.count("snapshot"),
        summary["rollbacks"],
        summary["accuracy"],
        seconds,
      )
    )
  failed = [
    m for m, (_, s, _) in results.items() if s["rollbacks"] != len(spikes)
  ]
  if failed:
    print("unexpected: modes %s did not roll back every spike" % failed)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
