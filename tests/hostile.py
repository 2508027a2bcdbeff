"""What the hostile-file tests share: a model, stores in every mode, checks.

`HostileFileCase` builds one graph for the test class: variables `a` (float32
[4, 3]) and `b/c` (int32 [5]) under scope "net", and a device, a host and a
disk store over them, each holding a snapshot "good". After a hostile file is
refused, `assert_usable` checks that the store is as before and still works;
`peak_bytes` measures what a call allocates (numpy's buffers included).
"""

import io
import os
import tempfile
import threading
import tracemalloc

import numpy as np

import snapstore
from snapstore._tf import tf

from snapstore import cli
from tests import helpers

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x

SHAPES = {"a": ((4, 3), np.float32), "b/c": ((5,), np.int32)}
MODES = ("device", "host", "disk")
# Anything a refusal allocates is small next to this; the hostile files
# declare gigabytes.
ALLOCATION_BOUND = 8 << 20


def values(seed):
  """Random values of the model's variables, special floats included."""
  rng = np.random.RandomState(seed)
  return dict(
    (k, helpers.random_value(rng, shape, dtype))
    for k, (shape, dtype) in SHAPES.items()
  )


def peak_bytes(call):
  """(result or exception, peak bytes traced while `call()` ran)."""
  tracemalloc.start()
  try:
    try:
      outcome = call()
    except Exception as e:  # pylint: disable=broad-except
      outcome = e
    return outcome, tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


def open_fds():
  return sorted(os.listdir("/proc/self/fd"))


def run_cli(*argv):
  out, err = io.StringIO(), io.StringIO()
  status = cli.main(list(argv), out=out, err=err)
  return status, out.getvalue(), err.getvalue()


class HostileFileCase(tf.test.TestCase):
  """One graph, session and store per mode for the whole class (see module doc)."""

  @classmethod
  def setUpClass(cls):
    super(HostileFileCase, cls).setUpClass()
    cls.dir = tempfile.mkdtemp(dir=tf.test.get_temp_dir())
    cls.graph = tf.Graph()
    with cls.graph.as_default():
      with tf.variable_scope("net"):
        cls.variables = dict(
          (k, tf.get_variable(k, shape, dtype=tf.as_dtype(dtype)))
          for k, (shape, dtype) in SHAPES.items()
        )
      cls.stores = {}
      for mode in MODES:
        options = (
          {"spill_path": os.path.join(cls.dir, "store.h5"), "memory_budget": 0}
          if mode == "disk"
          else {}
        )
        cls.stores[mode] = snapstore.SnapshotStore(
          scope="net", mode=mode, max_to_keep=3, name=mode, **options
        )
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    cls.sess = tf.Session(graph=cls.graph)
    cls.sess.run(init)
    cls.good = values(0)
    cls.load(cls.good)
    for store in cls.stores.values():
      store.snapshot("good", session=cls.sess)

  @classmethod
  def tearDownClass(cls):
    for store in cls.stores.values():
      store.close()
    cls.sess.close()
    super(HostileFileCase, cls).tearDownClass()

  def setUp(self):
    super(HostileFileCase, self).setUp()
    for store in self.stores.values():  # what an earlier failure left
      for tag in store.tags():
        if tag != "good":
          store.delete(tag)
      store.files.flush()

  @classmethod
  def load(cls, state):
    for key, value in state.items():
      cls.variables[key].load(value, cls.sess)

  def current(self):
    keys = sorted(self.variables)
    return dict(zip(keys, self.sess.run([self.variables[k] for k in keys])))

  def path(self, name):
    return os.path.join(self.dir, name)

  def assert_refused(self, call, error, message):
    """`call()` raises `error` matching `message`, allocating little."""
    outcome, peak = peak_bytes(call)
    if not isinstance(outcome, error):
      self.fail("expected %s(%s), got %r" % (error.__name__, message, outcome))
    self.assertRegex(str(outcome), message)
    self.assertLess(
      peak, ALLOCATION_BOUND, "a refusal allocated %d bytes" % peak
    )
    return outcome

  def assert_usable(self, store):
    """The store holds what it held, and snapshots and restores exactly."""
    self.assertEqual(store.tags(), ["good"])
    live = values(7)
    self.load(live)
    store.snapshot("probe", session=self.sess)
    store.restore("good", session=self.sess)
    helpers.assert_state(self.current(), self.good, "good")
    store.restore("probe", session=self.sess)
    helpers.assert_state(self.current(), live, "probe")
    store.delete("probe")

  def assert_nothing_leaked(self, fds, threads):
    self.assertEqual(open_fds(), fds)
    self.assertEqual(threading.active_count(), threads)
