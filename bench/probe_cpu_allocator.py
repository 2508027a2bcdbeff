#!/usr/bin/env python
"""Diagnostic: whether TensorFlow's CPU allocator gives freed memory back.

Plain TensorFlow, no snapstore: what a process's RSS says about the bytes
alive under each CPU allocator, to read bench_memory.py's and the memory
test's peaks by. In graph mode, a `Snapshot` of 16 float32 variables
(`--mib` in all) is fetched twice (sets A and B, both alive), A is dropped,
and a third set C is fetched: two sets are alive again. The RSS over the
model after each step, in models:

  system allocator   2.00, 1.00, 2.00   C takes the memory A gave back
  oneDNN's pool      2.00, 2.00, 3.00   A's memory stays resident and C
                                        takes pages never touched before

So under oneDNN's allocator (TensorFlow 2.x where oneDNN is on: by default
on x86 CPUs with AVX512_VNNI, AVX512_BF16 or AMX; `TF_ENABLE_ONEDNN_OPTS=1`
elsewhere) a process's RSS is its pool's high-water mark, not the bytes it
holds, whatever the program. `TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1` keeps
oneDNN's kernels and uses the system allocator. Each case runs in its own
child process (the allocator is chosen when TensorFlow starts):

    .venv-tf2/bin/python bench/probe_cpu_allocator.py [--mib 1024]

(On TensorFlow 1.15 only the system allocator exists; the three cases
then read alike.)
"""

import argparse
import json
import os
import subprocess
import sys

_CASES = [
  ("oneDNN off", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
  ("oneDNN on, its allocator", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
  (
    "oneDNN on, system allocator",
    {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"},
  ),
]


def _rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mib, count):
  """Runs the steps in this process; returns {step: RSS over base, in models}."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

  tf.disable_v2_behavior()
  rows = max(1, int(mib * (1 << 20)) // count // 4 // 1024)
  shape = [rows, 1024]
  nbytes = float(count * rows * 1024 * 4)
  variables = [
    tf.get_variable(
      "v%d" % i,
      shape,
      initializer=tf.random_uniform_initializer(),
      use_resource=True,
    )
    for i in range(count)
  ]
  copies = [tf.raw_ops.Snapshot(input=v.read_value()) for v in variables]
  sess = tf.Session()
  sess.run(tf.global_variables_initializer())
  base = _rss()
  out = {}
  a = sess.run(copies)
  b = sess.run(copies)
  out["A and B alive"] = (_rss() - base) / nbytes
  del a
  out["A dropped"] = (_rss() - base) / nbytes
  c = sess.run(copies)
  out["B and C alive"] = (_rss() - base) / nbytes
  del b, c
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--mib", type=float, default=1024.0)
  p.add_argument("--vars", type=int, default=16)
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.mib, args.vars)))
    return 0
  print("| TensorFlow | A and B alive | A dropped | B and C alive |")
  print("| --- | ---: | ---: | ---: |")
  for name, env in _CASES:
    out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child"]
      + ["--mib", str(args.mib), "--vars", str(args.vars)],
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env),
    )
    if out.returncode != 0:
      print("| %s | failed (exit %d) | | |" % (name, out.returncode))
      continue
    steps = json.loads(out.stdout.decode().strip().splitlines()[-1])
    print(
      "| %s | %.2f | %.2f | %.2f |"
      % (
        name,
        steps["A and B alive"],
        steps["A dropped"],
        steps["B and C alive"],
      ),
      flush=True,
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
