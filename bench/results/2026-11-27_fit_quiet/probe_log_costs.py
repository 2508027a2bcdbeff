"""What the in-step callback's batch hook cost on tf-keras before 1a407b5.

tf-keras converts a batch's logs to numpy for callbacks that do not take
them as tensors (`sync_to_numpy_or_python_type`); the hook then checked the
loss through numpy. Timed with timeit, TF 2.21, tf-keras:

    TF_USE_LEGACY_KERAS=1 .venv-tf2/bin/python bench/results/2026-11-27_fit_quiet/probe_log_costs.py
"""

import math
import timeit

import numpy as np
import tensorflow as tf
from tf_keras.src.utils import tf_utils

N = 20000
logs = {"loss": tf.constant(0.5), "mae": tf.constant(0.3)}


def per_call(fn):
  return timeit.timeit(fn, number=N) / N * 1e6


print(
  "sync_to_numpy_or_python_type of a loss and one metric: %.2f us"
  % per_call(lambda: tf_utils.sync_to_numpy_or_python_type(logs))
)
print("one tensor's .numpy(): %.2f us" % per_call(lambda: logs["loss"].numpy()))
value = np.float32(0.5)
print(
  "np.all(np.isfinite(np.asarray(scalar))): %.2f us"
  % per_call(lambda: bool(np.all(np.isfinite(np.asarray(value)))))
)
print("math.isfinite(scalar): %.2f us" % per_call(lambda: math.isfinite(value)))
