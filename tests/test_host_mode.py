"""Host mode: snapshots are real numpy copies, never aliases of TF buffers."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.core import buffers
from tests import helpers


class HostCopiesTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        # Large enough that TF would use its own buffers, not small-tensor paths.
        w = tf.get_variable(
          "w", [256, 1024], initializer=tf.zeros_initializer()
        )
      step = (
        w.assign_add(tf.ones_like(w), read_value=False)
        if use_resource
        else tf.assign_add(w, tf.ones_like(w)).op
      )
      store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=2)
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    helpers.init(sess)
    return w, step, store, sess

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_snapshot_does_not_alias_the_variable(self, use_resource):
    w, step, store, sess = self._setup(use_resource)
    store.snapshot("zero", session=sess)
    held = store.arrays("zero")["w"]
    for _ in range(3):  # in-place updates of the variable's buffer
      sess.run(step)
    np.testing.assert_array_equal(held, np.zeros([256, 1024], np.float32))
    np.testing.assert_array_equal(
      sess.run(w), np.full([256, 1024], 3, np.float32)
    )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_restore_does_not_alias_the_snapshot(self, use_resource):
    w, step, store, sess = self._setup(use_resource)
    store.snapshot("zero", session=sess)
    store.restore("zero", session=sess)
    sess.run(step)  # writes the restored variable in place
    np.testing.assert_array_equal(
      store.arrays("zero")["w"], np.zeros([256, 1024], np.float32)
    )
    store.restore("zero", session=sess)
    np.testing.assert_array_equal(
      sess.run(w), np.zeros([256, 1024], np.float32)
    )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_snapshots_are_read_only_and_loaded_arrays_copied(self, use_resource):
    _, _, store, sess = self._setup(use_resource)
    source = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    store.load_arrays({"w": source}, tag="given")
    source[:] = -1  # the caller's array is not the snapshot
    held = store.arrays("given")["w"]
    self.assertEqual(held[0, 1], 1.0)
    with self.assertRaisesRegex(ValueError, "read-only"):
      held[0, 0] = 5
    del sess

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_optimizer_steps_after_restore_leave_the_snapshot(self, use_resource):
    # A restore feeds the snapshot's aligned arrays in place; a resource
    # variable adopts the buffer, and its next update must copy it first.
    w, _, store, sess = self._setup(use_resource)
    with sess.graph.as_default():
      sgd = tf.train.GradientDescentOptimizer(0.5).apply_gradients(
        [(tf.ones([256, 1024]), w)]
      )
      momentum = tf.train.MomentumOptimizer(0.5, 0.9).apply_gradients(
        [(tf.ones([256, 1024]), w)]
      )
      sess.run(
        tf.variables_initializer(
          [v for v in tf.global_variables() if v is not w]
        )
      )
    store.snapshot("zero", session=sess)
    held = store.arrays("zero")["w"]
    for step in (sgd, momentum, sgd):
      store.restore("zero", session=sess)
      sess.run(step)
      np.testing.assert_array_equal(held, np.zeros([256, 1024], np.float32))
      self.assertNotEqual(float(sess.run(w)[0, 0]), 0.0)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_local_cpu_snapshots_are_aligned_for_feeding(self, use_resource):
    _, _, store, sess = self._setup(use_resource)
    store.snapshot("a", session=sess)
    store.load_arrays({"w": np.ones([256, 1024], np.float32)}, tag="b")
    for tag in ("a", "b"):
      self.assertTrue(buffers.is_aligned(store.arrays(tag)["w"]), tag)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_snapshot_over_an_evicted_one_copies_into_its_arrays(
    self, use_resource
  ):
    # max_to_keep=2: the third snapshot evicts the first and is copied into
    # its arrays (no second model's worth of buffers), bit for bit.
    w, step, store, sess = self._setup(use_resource)
    store.snapshot("a", session=sess)
    address = store.arrays("a")["w"].ctypes.data
    sess.run(step)
    store.snapshot("b", session=sess)
    sess.run(step)
    store.snapshot("c", session=sess)  # evicts "a"
    self.assertEqual(store.tags(), ["b", "c"])
    held = store.arrays("c")["w"]
    self.assertEqual(held.ctypes.data, address, "not copied in place")
    np.testing.assert_array_equal(held, np.full([256, 1024], 2, np.float32))
    with self.assertRaisesRegex(ValueError, "read-only"):
      held[0, 0] = 5
    np.testing.assert_array_equal(
      store.arrays("b")["w"], np.ones([256, 1024], np.float32)
    )
    del held
    sess.run(step)
    store.restore("c", session=sess)
    np.testing.assert_array_equal(
      sess.run(w), np.full([256, 1024], 2, np.float32)
    )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_arrays_someone_holds_are_never_written(self, use_resource):
    w, step, store, sess = self._setup(use_resource)
    store.snapshot("a", session=sess)
    mine = store.arrays("a")["w"]  # the caller's: "a" gets new arrays
    sess.run(step)
    store.snapshot("a", session=sess)
    np.testing.assert_array_equal(mine, np.zeros([256, 1024], np.float32))
    np.testing.assert_array_equal(
      store.arrays("a")["w"], np.ones([256, 1024], np.float32)
    )
    # Restored: the variable may hold the snapshot's buffer until its next
    # write; a snapshot over that tag, then an update, leaves the snapshot.
    store.restore("a", session=sess)
    store.snapshot("a", session=sess)
    sess.run(step)
    store.snapshot("b", session=sess)
    sess.run(step)
    store.snapshot("c", session=sess)  # over "a"'s arrays, in place
    sess.run(step)
    np.testing.assert_array_equal(
      store.arrays("b")["w"], np.full([256, 1024], 2, np.float32)
    )
    np.testing.assert_array_equal(
      store.arrays("c")["w"], np.full([256, 1024], 3, np.float32)
    )
    np.testing.assert_array_equal(
      sess.run(w), np.full([256, 1024], 4, np.float32)
    )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_failed_snapshot_keeps_the_one_it_would_evict(self, use_resource):
    w, step, store, sess = self._setup(use_resource)
    store.snapshot("a", session=sess)
    sess.run(step)
    store.snapshot("b", session=sess)
    other = tf.Session(graph=sess.graph)  # its variables are uninitialized
    self.addCleanup(other.close)
    with self.assertRaisesRegex(
      snapstore.SnapshotError, "Taking snapshot 'c' failed.*unchanged"
    ) as raised:
      store.snapshot("c", session=other)
    self.assertNotIn("dropped", str(raised.exception))
    self.assertEqual(store.tags(), ["a", "b"])
    np.testing.assert_array_equal(
      store.arrays("a")["w"], np.zeros([256, 1024], np.float32)
    )
    store.restore("a", session=sess)
    np.testing.assert_array_equal(
      sess.run(w), np.zeros([256, 1024], np.float32)
    )
    del step

  def test_in_place_snapshots_on_two_cpu_devices(self):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=True):
        parts = []
        for i in range(2):
          with tf.device("/cpu:%d" % i):
            parts.append(tf.get_variable("w%d" % i, [64, 1024], tf.float32))
      step = tf.group(*[p.assign_add(tf.ones_like(p)) for p in parts])
      store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=2)
    sess = tf.Session(
      graph=graph, config=tf.ConfigProto(device_count={"CPU": 2})
    )
    self.addCleanup(sess.close)
    helpers.init(sess)
    start = sess.run(parts)
    store.snapshot("a", session=sess)
    addresses = [a.ctypes.data for a in store.arrays("a").values()]
    sess.run(step)
    store.snapshot("b", session=sess)
    sess.run(step)
    store.snapshot("c", session=sess)  # into "a"'s arrays
    held = store.arrays("c")
    self.assertEqual([a.ctypes.data for a in held.values()], addresses)
    for i, value in enumerate(start):
      helpers.assert_bit_equal(held["w%d" % i], (value + 1) + 1)
      helpers.assert_bit_equal(store.arrays("b")["w%d" % i], value + 1)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_scalars_are_copied_in_place_too(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        count = tf.get_variable(
          "count", [], tf.int64, initializer=tf.zeros_initializer()
        )
        rate = tf.get_variable(
          "rate", [], tf.float32, initializer=tf.ones_initializer()
        )
      step = tf.group(tf.assign_add(count, 1), tf.assign(rate, rate * 0.5))
      store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=2)
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    helpers.init(sess)
    store.snapshot("a", session=sess)
    held = store.arrays("a")
    self.assertIsInstance(held["count"], np.ndarray)  # not a numpy scalar
    addresses = sorted(a.ctypes.data for a in held.values())
    del held
    for tag in ("b", "c"):
      sess.run(step)
      store.snapshot(tag, session=sess)
    held = store.arrays("c")
    self.assertEqual(sorted(a.ctypes.data for a in held.values()), addresses)
    self.assertEqual(int(held["count"]), 2)
    self.assertEqual(float(held["rate"]), 0.25)
    self.assertEqual(held["count"].shape, ())

  def test_every_supported_dtype_is_copied_in_place(self):
    dtypes = [
      tf.float16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32,
      tf.int64, tf.uint8, tf.uint16, tf.bool, tf.complex64, tf.complex128,
    ]  # fmt: skip
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=True):
        parts = [
          tf.get_variable("v%d" % i, [3, 5], d, tf.zeros_initializer())
          for i, d in enumerate(dtypes)
        ]
      ones = tf.group(*[p.assign(tf.ones_like(p)) for p in parts])
      store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=1)
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    helpers.init(sess)
    store.snapshot(1, session=sess)
    addresses = [a.ctypes.data for a in store.arrays(1).values()]
    sess.run(ones)
    store.snapshot(2, session=sess)  # max_to_keep=1: over snapshot 1
    held = store.arrays(2)
    self.assertEqual([a.ctypes.data for a in held.values()], addresses)
    for i, d in enumerate(dtypes):
      helpers.assert_bit_equal(
        held["v%d" % i], np.ones([3, 5], d.as_numpy_dtype), d.name
      )

  def test_nbytes_counts_held_arrays(self):
    _, _, store, sess = self._setup(False)
    self.assertEqual(store.nbytes, 0)
    store.snapshot(session=sess)
    store.snapshot(session=sess)
    self.assertEqual(store.nbytes, 2 * 256 * 1024 * 4)
    store.snapshot(session=sess)  # max_to_keep=2: one evicted
    self.assertEqual(store.nbytes, 2 * 256 * 1024 * 4)
    with self.assertRaises(snapstore.ModeError):
      store.slots  # pylint: disable=pointless-statement  # no device slots

  def test_host_needs_no_session_for_files(self):
    _, _, store, sess = self._setup(False)
    store.snapshot("a", session=sess)
    path = self.get_temp_dir() + "/a.npz"
    self.assertIsNone(tf.get_default_session())
    store.files.save_npz(path)
    self.assertEqual(store.files.load_npz(path, tag="b"), "b")
    helpers.assert_bit_equal(store.arrays("b")["w"], store.arrays("a")["w"])

  def test_unbounded_with_zero(self):
    _, _, store_unused, sess = self._setup(False)
    del store_unused
    with sess.graph.as_default():
      store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=0)
    self.assertIsNone(store.max_to_keep)
    for _ in range(12):
      store.snapshot(session=sess)
    self.assertLen(store.tags(), 12)


if __name__ == "__main__":
  tf.test.main()
