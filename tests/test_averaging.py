"""Averages in device shadows: EMA equal to TF's, rates per kind, SWA, pinned slots."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

FLOATS = (
  ("w", tf.float32, True),
  ("b", tf.float64, True),
  ("h", tf.float16, True),
  ("moving_mean", tf.float32, False),
)


class _Model(object):
  """Float variables of three dtypes, a non-trainable one (a batch-norm
  statistic), an int counter, and a train op adding fresh noise to each."""

  def __init__(self, use_resource=False):
    self.variables = {}
    with tf.variable_scope("net", use_resource=use_resource):
      for name, dtype, trainable in FLOATS:
        self.variables[name] = tf.get_variable(
          name,
          [2, 3],
          dtype=dtype,
          trainable=trainable,
          initializer=tf.random_normal_initializer(seed=len(name)),
        )
      self.variables["count"] = tf.get_variable(
        "count",
        [2],
        tf.int32,
        trainable=False,
        initializer=tf.zeros_initializer(),
      )
    self.step = tf.train.get_or_create_global_step()
    updates = [
      tf.assign_add(v, tf.random.normal(v.shape, dtype=v.dtype.base_dtype))
      if not use_resource
      else v.assign_add(tf.random.normal(v.shape, dtype=v.dtype.base_dtype))
      for name, v in self.variables.items()
      if name != "count"
    ]
    updates.append(
      tf.assign_add(self.variables["count"], [1, 2])
      if not use_resource
      else self.variables["count"].assign_add([1, 2])
    )
    updates.append(tf.assign_add(self.step, 1))
    self.train_op = tf.group(*updates)

  def store(self, **kwargs):
    kwargs.setdefault("mode", "device")
    return snapstore.SnapshotStore(
      scope="net", include_global_step=True, **kwargs
    )

  def values(self, sess):
    return sess.run(self.variables)


class MovingAverageTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("ref", False, False, {}),
    ("resource", True, False, {}),
    ("ref_num_updates", False, True, {}),
    ("resource_num_updates", True, True, {}),
    ("ref_form_ema", False, False, {"form": "ema"}),
    ("resource_num_updates_form_ema", True, True, {"form": "ema"}),
  )
  def test_equals_tf_exponential_moving_average_step_by_step(
    self, use_resource, warmup, kwargs
  ):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model(use_resource)
      store = model.store()
      floats = [model.variables[name] for name, _, _ in FLOATS]
      num_updates = model.step if warmup else None
      with tf.control_dependencies([model.train_op]):
        ema = snapstore.MovingAverage(
          store, decay=0.9, num_updates=num_updates, **kwargs
        )
        reference = tf.train.ExponentialMovingAverage(
          0.9, num_updates=num_updates
        )
        reference_op = reference.apply(floats)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      for step in range(15):
        sess.run([ema.update_op, reference_op])
        averages = sess.run(ema.store.slots.shadows(ema.slot))
        for var in floats:
          key = var.op.name[len("net/") :]
          helpers.assert_bit_equal(
            averages[key],
            sess.run(reference.average(var)),
            "%s step %d" % (key, step),
          )
        # Not floats: copied.
        self.assertAllEqual(
          averages["count"], sess.run(model.variables["count"])
        )
        self.assertEqual(averages["global_step"], sess.run(model.step))

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_tau_and_a_separate_rate_for_non_trainable(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model(use_resource)
      store = model.store(max_to_keep=2)
      with tf.control_dependencies([model.train_op]):
        ema = snapstore.MovingAverage(
          store, tau=0.1, tau_non_trainable=0.5, slot=1, tag="polyak"
        )
    self.assertEqual(ema.tau, 0.1)
    self.assertIsNone(ema.decay)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      expected = model.values(sess)
      for step in range(10):
        sess.run(ema.update_op)
        values = model.values(sess)
        for name, dtype, trainable in FLOATS:
          rate = dtype.as_numpy_dtype(0.1 if trainable else 0.5)
          expected[name] = (
            expected[name] - (expected[name] - values[name]) * rate
          )
        expected["count"] = values["count"]
        averages = sess.run(ema.store.slots.shadows(ema.slot))
        for name in expected:
          helpers.assert_bit_equal(
            averages[name], expected[name], "%s step %d" % (name, step)
          )
      self.assertEqual(store.tags(), ["polyak"])

  @parameterized.named_parameters(
    ("ref", False, {}),
    ("resource", True, {}),
    ("ref_tau_non_trainable", False, {"tau_non_trainable": 0.2517}),
    ("resource_tau_non_trainable", True, {"tau_non_trainable": 0.2517}),
    ("ref_num_updates", False, {"num_updates": True}),
    ("resource_num_updates", True, {"num_updates": True}),
  )
  def test_lerp_form_is_the_rl_libraries_soft_update_bit_for_bit(
    self, use_resource, kwargs
  ):
    # The soft target update of trfl's update_target_variables, tf-agents'
    # soft_variables_update and OpenAI baselines: (1 - tau) * target + tau *
    # source, tau a Python float; 1 - tau is taken in Python (float64), then
    # both weights are rounded once to the variable's dtype.
    tau = 0.0476
    tau_nt = kwargs.get("tau_non_trainable", tau)
    for rate in (tau, tau_nt):  # so taking 1 - tau in the dtype would show
      self.assertNotEqual(np.float32(1 - rate), 1 - np.float32(rate))
      self.assertNotEqual(np.float16(1 - rate), 1 - np.float16(rate))
    graph = tf.Graph()
    with graph.as_default():
      model = _Model(use_resource)
      store = model.store()
      # No train op: each step loads fresh values of every magnitude instead.
      num_updates = model.step if kwargs.get("num_updates") else None
      lerp = snapstore.MovingAverage(
        store,
        tau=tau,
        form="lerp",
        num_updates=num_updates,
        tau_non_trainable=kwargs.get("tau_non_trainable"),
      )
      # The libraries' expression itself, on variables of their own.
      sources = [model.variables[name] for name, _, _ in FLOATS]
      with tf.variable_scope("reference", use_resource=use_resource):
        targets = [
          tf.get_variable(
            v.op.name.split("/")[-1],
            v.shape,
            v.dtype.base_dtype,
            trainable=False,
          )
          for v in sources
        ]
      reference_op = tf.group(
        *[
          tf.assign(
            t,
            (1 - (tau if trainable else tau_nt)) * t
            + (tau if trainable else tau_nt) * s,
          )
          if not use_resource
          else t.assign(
            (1 - (tau if trainable else tau_nt)) * t
            + (tau if trainable else tau_nt) * s
          )
          for t, s, (_, _, trainable) in zip(targets, sources, FLOATS)
        ]
      )
      next_step = tf.assign_add(model.step, 1)
    self.assertEqual(lerp.form, "lerp")
    rng = np.random.RandomState(7)

    def wide(shape, dtype):  # both signs, magnitudes 1e-3 to 1e3
      return (
        rng.choice([-1, 1], shape) * 10.0 ** rng.uniform(-3, 3, shape)
      ).astype(dtype)

    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      for name, var in model.variables.items():
        if name != "count":
          var.load(wide([2, 3], var.dtype.base_dtype.as_numpy_dtype), sess)
      sess.run(store.slots.snapshot_op(lerp.slot))  # the average starts here
      for target, source in zip(targets, sources):
        target.load(sess.run(source), sess)
      # The warm-up (d = (1 + n) / (10 + n)) ends at n = 180 for tau: the
      # updates cover both sides.
      model.step.load(165, sess)
      expected = model.values(sess)
      differs = {name: 0 for name, _, _ in FLOATS}
      warming_up = set()
      for step in range(30):
        for name, var in model.variables.items():
          if name != "count":
            var.load(wide([2, 3], var.dtype.base_dtype.as_numpy_dtype), sess)
        n = sess.run(model.step)
        sess.run([lerp.update_op, reference_op])
        values = model.values(sess)
        for name, dtype, trainable in FLOATS:
          t = dtype.as_numpy_dtype
          rate = tau if trainable else tau_nt
          keep, weight = t(1 - rate), t(rate)
          if num_updates is not None:  # TF's warm-up, its decay in float32
            decay = np.float32(1 + n) / np.float32(10 + n)
            warming_up.add((trainable, t(decay) < keep))
            if t(decay) < keep:
              keep, weight = t(decay), t(np.float32(1) - decay)
          average, value = expected[name], values[name]
          ema_form = average - (average - value) * weight
          expected[name] = keep * average + weight * value
          differs[name] += np.sum(ema_form != expected[name])
        expected["count"] = values["count"]
        averages = sess.run(lerp.store.slots.shadows(lerp.slot))
        for name in expected:
          helpers.assert_bit_equal(
            averages[name], expected[name], "%s step %d" % (name, step)
          )
        if num_updates is None:  # the libraries have no warm-up
          for (name, _, _), target in zip(FLOATS, targets):
            helpers.assert_bit_equal(
              averages[name],
              sess.run(target),
              "%s step %d, the libraries' op" % (name, step),
            )
        sess.run(next_step)
      # The data tell the two forms apart, so the test would see the wrong one.
      for name in ("w", "b"):
        self.assertGreater(differs[name], 0, name)
      if num_updates is not None:
        self.assertEqual(
          warming_up,
          {(True, True), (True, False), (False, True), (False, False)},
        )

  @parameterized.named_parameters(
    ("ref", False, "ema"),
    ("resource", True, "ema"),
    ("ref_lerp", False, "lerp"),
    ("resource_lerp", True, "lerp"),
  )
  def test_tau_one_is_an_exact_hard_copy(self, use_resource, form):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model(use_resource)
      store = model.store()
      copy = snapstore.MovingAverage(store, tau=1.0, form=form)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      rng = np.random.RandomState(0)
      for var in model.variables.values():  # NaN, infinities, signed zeros
        var.load(
          helpers.random_value(
            rng, var.shape.as_list(), var.dtype.base_dtype.as_numpy_dtype
          ),
          sess,
        )
      sess.run(copy.update_op)
      averages = sess.run(copy.store.slots.shadows(copy.slot))
      for name, value in model.values(sess).items():
        helpers.assert_bit_equal(averages[name], value, name)

  def test_evaluate_with_the_average_and_restore_it(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model()
      x = tf.placeholder(tf.float32, [None, 2])
      out = tf.matmul(x, model.variables["w"])
      store = model.store()
      with tf.control_dependencies([model.train_op]):
        ema = snapstore.MovingAverage(store, tau=0.3)
    x_value = np.ones([4, 2], np.float32)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      for _ in range(5):
        sess.run(ema.update_op)
      live = model.values(sess)
      average = sess.run(ema.store.slots.shadows(ema.slot)["w"])
      self.assertAllClose(
        ema.evaluate_with(out, {x: x_value}, session=sess), x_value.dot(average)
      )
      self.assertAllClose(
        store.evaluate_with(out, {x: x_value}, tag="ema", session=sess),
        x_value.dot(average),
      )
      helpers.assert_state(model.values(sess), live)
      store.restore("ema", session=sess)  # e.g. at the end of training
      helpers.assert_bit_equal(sess.run(model.variables["w"]), average)

  def test_store_built_inside_the_train_ops_control_dependencies(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model()
      feed_me = tf.placeholder(tf.float32, [])
      with tf.control_dependencies([model.train_op, feed_me]):
        store = model.store(
          max_to_keep=2
        )  # its ops must not depend on the step
        ema = snapstore.MovingAverage(store, tau=0.5)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      live = model.values(sess)
      store.snapshot("x", session=sess)
      store.restore("x", session=sess)
      store.evaluate_with(model.step, tag="ema", session=sess)
      store.arrays("ema", session=sess)
      helpers.assert_state(model.values(sess), live)  # the train op never ran
      with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError, "feed a value"
      ):
        sess.run(ema.update_op)  # the update does depend on the step

  def test_no_ops_are_added_after_construction(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model()
      store = model.store(max_to_keep=2)
      with tf.control_dependencies([model.train_op]):
        ema = snapstore.MovingAverage(store, tau=0.5, num_updates=model.step)
      swa = snapstore.RunningMean(store, slot=1)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      for _ in range(20):
        sess.run([ema.update_op])
        sess.run(swa.update_op)
        store.evaluate_with(model.step, tag=ema.tag, session=sess)
      sess.run(swa.reset_op)


class RunningMeanTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.kind_cases())
  def test_running_mean_with_count_and_reset(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model(use_resource)
      store = model.store()
      swa = snapstore.RunningMean(store)
    self.assertIn(swa.count, graph.get_collection(tf.GraphKeys.LOCAL_VARIABLES))
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      history = []
      expected = None
      for n in range(8):
        sess.run(model.train_op)
        values = model.values(sess)
        history.append(values)
        sess.run(swa.update_op)
        if expected is None:
          expected = dict(values)  # the first update copies
        else:
          for name, dtype, _ in FLOATS:
            t = dtype.as_numpy_dtype
            expected[name] = expected[name] + (
              values[name] - expected[name]
            ) / t(n + 1)
          expected["count"] = values["count"]
        averages = sess.run(swa.store.slots.shadows(swa.slot))
        for name in expected:
          helpers.assert_bit_equal(
            averages[name], expected[name], "%s update %d" % (name, n)
          )
        self.assertEqual(sess.run(swa.count), n + 1)
      self.assertAllClose(
        averages["w"], np.mean([h["w"] for h in history], axis=0), rtol=1e-5
      )
      sess.run(swa.reset_op)
      sess.run(model.train_op)
      sess.run(swa.update_op)  # a new mean: a copy
      helpers.assert_bit_equal(
        sess.run(swa.store.slots.shadows(swa.slot)["w"]),
        sess.run(model.variables["w"]),
      )
      self.assertEqual(sess.run(swa.count), 1)

  def test_count_is_saved_with_a_saveable_store(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Model()
      swa = snapstore.RunningMean(model.store(saveable=True))
      saved = tf.train.Saver()._var_list  # pylint: disable=protected-access
    self.assertIn(
      swa.count, graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
    )
    self.assertIn(swa.store.slots.shadows(swa.slot)["w"], saved)
    self.assertIn(swa.count, saved)
    self.assertNotIn(
      swa.count, graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    )


class AveragingErrorsTest(tf.test.TestCase):
  def _store(self, mode="device", **kwargs):
    with tf.Graph().as_default():
      return _Model().store(mode=mode, **kwargs)

  def test_bad_arguments(self):
    store = self._store(max_to_keep=3)
    with self.assertRaisesRegex(ValueError, "tau= or as decay=.*not both"):
      snapstore.MovingAverage(store, tau=0.1, decay=0.9)
    with self.assertRaisesRegex(ValueError, "tau= or as decay=.*not neither"):
      snapstore.MovingAverage(store)
    with self.assertRaisesRegex(ValueError, r"tau must be in \(0, 1\]"):
      snapstore.MovingAverage(store, tau=0.0)
    with self.assertRaisesRegex(
      ValueError, r"tau_non_trainable must be in \(0, 1\]"
    ):
      snapstore.MovingAverage(store, tau=0.1, tau_non_trainable=2.0)
    with self.assertRaisesRegex(ValueError, r"decay must be in \[0, 1\)"):
      snapstore.MovingAverage(store, decay=1.0)
    with self.assertRaisesRegex(TypeError, "tau must be a number"):
      snapstore.MovingAverage(store, tau="0.1")
    with self.assertRaisesRegex(
      ValueError, r"form must be 'ema' \(.*\) or 'lerp' \(.*\), got 'polyak'"
    ):
      snapstore.MovingAverage(store, tau=0.1, form="polyak")
    with self.assertRaisesRegex(
      ValueError, "form='lerp' takes the rate as tau="
    ):
      snapstore.MovingAverage(store, decay=0.9, form="lerp")
    with self.assertRaisesRegex(
      TypeError, "num_updates must be a scalar tensor"
    ):
      snapstore.MovingAverage(store, tau=0.1, num_updates=3)
    with store.graph.as_default():
      vector = tf.zeros([2])
    with self.assertRaisesRegex(
      TypeError, "num_updates must be a numeric scalar"
    ):
      snapstore.MovingAverage(store, tau=0.1, num_updates=vector)
    with tf.Graph().as_default():
      other = tf.constant(1)
    with self.assertRaisesRegex(
      snapstore.GraphMismatchError,
      "num_updates Const:0 belongs to another graph",
    ):
      snapstore.MovingAverage(store, tau=0.1, num_updates=other)
    self.assertEqual(store.tags(), [])  # nothing was pinned

  def test_host_store(self):
    store = self._store(mode="host")
    with self.assertRaisesRegex(
      snapstore.ModeError,
      "MovingAverage keeps its average in device.*mode='device'",
    ):
      snapstore.MovingAverage(store, tau=0.1)
    with self.assertRaisesRegex(
      snapstore.ModeError, "RunningMean keeps its average in device shadows"
    ):
      snapstore.RunningMean(store)

  def test_update_is_the_eager_engines(self):
    ema = snapstore.MovingAverage(self._store(), tau=0.1)
    with self.assertRaisesRegex(
      snapstore.ModeError, "update\\(\\) is the eager engine's.*update_op"
    ):
      ema.update()

  def test_slot_taken(self):
    store = self._store(max_to_keep=2)
    snapstore.MovingAverage(store, tau=0.1)
    with self.assertRaisesRegex(ValueError, "Slot 0 holds snapshot 'ema'"):
      snapstore.RunningMean(store, slot=0)
    with self.assertRaisesRegex(ValueError, "slot must be <= 1"):
      snapstore.RunningMean(store, slot=2)


class PinSlotTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode="device", max_to_keep=3, use_resource=False):
    graph = tf.Graph()
    with graph.as_default():
      self.model = helpers.Model(
        use_resource=use_resource, dtypes=(tf.float32,)
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep
      )
      self.refresh = (
        self.store.slots.snapshot_op(0) if mode == "device" else None
      )
    self.sess = tf.Session(graph=graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    return self.store, self.sess

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_pinned_tag_names_what_in_graph_ops_wrote(self, use_resource):
    store, sess = self._setup(use_resource=use_resource)
    self.assertEqual(store.slots.pin(0, "target"), "target")
    self.assertEqual(store.slots.pin(0, "target"), "target")  # idempotent
    self.model.randomize(sess, seed=1)
    sess.run(self.refresh)  # e.g. inside the train step
    refreshed = self.model.values(sess)
    live = self.model.randomize(sess, seed=2)
    store.restore("target", session=sess)
    helpers.assert_state(self.model.values(sess), refreshed)
    self.model.randomize(sess, seed=2)
    self.assertEqual(store.slots.slot_of("target"), 0)
    self.assertEqual(store.slots.pinned(), ["target"])
    helpers.assert_state(self.model.values(sess), live)

  def test_pinned_slots_are_never_evicted(self):
    store, sess = self._setup(max_to_keep=3)
    store.slots.pin(1, "average")
    for _ in range(5):
      store.snapshot(session=sess)
    self.assertEqual(store.tags(), ["average", 3, 4])
    self.assertEqual(store.slots.slot_of("average"), 1)
    self.assertNotIn(1, [store.slots.slot_of(t) for t in (3, 4)])

  def test_every_slot_pinned(self):
    store, sess = self._setup(max_to_keep=2)
    store.slots.pin(0, "a")
    store.slots.pin(1, "b")
    with self.assertRaisesRegex(
      snapstore.PinnedTagError,
      r"every slot of the store is pinned \('a', 'b'\)",
    ):
      store.snapshot(session=sess)
    self.assertEqual(store.tags(), ["a", "b"])
    self.model.randomize(sess, seed=3)
    store.snapshot("a", session=sess)  # overwriting a pinned slot is allowed
    self.model.randomize(sess, seed=4)
    store.restore("a", session=sess)
    self.model.randomize(sess, seed=3)

  def test_pinned_tag_cannot_be_deleted(self):
    store, _ = self._setup()
    store.slots.pin(2, "slow")
    with self.assertRaisesRegex(
      snapstore.PinnedTagError, "Snapshot 'slow' is pinned to device slot 2"
    ):
      store.delete("slow")
    self.assertEqual(store.tags(), ["slow"])

  def test_bad_pins(self):
    store, sess = self._setup()
    store.snapshot("held", session=sess)
    with self.assertRaisesRegex(ValueError, "Slot 0 holds snapshot 'held'"):
      store.slots.pin(0, "x")
    with self.assertRaisesRegex(
      ValueError, "Tag 'held' is held in slot 0, not slot 1"
    ):
      store.slots.pin(1, "held")
    with self.assertRaisesRegex(ValueError, "slot must be <= 2"):
      store.slots.pin(3, "x")
    with self.assertRaisesRegex(TypeError, r"pin\(\) needs a tag"):
      store.slots.pin(1, None)
    self.assertEqual(store.slots.pin(0, "held"), "held")  # pins it in place
    host, _ = self._setup(mode="host")
    with self.assertRaisesRegex(
      snapstore.ModeError, r"store\.slots: this store uses mode 'host'"
    ):
      host.slots.pin(0, "x")


if __name__ == "__main__":
  tf.test.main()
