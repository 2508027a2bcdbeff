"""Every user-facing error: its message, and that nothing was changed."""

import io
import os
import zipfile

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

CASES = helpers.mode_and_kind_cases()


class _StoreCase(tf.test.TestCase, parameterized.TestCase):
  """A model and store with one snapshot ('good'), and live state != snapshot."""

  def _setup(self, mode, use_resource):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = helpers.Model(
        use_resource=use_resource, dtypes=(tf.float32, tf.int32)
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=3
      )
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.model.randomize(self.sess, seed=1)
    self.store.snapshot("good", session=self.sess)
    self.good = self.model.values(self.sess)
    self.live = self.model.randomize(self.sess, seed=2)
    self.tags = self.store.tags()

  def assertUnchanged(self):
    helpers.assert_state(self.model.values(self.sess), self.live, "live state")
    self.assertEqual(self.store.tags(), self.tags)
    self.store.restore("good", session=self.sess)  # the snapshot is intact
    helpers.assert_state(self.model.values(self.sess), self.good, "snapshot")

  def _npz(self, arrays, name="x.npz"):
    path = os.path.join(self.get_temp_dir(), name)
    np.savez(path, **arrays)
    return path

  def _good_arrays(self):
    return {
      "v0_float32": np.zeros([3, 5], np.float32),
      "v1_int32": np.zeros([3, 5], np.int32),
    }


class TagErrorsTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_unknown_tag_lists_existing(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.store.snapshot(4, session=self.sess)
    self.live = self.model.values(self.sess)
    self.tags = self.store.tags()
    for call in (
      lambda: self.store.restore("bad", session=self.sess),
      lambda: self.store.evaluate_with([], tag="bad", session=self.sess),
      lambda: self.store.arrays("bad", session=self.sess),
      lambda: self.store.delete("bad"),
    ):
      with self.assertRaisesRegex(
        snapstore.UnknownTagError, r"No snapshot tagged 'bad'.*'good', 4\b"
      ):
        call()
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_restore_from_empty_store(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.store.delete("good")
    with self.assertRaisesRegex(
      snapstore.UnknownTagError,
      "holds no snapshots yet; take one with snapshot",
    ):
      self.store.restore(session=self.sess)
    helpers.assert_state(self.model.values(self.sess), self.live)

  @parameterized.named_parameters(*CASES)
  def test_bad_tag_type(self, mode, use_resource):
    self._setup(mode, use_resource)
    for tag in (1.5, True, "", ("a",)):
      with self.assertRaisesRegex(
        TypeError, "A tag must be an int or a non-empty string"
      ):
        self.store.snapshot(tag, session=self.sess)
    self.assertUnchanged()


class SessionErrorsTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_session_of_another_graph(self, mode, use_resource):
    self._setup(mode, use_resource)
    other_graph = tf.Graph()
    with other_graph.as_default():
      tf.Variable(1.0)
    with tf.Session(graph=other_graph) as other:
      for call in (self.store.snapshot, self.store.restore, self.store.recover):
        with self.assertRaisesRegex(
          snapstore.GraphMismatchError,
          r"session belongs to another graph than the store's variables",
        ):
          call(session=other)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_no_session(self, mode, use_resource):
    self._setup(mode, use_resource)
    self.assertIsNone(tf.get_default_session())
    with helpers.assert_raises_naming(
      self,
      snapstore.NoSessionError,
      r"restore\(\) needs a session",
      r"session=",
      r"session\.as_default\(\)",
    ):
      self.store.restore()
    with self.assertRaisesRegex(
      snapstore.NoSessionError, r"snapshot\(\) needs a session"
    ):
      self.store.snapshot()
    self.assertUnchanged()

  def test_not_a_session(self):
    self._setup("host", False)
    with self.assertRaisesRegex(TypeError, "session must be a tf.Session"):
      self.store.snapshot(session=object())
    self.assertUnchanged()


class NpzErrorsTest(_StoreCase):
  @parameterized.named_parameters(*CASES)
  def test_missing_extra_shape_and_dtype_named_together(
    self, mode, use_resource
  ):
    self._setup(mode, use_resource)
    path = self._npz(
      {
        "v0_float32": np.zeros([5, 3], np.float64),
        "surplus": np.zeros([2], np.float32),
        "other/extra": np.zeros([1], np.int8),
      }
    )
    with helpers.assert_raises_naming(
      self,
      snapstore.IncompatibleSnapshotError,
      r"x\.npz does not match",
      r"missing variables: v1_int32\b",
      r"variables the store does not have: other/extra, surplus\b",
      r"v0_float32 has shape \(5, 3\), the variable has shape \(3, 5\)",
      r"v0_float32 has dtype float64, the variable has dtype float32",
    ):
      self.store.files.load_npz(path, session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_each_problem_alone(self, mode, use_resource):
    self._setup(mode, use_resource)
    cases = {
      "missing variables: v1_int32": {
        "v0_float32": np.zeros([3, 5], np.float32)
      },
      "variables the store does not have: w": dict(
        self._good_arrays(), w=np.zeros(1)
      ),
      r"v1_int32 has shape \(15,\), the variable has shape \(3, 5\)": dict(
        self._good_arrays(), v1_int32=np.zeros([15], np.int32)
      ),
      "v1_int32 has dtype int64, the variable has dtype int32": dict(
        self._good_arrays(), v1_int32=np.zeros([3, 5], np.int64)
      ),
    }
    for message, arrays in cases.items():
      with self.assertRaisesRegex(snapstore.IncompatibleSnapshotError, message):
        self.store.files.load_npz(self._npz(arrays), session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_pickled_npz(self, mode, use_resource):
    self._setup(mode, use_resource)
    arrays = self._good_arrays()
    arrays["v1_int32"] = np.array([{"evil": 1}] * 15, dtype=object).reshape(
      3, 5
    )
    path = self._npz(arrays)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"holds pickled Python objects in v1_int32"
    ):
      self.store.files.load_npz(path, session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_not_an_npz(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = os.path.join(self.get_temp_dir(), "junk.npz")
    with open(path, "wb") as f:
      f.write(b"this is not a zip archive" * 10)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"junk\.npz is not an \.npz archive"
    ):
      self.store.files.load_npz(path, session=self.sess)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"junk\.npz\.missing: no such file"
    ):
      self.store.files.load_npz(path + ".missing", session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_corrupt_member_data(self, mode, use_resource):
    self._setup(mode, use_resource)
    good = self._npz(self._good_arrays(), "good.npz")
    data = bytearray(open(good, "rb").read())
    # Flip a byte inside the first member's array data (after its header).
    data[200] ^= 0xFF
    path = os.path.join(self.get_temp_dir(), "flipped.npz")
    with open(path, "wb") as f:
      f.write(bytes(data))
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError,
      r"flipped\.npz: array '\w+' (is truncated or corrupt|has no valid)",
    ):
      self.store.files.load_npz(path, session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_member_that_is_not_an_array(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = os.path.join(self.get_temp_dir(), "readme.npz")
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros([3, 5], np.float32))
    with zipfile.ZipFile(path, "w") as zf:
      zf.writestr("v0_float32.npy", buf.getvalue())
      zf.writestr("README.txt", "hello")
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError,
      r"holds 'README\.txt', which is not a \.npy array",
    ):
      self.store.files.load_npz(path, session=self.sess)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_load_arrays_checks_like_npz(self, mode, use_resource):
    self._setup(mode, use_resource)
    with self.assertRaisesRegex(
      snapstore.IncompatibleSnapshotError, r"missing variables: v1_int32\b"
    ):
      self.store.load_arrays(
        {"v0_float32": np.zeros([3, 5], np.float32)}, session=self.sess
      )
    self.assertUnchanged()

  def test_save_into_missing_directory(self):
    self._setup("host", False)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError,
      r"Cannot write .*: directory .*nowhere does not exist",
    ):
      self.store.files.save_npz(
        os.path.join(self.get_temp_dir(), "nowhere", "x.npz")
      )
    self.assertUnchanged()


class ConstructionErrorsTest(tf.test.TestCase, parameterized.TestCase):
  def test_unknown_mode_lists_valid_ones(self):
    with tf.Graph().as_default():
      helpers.Model()
      with self.assertRaisesRegex(
        ValueError, r"Invalid mode 'gpu'; must be one of device, disk, host"
      ):
        snapstore.SnapshotStore(mode="gpu")

  def test_chief_only_that_is_not_a_bool(self):
    with tf.Graph().as_default():
      helpers.Model()
      with self.assertRaisesRegex(
        TypeError, r"^chief_only must be True or False, got 'no'\.$"
      ):
        snapstore.SnapshotStore(chief_only="no")

  def test_unknown_mode_option(self):
    with tf.Graph().as_default():
      helpers.Model()
      # The message names the option and lists the valid ones.
      with helpers.assert_raises_naming(
        self,
        TypeError,
        r"Mode 'host' takes no option saveable",
        r"spill_path, compression, compression_opts, max_pending, durable\b",
      ):
        snapstore.SnapshotStore(mode="host", saveable=True)
      with helpers.assert_raises_naming(
        self,
        TypeError,
        r"Mode 'device' takes no option colour",
        r"saveable, pack, spill_path, compression, compression_opts, max_pending, durable\b",
      ):
        snapstore.SnapshotStore(mode="device", colour=1)

  def test_empty_variable_sets(self):
    with tf.Graph().as_default():
      helpers.Model()
      with self.assertRaisesRegex(
        ValueError, r"collection 'variables' under scope 'nothing' is empty"
      ):
        snapstore.SnapshotStore(scope="nothing")
      with self.assertRaisesRegex(ValueError, r"var_list is empty"):
        snapstore.SnapshotStore(var_list=[])
      with self.assertRaisesRegex(
        ValueError,
        r"collection 'model_variables' of the default graph is empty",
      ):
        snapstore.SnapshotStore(collection=tf.GraphKeys.MODEL_VARIABLES)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
        ValueError,
        r"collection 'trainable_variables' of the default graph is empty",
      ):
        snapstore.SnapshotStore()

  def test_scope_does_not_match_longer_names(self):
    with tf.Graph().as_default():
      with tf.variable_scope("net2"):
        tf.get_variable("w", [1])
      with self.assertRaisesRegex(ValueError, "scope 'net' is empty"):
        snapstore.SnapshotStore(scope="net")

  def test_var_list_and_collection(self):
    with tf.Graph().as_default():
      v = tf.Variable(1.0)
      with self.assertRaisesRegex(
        ValueError, "Pass var_list or collection, not both"
      ):
        snapstore.SnapshotStore(
          var_list=[v], collection=tf.GraphKeys.GLOBAL_VARIABLES
        )

  def test_non_variables(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
        TypeError, r"var_list holds .*Tensor.*not a tf\.Variable"
      ):
        snapstore.SnapshotStore(var_list=[tf.constant(1.0)])
      tf.add_to_collection("stuff", tf.constant(1.0))
      with self.assertRaisesRegex(
        TypeError, r"Collection 'stuff' holds .*not a variable"
      ):
        snapstore.SnapshotStore(collection="stuff")

  def test_duplicate_keys(self):
    with tf.Graph().as_default():
      with tf.variable_scope("a"):
        inside = tf.get_variable("w", [1])
      outside = tf.get_variable("w", [1])  # keeps its full name "w" as key
      with helpers.assert_raises_naming(
        self, ValueError, r"a/w:0 and w:0 both map to key 'w'", r"dict var_list"
      ):
        snapstore.SnapshotStore(var_list=[inside, outside], scope="a")
      store = snapstore.SnapshotStore(
        var_list={"inner": inside, "outer": outside}
      )
      self.assertEqual(store.keys, ("inner", "outer"))

  def test_unknown_shape_and_unsupported_dtype(self):
    with tf.Graph().as_default():
      v = tf.Variable(
        tf.zeros([3]), validate_shape=False, shape=tf.TensorShape(None)
      )
      with self.assertRaisesRegex(
        ValueError, r"has shape <unknown>, which is not fully defined"
      ):
        snapstore.SnapshotStore(var_list=[v])
      s = tf.Variable("text")
      with self.assertRaisesRegex(
        ValueError, r"has dtype string, which snapstore does not support"
      ):
        snapstore.SnapshotStore(var_list=[s])

  def test_variables_of_two_graphs(self):
    with tf.Graph().as_default():
      a = tf.Variable(1.0, name="a")
    with tf.Graph().as_default():
      b = tf.Variable(1.0, name="b")
      with self.assertRaisesRegex(ValueError, "belong to 2 different graphs"):
        snapstore.SnapshotStore(var_list=[a, b])

  def test_optimizer_without_state_and_missing_global_step(self):
    with tf.Graph().as_default():
      helpers.Model(dtypes=(tf.float32,))
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"Optimizer Adam has no variables yet",
        r"train op",
        r"snapstore.create_optimizer_slots\(optimizer, var_list\)",
      ):
        snapstore.SnapshotStore(optimizer=tf.train.AdamOptimizer())
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"include_global_step=True, but the graph has no global step",
        r"get_or_create_global_step",
      ):
        snapstore.SnapshotStore(include_global_step=True)

  def test_global_step_with_sync_replicas_is_refused(self):
    # Restoring it hung training: every later gradient was stale.
    with tf.Graph().as_default():
      w = tf.Variable([1.0, 2.0], name="w")
      step = tf.train.get_or_create_global_step()
      opt = tf.train.SyncReplicasOptimizer(
        tf.train.AdamOptimizer(0.1), replicas_to_aggregate=1
      )
      opt.minimize(tf.reduce_sum(w * w), global_step=step)
      with helpers.assert_raises_naming(
        self,
        ValueError,
        r"include_global_step=True with a SyncReplicasOptimizer",
        r"token queue",
        r"hang",
        r"Leave the global step out",
      ):
        snapstore.SnapshotStore(optimizer=opt, include_global_step=True)
      store = snapstore.SnapshotStore(var_list=[w], optimizer=opt)  # built
      self.assertIn("beta1_power", store.keys)

  @parameterized.parameters(
    ("device", 0, r">= 1\b.*got 0"),
    ("device", -1, r">= 1\b.*got -1"),
    ("host", -2, r">= 0\b.*got -2"),
  )
  def test_bad_max_to_keep(self, mode, value, fragment):
    with tf.Graph().as_default():
      helpers.Model()
      with self.assertRaisesRegex(
        ValueError, "max_to_keep must be " + fragment
      ):
        snapstore.SnapshotStore(mode=mode, max_to_keep=value)
      with self.assertRaisesRegex(TypeError, "max_to_keep must be an int"):
        snapstore.SnapshotStore(mode=mode, max_to_keep=2.0)

  def test_host_only_calls_on_device_ops(self):
    with tf.Graph().as_default():
      helpers.Model()
      store = snapstore.SnapshotStore(mode="host")
      with helpers.assert_raises_naming(
        self,
        snapstore.ModeError,
        r"store\.slots",
        "mode 'host'",
        "no device slots",
        r"snapshot_op, restore_op, shadows, past",
        "mode='device' has them",
      ):
        store.slots  # pylint: disable=pointless-statement

  def test_slot_out_of_range(self):
    with tf.Graph().as_default():
      helpers.Model()
      store = snapstore.SnapshotStore(max_to_keep=2)
      with self.assertRaisesRegex(ValueError, r"slot must be <= 1\b.*got 2"):
        store.slots.snapshot_op(2)
      with self.assertRaisesRegex(TypeError, r"slot must be an int"):
        store.slots.snapshot_op(True)


if __name__ == "__main__":
  tf.test.main()
