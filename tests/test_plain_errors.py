"""Misuse that used to be dropped silently, or answered by TF or numpy internals.

Each case gets a plain error naming the problem and the fix, and changes
nothing: duplicate variables in `var_list`, a `max_to_keep` whose device slots
cannot fit in memory, a single variable as `var_list`, a list, tensors or
objects where `load_arrays` wants a dict of arrays, `evaluate_each(tags=0)`,
and a closed session (nothing runs, so nothing can be half restored).
"""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import test_errors

CASES = helpers.mode_and_kind_cases()


class VarListTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_variable_under_two_keys_is_refused(self, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource, dtypes=(tf.float32,))
      w = model.variables["v0_float32"]
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"names variable net/v0_float32:0 twice",
        r"key 'a'",
        r"key 'b'",
        r"List each variable once",
      ):
        snapstore.SnapshotStore(var_list={"a": w, "b": w})

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_variable_listed_twice_is_refused(self, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(
        use_resource=use_resource, dtypes=(tf.float32, tf.int32)
      )
      w, n = model.variables["v0_float32"], model.variables["v1_int32"]
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"names variable net/v0_float32:0 twice",
        r"at position 0 and at position 2",
      ):
        snapstore.SnapshotStore(var_list=[w, n, w])

  def test_a_part_of_a_partitioned_variable_listed_again_is_refused(self):
    with tf.Graph().as_default():
      parted = tf.get_variable(
        "p", [4, 2], partitioner=tf.fixed_size_partitioner(2)
      )
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"names variable p/part_1:0 twice",
        r"at position 0 and at position 1",
      ):
        snapstore.SnapshotStore(var_list=[parted, list(parted)[1]])

  def test_optimizer_state_also_in_var_list_is_still_fine(self):
    # Only var_list itself must name each variable once: the optimizer's and
    # the global step's variables may be listed in it too.
    with tf.Graph().as_default():
      w = tf.get_variable("w", [2])
      step = tf.train.get_or_create_global_step()
      tf.train.GradientDescentOptimizer(0.1).minimize(
        tf.reduce_sum(w), global_step=step
      )
      store = snapstore.SnapshotStore(
        var_list=[w, step], include_global_step=True
      )
      self.assertEqual(store.keys, ("w", "global_step"))  # var_list order

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_a_single_variable_as_var_list(self, use_resource):
    with tf.Graph().as_default():
      model = helpers.Model(use_resource=use_resource, dtypes=(tf.float32,))
      with helpers.assert_raises_naming(
        self,
        TypeError,
        r"got the single variable net/v0_float32:0",
        r"var_list=\[net/v0_float32\]",
      ):
        snapstore.SnapshotStore(var_list=model.variables["v0_float32"])


class DeviceSlotsMustFitTest(tf.test.TestCase):
  def test_slots_beyond_physical_memory_are_refused_before_building(self):
    with tf.Graph().as_default() as graph:
      tf.get_variable("net/w", [2, 2])
      ops = len(graph.get_operations())
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"max_to_keep=1000000000 device slots cannot fit",
        r"need \d{14,} bytes",
        r"physical memory of this machine",
        r"Lower max_to_keep",
        r"mode='host' or mode='disk'",
      ):
        snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=10**9)
      self.assertLen(graph.get_operations(), ops)  # nothing was built

  def test_large_variables_on_a_remote_task_name_the_task(self):
    with tf.Graph().as_default():
      with tf.device("/job:ps/task:1"):
        tf.get_variable("net/w", [1 << 20], dtype=tf.float64)  # 8 MiB
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"on task /job:ps/task:1",
        r"8388608 bytes of variables",
      ):
        snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=10**6)

  def test_host_and_disk_stores_allocate_per_snapshot(self):
    with tf.Graph().as_default():
      tf.get_variable("net/w", [2, 2])
      store = snapstore.SnapshotStore(
        scope="net", mode="host", max_to_keep=10**9
      )
      self.assertEqual(store.max_to_keep, 10**9)


class _StoreCase(test_errors._StoreCase):  # pylint: disable=protected-access
  """A store holding 'good', and live state != snapshot (see test_errors)."""

  def assertUnchanged(self):
    self.assertEqual(self.store.tags(), ["good"])
    helpers.assert_state(self.model.values(self.sess), self.live, "live state")


class LoadArraysTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_a_list_instead_of_a_dict(self, mode, use_resource):
    self._setup(mode, use_resource)
    values = [np.zeros([3, 5], np.float32), np.zeros([3, 5], np.int32)]
    with helpers.assert_raises_naming(
      self,
      TypeError,
      r"takes a dict \{key: numpy array\}, got list",
      r"dict\(zip\(store.keys, values\)\)",
    ):
      self.store.load_arrays(values, tag="x", session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_tensors_and_variables_instead_of_arrays(self, mode, use_resource):
    self._setup(mode, use_resource)
    with self.graph.as_default():
      tensor = tf.zeros([3, 5], tf.int32, name="zeros")
    for value, fragment in (
      (tensor, r"'v1_int32' is a tensor \(zeros:0\)"),
      (
        self.model.variables["v1_int32"],
        r"'v1_int32' is a variable \(net/v1_int32:0\)",
      ),
    ):
      with helpers.assert_raises_naming(
        self,
        TypeError,
        r"load_arrays\(\) takes numpy arrays",
        fragment,
        r"Evaluate it first \(session.run\)",
      ):
        self.store.load_arrays(
          {"v0_float32": np.zeros([3, 5], np.float32), "v1_int32": value},
          tag="x",
          session=self.sess,
        )
      self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_python_objects_instead_of_arrays(self, mode, use_resource):
    self._setup(mode, use_resource)
    with helpers.assert_raises_naming(
      self, TypeError, r"'v0_float32' holds Python objects \(dict\)"
    ):
      self.store.load_arrays(
        {"v0_float32": {}, "v1_int32": np.zeros([3, 5], np.int32)},
        tag="x",
        session=self.sess,
      )
    self.assertUnchanged()


class EvaluateEachTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_one_tag_instead_of_a_list(self, mode, use_resource):
    self._setup(mode, use_resource)
    w = self.model.variables["v0_float32"]
    for tags in (0, "good"):
      with helpers.assert_raises_naming(
        self,
        TypeError,
        r"takes a list of tags, got tags=%r" % (tags,),
        r"tags=\[%r\]" % (tags,),
        r"evaluate_with\(\.\.\., tag=%r\)" % (tags,),
      ):
        self.store.evaluate_each(w, tags=tags, session=self.sess)
      self.assertUnchanged()


class ClosedSessionTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_nothing_runs_in_a_closed_session(self, mode, use_resource):
    self._setup(mode, use_resource)
    closed = tf.Session(graph=self.graph)
    closed.close()
    w = self.model.variables["v0_float32"]
    calls = {
      "restore": lambda: self.store.restore("good", session=closed),
      "snapshot": lambda: self.store.snapshot("other", session=closed),
      "evaluate_with": lambda: self.store.evaluate_with(w, session=closed),
      "arrays": lambda: self.store.arrays("good", session=closed),
    }
    for what, call in calls.items():
      with helpers.assert_raises_naming(
        self,
        snapstore.NoSessionError,
        r"%s\(\)'s session is closed; nothing was run" % what,
        r"Pass an open session",
      ) as caught:
        call()
      self.assertNotRegex(str(caught.exception), "mix")
      self.assertUnchanged()
    self.store.restore("good", session=self.sess)
    helpers.assert_state(self.model.values(self.sess), self.good)


if __name__ == "__main__":
  tf.test.main()
