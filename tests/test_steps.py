"""store.slots.snapshot_before(): a snapshot in the train step's own run, before the update."""

import contextlib
from unittest import mock
import warnings

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore import _tf
from snapstore._tf import tf
from snapstore.engines.graph import subgraph
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
      model = th.Regression(
        use_resource=use_resource, optimizer_fn=tf.train.AdamOptimizer
      )
      store = model.store(mode="device", max_to_keep=2)
      grads = model.optimizer.compute_gradients(model.loss)
      train_op = store.slots.snapshot_before(
        lambda: model.optimizer.apply_gradients(grads, global_step=model.step),
        slot=1,
        tag="pre",
      )
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
    self.assertEqual(
      self.graph.get_collection(tf.GraphKeys.TRAIN_OP), [train_op]
    )

  def test_a_guard_with_the_tag_takes_its_snapshot_in_the_step(self):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression(optimizer_fn=tf.train.AdamOptimizer)
      store = model.store(mode="device", max_to_keep=1)
      grads = model.optimizer.compute_gradients(model.loss)
      train_op = store.slots.snapshot_before(
        lambda: model.optimizer.apply_gradients(grads, global_step=model.step),
        tag="guard",
      )
    sess = th.session(self, graph)
    feeds = model.feeds(0, 3)
    th.run_steps(sess, train_op, feeds[:2])
    start = th.state(store, sess)
    with mock.patch.object(store, "snapshot", wraps=store.snapshot) as snapshot:
      with snapstore.Guard(
        store, watch=model.loss, reraise=False, session=sess
      ) as guard:
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
        tag="guard",
      )
    sess = th.session(self, graph)
    feed = model.feeds(0, 1)[0]
    sess.run(train_op, feed)
    start = th.state(store, sess)
    with mock.patch.object(store, "snapshot", wraps=store.snapshot) as snapshot:
      for attempt in snapstore.Guard(
        store, watch=model.loss, retries=1, session=sess
      ):
        with attempt:
          attempt.run(
            train_op, model.with_lr(feed, 1e30 if attempt.number == 0 else 0.01)
          )
          attempt.run(model.loss, feed)
      self.assertEqual(snapshot.call_count, 0)
    self.assertEqual(attempt.number, 1)
    after = th.state(store, sess)
    store.restore("guard", session=sess)
    helpers.assert_state(
      th.state(store, sess), start, "the second attempt's start"
    )
    sess.run(train_op, feed)
    helpers.assert_state(th.state(store, sess), after, "one good step")

  def test_a_guard_refuses_a_second_in_step_snapshot_in_one_block(self):
    model, store, train_op, sess = self._linear(False, max_to_keep=1)
    with snapstore.Guard(
      store, tag="before_step", reraise=False, session=sess
    ) as guard:
      guard.run(train_op)
      after_one = th.state(store, sess)
      with helpers.assert_raises_naming(
        self, ValueError, "second run", "before_step", "once per guarded block"
      ):
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
      with helpers.assert_raises_naming(
        self, TypeError, "already built", built.name, "lambda"
      ):
        store.slots.snapshot_before(built)
      self.assertEqual(store.tags(), [])

  def test_a_function_returning_a_built_train_op_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      built = model.apply()
      with helpers.assert_raises_naming(
        self, ValueError, "does not wait", "lin/w", "inside the update function"
      ):
        store.slots.snapshot_before(lambda: built)
      self.assertEqual(store.slots.pinned(), [])

  @parameterized.named_parameters(*KINDS)
  def test_an_update_op_built_before_is_refused(self, use_resource):
    with tf.Graph().as_default():
      model = th.Linear(use_resource)
      with tf.variable_scope("bn", use_resource=use_resource):
        moving = tf.get_variable(
          "moving_mean", initializer=np.float32(0.0), trainable=False
        )
      update_moving = (
        tf.assign_add(moving, 1.0)
        if not use_resource
        else (moving.assign_add(1.0))
      )
      store = snapstore.SnapshotStore(var_list=[model.w, moving], mode="device")

      def apply():
        with tf.control_dependencies([update_moving]):
          return model.apply()

      with helpers.assert_raises_naming(
        self, ValueError, "does not wait", "bn/moving_mean", "UPDATE_OPS"
      ):
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
      with helpers.assert_raises_naming(
        self, snapstore.ModeError, "snapshot_before", "mode='device'"
      ):
        store.slots.snapshot_before(model.apply)

  def test_a_slot_holding_another_snapshot_is_refused(self):
    model, store, _, sess = self._linear(False, max_to_keep=2)
    store.snapshot("mine", session=sess)
    with self.graph.as_default():
      with helpers.assert_raises_naming(
        self, ValueError, "Slot 1 holds", "'mine'"
      ):
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
      with helpers.assert_raises_naming(
        self, TypeError, "function of no arguments"
      ):
        store.slots.snapshot_before(3)

  def test_a_bad_slot_is_refused(self):
    with tf.Graph().as_default():
      model = th.Linear(False)
      store = model.store()
      with helpers.assert_raises_naming(self, ValueError, "slot"):
        store.slots.snapshot_before(model.apply, slot=1)


class InStepCountTest(tf.test.TestCase, parameterized.TestCase):
  """The count of copies a guard on the in-step tag compares (`Guard`)."""

  def _linear(self, use_resource, local_init=True):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Linear(use_resource)
      store = model.store()
      train_op = store.slots.snapshot_before(model.apply)
      # A step of the user's own that waits for the train op.
      ran = tf.Variable(np.int64(0), trainable=False, name="ran")
      with tf.control_dependencies([train_op]):
        chained = tf.assign_add(ran, np.int64(1)).op
    if local_init:
      sess = th.session(self, graph)
    else:
      sess = tf.Session(graph=graph)
      self.addCleanup(sess.close)
      with graph.as_default():
        sess.run(tf.global_variables_initializer())  # not the local one
    return model, store, train_op, chained, ran, sess

  @parameterized.named_parameters(*KINDS)
  def test_the_step_bumps_the_count_without_reading_it(self, use_resource):
    # The count is in every run of the train op: a read, an add and an
    # assign (with the read's initialized-or-not switch) cost a small model's
    # step measurably more than one in-place add (bench/README.md,
    # "Training-loop overhead").
    _, store, train_op, _, _, _ = self._linear(use_resource)
    (entry,) = store.slots.in_steps("before_step")
    scope = entry.count.op.name.split("/")[0] + "/"
    run = subgraph.backward_ops([train_op])
    types = sorted(op.type for op in run if op.name.startswith(scope))
    self.assertEqual(types.count("AssignAddVariableOp"), 1, types)
    self.assertNotIn("ReadVariableOp", types)
    self.assertNotIn("Merge", types)
    self.assertLessEqual(len(types), 7, types)

  @parameterized.named_parameters(*KINDS)
  def test_without_the_local_initializer_the_step_runs_and_is_counted(
    self, use_resource
  ):
    model, store, train_op, chained, ran, sess = self._linear(
      use_resource, local_init=False
    )
    expected = th.momentum_steps(4)
    shadows = list(store.slots.shadows(0).values())
    for i in range(2):
      sess.run(chained)
      slot = dict(zip(store.keys, sess.run(shadows)))
      self.assertAllEqual(slot["lin/w"], expected[i][0])
      self.assertEqual(slot["global_step"], expected[i][2])
    self.assertEqual(sess.run(ran), 2)  # what waits for the step ran too
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "cannot roll back",
      "'before_step'",
      "ran 2 times outside guard.run",
    ):
      with snapstore.Guard(
        store, tag="before_step", watch=model.loss, reraise=False, session=sess
      ) as guard:
        guard.run(train_op)  # the guard's snapshot, in the step
        sess.run(chained)
        sess.run(train_op)  # the slot now holds this step's start
        guard.run(model.loss, {model.scale: np.nan})
    self.assertEqual(sess.run(ran), 3)

  @parameterized.named_parameters(*KINDS)
  def test_a_guards_first_step_in_a_session_rolls_back_exactly(
    self, use_resource
  ):
    # Without the local initializer, the guard's run is the count's first.
    model, store, train_op, _, _, sess = self._linear(
      use_resource, local_init=False
    )
    entry = th.state(store, sess)
    with snapstore.Guard(
      store, tag="before_step", watch=model.loss, reraise=False, session=sess
    ) as guard:
      guard.run(train_op, {model.scale: 1e30})
      guard.run(model.loss, {model.scale: np.nan})
    self.assertTrue(guard.failed)
    helpers.assert_state(th.state(store, sess), entry, "rolled back")
    # The next block counts from there: runs outside guard.run are seen.
    with helpers.assert_raises_naming(
      self, ValueError, "cannot roll back", "ran 1 time outside guard.run"
    ):
      with snapstore.Guard(
        store, tag="before_step", watch=model.loss, reraise=False, session=sess
      ) as guard:
        guard.run(train_op)
        sess.run(train_op)
        guard.run(model.loss, {model.scale: np.nan})


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
    return dict(
      zip(store.keys, sess.run(list(store.slots.shadows(0).values())))
    )

  @parameterized.named_parameters(*KINDS)
  def test_a_non_finite_loss_leaves_the_slot_and_a_finite_one_writes_it(
    self, use_resource
  ):
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
      helpers.assert_state(
        self._slot(store, sess), th.linear_state(s0), "finite"
      )
      helpers.assert_state(th.state(store, sess), th.linear_state(s1))
      step(1.0, s1)
      helpers.assert_state(
        self._slot(store, sess), th.linear_state(s1), "finite"
      )
      helpers.assert_state(th.state(store, sess), th.linear_state(s2))
      # Not finite: the slot keeps s1 and the update still runs (NaN in).
      step(np.nan, s2)
      helpers.assert_state(
        self._slot(store, sess), th.linear_state(s1), "NaN loss"
      )
      after_nan = th.state(store, sess)
      self.assertTrue(np.all(np.isnan(after_nan["lin/w"])))
      self.assertTrue(np.all(np.isnan(after_nan["lin/w/Momentum"])))
      self.assertEqual(after_nan["global_step"], 3)
      self.assertEqual(
        store.restore("before_step", session=sess), "before_step"
      )
      helpers.assert_state(
        th.state(store, sess), th.linear_state(s1), "restored"
      )
      # An infinite loss: skipped too; the update writes infinities.
      step(np.inf, s1)
      helpers.assert_state(
        self._slot(store, sess), th.linear_state(s1), "inf loss"
      )
      helpers.assert_state(
        th.state(store, sess), th.linear_state(th.momentum_step(s1, np.inf))
      )
      store.restore("before_step", session=sess)
      step(1.0, s1)  # the same step again: the same parameters
      helpers.assert_state(
        self._slot(store, sess), th.linear_state(s1), "replayed"
      )
      helpers.assert_state(
        th.state(store, sess), th.linear_state(s2), "replayed"
      )

  @parameterized.named_parameters(*KINDS)
  def test_the_store_records_which_copy_is_conditional(self, use_resource):
    model, store, train_op, _ = self._linear(use_resource)
    with self.graph.as_default():
      plain = store.slots.snapshot_before(
        model.apply, slot=0, tag="before_step", name="plain"
      )
    self.assertEqual(store.slots.in_step_ops("before_step"), [train_op, plain])
    self.assertIs(store.slots.in_step_condition(train_op), model.loss)
    self.assertIsNone(store.slots.in_step_condition(plain))
    with helpers.assert_raises_naming(
      self,
      ValueError,
      model.loss.op.name,
      "not a train op built by this store",
      "plain, snapshot_before",
    ):
      store.slots.in_step_condition(model.loss.op)

  def test_a_guard_refuses_a_tag_whose_copy_is_conditional(self):
    model, store, train_op, sess = self._linear(False)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "'before_step'",
      "only when its loss is finite",
      "another tag",
      "in_step_tag=",
    ):
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
    self._refused(
      TypeError,
      ["if_finite takes a float tensor", "'lin/w:0'"],
      lambda model: model.w,
    )

  def test_if_finite_must_be_a_float_tensor(self):
    self._refused(
      TypeError,
      ["if_finite .* has dtype int64", "Pass the \\(float\\) loss"],
      lambda model: tf.identity(model.step),
    )

  def test_if_finite_must_be_of_the_stores_graph(self):
    with tf.Graph().as_default():
      other = tf.constant(1.0, name="other")
    self._refused(
      snapstore.GraphMismatchError,
      [
        "if_finite other:0 belongs to another graph",
        "loss of the model the store covers",
      ],
      lambda model: other,
    )

  def test_if_finite_must_not_be_inside_a_cond(self):
    inside = []

    def branch(model):
      inside.append(model.loss * 2.0)
      return inside[-1]

    def loss_in_cond(model):
      tf.cond(model.scale > 0, lambda: branch(model), lambda: model.loss)
      return inside[0]

    self._refused(
      ValueError,
      ["inside a tf.cond or tf.while_loop", "computed outside"],
      loss_in_cond,
    )

  def test_a_loss_that_writes_a_variable_of_the_store_is_refused(self):
    def writing_loss(model):
      with tf.control_dependencies([tf.assign_add(model.w, C)]):
        return tf.identity(model.loss)

    self._refused(
      ValueError,
      ["'AssignAdd' .* writes lin/w", "does not wait for the snapshot"],
      writing_loss,
    )


@contextlib.contextmanager
def control_flow_v2():
  """v2 control flow in the block (tf.cond builds an If op...), as TF 2.x has it.

  The suite runs with v1 control flow (TF 1.15's default; on TF 2.x importing
  snapstore calls disable_v2_behavior()). TF 1.15 and 2.x both have the toggle.
  """
  was = tf.control_flow_v2_enabled()
  tf.enable_control_flow_v2()
  try:
    yield
  finally:
    if not was:
      tf.disable_control_flow_v2()


ONES = np.ones(4, np.float32)
MOVING = "bn/moving_mean"


def _add(v):
  return tf.assign_add(v, ONES)  # AssignAdd, or AssignAddVariableOp


def _read(v):
  return tf.identity(v.read_value())


# Ops that write a variable, built by TF's own Python API: (name, build, the
# op type for a ref variable, for a resource variable). `build(v, count)`
# writes `v` (float32 [4]) or `count` (int64 scalar).
_PLAIN_WRITERS = (
  ("assign", lambda v, c: tf.assign(v, v + 1.0), "Assign", "AssignVariableOp"),
  ("assign_add", lambda v, c: _add(v), "AssignAdd", "AssignAddVariableOp"),
  (
    "assign_sub",
    lambda v, c: tf.assign_sub(v, ONES),
    "AssignSub",
    "AssignSubVariableOp",
  ),
  (
    "scatter_update",
    lambda v, c: tf.scatter_update(v, [1, 3], [5.0, 6.0]),
    "ScatterUpdate",
    "ResourceScatterUpdate",
  ),
  (
    "scatter_add",
    lambda v, c: tf.scatter_add(v, [0], [1.0]),
    "ScatterAdd",
    "ResourceScatterAdd",
  ),
  (
    "scatter_nd_update",
    lambda v, c: tf.scatter_nd_update(v, [[2]], [7.0]),
    "ScatterNdUpdate",
    "ResourceScatterNdUpdate",
  ),
  (
    "slice_assign",
    lambda v, c: v[1:3].assign([8.0, 9.0]),
    "StridedSliceAssign",
    "ResourceStridedSliceAssign",
  ),
  (
    "apply",
    lambda v, c: tf.train.GradientDescentOptimizer(0.5).apply_gradients(
      [(tf.constant(-ONES), v)]
    ),
    "ApplyGradientDescent",
    "ResourceApplyGradientDescent",
  ),
  (
    "sparse_apply",
    lambda v, c: tf.train.AdagradOptimizer(0.5).apply_gradients(
      [(tf.IndexedSlices(tf.constant([-1.0]), tf.constant([2])), v)]
    ),
    "SparseApplyAdagrad",
    "ResourceSparseApplyAdagrad",
  ),
  (
    "count_up_to",
    lambda v, c: tf.count_up_to(c, 100),
    "CountUpTo",
    "ResourceCountUpTo",
  ),
)


def _plain_writer_cases():
  return [
    (
      "%s_%s" % (name, kind),
      build,
      ref_type if not use_resource else resource_type,
      use_resource,
    )
    for name, build, ref_type, resource_type in _PLAIN_WRITERS
    for kind, use_resource in helpers.VARIABLE_KINDS
  ]


def _write_in_function(v):
  @tf.function
  def write_moving():
    _add(v)
    return tf.constant(0)

  return write_moving()


def _write_in_nested_function(v):
  @tf.function
  def outer():
    return _write_in_function(v) + 1

  return outer()


def _write_in_cond(v):
  return tf.cond(
    tf.placeholder_with_default(True, []),
    lambda: _add(v),
    lambda: _read(v),
    name="bn_cond",
  )


def _write_in_loop(v, write=_add):
  def body(i):
    with tf.control_dependencies([write(v)]):
      return i + 1

  return tf.while_loop(lambda i: i < 1, body, [0], name="bn_loop")


def _write_in_case(v):
  return tf.switch_case(
    tf.placeholder_with_default(0, []),
    [lambda: _add(v), lambda: _read(v)],
    name="bn_case",
  )


def _write_in_cond_in_function(v):
  @tf.function
  def update():
    return _write_in_cond(v)

  return update()


def _write_in_function_in_loop(v):
  return _write_in_loop(v, write=_write_in_function)


def _write_in_loop_in_cond(v):
  return tf.cond(
    tf.placeholder_with_default(True, []),
    lambda: _write_in_loop(v),
    lambda: tf.constant(1),
    name="bn_cond",
  )


_HANDLE = tf.TensorSpec([], tf.resource)


def _on_handle(write):
  """A traced tf.function of a variable's handle, for ops built by hand."""

  @tf.function
  def on_handle(h):
    if write:
      tf.raw_ops.AssignAddVariableOp(resource=h, value=tf.constant(ONES))
    return tf.reduce_sum(
      tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32)
    )

  return on_handle.get_concrete_function(_HANDLE)


def _loop_body(write):
  """A For loop's body (index, handle) -> handle."""

  @tf.function
  def loop_body(i, h):
    del i
    if write:
      tf.raw_ops.AssignAddVariableOp(resource=h, value=tf.constant(ONES))
    else:
      tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32)
    return h

  return loop_body.get_concrete_function(tf.TensorSpec([], tf.int32), _HANDLE)


# Functional ops that tf.cond and tf.function do not build around a write
# (TF picks StatelessIf and PartitionedCall for functions without state; For
# has no tf.* wrapper) but tf.raw_ops does: `build(v, write)`.
_BY_HAND = (
  (
    "stateless_if",
    lambda v, write: tf.raw_ops.StatelessIf(
      cond=tf.constant(True),
      input=[v.handle],
      Tout=[tf.float32],
      then_branch=_on_handle(write),
      else_branch=_on_handle(False),
      name="bn_if",
    )[0],
    "StatelessIf",
  ),
  (
    "partitioned_call",
    lambda v, write: tf.raw_ops.PartitionedCall(
      args=[v.handle], Tout=[tf.float32], f=_on_handle(write), name="bn_call"
    )[0],
    "PartitionedCall",
  ),
  # An op whose inputs snapstore does not map to its function's arguments.
  (
    "for_loop",
    lambda v, write: tf.raw_ops.For(
      start=0,
      limit=1,
      delta=1,
      input=[v.handle],
      body=_loop_body(write),
      name="bn_for",
    )[0],
    "For",
  ),
)


# Writes hidden in a function-call or v2 control-flow op, and what the refusal
# names: the op, the function that writes and the op in it.
_HIDDEN_WRITERS = (
  (
    "cond",
    _write_in_cond,
    [
      r"'bn_cond' \(type If\) writes bn/moving_mean",
      r"function bn_cond_true_\d+",
      r"'AssignAddVariableOp' \(type AssignAddVariableOp\)",
    ],
  ),
  (
    "while_loop",
    _write_in_loop,
    [
      r"'bn_loop' \(type While\) writes bn/moving_mean",
      r"function bn_loop_body_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "switch_case",
    _write_in_case,
    [
      r"'bn_case/indexed_case' \(type Case\) writes bn/moving_mean",
      r"function bn_case_indexed_case_branch0_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "function",
    _write_in_function,
    [
      r"'StatefulPartitionedCall' \(type StatefulPartitionedCall\) writes "
      r"bn/moving_mean",
      r"function __inference_write_moving_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "nested_functions",
    _write_in_nested_function,
    [
      r"\(type StatefulPartitionedCall\) writes bn/moving_mean",
      r"function __inference_outer_\d+",
      r"function __inference_write_moving_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "cond_in_function",
    _write_in_cond_in_function,
    [
      r"\(type StatefulPartitionedCall\) writes bn/moving_mean",
      r"function __inference_update_\d+",
      r"'bn_cond(_\d+)?' \(type If\)",
      r"function bn_cond_true_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "function_in_loop",
    _write_in_function_in_loop,
    [
      r"'bn_loop' \(type While\) writes bn/moving_mean",
      r"function bn_loop_body_\d+",
      r"\(type StatefulPartitionedCall\)",
      r"function __inference_write_moving_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
  (
    "loop_in_cond",
    _write_in_loop_in_cond,
    [
      r"'bn_cond' \(type If\) writes bn/moving_mean",
      r"function bn_cond_true_\d+",
      r"'bn_loop(_\d+)?' \(type While\)",
      r"function bn_loop_body_\d+",
      r"\(type AssignAddVariableOp\)",
    ],
  ),
) + tuple(
  (
    "%s_by_hand" % name,
    lambda v, build=build: build(v, True),
    [
      r"'bn_\w+' \(type %s\) writes bn/moving_mean" % op_type,
      r"function __inference_(on_handle|loop_body)_\d+",
      r"'AssignAddVariableOp' \(type AssignAddVariableOp\)",
    ],
  )
  for name, build, op_type in _BY_HAND
)

_FIX = (
  "does not wait for the snapshot",
  "Build it inside the update function, or leave the variable out of "
  "the store. Nothing was pinned",
)


class HiddenWritersTest(tf.test.TestCase, parameterized.TestCase):
  """The ordering check finds every kind of op that can write a variable.

  An op built before snapshot_before() (here: passed in as a control
  dependency of the update, as batch norm's UPDATE_OPS are) cannot be made to
  wait for the copy, so one that writes a variable of the store is refused:
  the copy would race it.
  """

  def _refused(self, build_writer, use_resource, fragments, v2=False):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Linear(use_resource)
      with tf.variable_scope("bn", use_resource=use_resource):
        moving = tf.get_variable(
          "moving_mean", initializer=np.zeros(4, np.float32), trainable=False
        )
        count = tf.get_variable(
          "count", initializer=np.int64(0), trainable=False
        )
      with control_flow_v2() if v2 else contextlib.suppress():
        writer = build_writer(moving, count)
      store = snapstore.SnapshotStore(
        var_list=[model.w, moving, count], mode="device"
      )

      def apply():
        with tf.control_dependencies([writer]):
          return model.apply()

      with helpers.new_ops(graph) as made:
        with helpers.assert_raises_naming(
          self, ValueError, *(tuple(fragments) + _FIX)
        ):
          store.slots.snapshot_before(apply)
    self.assertEqual(store.slots.pinned(), [])
    self.assertEqual(store.tags(), [])
    self.assertTrue(made)  # built, then left unused

  @parameterized.named_parameters(*_plain_writer_cases())
  def test_an_assign_scatter_or_apply_op_built_before_is_refused(
    self, build, op_type, use_resource
  ):
    target = "bn/count" if op_type.endswith("CountUpTo") else MOVING
    self._refused(
      build, use_resource, [r"\(type %s\) writes %s" % (op_type, target)]
    )

  @parameterized.named_parameters(*_HIDDEN_WRITERS)
  def test_a_write_inside_a_function_or_v2_control_flow_op_is_refused(
    self, build, fragments
  ):
    # Resource variables only: a function body cannot take a ref variable's
    # reference (TF captures its value), so it cannot write one.
    self._refused(lambda v, c: build(v), True, fragments, v2=True)

  @parameterized.named_parameters(
    *[
      ("%s_%s" % (name, kind), build, use_resource)
      for name, build in (
        ("cond", _write_in_cond),
        ("while_loop", _write_in_loop),
      )
      for kind, use_resource in helpers.VARIABLE_KINDS
    ]
  )
  def test_a_write_inside_v1_control_flow_is_refused(self, build, use_resource):
    # v1 control flow: the write is an op of the graph, taking the variable
    # through Switch or Enter ops.
    self._refused(
      lambda v, c: build(v),
      use_resource,
      [
        r"'bn_(cond|loop)/[\w/]*AssignAdd\w*' \(type AssignAdd(VariableOp)?\) "
        r"writes bn/moving_mean"
      ],
    )

  @parameterized.named_parameters(
    (
      "cond",
      lambda v: tf.cond(tf.constant(True), lambda: _add(v), lambda: _read(v)),
    ),
    ("function", _write_in_function),
  )
  def test_a_function_body_cannot_write_a_ref_variable(self, build):
    # Why the tests above use resource variables: TF gives a function body a
    # ref variable's value, not its reference, so no body can write one.
    with tf.Graph().as_default():
      v = tf.Variable(ONES, name="ref_v")
      with control_flow_v2():
        with helpers.assert_raises_naming(self, TypeError, "float32_ref"):
          build(v)

  def test_a_loop_that_moves_the_handle_to_a_written_loop_var_is_refused(self):
    # Round 1 writes another variable; the body swaps the handles, so round
    # 2 writes the covered one through the same loop var.
    def swapping_loop(v, c):
      del c
      other = tf.get_variable(
        "other", initializer=np.zeros(4, np.float32), use_resource=True
      )

      def body(i, a, b):
        with tf.control_dependencies(
          [tf.raw_ops.AssignAddVariableOp(resource=b, value=tf.constant(ONES))]
        ):
          return i + 1, tf.identity(b), tf.identity(a)

      return tf.while_loop(
        lambda i, a, b: i < 2, body, [0, v.handle, other.handle], name="bn_swap"
      )[0]

    self._refused(
      swapping_loop,
      True,
      [
        r"'bn_swap' \(type While\) writes bn/moving_mean",
        r"function bn_swap_body_\d+",
        r"\(type AssignAddVariableOp\)",
      ],
      v2=True,
    )

  def test_a_function_op_whose_function_is_missing_is_refused(self):
    # "If the analysis cannot decide": no body to read.
    def lost_call(v, c):
      del c
      attr = tf.AttrValue
      return tf.get_default_graph().create_op(
        "StatefulPartitionedCall",
        [v.handle],
        [tf.float32],
        name="lost_call",
        attrs={
          "f": attr(func=tf.NameAttrList(name="no_such_function")),
          "Tin": attr(list=attr.ListValue(type=[tf.resource.as_datatype_enum])),
          "Tout": attr(list=attr.ListValue(type=[tf.float32.as_datatype_enum])),
          "config": attr(s=b""),
          "config_proto": attr(s=b""),
          "executor_type": attr(s=b""),
        },
      )

    self._refused(
      lost_call,
      True,
      [
        r"'lost_call' \(type StatefulPartitionedCall\) may write "
        r"bn/moving_mean",
        "function no_such_function is not in the graph's function library",
      ],
    )

  def test_a_writer_type_snapstore_does_not_list_is_refused(self):
    # "Unless proven read-only": an op taking the handle that is not known to
    # only read it is a writer, whatever its type.
    if not hasattr(tf.raw_ops, "AssignVariableXlaConcatND"):
      self.skipTest(
        "TF %d.%d has no resource-variable writer outside the "
        "assign, scatter and apply ops" % _tf.VERSION
      )
    self._refused(
      lambda v, c: tf.raw_ops.AssignVariableXlaConcatND(
        resource=v.handle,
        inputs=[tf.constant(ONES)],
        num_concats=[1],
        name="concat_assign",
      ),
      True,
      [
        r"'concat_assign' \(type AssignVariableXlaConcatND\) may write "
        r"bn/moving_mean",
        "not known to only read",
      ],
    )


def _total_in_cond(w, c):
  # The untaken branch reads w too: both branches take its handle.
  return tf.cond(
    tf.placeholder_with_default(True, []),
    lambda: tf.reduce_sum(c * w),
    lambda: 2.0 * tf.reduce_sum(c * w),
  )


def _total_in_function(w, c):
  @tf.function
  def total():
    return tf.reduce_sum(c * tf.gather(w, [0, 1, 2]))  # ResourceGather

  return total()


def _total_in_loop(w, c):
  return tf.while_loop(
    lambda i, acc: i < 1,
    lambda i, acc: (i + 1, acc + tf.reduce_sum(c * w)),
    [0, 0.0],
  )[1]


def _total_in_case(w, c):
  return tf.switch_case(
    tf.placeholder_with_default(1, []),
    [lambda: 3.0 * tf.reduce_sum(c * w), lambda: tf.reduce_sum(c * w)],
  )


def _total_in_cond_in_function(w, c):
  @tf.function
  def total():
    return _total_in_cond(w, c) + tf.cast(tf.size(w), tf.float32) * 0.0

  return total()


def _total_in_function_in_loop(w, c):
  return tf.while_loop(
    lambda i, acc: i < 1,
    lambda i, acc: (i + 1, acc + _total_in_function(w, c)),
    [0, 0.0],
  )[1]


_READERS = (
  ("cond", _total_in_cond),
  ("function", _total_in_function),
  ("while_loop", _total_in_loop),
  ("switch_case", _total_in_case),
  ("cond_in_function", _total_in_cond_in_function),
  ("function_in_loop", _total_in_function_in_loop),
)


class ReadingFunctionsTest(tf.test.TestCase, parameterized.TestCase):
  """Function calls and v2 control flow that only read the variables pass."""

  @parameterized.named_parameters(
    *[
      ("%s_%s" % (name, kind), total, use_resource)
      for name, total in _READERS
      for kind, use_resource in helpers.VARIABLE_KINDS
    ]
  )
  def test_a_forward_pass_reading_in_them_is_accepted_and_ordered(
    self, total, use_resource
  ):
    # The loss (and its gradient, computed outside the update function) is
    # built by them; they read w and run in parallel with the copy.
    graph = tf.Graph()
    with graph.as_default():
      with control_flow_v2():
        model = th.Linear(use_resource, total=total)
      types = set(op.type for op in graph.get_operations())
      self.assertTrue(
        types
        & {
          "If",
          "StatelessIf",
          "While",
          "StatelessWhile",
          "Case",
          "StatelessCase",
          "PartitionedCall",
          "StatefulPartitionedCall",
        },
        sorted(types),
      )
      store = model.store()
      train_op = store.slots.snapshot_before(model.apply)
    sess = th.session(self, graph)
    expected = th.momentum_steps(3)
    shadows = list(store.slots.shadows(0).values())
    for before, after in zip(expected, expected[1:]):
      sess.run(train_op)
      slot = dict(zip(store.keys, sess.run(shadows)))
      helpers.assert_state(slot, th.linear_state(before), "slot")
      helpers.assert_state(
        th.state(store, sess), th.linear_state(after), "state"
      )

  @parameterized.named_parameters(
    *[(name, build) for name, build, _ in _BY_HAND]
  )
  def test_a_functional_op_built_before_that_only_reads_is_accepted(
    self, build
  ):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Linear(True)
      with tf.variable_scope("bn", use_resource=True):
        moving = tf.get_variable(
          "moving_mean", initializer=ONES * 5.0, trainable=False
        )
      reader = build(moving, False)
      store = snapstore.SnapshotStore(
        var_list=[model.w, moving], optimizer=model.opt, mode="device"
      )

      def apply():
        with tf.control_dependencies([reader]):
          return model.apply()

      train_op = store.slots.snapshot_before(apply)
    sess = th.session(self, graph)
    expected = th.momentum_steps(2)
    shadows = store.slots.shadows(0)
    for before, after in zip(expected, expected[1:]):
      sess.run(train_op)
      self.assertAllEqual(sess.run(shadows["lin/w"]), before[0])
      self.assertAllEqual(sess.run(shadows["bn/moving_mean"]), ONES * 5.0)
      self.assertAllEqual(sess.run(model.w), after[0])


class BatchNormTest(tf.test.TestCase, parameterized.TestCase):
  """tf.layers.batch_normalization with a training flag, under v2 control flow.

  Its forward pass reads the moving statistics in If ops; its UPDATE_OPS are
  the outputs of If ops that write them.
  """

  def _model(self, cover_moving, pass_updates):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0)
      training = tf.placeholder_with_default(True, [], name="training")
      with control_flow_v2():
        with tf.variable_scope("net", use_resource=True):
          h = tf.layers.batch_normalization(x, training=training)
          loss = tf.reduce_sum(tf.square(h - 0.5))
      updates = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
      self.assertLen(updates, 2)
      self.assertTrue(any(op.type == "If" for op in graph.get_operations()))
      opt = tf.train.GradientDescentOptimizer(0.25)
      grads = opt.compute_gradients(loss)
      moving = [v for v in tf.global_variables() if "moving" in v.op.name]
      store = snapstore.SnapshotStore(
        var_list=[
          v for v in tf.global_variables() if cover_moving or v not in moving
        ],
        mode="device",
      )

      def apply():
        with tf.control_dependencies(updates if pass_updates else []):
          return opt.apply_gradients(grads)

      train_op = store.slots.snapshot_before(apply)
    return graph, store, train_op, moving

  def test_its_update_ops_are_refused_when_the_store_covers_the_statistics(
    self,
  ):
    with helpers.assert_raises_naming(
      self,
      ValueError,
      r"\(type If\) writes "
      r"net/batch_normalization/moving_(mean|variance)",
      r"its function",
      *_FIX,
    ):
      self._model(cover_moving=True, pass_updates=True)

  @parameterized.named_parameters(
    ("statistics_left_out", False, True),
    ("updates_not_in_the_step", True, False),
  )
  def test_it_is_accepted_and_the_slot_holds_each_steps_start(
    self, cover_moving, pass_updates
  ):
    graph, store, train_op, moving = self._model(cover_moving, pass_updates)
    self.assertEqual(
      [v for v in moving if v in store.variables.values()],
      moving if cover_moving else [],
    )
    sess = th.session(self, graph)
    shadows = list(store.slots.shadows(0).values())
    for _ in range(3):
      start = th.state(store, sess)
      moving_start = sess.run(moving)
      sess.run(train_op)
      helpers.assert_state(
        dict(zip(store.keys, sess.run(shadows))), start, "slot"
      )
      helpers.assert_state_differs(th.state(store, sess), start)
      # The statistics moved only when the step ran the update ops.
      for value, was in zip(sess.run(moving), moving_start):
        self.assertEqual(np.array_equal(value, was), not pass_updates)


class CreateOptimizerSlotsTest(tf.test.TestCase):
  def test_it_makes_adams_state_that_apply_gradients_then_uses(self):
    with tf.Graph().as_default():
      w = tf.Variable([1.0, 2.0], name="w")
      opt = tf.train.AdamOptimizer(0.1)
      made = snapstore.create_optimizer_slots(opt, [w])
      self.assertCountEqual(
        [v.op.name for v in made],
        ["w/Adam", "w/Adam_1", "beta1_power", "beta2_power"],
      )
      opt.minimize(tf.reduce_sum(w))
      self.assertCountEqual(opt.variables(), made)

  def test_a_keras_or_other_optimizer_is_refused(self):
    with tf.Graph().as_default():
      w = tf.Variable([1.0], name="w")
      with helpers.assert_raises_naming(self, TypeError, "tf.train.Optimizer"):
        snapstore.create_optimizer_slots(object(), [w])

  def test_no_variables_are_refused(self):
    with helpers.assert_raises_naming(self, ValueError, "got none"):
      snapstore.create_optimizer_slots(tf.train.AdamOptimizer(0.1), [])

  def test_a_non_variable_is_refused(self):
    with tf.Graph().as_default():
      with helpers.assert_raises_naming(self, TypeError, "takes variables"):
        snapstore.create_optimizer_slots(
          tf.train.AdamOptimizer(0.1), [tf.constant(1.0)]
        )

  def test_create_slots_is_the_deprecated_name(self):
    # Kept for one release: it warns, naming the new name, and does the same.
    with tf.Graph().as_default():
      w = tf.Variable([1.0, 2.0], name="w")
      opt = tf.train.AdamOptimizer(0.1)
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = snapstore.create_slots(opt, [w])
      self.assertEqual(
        [w.category for w in caught], [DeprecationWarning], caught
      )
      self.assertRegex(
        str(caught[0].message),
        r"snapstore.create_slots is deprecated.*"
        r"snapstore.create_optimizer_slots\(optimizer, var_list\)",
      )
      self.assertEqual(caught[0].filename, __file__)  # the caller's line
      self.assertCountEqual(opt.variables(), made)
      self.assertEqual(len(made), 4)


if __name__ == "__main__":
  tf.test.main()
