"""pytest configuration: quiet TensorFlow logs and pick TF1-style Keras before TF is imported."""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's tf.compat.v1.layers and Keras models are TF1-style Keras, which
# TF 2.16+ takes from tf-keras only with this set before it is imported. Where
# tf-keras is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own. The
# Keras 3 tests run in a child process without it.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def pytest_collection_modifyitems(items):
  """Drops `tf.test.TestCase.test_session`, a helper pytest takes for a test.

  TF defines it on every `tf.test.TestCase` and skips it when run ("Not a
  test."), which showed as one skipped test per test class.
  """
  from tensorflow.python.framework import test_util  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  helper = getattr(test_util.TensorFlowTestCase, "test_session", None)
  items[:] = [
    item
    for item in items
    if getattr(getattr(item, "cls", None), "test_session", None) is not helper
    or item.name != "test_session"
  ]
