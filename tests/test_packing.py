"""Device mode with pack=True: small variables share a buffer per device and dtype."""

import collections

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

KINDS = helpers.kind_cases()

# Per device: small variables of the packed dtypes in mixed shapes (a scalar
# included), variables packing leaves alone (int64, bool), and one float32
# variable over the 1 MiB limit.
_SMALL = [
  ("s", [], tf.float32),
  ("b", [7], tf.float32),
  ("w", [3, 5], tf.float32),
  ("t", [2, 3, 4], tf.float32),
  ("h", [4], tf.float16),
  ("d", [5, 2], tf.float64),
  ("e", [1], tf.float32),
  ("h2", [2, 2], tf.float16),
  ("d2", [3], tf.float64),
]
_OTHER = [("step", [], tf.int64), ("mask", [3], tf.bool)]
_BIG = ("big", [600, 512], tf.float32)  # 1.17 MiB


class _Mixed(object):
  """Variables of `_SMALL`, `_OTHER` and `_BIG` on each of `devices`."""

  def __init__(self, use_resource, devices=(None,), big=True):
    self.variables = collections.OrderedDict()
    specs = _SMALL + _OTHER + ([_BIG] if big else [])
    with tf.variable_scope("net", use_resource=use_resource):
      for d, device in enumerate(devices):
        with tf.device(device):
          for name, shape, dtype in specs:
            key = "%s%d" % (name, d)
            self.variables[key] = tf.get_variable(
              key, shape, dtype, initializer=tf.zeros_initializer()
            )
    self.train_op = helpers.change_op(self.variables.values(), use_resource)

  def randomize(self, sess, seed):
    rng = np.random.RandomState(seed)
    for var in self.variables.values():
      var.load(
        helpers.random_value(
          rng, var.shape.as_list(), var.dtype.base_dtype.as_numpy_dtype
        ),
        sess,
      )
    return self.values(sess)

  def values(self, sess):
    return dict(zip(self.variables, sess.run(list(self.variables.values()))))


def _buffers(graph):
  """The packed buffers' variable ops, by name."""
  return dict(
    (op.name, op)
    for op in graph.get_operations()
    if op.type in ("VarHandleOp", "VariableV2") and "/packed_" in op.name
  )


def _anchor(op):
  """The name of the op `op` is colocated with."""
  return op.colocation_groups()[0].decode()[len("loc:@") :]


class PackedStoreTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*KINDS)
  def test_snapshots_restores_and_reads_are_bit_exact(self, use_resource):
    with tf.Graph().as_default():
      model = _Mixed(use_resource)
      store = snapstore.SnapshotStore(scope="net", max_to_keep=3, pack=True)
      reads = [tf.identity(v) for v in model.variables.values()]
      with tf.Session() as sess:
        helpers.init(sess)
        first = model.randomize(sess, seed=1)
        store.snapshot("a", session=sess)
        second = model.randomize(sess, seed=2)
        store.snapshot("b", session=sess)
        sess.run(model.train_op)
        current = model.values(sess)
        helpers.assert_state(dict(store.arrays("a", session=sess)), first)
        past = store.evaluate_with(reads, tag="a", session=sess)
        helpers.assert_state(dict(zip(model.variables, past)), first)
        helpers.assert_state(model.values(sess), current)  # put back exactly
        store.restore("b", session=sess)
        helpers.assert_state(model.values(sess), second)
        store.restore("a", session=sess)
        helpers.assert_state(model.values(sess), first)
        # Arrays written into a slot (load_arrays feeds the snapshot's reads).
        store.load_arrays(store.arrays("b", session=sess), "c", session=sess)
        store.restore("c", session=sess)
        helpers.assert_state(model.values(sess), second)

  @parameterized.named_parameters(*KINDS)
  def test_small_floats_share_a_buffer_per_device_and_dtype(self, use_resource):
    devices = ["/cpu:0", "/cpu:1"]
    with tf.Graph().as_default() as graph:
      model = _Mixed(use_resource, devices=devices)
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2, pack=True)
      buffers = _buffers(graph)
      # float32, float16 and float64 on each device, each in two slots and
      # the scratch; nothing else is packed.
      self.assertLen(buffers, 3 * 2 * 3)
      for name, op in buffers.items():
        self.assertRegex(name, r"^snapstore/packed_\d+/(slot_[01]|scratch)$")
      sizes = {}
      for op in buffers.values():
        anchor = graph.get_operation_by_name(_anchor(op))
        sizes[(anchor.device, op.get_attr("dtype"))] = (
          op.get_attr("shape").dim[0].size
        )
      expected = collections.Counter()
      for d in range(len(devices)):
        for name, shape, dtype in _SMALL:
          var = model.variables["%s%d" % (name, d)]
          expected[(var.device, dtype)] += int(np.prod(shape))
      self.assertEqual(sizes, dict(expected))
      # Shadows of their own: the big variable, the int64 and the bool.
      own = [
        op.name
        for op in graph.get_operations()
        if op.type in ("VarHandleOp", "VariableV2")
        and op.name.startswith("net/")
        and "/snapstore/" in op.name
      ]
      self.assertCountEqual(
        own,
        [
          "net/%s%d/snapstore/%s" % (n, d, s)
          for n, _, _ in _OTHER + [_BIG]
          for d in range(2)
          for s in ("slot_0", "slot_1", "scratch")
        ],
      )
      config = tf.ConfigProto(
        device_count={"CPU": 2}, allow_soft_placement=False
      )
      config.graph_options.rewrite_options.disable_meta_optimizer = True
      with tf.Session(config=config) as sess:
        helpers.init(sess)
        expected = model.randomize(sess, seed=0)
        tag = store.snapshot(session=sess)
        placed = {}
        for op in (store.slots.snapshot_op(1), store.slots.restore_op(0)):
          placed.update(helpers.placements(sess, op))
        # Every op the copies ran (concat, split, reshape, assign) ran on the
        # device of the variables it copies.
        checked = 0
        for name, device in placed.items():
          name = name.split(":")[0]  # a trace may suffix ":<op type>"
          if name.startswith("snapstore/packed_"):
            anchor = graph.get_operation_by_name(
              _anchor(graph.get_operation_by_name(name))
            )
            self.assertTrue(device.endswith(anchor.device), (name, device))
            checked += 1
        self.assertGreater(checked, 6 * 10)
        sess.run(model.train_op)
        store.restore(tag, session=sess)
        helpers.assert_state(model.values(sess), expected)

  @parameterized.named_parameters(*KINDS)
  def test_at_most_six_ops_per_variable_and_slot(self, use_resource):
    # The issue-14 target, for 300 small float32 variables of mixed shapes
    # and four slots: unpacked, a store adds about 7 to 8 ops per variable
    # and slot.
    rng = np.random.RandomState(0)
    counts = {}
    for pack in (False, True):
      with tf.Graph().as_default() as graph:
        with tf.variable_scope("net", use_resource=use_resource):
          for i in range(300):
            shape = (
              [int(rng.randint(1, 33))]
              if i % 3
              else [int(rng.randint(1, 17)), int(rng.randint(1, 17))]
            )
            tf.get_variable("w%d" % i, shape)
        with helpers.new_ops(graph) as added:
          snapstore.SnapshotStore(scope="net", max_to_keep=4, pack=pack)
        counts[pack] = len(added) / (300.0 * 4)
    self.assertLessEqual(counts[True], 6.0)
    self.assertLess(counts[True], counts[False] * 0.75)

  @parameterized.named_parameters(*KINDS)
  def test_buffers_start_at_the_initial_values_and_are_initialized_once(
    self, use_resource
  ):
    with tf.Graph().as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable(
          "w", [50, 4], initializer=tf.random_normal_initializer()
        )
        b = tf.get_variable(
          "b", [4], initializer=tf.random_normal_initializer()
        )
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2, pack=True)
      change = tf.group(
        tf.assign_add(w, tf.ones_like(w))
        if not use_resource
        else w.assign_add(tf.ones_like(w)),
        tf.assign_add(b, tf.ones_like(b))
        if not use_resource
        else b.assign_add(tf.ones_like(b)),
      )
      with tf.Session() as sess:
        # Both initializers in one run: each random initial value is drawn
        # once, and slot 1 starts with it.
        sess.run(
          [tf.global_variables_initializer(), tf.local_variables_initializer()]
        )
        initial = sess.run([w, b])
        store.snapshot("a", session=sess)  # slot 0
        sess.run(change)
        after = sess.run([w, b])
        sess.run(tf.local_variables_initializer())  # e.g. resetting tf.metrics
        sess.run(store.slots.restore_op(1))
        for got, want in zip(sess.run([w, b]), initial):
          helpers.assert_bit_equal(got, want)
        store.restore("a", session=sess)
        for got, want in zip(sess.run([w, b]), initial):
          helpers.assert_bit_equal(got, want)
        self.assertFalse(np.array_equal(after[0], initial[0]))

  @parameterized.named_parameters(*KINDS)
  def test_in_step_snapshot_and_slot_ops(self, use_resource):
    with tf.Graph().as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3], initializer=tf.zeros_initializer())
        b = tf.get_variable("b", [2, 2], initializer=tf.zeros_initializer())
      loss = tf.reduce_sum(w) + tf.reduce_sum(b)
      opt = tf.train.GradientDescentOptimizer(-1.0)  # adds 1 per step
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2, pack=True)
      train = store.slots.snapshot_before(lambda: opt.minimize(loss))
      with tf.control_dependencies([store.slots.snapshot_op(1)]):
        marker = tf.no_op()
      with tf.Session() as sess:
        helpers.init(sess)
        for step in range(3):
          sess.run(train)
          self.assertAllEqual(sess.run(w), np.full([3], step + 1.0))
        store.restore("before_step", session=sess)
        self.assertAllEqual(sess.run(w), np.full([3], 2.0))
        self.assertAllEqual(sess.run(b), np.full([2, 2], 2.0))
        sess.run(marker)
        sess.run(train)
        sess.run(store.slots.restore_op(1))
        self.assertAllEqual(sess.run(b), np.full([2, 2], 2.0))

  @parameterized.named_parameters(*KINDS)
  def test_in_step_snapshot_if_finite(self, use_resource):
    with tf.Graph().as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3], initializer=tf.zeros_initializer())
        b = tf.get_variable("b", [2, 2], initializer=tf.zeros_initializer())
      scale = tf.placeholder_with_default(1.0, [])
      loss = scale * (tf.reduce_sum(w) + tf.reduce_sum(b))
      opt = tf.train.GradientDescentOptimizer(-1.0)  # adds `scale` per step
      store = snapstore.SnapshotStore(scope="net", pack=True)
      train = store.slots.snapshot_before(
        lambda: opt.minimize(loss), if_finite=loss
      )
      with tf.Session() as sess:
        helpers.init(sess)
        sess.run(train)  # copies 0, then w = 1
        sess.run(train)  # copies 1, then w = 2
        sess.run(train, {scale: np.nan})  # no copy; w becomes NaN
        self.assertTrue(np.all(np.isnan(sess.run(w))))
        store.restore("before_step", session=sess)
        self.assertAllEqual(sess.run(w), np.full([3], 1.0))
        self.assertAllEqual(sess.run(b), np.full([2, 2], 1.0))

  @parameterized.named_parameters(*KINDS)
  def test_no_new_ops_after_construction(self, use_resource):
    with tf.Graph().as_default() as graph:
      model = _Mixed(use_resource, big=False)
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2, pack=True)
      fetch = tf.add_n(
        [
          tf.reduce_sum(tf.cast(v, tf.float32))
          for v in model.variables.values()
        ]
      )
      with tf.Session() as sess:
        helpers.init(sess)
        graph.finalize()
        expected = model.randomize(sess, seed=3)
        for _ in range(3):
          tag = store.snapshot(session=sess)
          store.evaluate_with(fetch, session=sess)
          sess.run(model.train_op)
          store.load_arrays(
            store.arrays(tag, session=sess), "copy", session=sess
          )
          store.restore("copy", session=sess)
          helpers.assert_state(model.values(sess), expected)
          store.delete("copy")

  def test_shadows_and_past_are_refused_with_the_fix(self):
    with tf.Graph().as_default():
      model = _Mixed(False, big=False)
      store = snapstore.SnapshotStore(scope="net", pack=True)
      with helpers.assert_raises_naming(
        self,
        snapstore.ModeError,
        r"^shadows\(\)",
        "packs 9 of its 11 variables into 3 buffers",
        r"pack=False \(the default\)",
      ):
        store.slots.shadows(0)
      with helpers.assert_raises_naming(
        self, snapstore.ModeError, r"^past\(\)", "pack=False"
      ):
        store.slots.past(model.variables["w0"].read_value())

  def test_a_store_with_nothing_to_pack_has_its_shadows(self):
    with tf.Graph().as_default():
      with tf.variable_scope("net"):
        tf.get_variable("step", [], tf.int64)
        tf.get_variable("w", [3])
      store = snapstore.SnapshotStore(scope="net", pack=True)
      self.assertEqual(list(store.slots.shadows()), ["step", "w"])

  def test_pack_must_be_a_bool(self):
    with tf.Graph().as_default():
      _Mixed(False, big=False)
      with self.assertRaisesRegex(
        TypeError, "pack must be True or False, got 'yes'"
      ):
        snapstore.SnapshotStore(scope="net", pack="yes")

  def test_host_mode_takes_no_pack_option(self):
    with tf.Graph().as_default():
      _Mixed(False, big=False)
      with self.assertRaisesRegex(
        TypeError, "Mode 'host' takes no option pack"
      ):
        snapstore.SnapshotStore(scope="net", mode="host", pack=True)


if __name__ == "__main__":
  tf.test.main()
