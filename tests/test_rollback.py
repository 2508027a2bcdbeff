"""RollbackOptimizer: steps that raise the loss are undone in the graph, exactly."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th


class _Quadratic(object):
  """loss = 0.5 * sum((w - c)^2) for a fed target c; SGD overshoots when lr > 2.

  A step scales the distance to c by (1 - lr), so the loss after a step is
  (1 - lr)^2 times the loss before it: numbers the test can work out.
  """

  def __init__(self, use_resource=False, lr=0.5, inner=None, **kwargs):
    with tf.variable_scope("net", use_resource=use_resource):
      self.w = tf.get_variable("w", [3], initializer=tf.zeros_initializer())
      self.lr = tf.get_variable(
        "lr", [], initializer=tf.constant_initializer(lr), trainable=False
      )
    self.c = tf.placeholder(tf.float32, [3])
    self.loss = 0.5 * tf.reduce_sum(tf.square(self.w - self.c))
    self.step = tf.train.get_or_create_global_step()
    inner = inner or tf.train.GradientDescentOptimizer(self.lr)
    self.opt = snapstore.RollbackOptimizer(inner, **kwargs)
    self.train_op = self.opt.minimize(self.loss, global_step=self.step)


class RollbackTest(tf.test.TestCase, parameterized.TestCase):
  def _session(self, graph):
    return th.session(self, graph)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_step_that_raises_the_loss_is_undone_exactly(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      lr = tf.Variable(
        0.01, trainable=False, name="lr", use_resource=use_resource
      )
      model = th.Regression(
        use_resource=use_resource,
        optimizer_fn=lambda _: snapstore.RollbackOptimizer(
          tf.train.AdamOptimizer(lr), learning_rate=lr, backoff=0.5
        ),
      )
      opt = model.optimizer
      covered = list(opt.store().variables.values())
    self.assertCountEqual(
      opt.store().keys,
      [
        "beta1_power",
        "beta2_power",
        "net/dense/bias",
        "net/dense/bias/Adam",
        "net/dense/bias/Adam_1",
        "net/dense/kernel",
        "net/dense/kernel/Adam",
        "net/dense/kernel/Adam_1",
        "net/dense_1/bias",
        "net/dense_1/bias/Adam",
        "net/dense_1/bias/Adam_1",
        "net/dense_1/kernel",
        "net/dense_1/kernel/Adam",
        "net/dense_1/kernel/Adam_1",
      ],
    )
    sess = self._session(graph)
    feeds = model.feeds(0, 4)
    for feed in feeds[:3]:
      sess.run(model.train_op, feed)
      self.assertFalse(sess.run(opt.check, feed))
    before = sess.run(covered)
    lr.load(10.0, sess)  # Adam moves every weight by about lr: the loss rises
    _, loss_before = sess.run([model.train_op, model.loss], feeds[3])
    helpers.assert_state_differs(
      dict(enumerate(sess.run(covered))), dict(enumerate(before))
    )
    self.assertGreater(sess.run(model.loss, feeds[3]), loss_before)
    self.assertTrue(sess.run(opt.check, feeds[3]))
    for key, a, b in zip(opt.store().keys, sess.run(covered), before):
      helpers.assert_bit_equal(a, b, key)
    self.assertEqual(sess.run(opt.loss_before), loss_before)
    self.assertEqual(sess.run(model.loss, feeds[3]), loss_before)
    self.assertEqual(sess.run(lr), np.float32(5.0))  # backoff
    self.assertEqual(sess.run(opt.rollbacks), 1)
    self.assertEqual(sess.run(model.step), 4)  # the rejected step still counts
    # The check decides once: again, or without a step, it does nothing.
    self.assertFalse(sess.run(opt.check, feeds[0]))
    self.assertEqual(sess.run(opt.rollbacks), 1)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_kept_steps_are_the_inner_optimizers_steps(self, use_resource):
    trajectories = []
    for wrap in (False, True):
      graph = tf.Graph()
      with graph.as_default():
        model = th.Regression(
          use_resource=use_resource,
          optimizer_fn=lambda lr, wrap=wrap: (
            snapstore.RollbackOptimizer(
              tf.train.MomentumOptimizer(lr, 0.9), tolerance=1e9
            )
            if wrap
            else tf.train.MomentumOptimizer(lr, 0.9)
          ),
        )
        variables = tf.trainable_variables()
      sess = self._session(graph)
      values = []
      for feed in model.feeds(1, 5):
        sess.run(model.train_op, feed)
        if wrap:
          self.assertFalse(sess.run(model.optimizer.check, feed))
        values.append(sess.run(variables))
      trajectories.append(values)
    for step, (plain, wrapped) in enumerate(zip(*trajectories)):
      for a, b in zip(plain, wrapped):
        helpers.assert_bit_equal(a, b, "step %d" % step)

  def test_tolerances(self):
    # lr = 2.2: the distance to c grows by 1.2, the loss by 1.44 - 1 = 0.44 of it.
    target = np.array([1.0, -2.0, 0.5], np.float32)
    loss0 = 0.5 * float(np.sum(target**2))
    cases = [
      ({"tolerance": 0.44 * loss0 * 1.01}, False),
      ({"tolerance": 0.44 * loss0 * 0.99}, True),
      ({"relative_tolerance": 0.45}, False),
      ({"relative_tolerance": 0.43}, True),
      ({"tolerance": 0.2 * loss0, "relative_tolerance": 0.2}, True),
      ({"tolerance": 0.25 * loss0, "relative_tolerance": 0.2}, False),
    ]
    for kwargs, rolled_back in cases:
      graph = tf.Graph()
      with graph.as_default():
        model = _Quadratic(lr=2.2, **kwargs)
      sess = self._session(graph)
      sess.run(model.train_op, {model.c: target})
      self.assertEqual(
        sess.run(model.opt.check, {model.c: target}), rolled_back, kwargs
      )
      expected = np.zeros(3) if rolled_back else 2.2 * target
      self.assertAllClose(sess.run(model.w), expected, rtol=1e-6)

  def test_non_finite_loss_is_rolled_back(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Quadratic(lr=1e30, tolerance=1e38)
    sess = self._session(graph)
    feed = {model.c: np.array([1e10, 1.0, 1.0], np.float32)}
    sess.run(model.train_op, feed)
    self.assertFalse(np.isfinite(sess.run(model.loss, feed)))
    self.assertTrue(sess.run(model.opt.check, feed))
    helpers.assert_bit_equal(sess.run(model.w), np.zeros(3, np.float32))

  def test_no_ops_are_added_after_construction(self):
    graph = tf.Graph()
    with graph.as_default():
      model = _Quadratic(lr=2.5, learning_rate=None)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      rolled = []
      for _ in range(20):
        sess.run(model.train_op, {model.c: np.ones(3)})
        rolled.append(sess.run(model.opt.check, {model.c: np.ones(3)}))
    self.assertTrue(all(rolled))  # lr 2.5 always overshoots; nothing ever moves


class _LateStateOptimizer(tf.train.GradientDescentOptimizer):
  """Creates a variable while building its update, not in _create_slots."""

  def _finish(self, update_ops, name_scope):
    with tf.init_scope():
      self._create_non_slot_variable(0.0, "late", self._first)
    return super(_LateStateOptimizer, self)._finish(update_ops, name_scope)

  def _create_slots(self, var_list):
    self._first = var_list[0]


class RollbackErrorsTest(tf.test.TestCase):
  def test_bad_arguments(self):
    sgd = tf.train.GradientDescentOptimizer(0.1)
    with self.assertRaisesRegex(
      TypeError, "RollbackOptimizer wraps a tf.train"
    ):
      snapstore.RollbackOptimizer("sgd")
    with self.assertRaisesRegex(ValueError, "tolerance must be >= 0"):
      snapstore.RollbackOptimizer(sgd, tolerance=-1.0)
    with self.assertRaisesRegex(
      TypeError, "relative_tolerance must be a number"
    ):
      snapstore.RollbackOptimizer(sgd, relative_tolerance="0.1")
    with self.assertRaisesRegex(
      ValueError, "learning_rate= and backoff= go together"
    ):
      snapstore.RollbackOptimizer(sgd, backoff=0.5)
    with tf.Graph().as_default():
      lr = tf.Variable(0.1, trainable=False)
      with self.assertRaisesRegex(ValueError, "backoff must be > 0"):
        snapstore.RollbackOptimizer(sgd, learning_rate=lr, backoff=0.0)
      with self.assertRaisesRegex(
        TypeError, "learning_rate must be a scalar float tf.Variable"
      ):
        snapstore.RollbackOptimizer(
          sgd, learning_rate=tf.constant(0.1), backoff=0.5
        )

  def test_bad_loss(self):
    with tf.Graph().as_default():
      w = tf.get_variable("w", [3])
      opt = snapstore.RollbackOptimizer(tf.train.GradientDescentOptimizer(0.1))
      with self.assertRaisesRegex(
        ValueError, "has no train op in this graph yet"
      ):
        opt.check  # pylint: disable=pointless-statement
      grads = opt.compute_gradients(tf.reduce_sum(w))
      with self.assertRaisesRegex(
        ValueError, "needs the loss to check the step"
      ):
        opt.apply_gradients(grads)
      with self.assertRaisesRegex(
        TypeError, "loss must be a scalar float tensor"
      ):
        opt.apply_gradients(grads, loss=w * 2.0)
      with tf.Graph().as_default():
        other = tf.constant(1.0)
      with self.assertRaisesRegex(
        snapstore.GraphMismatchError, "loss Const:0 belongs to another graph"
      ):
        opt.apply_gradients(grads, loss=other)
      train_op = opt.apply_gradients(grads, loss=tf.reduce_sum(w))
      self.assertEqual(tf.get_collection(tf.GraphKeys.TRAIN_OP), [train_op])
      with self.assertRaisesRegex(ValueError, "already has a train op"):
        opt.minimize(tf.reduce_sum(w))

  def test_inner_state_made_outside_create_slots(self):
    with tf.Graph().as_default():
      w = tf.get_variable("w", [3])
      opt = snapstore.RollbackOptimizer(_LateStateOptimizer(0.1))
      with self.assertRaisesRegex(
        ValueError, r"created state while building its step \(.*late:0\)"
      ):
        opt.minimize(tf.reduce_sum(w))


if __name__ == "__main__":
  tf.test.main()
