"""pytest configuration: the engine a run tests, TF logs, and which Keras.

`import snapstore` leaves TensorFlow's mode alone, so a run tests one engine:
  python -m pytest tests                                  # graph mode (default)
  SNAPSTORE_TEST_ENGINE=eager python -m pytest tests/eager   # the eager engine
A graph run calls `tf.compat.v1.disable_v2_behavior()` first, as a TF1-style
program does, and leaves out tests/eager; an eager run collects only
tests/eager (TensorFlow 2.x). The Makefile's test targets run both.

`SNAPSTORE_TEST_SHARD=i/n` runs the i-th (0-based) of n parts of the
suite, so that n processes run it together, one per core (`make test`):
  SNAPSTORE_TEST_SHARD=0/2 python -m pytest tests   # and 1/2 beside it
"""

import collections
import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's tf.compat.v1.layers and Keras models are TF1-style Keras, which
# TF 2.16+ takes from tf-keras only with this set before it is imported. Where
# tf-keras is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own. The
# Keras 3 tests run in a child process without it.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

ENGINE = os.environ.get("SNAPSTORE_TEST_ENGINE", "graph")
if ENGINE not in ("graph", "eager"):
  raise ValueError(
    "SNAPSTORE_TEST_ENGINE must be 'graph' or 'eager', got %r." % ENGINE
  )
SHARD = os.environ.get("SNAPSTORE_TEST_SHARD", "0/1")


def _shard(text):
  """(i, n) of `SNAPSTORE_TEST_SHARD` ("i/n", 0 <= i < n)."""
  try:
    index, count = (int(part) for part in text.split("/"))
  except ValueError:
    index, count = -1, 0
  if not 0 <= index < count:
    raise ValueError(
      "SNAPSTORE_TEST_SHARD must be 'i/n' with 0 <= i < n (run the i-th of "
      "n parts of the suite), got %r." % text
    )
  return index, count


SHARD_INDEX, SHARD_COUNT = _shard(SHARD)
_EAGER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eager")

if ENGINE == "graph":
  import tensorflow.compat.v1 as _tf  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import deprecation as _deprecation  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  with _deprecation.silence():  # TF's advice about ref variables, not ours
    _tf.disable_v2_behavior()


def pytest_ignore_collect(collection_path, config):
  """Graph runs leave out tests/eager; eager runs collect only it."""
  del config
  path = os.path.abspath(str(collection_path))
  inside = path == _EAGER_DIR or path.startswith(_EAGER_DIR + os.sep)
  if ENGINE == "graph":
    return True if inside else None
  if inside or _EAGER_DIR.startswith(path + os.sep):
    return None  # tests/eager, or a folder above it
  return True


def pytest_collection_modifyitems(config, items):
  """Drops `tf.test.TestCase.test_session`, a helper pytest takes for a test,
  and the tests of other shards (`SNAPSTORE_TEST_SHARD`, `shard_of`).

  TF defines `test_session` on every `tf.test.TestCase` and skips it when run
  ("Not a test."), which showed as one skipped test per test class.
  """
  from tensorflow.python.framework import test_util  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  helper = getattr(test_util.TensorFlowTestCase, "test_session", None)
  items[:] = [
    item
    for item in items
    if getattr(getattr(item, "cls", None), "test_session", None) is not helper
    or item.name != "test_session"
  ]
  if SHARD_COUNT > 1:
    shards = shard_of(items, SHARD_COUNT)
    others = [item for item, k in zip(items, shards) if k != SHARD_INDEX]
    items[:] = [item for item, k in zip(items, shards) if k == SHARD_INDEX]
    config.hook.pytest_deselected(items=others)


def shard_of(items, count):
  """The shard of each of `items` (0 to count - 1).

  Tests that share an expensive set-up stay together, so that it runs in one
  shard only: a module's tests that use one of its module-scoped fixtures
  (two-worker clusters), a class's tests when the class has a `setUpClass`
  of the suite's own (loopback servers). Groups go, in collection order, to
  the shard with the fewest tests so far: single tests alternate, and each
  shard gets a part of every file.
  """
  sizes = collections.OrderedDict()
  keys = [_group(item) for item in items]
  for key in keys:
    sizes[key] = sizes.get(key, 0) + 1
  loads, where = [0] * count, {}
  for key, size in sizes.items():
    k = loads.index(min(loads))
    where[key] = k
    loads[k] += size
  return [where[key] for key in keys]


def _group(item):
  """What `item` must share a shard with (`shard_of`)."""
  path = item.nodeid.split("::")[0]
  defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
  if any(d.scope == "module" for ds in defs.values() for d in ds):
    return (path,)
  cls = getattr(item, "cls", None)
  if cls is not None and _own_set_up_class(cls):
    return (path, cls.__name__)
  return (item.nodeid,)


def _own_set_up_class(cls):
  """True if a class of the suite (not TF, absl, unittest) defines
  `setUpClass` for `cls`."""
  for klass in cls.__mro__:
    if "setUpClass" in vars(klass):
      return klass.__module__.split(".")[0] == "tests"
  return False
