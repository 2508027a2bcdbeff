"""pytest configuration: quiet TensorFlow logs before TF is imported."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def pytest_collection_modifyitems(items):
  """Drops `tf.test.TestCase.test_session`, a helper pytest takes for a test.

  TF 1.15 defines it on every `tf.test.TestCase` and skips it when run ("Not a
  test."), which showed as one skipped test per test class.
  """
  from tensorflow.python.framework import test_util  # pylint: disable=g-import-not-at-top
  helper = test_util.TensorFlowTestCase.test_session
  items[:] = [item for item in items
              if getattr(getattr(item, "cls", None), "test_session", None) is not helper
              or item.name != "test_session"]
