"""Guards and trials nested in each other each roll back to their own entry state.

The step doubles a float64 variable and adds one (exact in IEEE arithmetic,
so numpy computes the same bits) and counts an int64 step; every expected
state is computed in numpy from the loaded start, never read back from TF.
"""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers


def _step(state):
  return {"w": state["w"] * 2.0 + 1.0, "n": state["n"] + np.int64(1)}


class _Case(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode, use_resource, max_to_keep=3):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        w = tf.get_variable("w", [4], tf.float64)
        n = tf.get_variable(
          "n", [], tf.int64, initializer=tf.zeros_initializer()
        )
      self.vars = {"w": w, "n": n}
      self.step = tf.group(
        tf.assign(w, w * 2.0 + 1.0)
        if not use_resource
        else w.assign(w.read_value() * 2.0 + 1.0),
        tf.assign_add(n, 1) if not use_resource else n.assign_add(1),
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep
      )
    self.sess = tf.Session(graph=graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    start = {"w": np.random.RandomState(0).randn(4), "n": np.int64(7)}
    for key, value in start.items():
      self.vars[key].load(value, self.sess)
    return start

  def run_step(self):
    self.sess.run(self.step)

  def assertState(self, expected, msg):
    values = dict(zip(self.vars, self.sess.run(list(self.vars.values()))))
    helpers.assert_state(values, expected, msg)


class NestedGuardsTest(_Case):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_inner_and_outer_guard_roll_back_to_their_own_entry(
    self, mode, use_resource
  ):
    a = self._setup(mode, use_resource)
    b = _step(a)
    with snapstore.Guard(self.store, reraise=False, session=self.sess) as outer:
      self.run_step()
      with snapstore.Guard(
        self.store, reraise=False, session=self.sess
      ) as inner:
        self.run_step()
        self.run_step()
        raise ValueError("inner step failed")
      self.assertTrue(inner.failed)
      self.assertEqual((outer.tag, inner.tag), ("guard", "guard/1"))
      self.assertState(b, "inner rollback")
      self.run_step()
      raise ValueError("outer step failed")
    self.assertTrue(outer.failed)
    self.assertState(a, "outer rollback")
    # Both are done: the next guard is a top-level one again.
    with snapstore.Guard(self.store, session=self.sess) as again:
      self.assertEqual(again.tag, "guard")

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_trials_and_guards_nest_in_each_other(self, mode, use_resource):
    a = self._setup(mode, use_resource, max_to_keep=4)
    b = _step(a)
    c = _step(b)
    with snapstore.Trial(self.store, session=self.sess) as outer:  # at a
      self.run_step()
      with snapstore.Trial(self.store, session=self.sess) as middle:  # at b
        self.run_step()
        with snapstore.Guard(
          self.store, reraise=False, session=self.sess
        ) as inner:  # at c
          self.run_step()
          raise ValueError
        self.assertState(c, "guard in trial")
        middle.reject()
      self.assertEqual(
        (outer.tag, middle.tag, inner.tag), ("trial", "trial/1", "guard")
      )
      self.assertState(b, "trial in trial")
      outer.reject()
    self.assertState(a, "outer trial")

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_retries_inside_a_guard(self, mode, use_resource):
    a = self._setup(mode, use_resource)
    b = _step(a)
    with snapstore.Guard(self.store, reraise=False, session=self.sess):
      self.run_step()
      for attempt in snapstore.Guard(self.store, retries=2, session=self.sess):
        with attempt:
          self.run_step()
          self.assertState(_step(b), "attempt %d from b" % attempt.number)
          if attempt.number < 2:
            raise ValueError
      self.assertEqual(attempt.number, 2)
      self.assertState(_step(b), "kept the last attempt")
      raise ValueError
    self.assertState(a, "outer rollback")

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_an_inner_snapshot_that_would_evict_the_outer_one_is_refused(
    self, use_resource
  ):
    a = self._setup("device", use_resource, max_to_keep=1)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      r"keeps max_to_keep=1 snapshots",
      r"taking 'guard/1' would evict 'guard'",
      r"an enclosing guard or trial rolls back to",
      r"larger max_to_keep",
    ):
      with snapstore.Guard(self.store, session=self.sess):
        self.run_step()
        with snapstore.Guard(self.store, session=self.sess):
          self.fail("the inner guard must not start")
    self.assertState(a, "the outer guard rolled back")  # its snapshot was kept
    self.assertEqual(self.store.tags(), ["guard"])
    with snapstore.Guard(self.store, session=self.sess) as again:
      self.assertEqual(again.tag, "guard")

  def test_evicts_tells_which_snapshot_would_go(self):
    self._setup("host", False, max_to_keep=2)
    self.assertIsNone(self.store.evicts())
    self.store.snapshot("x", session=self.sess)
    self.store.snapshot("y", session=self.sess)
    self.assertEqual(self.store.evicts("z"), "x")
    self.assertIsNone(self.store.evicts("y"))
    self.assertEqual(self.store.tags(), ["x", "y"])


if __name__ == "__main__":
  tf.test.main()
