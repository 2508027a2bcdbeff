#!/usr/bin/env python
"""Benchmark: how long building a store takes, next to building Adam's update.

A store is built once, with the graph, but a slow build is felt by every user
who restarts a job: it once took 18 s for 200 variables and 4 slots. Each row
builds, in a fresh graph holding only the variables (64 x 64 float32 each):

  adam          tf.train.AdamOptimizer().minimize(sum of squares): what users
                already accept for 2 slots per variable
  device K=1    SnapshotStore(mode="device", max_to_keep=1)
  device K=4    SnapshotStore(mode="device", max_to_keep=4)
  host          SnapshotStore(mode="host")

for RefVariables and ResourceVariables, and prints seconds, graph ops added per
variable, and the ratio to Adam. Build times are CPU-bound Python; repeated
builds are interleaved and the median is reported.

    .venv/bin/python bench/bench_setup.py
    .venv/bin/python bench/bench_setup.py --num-vars 50 200 --repeats 3 --json out.json
"""

import argparse
import importlib.util
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore._tf import stack  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TF 2.x (1.15's default)

tf.logging.set_verbosity(tf.logging.ERROR)


def _build(kind, use_resource, num_vars):
  """Seconds to build `kind` over `num_vars` variables, and ops it added."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.variable_scope("net", use_resource=use_resource):
      variables = [
        tf.get_variable("w%d" % i, [64, 64]) for i in range(num_vars)
      ]
    loss = tf.add_n([tf.reduce_sum(tf.square(v)) for v in variables])
    before = len(graph.get_operations())
    start = time.perf_counter()
    if kind == "adam":
      tf.train.AdamOptimizer().minimize(loss)
    elif kind == "host":
      snapstore.SnapshotStore(scope="net", mode="host")
    else:
      snapstore.SnapshotStore(
        scope="net", mode="device", max_to_keep=int(kind.split("=")[1])
      )
    seconds = time.perf_counter() - start
    return seconds, len(graph.get_operations()) - before


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num-vars", type=int, nargs="+", default=[50, 200])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", help="write the raw results here")
  args = parser.parse_args()
  print("stack: %s" % stack(), flush=True)
  kinds = ["adam", "device K=1", "device K=4", "host"]
  results = []
  print(
    "store construction vs Adam's minimize() (median of %d interleaved builds)"
    % args.repeats
  )
  print(
    "%-9s %5s %-11s %9s %9s %9s"
    % ("variables", "n", "built", "seconds", "ops/var", "vs adam")
  )
  for use_resource in (False, True):
    for n in args.num_vars:
      samples = {k: [] for k in kinds}
      ops = {}
      for _ in range(args.repeats):
        for kind in kinds:
          seconds, added = _build(kind, use_resource, n)
          samples[kind].append(seconds)
          ops[kind] = added
      adam = statistics.median(samples["adam"])
      for kind in kinds:
        median = statistics.median(samples[kind])
        label = "resource" if use_resource else "ref"
        print(
          "%-9s %5d %-11s %9.2f %9.1f %8.2fx"
          % (label, n, kind, median, ops[kind] / float(n), median / adam)
        )
        results.append(
          dict(
            variables=label,
            n=n,
            built=kind,
            seconds=median,
            samples=samples[kind],
            ops_per_variable=ops[kind] / float(n),
            ratio_to_adam=median / adam,
          )
        )
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
