"""store.slots.snapshot_before(): a snapshot in the train step's own run, before the update."""
from unittest import mock

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th

KINDS = helpers.kind_cases()
C = th.Linear.C


class SnapshotBeforeTest(tf.test.TestCase, parameterized.TestCase):

  def _linear(self, use_resource, **store_kwargs):
    self.graph = tf.Graph()
    with self.graph.as_default():
      model = th.Linear(use_resource)
      store = model.store(**store_kwargs)
      train_op = store.slots.snapshot_before(model.apply)
    sess = th.session(self, self.graph)
    return model, store, train_op, sess

  @parameterized.named_parameters(*KINDS)
  def test_the_slot_holds_the_state_each_step_started_from(self, use_resource):
    model, store, train_op, sess = self._linear(use_resource)
    expected = th.momentum_steps(4)
    shadows = list(store.slots.shadows(0).values())
    variables = list(store.variables.values())
    with helpers.assert_no_new_ops(self.graph):
      for before, after in zip(expected, expected[1:]):
        sess.run(train_op)
        state = dict(zip(store.keys, sess.run(variables)))
        slot = dict(zip(store.keys, sess.run(shadows)))
        # Had the copy run after the update, the slot would hold `after`.
        self.assertAllEqual(slot["lin/w"], before[0])
        self.assertAllEqual(slot["lin/w/Momentum"], before[1])
        self.assertEqual(slot["global_step"], before[2])
        self.assertAllEqual(state["lin/w"], after[0])
        self.assertAllEqual(state["lin/w/Momentum"], after[1])
        self.assertEqual(state["global_step"], after[2])
    self.assertEqual(store.tags(), ["before_step"])
    self.assertEqual(store.slots.pinned(), ["before_step"])
    self.assertEqual(store.slots.in_step_ops("before_step"), [train_op])
    self.assertEqual(store.slots.in_step_ops("other"), [])

  @parameterized.named_parameters(*KINDS)
  def test_restore_undoes_an_adam_step_bit_for_bit(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression(use_resource=use_resource,
                            optimizer_fn=tf.train.AdamOptimizer)
      store = model.store(mode="device", max_to_keep=2)
      grads = model.optimizer.compute_gradients(model.loss)
      train_op = store.slots.snapshot_before(
          lambda: model.optimizer.apply_gradients(grads, global_step=model.step),
          slot=1, tag="pre")
    sess = th.session(self, graph)
    feeds = model.feeds(0, 4)
    th.run_steps(sess, train_op, feeds[:3])
    start = th.state(store, sess)
    self.assertIn("beta1_power", start)
    sess.run(train_op, feeds[3])
    after = th.state(store, sess)
    helpers.assert_state_differs(after, start)
    with helpers.assert_no_new_ops(graph):
      self.assertEqual(store.restore("pre", session=sess), "pre")
    helpers.assert_state(th.state(store, sess), start, "restored")
    sess.run(train_op, feeds[3])  # the same step again: the same parameters
    helpers.assert_state(th.state(store, sess), after, "replayed")

  @parameterized.named_parameters(*KINDS)
  def test_it_replaces_the_update_in_train_op_collection(self, use_resource):
    _, _, train_op, _ = self._linear(use_resource)
    self.assertEqual(self.graph.get_collection(tf.GraphKeys.TRAIN_OP), [train_op])

  def test_a_guard_with_the_tag_takes_its_snapshot_in_the_step(self):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression(optimizer_fn=tf.train.AdamOptimizer)
      store = model.store(mode="device", max_to_keep=1)
      grads = model.optimizer.compute_gradients(model.loss)
      train_op = store.slots.snapshot_before(
          lambda: model.optimizer.apply_gradients(grads, global_step=model.step),
          tag="guard")
    sess = th.session(self, graph)
    feeds = model.feeds(0, 3)
    th.run_steps(sess, train_op, feeds[:2])
    start = th.state(store, sess)
    with mock.patch.object(store, "snapshot", wraps=store.snapshot) as snapshot:
      with snapstore.Guard(store, watch=model.loss, reraise=False, session=sess) as guard:
        guard.run(train_op, model.with_lr(feeds[2], 1e30))
        guard.run(model.loss, feeds[2])  # not finite: roll back
      self.assertEqual(snapshot.call_count, 0)
    self.assertTrue(guard.failed)
    helpers.assert_state(th.state(store, sess), start, "rolled back")
    # A block whose first run is not the train op snapshots as before.
    with mock.patch.object(store, "snapshot", wraps=store.snapshot) as snapshot:
      with snapstore.Guard(store, watch=model.loss, session=sess) as guard:
        guard.run(model.loss, feeds[2])
        guard.run(model.loss, feeds[2])
      self.assertEqual(snapshot.call_count, 1)

  def test_a_retried_guard_takes_each_attempts_snapshot_in_the_step(self):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression(use_resource=True)
      grads = model.optimizer.compute_gradients(model.loss)
      store = model.store(mode="device", max_to_keep=1)
      train_op = store.slots.snapshot_before(
          lambda: model.optimizer.apply_gradients(grads, global_step=model.step),
          tag="guard")
    sess = th.session(self, graph)
    feed = model.feeds(0, 1)[0]
    sess.run(train_op, feed)
    start = th.state(store, sess)
    with mock.patch.object(store, "snapshot", wraps=store.snapshot) as snapshot:
      for attempt in snapstore.Guard(store, watch=model.loss, retries=1, session=sess):
        with attempt:
          attempt.run(train_op, model.with_lr(feed, 1e30 if attempt.number == 0
                                              else 0.01))
          attempt.run(model.loss, feed)
      self.assertEqual(snapshot.call_count, 0)
    self.assertEqual(attempt.number, 1)
    after = th.state(store, sess)
    store.restore("guard", session=sess)
    helpers.assert_state(th.state(store, sess), start, "the second attempt's start")
    sess.run(train_op, feed)
    helpers.assert_state(th.state(store, sess), after, "one good step")

  def test_a_guard_refuses_a_second_in_step_snapshot_in_one_block(self):
    model, store, train_op, sess = self._linear(False, max_to_keep=1)
    with snapstore.Guard(store, tag="before_step", reraise=False, session=sess) as guard:
      guard.run(train_op)
      after_one = th.state(store, sess)
      with helpers.assert_raises_naming(self, ValueError, "second run",
                                        "before_step", "once per guarded block"):
        guard.run(train_op)
    self.assertFalse(guard.failed)
    helpers.assert_state(th.state(store, sess), after_one, "not run twice")
    del model

  # -- what is refused -------------------------------------------------------------

  def test_an_already_built_train_op_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      built = model.apply()
      with helpers.assert_raises_naming(self, TypeError, "already built",
                                        built.name, "lambda"):
        store.slots.snapshot_before(built)
      self.assertEqual(store.tags(), [])

  def test_a_function_returning_a_built_train_op_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      built = model.apply()
      with helpers.assert_raises_naming(self, ValueError, "does not wait",
                                        "lin/w", "inside the update function"):
        store.slots.snapshot_before(lambda: built)
      self.assertEqual(store.slots.pinned(), [])

  @parameterized.named_parameters(*KINDS)
  def test_an_update_op_built_before_is_refused(self, use_resource):
    with tf.Graph().as_default():
      model = th.Linear(use_resource)
      with tf.variable_scope("bn", use_resource=use_resource):
        moving = tf.get_variable("moving_mean", initializer=np.float32(0.0),
                                 trainable=False)
      update_moving = tf.assign_add(moving, 1.0) if not use_resource else (
          moving.assign_add(1.0))
      store = snapstore.SnapshotStore(var_list=[model.w, moving], mode="device")

      def apply():
        with tf.control_dependencies([update_moving]):
          return model.apply()

      with helpers.assert_raises_naming(self, ValueError, "does not wait",
                                        "bn/moving_mean", "UPDATE_OPS"):
        store.slots.snapshot_before(apply)

  def test_writes_of_variables_the_store_does_not_cover_are_not_ordered(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      counter = tf.Variable(0, name="counter")
      count = tf.assign_add(counter, 1)
      store = snapstore.SnapshotStore(var_list=[model.w], mode="device")

      def apply():
        with tf.control_dependencies([count]):
          return model.apply()

      self.assertIsInstance(store.slots.snapshot_before(apply), tf.Operation)

  def test_host_mode_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = snapstore.SnapshotStore(var_list=[model.w], mode="host")
      with helpers.assert_raises_naming(self, snapstore.ModeError,
                                        "snapshot_before", "mode='device'"):
        store.slots.snapshot_before(model.apply)

  def test_a_slot_holding_another_snapshot_is_refused(self):
    model, store, _, sess = self._linear(False, max_to_keep=2)
    store.snapshot("mine", session=sess)
    with self.graph.as_default():
      with helpers.assert_raises_naming(self, ValueError, "Slot 1 holds",
                                        "'mine'"):
        store.slots.snapshot_before(model.apply, slot=1, tag="other")

  def test_a_function_returning_nothing_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      with helpers.assert_raises_naming(self, ValueError, "returned None"):
        store.slots.snapshot_before(lambda: None)

  def test_a_non_function_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      with helpers.assert_raises_naming(self, TypeError, "function of no "
                                        "arguments"):
        store.slots.snapshot_before(3)

  def test_a_bad_slot_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      with helpers.assert_raises_naming(self, ValueError, "slot"):
        store.slots.snapshot_before(model.apply, slot=1)


class SnapshotIfFiniteTest(tf.test.TestCase, parameterized.TestCase):
  """snapshot_before(if_finite=loss): the copy runs only on a finite loss."""

  def _linear(self, use_resource):
    self.graph = tf.Graph()
    with self.graph.as_default():
      model = th.Linear(use_resource)
      store = model.store()
      train_op = store.slots.snapshot_before(model.apply, if_finite=model.loss)
    sess = th.session(self, self.graph)
    return model, store, train_op, sess

  def _slot(self, store, sess):
    return dict(zip(store.keys, sess.run(list(store.slots.shadows(0).values()))))

  @parameterized.named_parameters(*KINDS)
  def test_a_non_finite_loss_leaves_the_slot_and_a_finite_one_writes_it(
      self, use_resource):
    model, store, train_op, sess = self._linear(use_resource)
    s0 = th.momentum_steps(0)[0]
    s1 = th.momentum_step(s0)
    s2 = th.momentum_step(s1)

    def step(scale, start):
      # The loss fetched next to the train op is computed before the update.
      _, loss = sess.run([train_op, model.loss], {model.scale: scale})
      self.assertAllClose(loss, np.sum(C * start[0]) * np.float32(scale))

    with helpers.assert_no_new_ops(self.graph):
      step(1.0, s0)
      helpers.assert_state(self._slot(store, sess), th.linear_state(s0), "finite")
      helpers.assert_state(th.state(store, sess), th.linear_state(s1))
      step(1.0, s1)
      helpers.assert_state(self._slot(store, sess), th.linear_state(s1), "finite")
      helpers.assert_state(th.state(store, sess), th.linear_state(s2))
      # Not finite: the slot keeps s1 and the update still runs (NaN in).
      step(np.nan, s2)
      helpers.assert_state(self._slot(store, sess), th.linear_state(s1), "NaN loss")
      after_nan = th.state(store, sess)
      self.assertTrue(np.all(np.isnan(after_nan["lin/w"])))
      self.assertTrue(np.all(np.isnan(after_nan["lin/w/Momentum"])))
      self.assertEqual(after_nan["global_step"], 3)
      self.assertEqual(store.restore("before_step", session=sess), "before_step")
      helpers.assert_state(th.state(store, sess), th.linear_state(s1), "restored")
      # An infinite loss: skipped too; the update writes infinities.
      step(np.inf, s1)
      helpers.assert_state(self._slot(store, sess), th.linear_state(s1), "inf loss")
      helpers.assert_state(th.state(store, sess),
                           th.linear_state(th.momentum_step(s1, np.inf)))
      store.restore("before_step", session=sess)
      step(1.0, s1)  # the same step again: the same parameters
      helpers.assert_state(self._slot(store, sess), th.linear_state(s1), "replayed")
      helpers.assert_state(th.state(store, sess), th.linear_state(s2), "replayed")

  @parameterized.named_parameters(*KINDS)
  def test_the_store_records_which_copy_is_conditional(self, use_resource):
    model, store, train_op, _ = self._linear(use_resource)
    with self.graph.as_default():
      plain = store.slots.snapshot_before(model.apply, slot=0, tag="before_step",
                                    name="plain")
    self.assertEqual(store.slots.in_step_ops("before_step"), [train_op, plain])
    self.assertIs(store.slots.in_step_condition(train_op), model.loss)
    self.assertIsNone(store.slots.in_step_condition(plain))
    with helpers.assert_raises_naming(self, ValueError, model.loss.op.name,
                                      "not a train op built by this store",
                                      "plain, snapshot_before"):
      store.slots.in_step_condition(model.loss.op)

  def test_a_guard_refuses_a_tag_whose_copy_is_conditional(self):
    model, store, train_op, sess = self._linear(False)
    with helpers.assert_raises_naming(self, ValueError, "'before_step'",
                                      "only when its loss is finite",
                                      "another tag", "in_step="):
      with snapstore.Guard(store, tag="before_step", session=sess):
        sess.run(train_op)
    del model

  # -- what is refused -------------------------------------------------------------

  def _refused(self, error, fragments, loss_fn):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      with helpers.assert_raises_naming(self, error, *fragments):
        store.slots.snapshot_before(model.apply, if_finite=loss_fn(model))
      self.assertEqual(store.slots.pinned(), [])

  def test_if_finite_must_be_a_tensor(self):
    self._refused(TypeError, ["if_finite takes a float tensor", "'lin/w:0'"],
                  lambda model: model.w)

  def test_if_finite_must_be_a_float_tensor(self):
    self._refused(TypeError, ["if_finite .* has dtype int64",
                              "Pass the \\(float\\) loss"],
                  lambda model: tf.identity(model.step))

  def test_if_finite_must_be_of_the_stores_graph(self):
    with tf.Graph().as_default():
      other = tf.constant(1.0, name="other")
    self._refused(snapstore.GraphMismatchError,
                  ["if_finite other:0 belongs to another graph",
                   "loss of the model the store covers"], lambda model: other)

  def test_if_finite_must_not_be_inside_a_cond(self):
    inside = []

    def branch(model):
      inside.append(model.loss * 2.0)
      return inside[-1]

    def loss_in_cond(model):
      tf.cond(model.scale > 0, lambda: branch(model), lambda: model.loss)
      return inside[0]

    self._refused(ValueError, ["inside a tf.cond or tf.while_loop",
                               "computed outside"], loss_in_cond)

  def test_a_loss_that_writes_a_variable_of_the_store_is_refused(self):
    def writing_loss(model):
      with tf.control_dependencies([tf.assign_add(model.w, C)]):
        return tf.identity(model.loss)

    self._refused(ValueError, ["'AssignAdd' .* writes lin/w",
                               "does not wait for the snapshot"], writing_loss)


class CreateSlotsTest(tf.test.TestCase):

  def test_it_makes_adams_state_that_apply_gradients_then_uses(self):
    with tf.Graph().as_default():
      w = tf.Variable([1.0, 2.0], name="w")
      opt = tf.train.AdamOptimizer(0.1)
      made = snapstore.create_slots(opt, [w])
      self.assertCountEqual([v.op.name for v in made],
                            ["w/Adam", "w/Adam_1", "beta1_power", "beta2_power"])
      opt.minimize(tf.reduce_sum(w))
      self.assertCountEqual(opt.variables(), made)

  def test_a_keras_or_other_optimizer_is_refused(self):
    with tf.Graph().as_default():
      w = tf.Variable([1.0], name="w")
      with helpers.assert_raises_naming(self, TypeError, "tf.train.Optimizer"):
        snapstore.create_slots(object(), [w])

  def test_no_variables_are_refused(self):
    with helpers.assert_raises_naming(self, ValueError, "got none"):
      snapstore.create_slots(tf.train.AdamOptimizer(0.1), [])

  def test_a_non_variable_is_refused(self):
    with tf.Graph().as_default():
      with helpers.assert_raises_naming(self, TypeError, "takes variables"):
        snapstore.create_slots(tf.train.AdamOptimizer(0.1), [tf.constant(1.0)])


if __name__ == "__main__":
  tf.test.main()
