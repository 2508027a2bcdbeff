"""The target-network use case: network B with its past and current parameters.

In each step of one training loop, B is evaluated on the same input with its
parameters from before the previous optimizer step (past) and with its current
parameters; after every optimizer step the past is refreshed. Only the current
variables are trained.
"""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


class TargetNetworkTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_past_and_current_in_one_training_loop(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x, target = helpers.dense_net_placeholders()
      out = helpers.dense_net(x, scope="network_B", use_resource=use_resource)
      b_vars = tf.trainable_variables("network_B")
      loss = tf.reduce_mean(tf.square(out - target))
      store = snapstore.SnapshotStore(scope="network_B", mode=mode)
      opt = tf.train.GradientDescentOptimizer(0.1)
      if mode == "device":
        # The past is refreshed in-graph: copy into slot 0, then step.
        with tf.control_dependencies([store.slots.snapshot_op(0)]):
          train = opt.minimize(loss, var_list=b_vars)
      else:
        train = opt.minimize(loss, var_list=b_vars)
    # Only B's own variables are trained; the shadows are not trainable.
    self.assertCountEqual(
      graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES), b_vars
    )

    x_value, y_value = helpers.dense_net_data()
    feed = {x: x_value, target: y_value}
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      previous = None
      store.snapshot("past", session=sess)  # the first past: the initial values
      losses = []
      for _ in range(20):
        current = dict(
          zip(store.keys, sess.run(list(store.variables.values())))
        )
        past_out = store.evaluate_with(
          out, {x: x_value}, tag="past", session=sess
        )
        current_out = sess.run(out, {x: x_value})
        np.testing.assert_allclose(
          current_out,
          helpers.dense_net_numpy(x_value, current),
          rtol=1e-5,
          atol=1e-5,
        )
        np.testing.assert_allclose(
          past_out,
          helpers.dense_net_numpy(x_value, previous or current),
          rtol=1e-5,
          atol=1e-5,
        )
        # evaluate_with left the current parameters exactly as they were.
        for key, value in zip(
          store.keys, sess.run(list(store.variables.values()))
        ):
          helpers.assert_bit_equal(value, current[key], key)
        if mode == "host":
          store.snapshot("past", session=sess)
        _, value = sess.run([train, loss], feed)
        losses.append(value)
        if mode == "device":
          # The slot holds exactly the parameters from before this step.
          for key, shadow in store.slots.shadows(0).items():
            helpers.assert_bit_equal(sess.run(shadow), current[key], key)
        previous = current
      self.assertLess(losses[-1], losses[0])

  @parameterized.named_parameters(
    ("ref_saveable", False, "saveable"),
    ("resource_saveable", True, "saveable"),
    ("ref_own_saver", False, "own_saver"),
    ("resource_own_saver", True, "own_saver"),
    ("ref_not_saved", False, "not_saved"),
    ("resource_not_saved", True, "not_saved"),
  )
  def test_soft_target_across_a_checkpoint(self, use_resource, how):
    # The README's recipe: a soft-updated target network in a device slot,
    # checkpointed by a default Saver (saveable=True), by a Saver of the
    # trainable variables plus store.slots.shadows(slot) (a library's own saver),
    # or not at all (then a reload gives the shadows' initial value).
    graph = tf.Graph()
    with graph.as_default():
      x, y = helpers.dense_net_placeholders()
      out = helpers.dense_net(
        x, scope="online", use_resource=use_resource, seed=1
      )
      loss = tf.reduce_mean(tf.square(out - y))
      train = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
      store = snapstore.SnapshotStore(
        scope="online", mode="device", saveable=how == "saveable"
      )
      with tf.control_dependencies([train]):
        soft = snapstore.MovingAverage(
          store, tau=0.05, form="lerp", tag="target"
        )
      shadows = list(store.slots.shadows(soft.slot).values())
      if how == "own_saver":
        saver = tf.train.Saver(tf.trainable_variables() + shadows)
      else:
        saver = tf.train.Saver()
    x_value, y_value = helpers.dense_net_data()
    path = os.path.join(self.get_temp_dir(), "model_%s" % how)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      for _ in range(5):
        sess.run(soft.update_op, {x: x_value, y: y_value})
      online = sess.run(store.variables)
      target = sess.run(store.slots.shadows(soft.slot))
      for key in online:
        helpers.assert_bits_differ(target[key], online[key], key)
      saver.save(sess, path)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)  # a fresh start, then the checkpoint
      initial = sess.run(store.variables)
      saver.restore(sess, path)
      helpers.assert_state(sess.run(store.variables), online)
      reloaded = sess.run(store.slots.shadows(soft.slot))
      if how == "not_saved":
        # Lost: the online network's values when the shadows were initialized.
        helpers.assert_state(reloaded, initial)
      else:
        helpers.assert_state(reloaded, target)


if __name__ == "__main__":
  tf.test.main()
