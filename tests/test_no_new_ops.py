"""No call after construction adds ops: 1000 calls with the graph finalized."""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


class FinalizedGraphTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_thousand_calls_on_finalized_graph(self, mode, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [3, 2])
      y = tf.matmul(x, w)
      train = (
        w.assign_add(tf.ones_like(w), read_value=False)
        if use_resource
        else tf.assign_add(w, tf.ones_like(w)).op
      )
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=3)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    feed = {x: np.ones([2, 3], np.float32)}
    path = self.get_temp_dir() + "/s.npz"
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      for i in range(1000):
        tag = store.snapshot(session=sess)
        sess.run(train)
        past = store.evaluate_with(y, feed, session=sess)
        store.restore(tag, session=sess)
        np.testing.assert_array_equal(past, sess.run(y, feed))
        if i % 100 == 0:
          store.files.save_npz(path, session=sess)
          store.files.load_npz(path, session=sess)
          store.arrays(session=sess)
          store.delete(store.tags()[0])
      self.assertLen(store.tags(), 3)


if __name__ == "__main__":
  tf.test.main()
