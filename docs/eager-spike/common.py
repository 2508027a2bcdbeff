"""Shared helpers for the spike scripts (no snapstore import)."""
import os
import sys
import time
import numpy as np
import tensorflow as tf

LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
TF215 = tf.__version__.startswith("2.15")
if LEGACY:
  import tf_keras as keras
  STACK = "TF %s + tf-keras %s" % (tf.__version__, keras.__version__)
  K3 = False
elif TF215:
  keras = tf.keras
  import keras as _k
  STACK = "TF %s + Keras %s (tf.keras)" % (tf.__version__, _k.__version__)
  K3 = False
else:
  import keras
  STACK = "TF %s + Keras %s" % (tf.__version__, keras.__version__)
  K3 = True


def median_time(fn, reps=20, warmup=2):
  for _ in range(warmup):
    fn()
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return float(np.median(ts)), float(np.min(ts))


def bits(a):
  a = np.ascontiguousarray(a)
  return a.view(np.dtype("u%d" % a.dtype.itemsize)) if a.dtype.kind == "f" else a


def same_bits(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


print("#", STACK, file=sys.stderr)
