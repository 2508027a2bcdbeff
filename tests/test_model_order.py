"""Graph mode's side of the eager past issue: keys in the order given, key
lookups, a snapshot from a second set of variables, rates that change, and
the calls whose eager forms graph mode refuses with its own way."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf


def _dense(scope, seed, use_resource=False):
  with tf.variable_scope(scope, use_resource=use_resource):
    w = tf.get_variable(
      "w", [4, 3], initializer=tf.random_normal_initializer(seed=seed)
    )
    b = tf.get_variable(
      "b", [3], initializer=tf.random_normal_initializer(seed=seed + 1)
    )
  return w, b


class KeysTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(("ref", False), ("resource", True))
  def test_keys_in_the_order_given_and_key_lookups(self, use_resource):
    with tf.Graph().as_default():
      w, b = _dense("online", 1, use_resource)
      by_scope = snapstore.SnapshotStore(scope="online", name="by_scope")
      self.assertEqual(by_scope.keys, ("w", "b"))  # created in this order
      listed = snapstore.SnapshotStore(var_list=[b, w], name="listed")
      self.assertEqual(listed.keys, ("online/b", "online/w"))
      self.assertEqual(by_scope.key_of(b), "b")
      self.assertIs(by_scope.variable_of("w"), w)
      with self.assertRaisesRegex(ValueError, "does not cover"):
        listed.key_of(tf.Variable(1.0, name="other"))
      with self.assertRaisesRegex(KeyError, "Did you mean 'online/w'"):
        listed.variable_of("online/ww")

  @parameterized.named_parameters(("ref", False), ("resource", True))
  def test_load_arrays_from_a_list_of_variables(self, use_resource):
    with tf.Graph().as_default():
      w, b = _dense("online", 1, use_resource)
      tw, tb = _dense("target", 7, use_resource)
      store = snapstore.SnapshotStore(scope="online", mode="device")
      with self.session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(store.slots.initializer)
        tag = store.load_arrays([tw, tb], tag="target", session=sess)
        store.restore(tag, session=sess)
        got_w, got_b, want_w, want_b = sess.run([w, b, tw, tb])
        self.assertEqual(got_w.tobytes(), want_w.tobytes())
        self.assertEqual(got_b.tobytes(), want_b.tobytes())
        with self.assertRaisesRegex(
          snapstore.IncompatibleSnapshotError, "list of 1 variables"
        ):
          store.load_arrays([tw], session=sess)
        with self.assertRaisesRegex(
          TypeError, r"takes a dict \{key: numpy array\}.*other_store"
        ):
          store.load_arrays(42, session=sess)

  def test_eager_forms_are_refused_with_the_graph_way(self):
    with tf.Graph().as_default():
      w, b = _dense("online", 1)
      store = snapstore.SnapshotStore(scope="online", mode="device")
      x = tf.ones([2, 4])
      with self.assertRaisesRegex(
        TypeError, "in graph mode takes the tensors.*got the function"
      ):
        store.slots.past(lambda: tf.matmul(x, w) + b, 0)
      with self.assertRaisesRegex(snapstore.ModeError, "saveable=True"):
        store.slots.trackable(0)


class RatesTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("ref_lerp", False, "lerp"),
    ("resource_lerp", True, "lerp"),
    ("ref_ema", False, "ema"),
    ("resource_ema", True, "ema"),
  )
  def test_a_fed_rate_equals_the_formula_at_every_rate(
    self, use_resource, form
  ):
    with tf.Graph().as_default():
      w, b = _dense("online", 1, use_resource)
      noise = [
        tf.assign_add(v, tf.random.normal(v.shape, seed=3))
        if not use_resource
        else v.assign_add(tf.random.normal(v.shape, seed=3))
        for v in (w, b)
      ]
      tau = tf.placeholder(tf.float32, [], name="tau")
      store = snapstore.SnapshotStore(scope="online", mode="device")
      with tf.control_dependencies(noise):
        soft = snapstore.MovingAverage(store, tau=tau, form=form, tag="t")
      with self.session() as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(store.slots.initializer)
        average = sess.run([w, b])
        for rate in (0.0476, 0.731, 1.0, 0.2517):
          sess.run(soft.update_op, {tau: rate})
          now = sess.run([w, b])
          t = np.float32(rate)
          average = [
            (np.float32(1) - t) * a + t * v
            if form == "lerp"
            else a - (a - v) * t
            for a, v in zip(average, now)
          ]
          got = store.arrays("t", session=sess)
          self.assertEqual(got["w"].tobytes(), average[0].tobytes())
          self.assertEqual(got["b"].tobytes(), average[1].tobytes())
        with self.assertRaisesRegex(
          tf.errors.InvalidArgumentError, r"tau must be in \(0, 1\]"
        ):
          sess.run(soft.update_op, {tau: 1.5})

  def test_rate_errors(self):
    with tf.Graph().as_default():
      _dense("online", 1)
      store = snapstore.SnapshotStore(scope="online", mode="device")
      with self.assertRaisesRegex(TypeError, "scalar float tensor"):
        snapstore.MovingAverage(store, tau=tf.constant([0.1, 0.2]))
      with self.assertRaisesRegex(TypeError, "scalar float tensor"):
        snapstore.MovingAverage(store, tau=tf.constant(1))
      with tf.Graph().as_default():
        elsewhere = tf.constant(0.1)
      with self.assertRaisesRegex(
        snapstore.GraphMismatchError, "belongs to another graph"
      ):
        snapstore.MovingAverage(store, tau=elsewhere)
      self.assertEqual(store.slots.pinned(), [])
      soft = snapstore.MovingAverage(store, tau=0.1)
      with self.assertRaisesRegex(
        snapstore.ModeError, "update_op.*variable or placeholder"
      ):
        soft.update(tau=0.5)


if __name__ == "__main__":
  tf.test.main()
