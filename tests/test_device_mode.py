"""Device mode: shadows made like slots, placement, initializers, Saver, slot ops."""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

KINDS = helpers.kind_cases()


class ShadowVariableTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*KINDS)
  def test_shadows_are_slots_of_their_primaries(self, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      for slot in range(2):
        shadows = store.slots.shadows(slot)
        self.assertEqual(list(shadows), list(store.keys))
        for key, shadow in shadows.items():
          primary = model.variables[key]
          self.assertEqual(
            shadow.op.name, "%s/snapstore/slot_%d" % (primary.op.name, slot)
          )
          self.assertEqual(shadow.dtype.base_dtype, primary.dtype.base_dtype)
          self.assertEqual(shadow.shape, primary.shape)
          self.assertEqual(type(shadow), type(primary))
          self.assertIn(
            ("loc:@" + primary.op.name).encode(), shadow.op.colocation_groups()
          )
      shadow_set = set(
        v.name for slot in range(2) for v in store.slots.shadows(slot).values()
      )
      self.assertFalse(
        shadow_set & set(v.name for v in tf.trainable_variables())
      )
      self.assertFalse(shadow_set & set(v.name for v in tf.global_variables()))
      self.assertTrue(shadow_set <= set(v.name for v in tf.local_variables()))
      self.assertTrue(
        shadow_set
        <= set(v.name for v in tf.get_collection(snapstore.SHADOW_VARIABLES))
      )

  def test_two_stores_get_distinct_names(self):
    with tf.Graph().as_default():
      helpers.Model()
      snapstore.SnapshotStore(scope="net")
      second = snapstore.SnapshotStore(scope="net")
      self.assertEqual(second.name, "snapstore_1")
      self.assertEqual(
        second.slots.shadows()["v1_float32"].op.name,
        "net/v1_float32/snapstore_1/slot_0",
      )

  def test_shadows_never_become_covered_variables(self):
    with tf.Graph().as_default():
      helpers.Model()
      first = snapstore.SnapshotStore(scope="net", saveable=True)
      # Shadows are global variables under "net" now, but a second store over
      # the scope still covers only the model.
      second = snapstore.SnapshotStore(scope="net", mode="host")
      self.assertEqual(second.keys, first.keys)
      with self.assertRaisesRegex(
        ValueError, "collection 'local_variables' .*is empty"
      ):
        snapstore.SnapshotStore(collection=tf.GraphKeys.LOCAL_VARIABLES)

  @parameterized.named_parameters(*KINDS)
  def test_default_saver_ignores_shadows_unless_saveable(self, use_resource):
    with tf.Graph().as_default():
      helpers.Model(use_resource=use_resource)
      snapstore.SnapshotStore(scope="net")
      saved = set(tf.train.Saver()._var_list)  # pylint: disable=protected-access
      self.assertFalse(any("snapstore" in v.name for v in saved))
    with tf.Graph().as_default():
      helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net", saveable=True)
      saved = set(v.name for v in tf.train.Saver()._var_list)  # pylint: disable=protected-access
      self.assertTrue(
        set(v.name for v in store.slots.shadows().values()) <= saved
      )

  @parameterized.named_parameters(*KINDS)
  def test_checkpoint_without_store_restores_into_graph_with_store(
    self, use_resource
  ):
    path = os.path.join(self.get_temp_dir(), "ckpt")
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      with tf.Session() as sess:
        helpers.init(sess)
        expected = model.randomize(sess, seed=3)
        tf.train.Saver().save(sess, path)
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net")
      scaffold = tf.train.Scaffold(saver=tf.train.Saver())
      creator = tf.train.ChiefSessionCreator(
        scaffold=scaffold, checkpoint_filename_with_path=path
      )
      with tf.train.MonitoredSession(session_creator=creator) as sess:
        helpers.assert_state(model.values(sess), expected)
        # Local init ran after the restore: the shadows hold the restored values.
        shadows = store.slots.shadows()
        raw = sess._tf_sess()  # pylint: disable=protected-access
        for key, value in expected.items():
          helpers.assert_bit_equal(raw.run(shadows[key]), value, key)

  @parameterized.named_parameters(*KINDS)
  def test_initializers_give_shadows_the_primaries_values(self, use_resource):
    with tf.Graph().as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable(
          "w", [50, 4], initializer=tf.random_normal_initializer(seed=None)
        )
      store = snapstore.SnapshotStore(scope="net")
      with tf.Session() as sess:
        # Both initializers in one run: the random initial value is drawn once.
        sess.run(
          [tf.global_variables_initializer(), tf.local_variables_initializer()]
        )
        helpers.assert_bit_equal(
          sess.run(store.slots.shadows()["w"]), sess.run(w)
        )
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(
          w.assign(tf.ones_like(w))
          if use_resource
          else tf.assign(w, tf.ones_like(w))
        )
        sess.run(store.slots.initializer)
        helpers.assert_bit_equal(
          sess.run(store.slots.shadows()["w"]), np.ones([50, 4], np.float32)
        )

  @parameterized.named_parameters(*KINDS)
  def test_rerunning_initializers_keeps_snapshots(self, use_resource):
    # Resetting tf.metrics with local_variables_initializer() (or a non-chief
    # worker's local_init_op against shadows on a ps) used to overwrite every
    # slot with the current values: restore then gave the wrong values.
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      _, update_mean = tf.metrics.mean(model.variables["v1_float32"])
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      reset = tf.local_variables_initializer()
      with tf.Session() as sess:
        helpers.init(sess)
        expected = model.randomize(sess, seed=1)
        store.snapshot("a", session=sess)
        sess.run(model.train_op)
        sess.run(update_mean)
        sess.run(reset)
        sess.run(store.slots.initializer)
        store.restore("a", session=sess)
        helpers.assert_state(model.values(sess), expected)
        # Loading a shadow through its initializer still works.
        shadow = store.slots.shadows(1)["v1_float32"]
        shadow.load(np.full([3, 5], 7, np.float32), sess)
        helpers.assert_bit_equal(
          sess.run(shadow), np.full([3, 5], 7, np.float32)
        )

  @parameterized.named_parameters(*KINDS)
  def test_snapshot_into_never_initialized_slot(self, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(scope="net")
      with tf.Session() as sess:
        sess.run(
          tf.global_variables_initializer()
        )  # shadows stay uninitialized
        expected = model.randomize(sess, seed=1)
        store.snapshot(session=sess)
        sess.run(model.train_op)
        store.restore(session=sess)
        helpers.assert_state(model.values(sess), expected)

  @parameterized.named_parameters(*KINDS)
  def test_every_shadow_sits_on_its_primarys_device(self, use_resource):
    devices = ["/cpu:0", "/cpu:1", "/cpu:2"]
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource, devices=devices)
      with tf.device("/cpu:2"):  # a surrounding device scope must not win
        store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      config = tf.ConfigProto(
        device_count={"CPU": 3}, allow_soft_placement=False
      )
      # Trace the placer's decisions as they are: grappler and the L1 graph
      # optimizer would remove the Identity reads of ref variables.
      config.graph_options.rewrite_options.disable_meta_optimizer = True
      config.graph_options.optimizer_options.opt_level = tf.OptimizerOptions.L0
      graph = tf.get_default_graph()
      with tf.Session(config=config) as sess:
        helpers.init(sess)
        expected = model.randomize(sess, seed=0)
        tag = store.snapshot(session=sess)
        ops = [
          store.slots.snapshot_op(0),
          store.slots.snapshot_op(1),
          store.slots.restore_op(0),
          store.slots.restore_op(1),
        ]
        placed = {}
        for op in ops:  # one run each: the copies must not race each other
          placed.update(helpers.placements(sess, op))
        self.assertEqual(
          len(set(placed[v.op.name] for v in model.variables.values())), 3
        )
        for key, primary in model.variables.items():
          for slot in range(2):
            shadow = store.slots.shadows(slot)[key]
            self.assertEqual(shadow.device, primary.device)
            self.assertEqual(
              placed[shadow.op.name], placed[primary.op.name], key
            )
        # Every assign, and the read feeding it, ran on its variable's device:
        # no parameter value crossed devices.
        graph_ops = {op.name: op for op in graph.get_operations()}
        assigns = [
          graph_ops[name]
          for name in placed
          if name.startswith("snapstore/")
          and name in graph_ops
          and graph_ops[name].type in ("Assign", "AssignVariableOp")
        ]
        self.assertEqual(len(assigns), 4 * len(model.variables))
        for op in assigns:
          variable_device = placed[op.inputs[0].op.name]
          self.assertEqual(placed[op.name], variable_device, op.name)
          self.assertEqual(
            placed[op.inputs[1].op.name], variable_device, op.name
          )
        sess.run(model.train_op)
        store.restore(tag, session=sess)
        helpers.assert_state(model.values(sess), expected)

  @parameterized.named_parameters(*KINDS)
  def test_a_gpu_variables_store_stays_on_its_gpu(self, use_resource):
    # The placer puts every op of a colocation group on the device of the
    # group's variable. So if every op the store builds for a variable on
    # /gpu:0 (its shadows, their initializers, each snapshot and restore copy
    # and the read feeding it) is in that variable's group, the store runs on
    # the GPU and no parameter crosses to the host. Checked in the graph,
    # which needs no GPU; where TF sees one, the traced placement is checked
    # too, and elsewhere the store runs with soft placement.
    gpu = "/device:GPU:0"
    dtypes = (tf.float16, tf.float32, tf.float64, tf.int64)
    with tf.Graph().as_default() as graph:
      model = helpers.Model(
        use_resource=use_resource, dtypes=dtypes, devices=[gpu]
      )
      before = set(graph.get_operations())
      with tf.device("/cpu:0"):  # a surrounding device scope must not win
        store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      built = [op for op in graph.get_operations() if op not in before]
    groups = dict(
      (("loc:@" + v.op.name).encode(), v) for v in model.variables.values()
    )
    for v in model.variables.values():
      self.assertEqual(tf.DeviceSpec.from_string(v.device).device_type, "GPU")
    copies = [
      c
      for k in range(2)
      for group in (store.slots.snapshot_op(k), store.slots.restore_op(k))
      for c in group.control_inputs
    ]
    self.assertEqual(len(copies), 4 * len(model.variables))
    # Besides the grouping no-ops and the placeholders that take host arrays
    # (load_npz), the store built nothing a variable does not hold on its device.
    loose = [
      op.name
      for op in built
      if op.type not in ("NoOp", "Placeholder")
      and not (
        len(op.colocation_groups()) == 1 and op.colocation_groups()[0] in groups
      )
    ]
    self.assertEqual(loose, [])
    for slot in range(2):
      for key, shadow in store.slots.shadows(slot).items():
        self.assertEqual(
          shadow.op.colocation_groups(),
          model.variables[key].op.colocation_groups(),
        )
    for op in copies:  # the copy and the value it copies share a group
      self.assertEqual(
        op.colocation_groups(), op.inputs[1].op.colocation_groups()
      )
    gpus = tf.config.experimental.list_physical_devices("GPU")
    config = tf.ConfigProto(allow_soft_placement=not gpus)
    with tf.Session(graph=graph, config=config) as sess:
      helpers.init(sess)
      model.randomize(sess, seed=0)
      expected = model.values(sess)
      tag = store.snapshot(session=sess)
      if gpus:
        placed = {}
        for op in (store.slots.snapshot_op(0), store.slots.restore_op(0)):
          placed.update(helpers.placements(sess, op))
        for op in copies[: len(model.variables)]:
          self.assertIn("GPU:0", placed[op.name], op.name)
      sess.run(model.train_op)
      helpers.assert_state_differs(model.values(sess), expected)
      store.restore(tag, session=sess)
      helpers.assert_state(model.values(sess), expected)


class SlotOpsTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*KINDS)
  def test_snapshot_op_in_users_control_dependencies(self, use_resource):
    with tf.Graph().as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [4], initializer=tf.zeros_initializer())
      store = snapstore.SnapshotStore(scope="net")
      with tf.control_dependencies([store.slots.snapshot_op(0)]):
        # Copies w into slot 0, then increments it.
        train = (
          w.assign_add(tf.ones([4]), read_value=False)
          if use_resource
          else tf.assign_add(w, tf.ones([4])).op
        )
      with tf.Session() as sess:
        helpers.init(sess)
        for step in range(3):
          sess.run(train)
          self.assertAllEqual(
            sess.run(store.slots.shadows()["w"]), np.full([4], step)
          )
        sess.run(store.slots.restore_op(0))
        self.assertAllEqual(sess.run(w), np.full([4], 2.0))

  def test_slot_of_follows_the_ring(self):
    with tf.Graph().as_default():
      helpers.Model()
      store = snapstore.SnapshotStore(scope="net", max_to_keep=3)
      with tf.Session() as sess:
        helpers.init(sess)
        slots = [
          store.slots.slot_of(store.snapshot(session=sess)) for _ in range(3)
        ]
        self.assertEqual(slots, [0, 1, 2])
        store.snapshot(session=sess)  # evicts tag 0 and reuses its slot
        self.assertEqual(store.slots.slot_of(3), 0)
        self.assertEqual(len(store.slots), 3)

  def test_nbytes_counts_slots_and_scratch(self):
    with tf.Graph().as_default():
      helpers.Model()
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      with tf.Session() as sess:
        helpers.init(sess)
        self.assertEqual(store.param_nbytes, 15 * (2 + 4 + 8 + 4 + 8 + 1))
        self.assertEqual(store.nbytes, 2 * store.param_nbytes)
        store.snapshot(session=sess)
        store.evaluate_with(store.variables["v1_float32"], session=sess)
        self.assertEqual(store.nbytes, 3 * store.param_nbytes)


if __name__ == "__main__":
  tf.test.main()
