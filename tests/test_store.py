"""SnapshotStore behaviour, for every copy mode and both variable kinds."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore import _tf
from snapstore._tf import tf
from tests import helpers

CASES = helpers.mode_and_kind_cases()


class SnapshotRestoreTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode, use_resource, max_to_keep=None, **kwargs):
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(use_resource=use_resource)
      store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep, **kwargs
      )
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    with graph.as_default():
      helpers.init(sess)
    return model, store, sess

  @parameterized.named_parameters(*CASES)
  def test_restore_is_bit_exact(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    saved = model.randomize(sess, seed=1)
    tag = store.snapshot(session=sess)
    sess.run(model.train_op)
    helpers.assert_state_differs(model.values(sess), saved)
    self.assertEqual(store.restore(tag, session=sess), tag)
    helpers.assert_state(model.values(sess), saved)

  @parameterized.named_parameters(*CASES)
  def test_restore_defaults_to_newest_and_keeps_snapshot(
    self, mode, use_resource
  ):
    model, store, sess = self._setup(mode, use_resource, max_to_keep=3)
    model.randomize(sess, seed=1)
    store.snapshot(session=sess)
    newest = model.randomize(sess, seed=2)
    store.snapshot(session=sess)
    for _ in range(2):  # restoring twice: the snapshot stays
      sess.run(model.train_op)
      store.restore(session=sess)
      helpers.assert_state(model.values(sess), newest)

  @parameterized.named_parameters(*CASES)
  def test_named_tags_restore_their_own_state(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource, max_to_keep=3)
    states = {}
    for seed, tag in enumerate(["a", "b", 7]):
      states[tag] = model.randomize(sess, seed=seed)
      self.assertEqual(store.snapshot(tag, session=sess), tag)
    for tag in [7, "a", "b", "a"]:
      sess.run(model.train_op)
      store.restore(tag, session=sess)
      helpers.assert_state(model.values(sess), states[tag], "tag %r" % tag)

  @parameterized.named_parameters(*CASES)
  def test_eviction_drops_oldest(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource, max_to_keep=2)
    states = []
    for seed in range(4):
      states.append(model.randomize(sess, seed=seed))
      store.snapshot(session=sess)
    self.assertEqual(store.tags(), [2, 3])
    store.restore(2, session=sess)
    helpers.assert_state(model.values(sess), states[2])
    with self.assertRaisesRegex(
      snapstore.UnknownTagError, r"No snapshot tagged 0.*2, 3"
    ):
      store.restore(0, session=sess)

  @parameterized.named_parameters(*CASES)
  def test_same_tag_replaces_and_becomes_newest(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource, max_to_keep=2)
    store.snapshot("x", session=sess)
    store.snapshot("y", session=sess)
    replaced = model.randomize(sess, seed=5)
    store.snapshot("x", session=sess)
    self.assertEqual(store.tags(), ["y", "x"])
    sess.run(model.train_op)
    store.restore("x", session=sess)
    helpers.assert_state(model.values(sess), replaced)
    store.snapshot("z", session=sess)  # full: evicts "y", the oldest
    self.assertEqual(store.tags(), ["x", "z"])

  @parameterized.named_parameters(*CASES)
  def test_auto_tags_increase_past_deleted_and_given_ints(
    self, mode, use_resource
  ):
    _, store, sess = self._setup(mode, use_resource, max_to_keep=5)
    self.assertEqual(store.snapshot(session=sess), 0)
    self.assertEqual(store.snapshot(session=sess), 1)
    store.delete(1)
    self.assertEqual(store.snapshot(session=sess), 2)
    self.assertEqual(store.snapshot(10, session=sess), 10)
    self.assertEqual(store.snapshot("s", session=sess), "s")
    self.assertEqual(store.snapshot(session=sess), 11)
    self.assertEqual(store.tags(), [0, 2, 10, "s", 11])
    self.assertEqual(len(store), 5)
    self.assertIn("s", store)

  @parameterized.named_parameters(*CASES)
  def test_delete(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource, max_to_keep=2)
    store.snapshot("a", session=sess)
    b_state = model.randomize(sess, seed=3)
    store.snapshot("b", session=sess)
    store.delete("a")
    self.assertEqual(store.tags(), ["b"])
    store.snapshot("c", session=sess)  # reuses the freed room, keeps "b"
    self.assertEqual(store.tags(), ["b", "c"])
    store.restore("b", session=sess)
    helpers.assert_state(model.values(sess), b_state)
    with self.assertRaisesRegex(
      snapstore.UnknownTagError, r"No snapshot tagged 'a'.*'b', 'c'"
    ):
      store.delete("a")

  @parameterized.named_parameters(*CASES)
  def test_info_records_time(self, mode, use_resource):
    _, store, sess = self._setup(mode, use_resource)
    import time  # pylint: disable=g-import-not-at-top

    before = time.time()
    tag = store.snapshot(session=sess)
    info = store.info()
    self.assertEqual(info.tag, tag)
    self.assertBetween(info.time, before, time.time())

  @parameterized.named_parameters(*CASES)
  def test_default_session(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    saved = model.randomize(sess, seed=1)
    with sess.as_default():
      store.snapshot()
      sess.run(model.train_op)
      store.restore()
    helpers.assert_state(model.values(sess), saved)

  @parameterized.named_parameters(*CASES)
  def test_covers_optimizer_state_and_global_step(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.constant(np.random.RandomState(0).randn(8, 3).astype(np.float32))
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3, 1])
      loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
      step = tf.train.get_or_create_global_step()
      opt = tf.train.AdamOptimizer(0.1)
      train = opt.minimize(loss, global_step=step)
      store = snapstore.SnapshotStore(
        scope="net", mode=mode, optimizer=opt, include_global_step=True
      )
    self.assertEqual(
      store.keys,
      # the scope's, its slots, the optimizer's own, the step: in that order
      ("w", "w/Adam", "w/Adam_1", "beta1_power", "beta2_power", "global_step"),
    )
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      sess.run(train)
      store.snapshot(session=sess)
      tracked = [w, opt.get_slot(w, "m"), opt.get_slot(w, "v"), step] + list(
        opt._get_beta_accumulators()
      )  # pylint: disable=protected-access
      after_k = []
      for _ in range(3):
        sess.run(train)
      after_k = sess.run(tracked)
      store.restore(session=sess)
      for _ in range(3):
        sess.run(train)
      # Exact rollback: the same k steps again give bit-identical parameters.
      for a, b in zip(sess.run(tracked), after_k):
        helpers.assert_bit_equal(a, b)
      self.assertEqual(sess.run(step), 4)

  def _wrapper_rollback(
    self, mode, use_resource, wrap, own=("current_loss_scale", "good_steps")
  ):
    """A rollback over a wrapper's steps, one with NaN gradients; `own`: the
    wrapper's own state the store must hold."""
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [8, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3, 1])
      loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
      step = tf.train.get_or_create_global_step()
      opt = wrap()
      grads = tf.gradients(loss, [w])  # (Keras: no minimize of a tensor)
      if hasattr(opt, "get_scaled_loss"):  # Keras's wrapper scales by hand
        grads = opt.get_unscaled_gradients(
          tf.gradients(opt.get_scaled_loss(loss), [w])
        )
      elif hasattr(opt, "compute_gradients"):
        grads = [g for g, _ in opt.compute_gradients(loss, [w])]
      if hasattr(opt, "get_scaled_loss"):  # Keras: no global step
        train = tf.group(
          opt.apply_gradients(list(zip(grads, [w]))), step.assign_add(1)
        )
      else:
        train = opt.apply_gradients(list(zip(grads, [w])), global_step=step)
      store = snapstore.SnapshotStore(
        scope="net", mode=mode, optimizer=opt, include_global_step=True
      )
      # Keras's hyperparameters: left out, as the store leaves them
      hyper = ("beta_1", "beta_2", "decay", "learning_rate")
      # DropStaleGradientOptimizer's count of dropped gradients (for its
      # summary): a variable made inside apply_gradients and kept nowhere.
      hyper += ("stale_counter",)
      state = dict(
        (v.op.name, v)
        for v in tf.global_variables()
        if v.op.name.split("/")[-1] not in hyper
      )
    for key in own:
      self.assertIn(key, store.keys)
    covered = set(id(v) for v in store.variables.values())
    self.assertEqual([n for n, v in state.items() if id(v) not in covered], [])
    good = np.random.RandomState(0).randn(8, 3).astype(np.float32)
    bad = np.full_like(good, np.nan)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      sess.run(train, {x: good})
      store.snapshot(session=sess)
      saved = sess.run(state)
      for data in (bad, good, good):  # the bad step halves the loss scale
        sess.run(train, {x: data})
      after_k = sess.run(state)
      helpers.assert_state_differs(after_k, saved)
      store.restore(session=sess)
      helpers.assert_state(sess.run(state), saved)
      for data in (bad, good, good):
        sess.run(train, {x: data})
      helpers.assert_state(sess.run(state), after_k)

  @parameterized.named_parameters(*CASES)
  def test_covers_a_mixed_precision_optimizers_loss_scale(
    self, mode, use_resource
  ):
    # What enable_mixed_precision_graph_rewrite makes; TF 1.15's wrapper has
    # no variables() of its own (the store refused it as "no variables yet").
    self._wrapper_rollback(
      mode,
      use_resource,
      lambda: tf.train.experimental.MixedPrecisionLossScaleOptimizer(
        tf.train.AdamOptimizer(0.1), "dynamic"
      ),
    )

  @parameterized.named_parameters(*CASES)
  def test_covers_a_keras_loss_scale_optimizer_in_graph_mode(
    self, mode, use_resource
  ):
    if _tf.VERSION[0] >= 2:
      self.skipTest(
        "Keras's LossScaleOptimizer runs in graph mode on TF 1.15 only (on "
        "TF 2.x its apply_gradients fails there)"
      )
    if not use_resource:
      self.skipTest("Keras optimizers make no slots for ref variables")
    # TF 1.15's raises an AttributeError from variables().
    self._wrapper_rollback(
      mode,
      use_resource,
      lambda: tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        tf.keras.optimizers.Adam(0.1), "dynamic"
      ),
    )

  @parameterized.named_parameters(*CASES)
  def test_a_stateless_optimizer_adds_nothing(self, mode, use_resource):
    # It was refused: "Optimizer GradientDescent has no variables yet".
    for make in (
      lambda: tf.train.GradientDescentOptimizer(0.1),
      lambda: tf.train.ProximalGradientDescentOptimizer(0.1, 0.01),
    ):
      self._wrapper_rollback(mode, use_resource, make, own=())

  @parameterized.named_parameters(*CASES)
  def test_covers_tf_contrib_optimizer_wrappers(self, mode, use_resource):
    if _tf.VERSION[0] >= 2:
      self.skipTest("tf.contrib is TF 1.x's")
    # Each was refused ("no variables yet") or crashed in TensorFlow
    # (AttributeError: '_non_slot_dict'); passing the wrapped optimizer
    # instead left the loss scale and its counts out of the rollback.
    import tensorflow  # pylint: disable=g-import-not-at-top

    contrib = tensorflow.contrib  # (not in compat.v1)
    for wrap, own in (
      (
        lambda opt: contrib.mixed_precision.LossScaleOptimizer(
          opt,
          contrib.mixed_precision.ExponentialUpdateLossScaleManager(
            128.0, 2, decr_every_n_nan_or_inf=1
          ),
        ),
        ("loss_scale", "good_steps", "bad_steps"),
      ),
      (
        lambda opt: contrib.mixed_precision.LossScaleOptimizer(
          opt, contrib.mixed_precision.FixedLossScaleManager(128.0)
        ),
        (),
      ),
      (lambda opt: contrib.opt.DropStaleGradientOptimizer(opt, 5), ()),
      (
        lambda opt: contrib.opt.MovingAverageOptimizer(opt, 0.5),
        ("w/ExponentialMovingAverage",),
      ),
    ):
      self._wrapper_rollback(
        mode,
        use_resource,
        lambda: wrap(tf.train.AdamOptimizer(0.1)),
        own=own + ("w/Adam", "w/Adam_1"),
      )

  @parameterized.named_parameters(*CASES)
  def test_keys_line_up_across_scopes(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      online = helpers.Model(scope="online", use_resource=use_resource)
      target = helpers.Model(scope="target", use_resource=use_resource)
      online_store = snapstore.SnapshotStore(scope="online", mode=mode)
      target_store = snapstore.SnapshotStore(scope="target", mode=mode)
    self.assertEqual(online_store.keys, target_store.keys)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      online.randomize(sess, seed=4)
      online_store.snapshot(session=sess)
      target_store.load_arrays(online_store.arrays(session=sess), session=sess)
      target_store.restore(session=sess)
      helpers.assert_state(target.values(sess), online.values(sess))

  @parameterized.named_parameters(*CASES)
  def test_npz_round_trip_into_another_graph(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    saved = model.randomize(sess, seed=9)
    store.snapshot(session=sess)
    path = self.get_temp_dir() + "/snap.npz"
    store.files.save_npz(path, session=sess)
    with np.load(path, allow_pickle=False) as data:
      self.assertCountEqual(data.files, store.keys)
      for key in store.keys:
        helpers.assert_bit_equal(data[key], saved[key])
    other_model, other_store, other_sess = self._setup(mode, use_resource)
    tag = other_store.files.load_npz(path, tag="loaded", session=other_sess)
    self.assertEqual(tag, "loaded")
    helpers.assert_state_differs(other_model.values(other_sess), saved)
    other_store.restore("loaded", session=other_sess)
    helpers.assert_state(other_model.values(other_sess), saved)

  @parameterized.named_parameters(*CASES)
  def test_arrays_are_read_only_copies(self, mode, use_resource):
    model, store, sess = self._setup(mode, use_resource)
    saved = model.randomize(sess, seed=2)
    store.snapshot(session=sess)
    arrays = store.arrays(session=sess)
    sess.run(model.train_op)
    store.snapshot(session=sess)  # replaces the snapshot
    for key, value in arrays.items():
      helpers.assert_bit_equal(value, saved[key], key)
      self.assertFalse(value.flags.writeable)


class EvaluateWithTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3, 2])
        b = tf.get_variable("b", [2])
      y = tf.matmul(x, w) + b
      train = tf.group(
        tf.assign_add(w, tf.ones_like(w))
        if not use_resource
        else w.assign_add(tf.ones_like(w))
      )
      with tf.control_dependencies(
        [tf.debugging.assert_positive(tf.reduce_sum(x), message="bad x")]
      ):
        check = tf.identity(y)
      store = snapstore.SnapshotStore(scope="net", mode=mode)
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    helpers.init(sess)
    return store, sess, x, w, b, y, train, check

  @parameterized.named_parameters(*CASES)
  def test_past_values_and_current_left_intact(self, mode, use_resource):
    store, sess, x, w, b, y, train, _ = self._setup(mode, use_resource)
    feed = {x: np.arange(6, dtype=np.float32).reshape(2, 3)}
    w0, b0 = sess.run([w, b])
    store.snapshot(session=sess)
    sess.run(train)
    w1, b1 = sess.run([w, b])
    past = store.evaluate_with(y, feed, session=sess)
    # TF's matmul and numpy's sum in different orders: an output near zero
    # (a cancellation) differs by an ulp of its terms, not of itself.
    np.testing.assert_allclose(past, feed[x].dot(w0) + b0, rtol=1e-6, atol=1e-6)
    helpers.assert_bit_equal(sess.run(w), w1)
    helpers.assert_bit_equal(sess.run(b), b1)
    current = store.evaluate_with(y, feed, past=False, session=sess)
    np.testing.assert_allclose(
      current, feed[x].dot(w1) + b1, rtol=1e-6, atol=1e-6
    )

  @parameterized.named_parameters(*CASES)
  def test_current_intact_when_evaluation_raises(self, mode, use_resource):
    store, sess, x, w, b, _, train, check = self._setup(mode, use_resource)
    store.snapshot(session=sess)
    sess.run(train)
    w1, b1 = sess.run([w, b])
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "bad x"):
      store.evaluate_with(
        check, {x: -np.ones([1, 3], np.float32)}, session=sess
      )
    helpers.assert_bit_equal(sess.run(w), w1)
    helpers.assert_bit_equal(sess.run(b), b1)
    with self.assertRaises(ValueError):  # a Python-side error in Session.run
      store.evaluate_with(check, {x: np.ones([1, 4], np.float32)}, session=sess)
    helpers.assert_bit_equal(sess.run(w), w1)

  @parameterized.named_parameters(*CASES)
  def test_training_op_in_fetches_touches_neither_copy(
    self, mode, use_resource
  ):
    store, sess, _, w, _, _, train, _ = self._setup(mode, use_resource)
    w0 = sess.run(w)
    store.snapshot(session=sess)
    sess.run(train)
    w1 = sess.run(w)
    store.evaluate_with(train, session=sess)
    helpers.assert_bit_equal(sess.run(w), w1)
    store.restore(session=sess)
    helpers.assert_bit_equal(sess.run(w), w0)


if __name__ == "__main__":
  tf.test.main()
