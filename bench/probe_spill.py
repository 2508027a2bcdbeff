#!/usr/bin/env python
"""Probe: why a spill costs more than a raw write (not part of `make bench`).

Two measurements behind the notes on `bench_disk.py` in `bench/README.md`:

  checksum vs write   per 64 MiB: XXH3-64 of the data (what a spill adds), an
                      `os.pwrite` of the same bytes into the page cache (what
                      a spill's data write is), and both at once with the hash
                      on a second thread (could the hash hide behind the write?)
  run-to-run spread   the spill file layer alone (`SpillFile.write`, six 64 MiB
                      snapshots into a fresh file, as `bench_disk.py` does),
                      repeated, alternating the arrays (numpy's, or 64-byte
                      aligned copies as a store holds) and the calling thread
                      (this one, or a second one as the store's writer)

    .venv/bin/python bench/probe_spill.py [--reps 6] [--dir DIR]
"""

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from snapstore._tf import stack  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore.core import buffers  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore.engines.graph.variables import variable_set  # pylint: disable=g-import-not-at-top,wrong-import-position
from snapstore.spill import file as spill_file  # pylint: disable=g-import-not-at-top,wrong-import-position

MIB = 1 << 20
_SLAB = 16 * MIB  # as snapstore/spill/file.py writes


def _ms(fn):
  start = time.perf_counter()
  fn()
  return (time.perf_counter() - start) * 1e3


def checksum_vs_write(workdir, reps):
  data = np.random.RandomState(0).bytes(64 * MIB)
  array = np.frombuffer(data, np.uint8)
  path = os.path.join(workdir, "pwrite.bin")
  fd = os.open(path, os.O_RDWR | os.O_CREAT)
  try:

    def write():
      view = memoryview(array)
      for start in range(0, array.size, _SLAB):
        os.pwrite(fd, view[start : start + _SLAB], start)

    def both():
      hasher = threading.Thread(target=xxhash.xxh3_64_intdigest, args=(array,))
      hasher.start()
      write()
      hasher.join()

    write()  # the file's pages exist from here on
    rows = {
      "xxh3_64 of 64 MiB": [],
      "os.pwrite of 64 MiB": [],
      "both, hash on a second thread": [],
    }
    for _ in range(reps):
      rows["xxh3_64 of 64 MiB"].append(
        _ms(lambda: xxhash.xxh3_64_intdigest(array))
      )
      rows["os.pwrite of 64 MiB"].append(_ms(write))
      rows["both, hash on a second thread"].append(_ms(both))
  finally:
    os.close(fd)
    os.remove(path)
  print("checksum vs write (%d reps; ms):" % reps)
  for name, times in rows.items():
    print(
      "  %-32s median %6.1f  min %6.1f  max %6.1f"
      % (name, statistics.median(times), min(times), max(times))
    )


def run_to_run(workdir, reps):
  graph = tf.Graph()
  with graph.as_default():
    with tf.variable_scope("net"):
      for i in range(16):
        tf.get_variable("v%02d" % i, [4 * MIB // 4], tf.float32)
    varset = variable_set(scope="net")
  keys = list(varset.keys)
  rng = np.random.RandomState(0)
  plain = [
    [
      rng.standard_normal(spec.shape).astype(np.float32)
      for spec in varset.specs
    ]
    for _ in range(6)
  ]
  path = os.path.join(workdir, "spill.h5")

  def write_all(snapshots, threaded):
    f = spill_file.SpillFile.open_for_writing(path, varset)
    os.sync()
    per_snapshot = []

    def go():
      for i, arrays in enumerate(snapshots):
        per_snapshot.append(
          _ms(lambda: f.write(i, time.time(), None, keys, arrays))
        )

    if threaded:
      worker = threading.Thread(target=go)
      total = _ms(lambda: (worker.start(), worker.join()))
    else:
      total = _ms(go)
    f.close()
    os.remove(path)
    return total, per_snapshot

  print(
    "spill file layer, 6 x 64 MiB into a fresh file, per run: total ms "
    "(per-snapshot ms)"
  )
  for rep in range(reps):
    aligned = [[buffers.aligned_copy(a) for a in arrays] for arrays in plain]
    cells = []
    for name, snapshots, threaded in (
      ("numpy, this thread", plain, False),
      ("numpy, 2nd thread", plain, True),
      ("aligned, this thread", aligned, False),
      ("aligned, 2nd thread", aligned, True),
    ):
      total, per = write_all(snapshots, threaded)
      cells.append(
        "%s %.0f (%s)" % (name, total, " ".join("%.0f" % t for t in per))
      )
    print("  run %d: %s" % (rep + 1, "; ".join(cells)))
    del aligned


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=6)
  parser.add_argument(
    "--dir", default=None, help="where to write (default: a temp dir)"
  )
  args = parser.parse_args(argv)
  print("stack: %s" % stack(), flush=True)
  tf.logging.set_verbosity(tf.logging.ERROR)
  with tempfile.TemporaryDirectory(dir=args.dir) as workdir:
    checksum_vs_write(workdir, args.reps)
    run_to_run(workdir, args.reps)


if __name__ == "__main__":
  main()
