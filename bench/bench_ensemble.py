"""Benchmark: an ensemble of N checkpoints, one run vs what users do today.

N separately initialized checkpoints of one classifier (an MLP, written with
`tf.train.Saver` in the V2 format) are evaluated on one batch and their class
probabilities averaged, for N = 2, 4, 8, in these ways:

  ensemble (one run)     `snapstore.Ensemble` over a device store with N
                         slots, each loaded once with `store.files.load_checkpoint`:
                         every member in one `session.run` of the rewired
                         copies.
  sequential restore+run what users do with one graph: for each member,
                         `saver.restore(sess, path)` then `sess.run(probs)`.
  N scoped copies        what users do when they have the building function:
                         the model built N times under scopes `m0`..`m<N-1>`,
                         each copy restored once from its checkpoint (a Saver
                         with a name map), all N evaluated in one run.
  ensemble (host, streamed)
                         `snapstore.Ensemble` over a host store: members in
                         host memory, swapped into the live variables one at
                         a time (`evaluate_with`), for comparison.

One forward pass of one member (`sess.run(probs)`) is timed too, as the unit
that tells restore cost from compute.

Per evaluation the combine (a numpy mean) is included in every way. Setup is
timed once per way and reported separately: building the graph and session
(and initializing), and loading the checkpoints (`load_checkpoint` per member,
or the scoped copies' restores; sequential restores in every evaluation). The target (issue 5): the one-run ensemble is at least
1.5x faster than sequential restore+run for N >= 4, on medians of
interleaved rounds (minimums printed too, to tell contention from cost).
Every way's mean is checked against the others before timing.

Usage: python bench/bench_ensemble.py [--quick] [--batch N] [--width N]
[--members 2 4 8] [--json PATH]. A missed target is reported, not an exit
status.
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

# Interleaved rounds, median and minimum: the same timing as the rewiring bench.
from bench_rewire import _seconds  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

tf.logging.set_verbosity(tf.logging.ERROR)

TARGET = 1.5
FORWARD = "one forward pass (reference)"
FEATURES = 784
CLASSES = 10
DEPTH = 2


def _model(x, scope, width):
  with tf.variable_scope(scope):
    h = x
    for i in range(DEPTH):
      h = tf.layers.dense(h, width, activation=tf.nn.relu, name="dense_%d" % i)
    return tf.nn.softmax(tf.layers.dense(h, CLASSES, name="logits"))


def write_checkpoints(directory, n, width):
  """N checkpoints of the model under "net", each from its own seed."""
  paths = []
  for seed in range(n):
    graph = tf.Graph()
    with graph.as_default():
      tf.set_random_seed(seed)
      _model(tf.placeholder(tf.float32, [None, FEATURES]), "net", width)
      saver = tf.train.Saver()
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      paths.append(
        saver.save(sess, os.path.join(directory, "m%d" % seed, "model.ckpt"))
      )
  return paths


class _Way(object):
  """A graph, a session and `evaluate()` returning the members' mean."""

  def close(self):
    self.sess.close()


class OneRun(_Way):
  def __init__(self, paths, width, mode="device"):
    start = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, FEATURES])
      probs = _model(self.x, "net", width)
      store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=len(paths)
      )
      self.ensemble = snapstore.Ensemble(store, probs, combine="mean")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    self.sess = tf.Session(graph=graph)
    self.sess.run(init)
    loading = time.perf_counter()
    for i, path in enumerate(paths):
      store.files.load_checkpoint(path, tag=i, session=self.sess)
    self.setup = (loading - start, time.perf_counter() - loading)

  def evaluate(self, batch):
    return self.ensemble.evaluate({self.x: batch}, session=self.sess).combined


class Sequential(_Way):
  def __init__(self, paths, width):
    start = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, FEATURES])
      self.probs = _model(self.x, "net", width)
      self.saver = tf.train.Saver()
    graph.finalize()
    self.sess = tf.Session(graph=graph)
    self.paths = paths
    self.setup = (time.perf_counter() - start, 0.0)

  def evaluate(self, batch):
    outputs = []
    for path in self.paths:
      self.saver.restore(self.sess, path)
      outputs.append(self.sess.run(self.probs, {self.x: batch}))
    return np.mean(np.stack(outputs), axis=0)


class ScopedCopies(_Way):
  def __init__(self, paths, width):
    start = time.perf_counter()
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, FEATURES])
      self.probs = []
      savers = []
      for i in range(len(paths)):
        scope = "m%d" % i
        self.probs.append(_model(self.x, scope, width))
        variables = tf.global_variables(scope)
        savers.append(
          tf.train.Saver(
            dict(("net" + v.op.name[len(scope) :], v) for v in variables)
          )
        )
    graph.finalize()
    self.sess = tf.Session(graph=graph)
    loading = time.perf_counter()
    for saver, path in zip(savers, paths):
      saver.restore(self.sess, path)
    self.setup = (loading - start, time.perf_counter() - loading)

  def evaluate(self, batch):
    return np.mean(np.stack(self.sess.run(self.probs, {self.x: batch})), axis=0)


def run(paths, batch, width, repeats):
  """[(name, median s, min s, (build s, load s))] for the members `paths`."""
  data = np.random.RandomState(0).randn(batch, FEATURES).astype(np.float32)
  ways = [
    ("ensemble (one run)", OneRun(paths, width)),
    ("sequential restore+run", Sequential(paths, width)),
    ("N scoped copies (one run)", ScopedCopies(paths, width)),
    ("ensemble (host, streamed)", OneRun(paths, width, mode="host")),
  ]
  try:
    reference = ways[0][1].evaluate(data)
    for name, way in ways[1:]:
      np.testing.assert_allclose(
        way.evaluate(data), reference, rtol=1e-5, atol=1e-7, err_msg=name
      )
    sequential = ways[1][1]
    forward = (
      FORWARD,
      lambda: sequential.sess.run(sequential.probs, {sequential.x: data}),
    )
    timed = _seconds(
      [(name, lambda w=way: w.evaluate(data)) for name, way in ways]
      + [forward],
      repeats,
    )
    nbytes = ways[0][1].ensemble.device_nbytes
  finally:
    for _, way in ways:
      way.close()
  setups = dict((name, way.setup) for name, way in ways)
  setups[FORWARD] = (0.0, 0.0)
  return [(name, m, l, setups[name]) for name, m, l in timed], nbytes


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="fewer repeats")
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--width", type=int, default=1024)
  parser.add_argument("--members", type=int, nargs="+", default=[2, 4, 8])
  parser.add_argument("--json", default=None, help="also write results here")
  args = parser.parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  repeats = 5 if args.quick else 20
  directory = tempfile.mkdtemp(prefix="snapstore_bench_ensemble_")
  report = []
  try:
    paths = write_checkpoints(directory, max(args.members), args.width)
    for n in args.members:
      results, nbytes = run(paths[:n], args.batch, args.width, repeats)
      report.append((n, results, nbytes))
  finally:
    shutil.rmtree(directory)
  param_mib = report[0][2] / float(report[0][0]) / 2**20
  print(
    "MLP %d-%s-%d, %.1f MiB of float32 parameters per member; batch %d; "
    "%d interleaved rounds"
    % (
      FEATURES,
      "-".join([str(args.width)] * DEPTH),
      CLASSES,
      param_mib,
      args.batch,
      repeats,
    )
  )
  print("")
  print(
    "| N | way | median ms | min ms | sequential / way (median) | "
    "(min) | setup: build ms | setup: load ms |"
  )
  print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  verdicts = []
  for n, results, nbytes in report:
    by_name = dict((name, (m, l)) for name, m, l, _ in results)
    seq = by_name["sequential restore+run"]
    for name, m, l, (build, load) in results:
      if name == FORWARD:
        print("| %d | %s | %.1f | %.1f | | | | |" % (n, name, 1e3 * m, 1e3 * l))
        continue
      print(
        "| %d | %s | %.1f | %.1f | %.2f | %.2f | %.0f | %.0f |"
        % (
          n,
          name,
          1e3 * m,
          1e3 * l,
          seq[0] / m,
          seq[1] / l,
          1e3 * build,
          1e3 * load,
        )
      )
    speedup = seq[0] / by_name["ensemble (one run)"][0]
    if n >= 4:
      verdicts.append((n, speedup, speedup >= TARGET))
    print(
      "| %d | device memory of the members | %.1f MiB | | | | | |"
      % (n, nbytes / 2.0**20)
    )
  print("")
  for n, speedup, met in verdicts:
    print(
      "N=%d: one-run ensemble %.2fx faster than sequential restore+run "
      "(target >= %.1fx): %s" % (n, speedup, TARGET, "met" if met else "MISSED")
    )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {
          "batch": args.batch,
          "width": args.width,
          "repeats": repeats,
          "target": TARGET,
          "results": [
            {
              "members": n,
              "device_bytes": nbytes,
              "ways": [
                {
                  "name": name,
                  "median_ms": 1e3 * m,
                  "min_ms": 1e3 * l,
                  "build_ms": 1e3 * build,
                  "load_ms": 1e3 * load,
                }
                for name, m, l, (build, load) in results
              ],
            }
            for n, results, nbytes in report
          ],
        },
        f,
        indent=2,
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
