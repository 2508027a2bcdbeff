"""Lookahead: trajectories against a numpy implementation of Zhang et al.'s rule."""

import itertools
import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

LR = 0.1
MOMENTUM = 0.9
SHAPES = {"w": ([4, 3], np.float32), "b": ([3], np.float64)}


def numpy_lookahead(theta0, grads, k, alpha, momentum):
  """Algorithm 1 of the paper around SGD or heavy-ball momentum (TF's form).

  Args:
    theta0: dict name -> starting parameters.
    grads: list over steps of dict name -> gradient.

  Returns:
    A list over steps of (fast, slow) dicts after each step.
  """
  theta = {n: v.copy() for n, v in theta0.items()}
  phi = {n: v.copy() for n, v in theta0.items()}
  acc = {n: np.zeros_like(v) for n, v in theta0.items()}
  out = []
  for t, grad in enumerate(grads, 1):
    for n in theta:
      dtype = theta[n].dtype.type
      # TF makes the learning rate and momentum float32 tensors and casts.
      lr = dtype(np.float32(LR))
      if momentum:
        acc[n] = acc[n] * dtype(np.float32(MOMENTUM)) + grad[n]
        theta[n] = theta[n] - acc[n] * lr
      else:
        theta[n] = theta[n] - grad[n] * lr
      if t % k == 0:
        phi[n] = phi[n] + dtype(alpha) * (theta[n] - phi[n])
        theta[n] = phi[n].copy()
    out.append(
      (
        {n: v.copy() for n, v in theta.items()},
        {n: v.copy() for n, v in phi.items()},
      )
    )
  return out


def _inner(momentum):
  return (
    tf.train.MomentumOptimizer(LR, MOMENTUM)
    if momentum
    else tf.train.GradientDescentOptimizer(LR)
  )


class _FedGradients(object):
  """Variables trained by Lookahead from gradients fed by the test."""

  def __init__(self, k, alpha, momentum, use_resource):
    with tf.variable_scope("net", use_resource=use_resource):
      self.variables = {
        n: tf.get_variable(
          n,
          shape,
          dtype=dtype,
          initializer=tf.random_normal_initializer(seed=3),
        )
        for n, (shape, dtype) in sorted(SHAPES.items())
      }
    self.grads = {
      n: tf.placeholder(v.dtype.base_dtype, v.shape)
      for n, v in self.variables.items()
    }
    self.step = tf.train.get_or_create_global_step()
    self.optimizer = snapstore.Lookahead(_inner(momentum), k=k, alpha=alpha)
    self.train_op = self.optimizer.apply_gradients(
      [(self.grads[n], v) for n, v in sorted(self.variables.items())],
      global_step=self.step,
    )

  @staticmethod
  def random_grads(rng, steps):
    return [
      {
        n: rng.randn(*shape).astype(dtype)
        for n, (shape, dtype) in SHAPES.items()
      }
      for _ in range(steps)
    ]

  def run(self, sess, grads):
    sess.run(self.train_op, {self.grads[n]: g for n, g in grads.items()})

  def fast(self, sess):
    return sess.run(self.variables)

  def slow(self, sess):
    return sess.run(
      {n: self.optimizer.get_slot(v, "slow") for n, v in self.variables.items()}
    )


TRAJECTORY_CASES = [
  (
    "k%d_alpha%s_%s_%s" % (k, alpha, "momentum" if m else "sgd", kind),
    k,
    alpha,
    m,
    use_resource,
  )
  for (k, alpha), m, (kind, use_resource) in itertools.product(
    [(1, 0.5), (3, 0.3), (5, 0.5), (4, 0.8)],
    [False, True],
    helpers.VARIABLE_KINDS,
  )
]


class TrajectoryTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*TRAJECTORY_CASES)
  def test_every_step_equals_the_numpy_rule(
    self, k, alpha, momentum, use_resource
  ):
    graph = tf.Graph()
    with graph.as_default():
      model = _FedGradients(k, alpha, momentum, use_resource)
      init = tf.global_variables_initializer()  # and nothing else
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      theta0 = model.fast(sess)
      # The slow weights start at the starting parameters.
      for n, value in model.slow(sess).items():
        helpers.assert_bit_equal(value, theta0[n], "slow %s at start" % n)
      grads = model.random_grads(np.random.RandomState(k), 3 * k + 2)
      expected = numpy_lookahead(theta0, grads, k, alpha, momentum)
      for t, (grad, (fast, slow)) in enumerate(zip(grads, expected), 1):
        model.run(sess, grad)
        for n in SHAPES:
          helpers.assert_bit_equal(
            model.fast(sess)[n], fast[n], "fast %s step %d" % (n, t)
          )
          helpers.assert_bit_equal(
            model.slow(sess)[n], slow[n], "slow %s step %d" % (n, t)
          )
      self.assertEqual(sess.run(model.step), len(grads))

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_slow_weights_start_at_loaded_parameters(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = _FedGradients(3, 0.5, True, use_resource)
      init = tf.global_variables_initializer()
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      rng = np.random.RandomState(7)
      for n, v in model.variables.items():  # e.g. a pretrained model
        v.load(rng.randn(*SHAPES[n][0]).astype(SHAPES[n][1]), sess)
      theta0 = model.fast(sess)
      grads = model.random_grads(rng, 7)
      expected = numpy_lookahead(theta0, grads, 3, 0.5, True)
      for grad in grads:
        model.run(sess, grad)
      for n in SHAPES:
        helpers.assert_bit_equal(model.fast(sess)[n], expected[-1][0][n], n)
        helpers.assert_bit_equal(model.slow(sess)[n], expected[-1][1][n], n)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_minimize_a_loss(self, use_resource):
    rng = np.random.RandomState(0)
    x_value = rng.randn(32, 5).astype(np.float32)
    y_value = x_value.dot(rng.randn(5)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [5], initializer=tf.zeros_initializer())
      loss = tf.reduce_mean(tf.square(tf.tensordot(x_value, w, 1) - y_value))
      step = tf.train.get_or_create_global_step()
      opt = snapstore.Lookahead(
        tf.train.GradientDescentOptimizer(LR), k=3, alpha=0.5
      )
      train_op = opt.minimize(loss, global_step=step)
    theta = np.zeros(5, np.float32)
    phi = theta.copy()
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      losses = []
      for t in range(1, 13):
        _, value = sess.run([train_op, loss])
        losses.append(value)
        grad = 2.0 / len(x_value) * x_value.T.dot(x_value.dot(theta) - y_value)
        theta = theta - LR * grad
        if t % 3 == 0:
          phi = phi + 0.5 * (theta - phi)
          theta = phi.copy()
        self.assertAllClose(sess.run(w), theta, rtol=1e-5, atol=1e-6)
        self.assertAllClose(
          sess.run(opt.get_slot(w, "slow")), phi, rtol=1e-5, atol=1e-6
        )
      self.assertLess(losses[-1], losses[0])
      self.assertEqual(sess.run(step), 12)


class SlowWeightsTest(tf.test.TestCase, parameterized.TestCase):
  def _graph(self, use_resource=False, k=3):
    graph = tf.Graph()
    with graph.as_default():
      model = _FedGradients(k, 0.5, True, use_resource)
      model.x = tf.placeholder(tf.float32, [None, 4])
      model.out = tf.matmul(model.x, model.variables["w"])
    return graph, model

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_evaluate_with_the_slow_weights(self, use_resource):
    graph, model = self._graph(use_resource)
    x_value = np.random.RandomState(1).randn(5, 4).astype(np.float32)
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      for grad in model.random_grads(np.random.RandomState(2), 4):  # mid-cycle
        model.run(sess, grad)
      fast, slow = model.fast(sess), model.slow(sess)
      helpers.assert_bits_differ(fast["w"], slow["w"], "fast and slow")
      out = model.optimizer.evaluate_with(
        model.out, {model.x: x_value}, session=sess
      )
      self.assertAllClose(out, x_value.dot(slow["w"]), rtol=1e-6)
      with sess.as_default():  # the default session works too
        self.assertAllClose(
          model.optimizer.evaluate_with(model.out, {model.x: x_value}), out
        )
      for n, value in model.fast(sess).items():
        helpers.assert_bit_equal(value, fast[n], n)

  def test_state_is_in_the_optimizer_variables(self):
    graph, model = self._graph()
    opt = model.optimizer
    with graph.as_default():
      names = sorted(v.op.name for v in opt.variables())
      self.assertEqual(
        names,
        [
          "Lookahead_counter",
          "net/b/Lookahead/slot_0",
          "net/b/Momentum",
          "net/w/Lookahead/slot_0",
          "net/w/Momentum",
        ],
      )
      self.assertEqual(opt.get_slot_names(), ["momentum", "slow"])
      w = model.variables["w"]
      self.assertIs(
        opt.get_slot(w, "momentum"), opt.optimizer.get_slot(w, "momentum")
      )
      self.assertIs(
        opt.get_slot(w, "slow"), opt.store().slots.shadows(0)["net/w"]
      )
      self.assertEqual(opt.store().slots.pinned(), ["slow"])
      # The whole Lookahead step is the graph's train op, not the inner step.
      self.assertEqual(
        tf.get_collection(tf.GraphKeys.TRAIN_OP), [model.train_op]
      )
      # The slow weights are saved by a default Saver, like optimizer slots.
      self.assertIn(
        opt.get_slot(w, "slow"),
        tf.get_collection(tf.GraphKeys.GLOBAL_VARIABLES),
      )
      self.assertNotIn(
        opt.get_slot(w, "slow"),
        tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES),
      )

  def test_checkpoint_resumes_the_same_trajectory(self):
    path = os.path.join(self.get_temp_dir(), "ckpt")
    grads = _FedGradients.random_grads(np.random.RandomState(3), 10)
    graph, model = self._graph(k=4)
    with graph.as_default():
      saver = tf.train.Saver()
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      for grad in grads[:6]:  # stop mid-cycle
        model.run(sess, grad)
      saver.save(sess, path)
      for grad in grads[6:]:
        model.run(sess, grad)
      straight = model.fast(sess), model.slow(sess)
    graph, model = self._graph(k=4)
    with graph.as_default():
      saver = tf.train.Saver()
    with tf.Session(graph=graph) as sess:
      saver.restore(sess, path)
      for grad in grads[6:]:
        model.run(sess, grad)
      for got, want in zip((model.fast(sess), model.slow(sess)), straight):
        for n in SHAPES:
          helpers.assert_bit_equal(got[n], want[n], n)

  def test_a_store_with_the_optimizer_rolls_lookahead_back_exactly(self):
    graph, model = self._graph(k=3)
    with graph.as_default():
      store = snapstore.SnapshotStore(
        var_list=list(model.variables.values()),
        optimizer=model.optimizer,
        include_global_step=True,
      )
    self.assertCountEqual(
      store.keys,
      [
        "Lookahead_counter",
        "global_step",
        "net/b",
        "net/b/Lookahead/slot_0",
        "net/b/Momentum",
        "net/w",
        "net/w/Lookahead/slot_0",
        "net/w/Momentum",
      ],
    )
    grads = model.random_grads(np.random.RandomState(4), 5)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      model.run(sess, grads[0])
      store.snapshot(session=sess)
      for grad in grads[1:]:
        model.run(sess, grad)
      after = sess.run(list(store.variables.values()))
      store.restore(session=sess)
      for grad in grads[1:]:  # across a synchronization
        model.run(sess, grad)
      for key, a, b in zip(
        store.keys, sess.run(list(store.variables.values())), after
      ):
        helpers.assert_bit_equal(a, b, key)

  def test_no_ops_are_added_after_construction(self):
    graph, model = self._graph()
    x_value = np.ones([2, 4], np.float32)
    with graph.as_default():
      init = tf.global_variables_initializer()
    graph.finalize()
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      for grad in model.random_grads(np.random.RandomState(5), 30):
        model.run(sess, grad)
        model.optimizer.evaluate_with(
          model.out, {model.x: x_value}, session=sess
        )


class InStepTest(tf.test.TestCase, parameterized.TestCase):
  """`store.slots.snapshot_before` around a Lookahead step: its state (slow
  weights, counter) is made by `create_optimizer_slots`, before the store and the train
  op, so the store covers it and a rollback undoes a synchronization."""

  @parameterized.named_parameters(*helpers.VARIABLE_KINDS)
  def test_a_nan_step_rolled_back_with_the_slow_weights(self, use_resource):
    k, alpha = 2, 0.5
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        variables = {
          n: tf.get_variable(
            n, shape, dtype, tf.random_normal_initializer(seed=3)
          )
          for n, (shape, dtype) in sorted(SHAPES.items())
        }
      grads = {
        n: tf.placeholder(v.dtype.base_dtype, v.shape)
        for n, v in variables.items()
      }
      opt = snapstore.Lookahead(_inner(True), k=k, alpha=alpha)
      ordered = [v for _, v in sorted(variables.items())]
      made = snapstore.create_optimizer_slots(opt, ordered)
      self.assertCountEqual(
        [v.op.name for v in made],
        [
          "Lookahead_counter",
          "net/b/Lookahead/slot_0",
          "net/b/Momentum",
          "net/w/Lookahead/slot_0",
          "net/w/Momentum",
        ],
      )
      store = snapstore.SnapshotStore(var_list=ordered, optimizer=opt)
      self.assertEqual(len(store.keys), 7)  # the variables and all of `made`
      # NaN where a gradient is (x * 0 keeps NaN), from the variables too.
      loss = tf.add_n(
        [
          tf.reduce_sum(tf.cast(grads[n], tf.float32) * 0.0)
          + tf.reduce_sum(tf.cast(v, tf.float32) * 0.0)
          for n, v in sorted(variables.items())
        ]
      )
      train = store.slots.snapshot_before(
        lambda: opt.apply_gradients(
          [(grads[n], v) for n, v in sorted(variables.items())]
        ),
        if_finite=loss,
      )
    steps = _FedGradients.random_grads(np.random.RandomState(6), 5)
    nan = {n: g.copy() for n, g in steps[3].items()}
    nan["w"][1, 2] = np.nan
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      theta0 = sess.run(variables)
      feed = lambda g: {grads[n]: x for n, x in g.items()}  # noqa: E731
      for g in steps[:3]:
        sess.run(train, feed(g))
      sess.run(train, feed(nan))  # step 4 synchronizes: NaN slow weights
      self.assertTrue(
        np.isnan(sess.run(opt.get_slot(variables["w"], "slow"))).any()
      )
      # The slot holds the start of the newest step whose loss was finite:
      # step 3's (step 4's copy did not run), so step 3 runs again.
      store.restore("before_step", session=sess)
      for g in steps[2:]:
        sess.run(train, feed(g))
      fast, slow = numpy_lookahead(theta0, steps, k, alpha, True)[-1]
      got_slow = sess.run(
        {n: opt.get_slot(v, "slow") for n, v in variables.items()}
      )
      for n in sorted(variables):
        helpers.assert_bit_equal(sess.run(variables[n]), fast[n], n)
        helpers.assert_bit_equal(got_slow[n], slow[n], n + " slow")

  def test_a_train_op_over_other_variables_is_refused(self):
    with tf.Graph().as_default():
      w = tf.get_variable("w", [2])
      b = tf.get_variable("b", [2])
      opt = snapstore.Lookahead(tf.train.GradientDescentOptimizer(0.1))
      snapstore.create_optimizer_slots(opt, [w])
      with self.assertRaisesRegex(
        ValueError,
        r"made its slow weights for \['w'\] \(create_optimizer_slots\), but "
        r"this train op trains \['b', 'w'\]",
      ):
        opt.minimize(tf.reduce_sum(w + b))


class LookaheadClassTest(tf.test.TestCase):
  """`snapstore.Lookahead` is the tf.train wrapper; `KerasLookahead` is the
  eager engine's, refused in graph mode (tests/eager/test_lookahead.py)."""

  def test_what_lookahead_returns_is_a_lookahead_and_an_optimizer(self):
    with tf.Graph().as_default():
      opt = snapstore.Lookahead(tf.train.GradientDescentOptimizer(0.1))
      self.assertIsInstance(opt, snapstore.Lookahead)
      self.assertIsInstance(opt, tf.train.Optimizer)
      self.assertNotIsInstance(opt, snapstore.KerasLookahead)

  def test_keras_lookahead_is_refused_in_graph_mode(self):
    with tf.Graph().as_default():
      w = tf.get_variable("w", [2])
      with self.assertRaisesRegex(
        snapstore.ModeError,
        r"KerasLookahead runs on the eager engine.*snapstore\.Lookahead\(",
      ):
        snapstore.KerasLookahead(_keras_sgd(), var_list=[w])
      made = [v.op.name for v in tf.global_variables() if "Lookahead" in v.name]
      self.assertEqual(made, [])  # refused before any store or counter


def _keras_sgd():
  """A Keras optimizer of the Keras in use (tf-keras, or TF 1.15's own),
  which KerasLookahead takes; a stand-in of tf-keras's module on TF 1.15,
  whose tf.keras lives in the tensorflow package."""
  opt = tf.keras.optimizers.SGD(0.1)
  if type(opt).__module__.split(".")[0] in ("keras", "tf_keras"):
    return opt
  stand_in = type("SGD", (type(opt),), {"__module__": "tf_keras.optimizers"})
  return stand_in(0.1)


class LookaheadErrorsTest(tf.test.TestCase):
  def test_bad_arguments(self):
    sgd = tf.train.GradientDescentOptimizer(0.1)
    with self.assertRaisesRegex(
      TypeError,
      "Lookahead wraps a tf.train.Optimizer.*use snapstore.KerasLookahead",
    ):
      snapstore.Lookahead(tf.keras.optimizers.SGD(0.1))
    with self.assertRaisesRegex(ValueError, "k must be >= 1, got 0"):
      snapstore.Lookahead(sgd, k=0)
    with self.assertRaisesRegex(TypeError, "k must be an int"):
      snapstore.Lookahead(sgd, k=2.5)
    with self.assertRaisesRegex(ValueError, r"alpha must be in \(0, 1\]"):
      snapstore.Lookahead(sgd, alpha=0.0)
    with self.assertRaisesRegex(ValueError, r"alpha must be in \(0, 1\]"):
      snapstore.Lookahead(sgd, alpha=1.5)
    with self.assertRaisesRegex(TypeError, "alpha must be a number"):
      snapstore.Lookahead(sgd, alpha="0.5")

  def test_one_train_op_per_graph(self):
    with tf.Graph().as_default():
      w = tf.get_variable("w", [2])
      opt = snapstore.Lookahead(tf.train.GradientDescentOptimizer(0.1))
      with self.assertRaisesRegex(
        ValueError, "has no train op in this graph yet"
      ):
        opt.store()
      opt.minimize(tf.reduce_sum(w))
      with self.assertRaisesRegex(
        ValueError, "already has a train op in this graph"
      ):
        opt.minimize(tf.reduce_sum(w))
      with self.assertRaisesRegex(ValueError, "No gradients provided"):
        snapstore.Lookahead(
          tf.train.GradientDescentOptimizer(0.1)
        ).apply_gradients([(None, w)])
    with tf.Graph().as_default():  # another graph: a train op of its own
      w = tf.get_variable("w", [2])
      opt.minimize(tf.reduce_sum(w))
      self.assertEqual(list(opt.store().slots.shadows(0)), ["w"])


if __name__ == "__main__":
  tf.test.main()
