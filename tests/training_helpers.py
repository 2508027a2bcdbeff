"""A small trainable model for the training-loop tests, and state comparisons."""

import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


class Regression(object):
  """A two-layer regression net under scope "net", trained by `optimizer_fn(lr)`.

  The default optimizer is Momentum (0.9): it has a slot per variable.
  The learning rate is a placeholder with a default, so one step can be fed a
  learning rate that makes the loss blow up.
  """

  def __init__(
    self, use_resource=False, optimizer_fn=None, learning_rate=0.01, features=4
  ):
    self.features = features
    self.x = tf.placeholder(tf.float32, [None, features], name="x")
    self.y = tf.placeholder(tf.float32, [None], name="y")
    self.lr = tf.placeholder_with_default(learning_rate, [], name="lr")
    self.out = tf.squeeze(
      helpers.dense_net(
        self.x,
        use_resource=use_resource,
        outputs=1,
        activation=tf.nn.tanh,
        seed=1,
      ),
      1,
    )
    self.loss = tf.reduce_mean(tf.square(self.out - self.y), name="loss")
    self.step = tf.train.get_or_create_global_step()
    self.optimizer = (
      optimizer_fn(self.lr)
      if optimizer_fn
      else tf.train.MomentumOptimizer(self.lr, 0.9)
    )
    self.train_op = self.optimizer.minimize(self.loss, global_step=self.step)

  def store(self, **kwargs):
    """A store covering the model, the optimizer's state and the global step."""
    kwargs.setdefault("optimizer", self.optimizer)
    kwargs.setdefault("include_global_step", True)
    return snapstore.SnapshotStore(scope="net", **kwargs)

  def feed(self, rng, n=16, lr=None):
    x = rng.randn(n, self.features).astype(np.float32)
    feed = {self.x: x, self.y: np.sin(x.sum(axis=1))}
    if lr is not None:
      feed[self.lr] = lr
    return feed

  def with_lr(self, feed, lr):
    """A copy of `feed` that also feeds the learning rate."""
    feed = dict(feed)
    feed[self.lr] = lr
    return feed

  def feeds(self, seed, count):
    rng = np.random.RandomState(seed)
    return [self.feed(rng) for _ in range(count)]


class Linear(object):
  """loss = sum(C * w) * scale under scope "lin", trained by Momentum.

  The gradient is scale * C, so the steps are easy in numpy (`momentum_step`).
  `scale` is 1 unless fed: NaN or inf for a step whose loss is not finite.
  The optimizer's slots exist before any train op (`create_optimizer_slots`), so a
  store can be built first and the train op with `snapshot_before`.
  """

  C = np.array([1.5, -2.0, 0.25], np.float32)
  LR = 0.125
  MOMENTUM = 0.5

  def __init__(self, use_resource, total=None):
    """Builds the model.

    Args:
      use_resource: Whether w is a resource variable.
      total: Optional function of w and C building sum(C * w) some other
        way (in a tf.cond, a tf.function...); the gradient stays C * scale.
    """
    with tf.variable_scope("lin", use_resource=use_resource):
      self.w = tf.get_variable(
        "w", initializer=np.array([1.0, 2.0, 3.0], np.float32)
      )
    self.scale = tf.placeholder_with_default(np.float32(1.0), [], name="scale")
    total = total or (lambda w, c: tf.reduce_sum(c * w))
    self.loss = total(self.w, tf.constant(self.C)) * self.scale
    self.step = tf.train.get_or_create_global_step()
    self.opt = tf.train.MomentumOptimizer(self.LR, self.MOMENTUM)
    self.grads = self.opt.compute_gradients(self.loss)
    snapstore.create_optimizer_slots(self.opt, [self.w])

  def store(self, **kwargs):
    """A device store of w, its momentum and the global step."""
    return snapstore.SnapshotStore(
      var_list=[self.w],
      optimizer=self.opt,
      include_global_step=True,
      mode="device",
      **kwargs,
    )

  def apply(self):
    return self.opt.apply_gradients(self.grads, global_step=self.step)


def momentum_steps(n):
  """[(w, accumulator, step)] of `Linear` before each of n+1 steps, in numpy."""
  states = [(np.array([1.0, 2.0, 3.0], np.float32), np.zeros(3, np.float32), 0)]
  for _ in range(n):
    states.append(momentum_step(states[-1]))
  return states


def momentum_step(state, scale=1.0):
  """`Linear`'s (w, accumulator, step) after a step from `state` at `scale`.

  In float32, as TensorFlow computes it: accumulator = momentum *
  accumulator + gradient; w = w - lr * accumulator.
  """
  w, acc, step = state
  grad = (np.float32(scale) * Linear.C).astype(np.float32)
  acc = (np.float32(Linear.MOMENTUM) * acc + grad).astype(np.float32)
  return (w - np.float32(Linear.LR) * acc).astype(np.float32), acc, step + 1


def linear_state(values):
  """`(w, accumulator, step)` as a dict keyed like a `Linear` store's keys."""
  return {
    "lin/w": values[0],
    "lin/w/Momentum": values[1],
    "global_step": np.int64(values[2]),
  }


def state(store, sess):
  """The values of every variable `store` covers, by key."""
  return dict(zip(store.keys, sess.run(list(store.variables.values()))))


def run_steps(sess, train_op, feeds):
  for feed in feeds:
    sess.run(train_op, feed)


def session(test, graph):
  sess = tf.Session(graph=graph)
  test.addCleanup(sess.close)
  helpers.init(sess)
  return sess
