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

  def __init__(self, use_resource=False, optimizer_fn=None, learning_rate=0.01,
               features=4):
    self.features = features
    self.x = tf.placeholder(tf.float32, [None, features], name="x")
    self.y = tf.placeholder(tf.float32, [None], name="y")
    self.lr = tf.placeholder_with_default(learning_rate, [], name="lr")
    self.out = tf.squeeze(helpers.dense_net(
        self.x, use_resource=use_resource, outputs=1, activation=tf.nn.tanh,
        seed=1), 1)
    self.loss = tf.reduce_mean(tf.square(self.out - self.y), name="loss")
    self.step = tf.train.get_or_create_global_step()
    self.optimizer = (optimizer_fn(self.lr) if optimizer_fn
                      else tf.train.MomentumOptimizer(self.lr, 0.9))
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
