"""Sessions and graphs a store, hook or optimizer met are not kept alive by it.

An Estimator builds a new graph and session for every train() call; a cache
that kept them would grow without bound in a long job.
"""
import gc
import weakref

import snapstore
from snapstore._tf import tf
from tests import helpers


def _alive(refs):
  gc.collect()
  return sum(r() is not None for r in refs)


class LifetimeTest(tf.test.TestCase):

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
    hook = snapstore.SnapshotHook(lambda: snapstore.SnapshotStore(mode="host"),
                                  every_n_steps=1)
    refs = []
    for _ in range(3):  # like three Estimator.train() calls
      graph = tf.Graph()
      with graph.as_default():
        tf.get_variable("w", [4])
        tf.train.get_or_create_global_step()
        hook.begin()
      refs.append(weakref.ref(graph))
      del graph
    hook = None
    self.assertEqual(_alive(refs), 0)


if __name__ == "__main__":
  tf.test.main()
