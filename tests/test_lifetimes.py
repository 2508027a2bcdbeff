"""Sessions and graphs a store, hook or optimizer met are not kept alive by it.

An Estimator builds a new graph and session for every train() call; a cache
that kept them would grow without bound in a long job.
"""

import gc
import weakref

from absl.testing import parameterized

import snapstore
from snapstore._tf import tf
from tests import helpers


def _alive(refs):
  gc.collect()
  return sum(r() is not None for r in refs)


class LifetimeTest(tf.test.TestCase, parameterized.TestCase):
  def test_sessions_are_released_after_store_calls(self):
    for mode in ("device", "host"):
      graph = tf.Graph()
      with graph.as_default():
        model = helpers.Model(dtypes=(tf.float32,))
        store = snapstore.SnapshotStore(scope="net", mode=mode)
      refs = []
      for _ in range(3):
        sess = tf.Session(graph=graph)
        helpers.init(sess)
        tag = store.snapshot(session=sess)
        store.restore(tag, session=sess)
        store.evaluate_with(model.variables["v0_float32"], session=sess)
        refs.append(weakref.ref(sess))
        sess.close()
        del sess
      self.assertEqual(_alive(refs), 0, mode)

  def test_hook_keeps_no_old_graph(self):
    hook = snapstore.SnapshotHook(
      lambda: snapstore.SnapshotStore(mode="host"), every_n_steps=1
    )
    refs = []
    for _ in range(3):  # like three Estimator.train() calls
      graph = tf.Graph()
      with graph.as_default():
        tf.get_variable("w", [4])
        tf.train.get_or_create_global_step()
        hook.begin()
      refs.append(weakref.ref(graph))
      del graph
    # The hook lives on and holds the store of the graph it runs now; the
    # graphs of earlier train() calls are gone.
    self.assertIs(hook.store.graph, refs[-1]())
    self.assertEqual(_alive(refs[:-1]), 0)

  @parameterized.named_parameters(
    ("lookahead", lambda inner: snapstore.Lookahead(inner, k=2)),
    ("rollback", snapstore.RollbackOptimizer),
  )
  def test_optimizer_keeps_no_old_graph(self, wrap):
    opt = wrap(tf.train.GradientDescentOptimizer(0.1))
    refs = []
    for _ in range(3):  # one optimizer for three graphs, as in an Estimator
      graph = tf.Graph()
      with graph.as_default():
        w = tf.Variable([1.0, 2.0], name="w")
        opt.minimize(tf.reduce_sum(tf.square(w)))
        self.assertIsNotNone(opt.store())
      refs.append(weakref.ref(graph))
      del graph, w
    # The inner GradientDescentOptimizer keeps its learning-rate tensor, so
    # the newest graph may live on; the wrapper keeps no graph.
    self.assertIsNotNone(opt.store(refs[-1]()))
    self.assertEqual(_alive(refs[:-1]), 0)


if __name__ == "__main__":
  tf.test.main()
