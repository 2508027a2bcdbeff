"""store.files.load_checkpoint (and load_npz's name mapping): values, names, every error."""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests.test_errors import _StoreCase

CASES = helpers.mode_and_kind_cases()
V1, V2 = tf.train.SaverDef.V1, tf.train.SaverDef.V2


def save_checkpoint(path, values, version=V2):
  """Saves `{checkpoint name: array}` with a Saver, in a graph of its own."""
  graph = tf.Graph()
  with graph.as_default():
    var_list = dict(
      (name, tf.Variable(value, name="v%d" % i))
      for i, (name, value) in enumerate(sorted(values.items()))
    )
    saver = tf.train.Saver(var_list=var_list, write_version=version)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return saver.save(sess, path)


def save_partitioned(path, full, parts, version=V2, scope="net"):
  """Saves `full` as variable `<scope>/emb` split into `parts` partitions."""
  graph = tf.Graph()
  with graph.as_default():
    with tf.variable_scope(scope):
      emb = tf.get_variable(
        "emb",
        full.shape,
        dtype=tf.as_dtype(full.dtype),
        partitioner=tf.fixed_size_partitioner(parts),
      )
    saver = tf.train.Saver(write_version=version)
  with tf.Session(graph=graph) as sess:
    sess.run(tf.global_variables_initializer())
    for part in emb:
      info = part._save_slice_info  # pylint: disable=protected-access
      part.load(
        full[
          tuple(
            slice(o, o + n) for o, n in zip(info.var_offset, info.var_shape)
          )
        ],
        sess,
      )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return saver.save(sess, path)


def _dtypes(version):
  # TF's reader reads no float16, uint16, bool or complex tensors from V1 files.
  if version == V1:
    return (tf.float32, tf.float64, tf.int32, tf.int64, tf.int8, tf.uint8)
  return helpers.DTYPES


class LoadTest(tf.test.TestCase, parameterized.TestCase):
  def _written(self, version, scope="net", seed=5):
    """A checkpoint of helpers.Model under `scope`, with random bit patterns."""
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(scope=scope, dtypes=_dtypes(version))
      saver = tf.train.Saver(write_version=version)
    path = os.path.join(
      self.get_temp_dir(), "written_%d_%s" % (version, scope), "model.ckpt"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.Session(graph=graph) as sess:
      sess.run(tf.global_variables_initializer())
      values = model.randomize(sess, seed)
      return saver.save(sess, path), values

  @parameterized.named_parameters(
    *[
      (name + "_" + v, mode, kind, version)
      for name, mode, kind in CASES
      for v, version in (("v1", V1), ("v2", V2))
    ]
  )
  def test_bit_exact_under_another_scope_no_ops(
    self, mode, use_resource, version
  ):
    path, written = self._written(version, scope="member")
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(
        scope="net", use_resource=use_resource, dtypes=_dtypes(version)
      )
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=2)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      model.randomize(sess, 1)
      store.snapshot("good", session=sess)
      good = model.values(sess)
      live = model.randomize(sess, 2)
      helpers.assert_state_differs(live, written)
      self.assertEqual(
        store.files.load_checkpoint(
          path, tag="ckpt", strip_prefix="member", session=sess
        ),
        "ckpt",
      )
      helpers.assert_state(
        store.arrays("ckpt", session=sess), written, "loaded"
      )
      helpers.assert_state(model.values(sess), live, "live after the load")
      helpers.assert_state(
        store.arrays("good", session=sess), good, "other snapshot"
      )
      store.restore("ckpt", session=sess)
      helpers.assert_state(model.values(sess), written, "restored")

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_directory_gives_its_latest_checkpoint(self, mode):
    directory = os.path.join(self.get_temp_dir(), "run")
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        w = tf.get_variable("w", [2])
      step = tf.train.get_or_create_global_step()
      saver = tf.train.Saver()
      store = snapstore.SnapshotStore(scope="net", mode=mode)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      for value in (1.0, 2.0):
        w.load([value, value], sess)
        step.load(int(value), sess)
        saver.save(
          sess, os.path.join(directory, "model.ckpt"), global_step=step
        )
      w.load([7.0, 7.0], sess)
      with self.assertRaisesRegex(
        snapstore.IncompatibleSnapshotError,
        r"variables the store does not have: global_step",
      ):
        store.files.load_checkpoint(directory, session=sess)
      tag = store.files.load_checkpoint(
        directory, allow_extra=True, session=sess
      )
      self.assertAllEqual(store.arrays(tag, session=sess)["w"], [2.0, 2.0])
      self.assertAllEqual(sess.run(w), [7.0, 7.0])

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_mapping_dict_renames_and_skips(self, mode):
    path = save_checkpoint(
      os.path.join(self.get_temp_dir(), "m", "model.ckpt"),
      {
        "first": np.float32([1, 2]),
        "second": np.int64(3),
        "net/junk": np.float32(0),
      },
    )
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("a", [2])
        tf.get_variable("b", [], tf.int64)
      store = snapstore.SnapshotStore(scope="net", mode=mode)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      store.files.load_checkpoint(
        path,
        tag="t",
        session=sess,
        mapping={"first": "a", "second": "b", "net/junk": None},
      )
      arrays = store.arrays("t", session=sess)
    self.assertAllEqual(arrays["a"], [1, 2])
    self.assertEqual(arrays["b"], 3)

  def test_object_based_checkpoint_through_a_mapping_function(self):
    graph = tf.Graph()
    with graph.as_default():
      var = tf.Variable([1.5, 2.5], name="kernel")
      checkpoint = tf.train.Checkpoint(kernel=var)
      with tf.Session() as sess:
        sess.run(var.initializer)
        path = checkpoint.save(
          os.path.join(self.get_temp_dir(), "obj", "ckpt"), session=sess
        )

    def from_object_names(name):
      if name.startswith("save_counter/"):
        return None
      return name.replace("/.ATTRIBUTES/VARIABLE_VALUE", "")

    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("kernel", [2])
      store = snapstore.SnapshotStore(scope="net", mode="host")
    store.files.load_checkpoint(path, tag="obj", mapping=from_object_names)
    self.assertAllEqual(store.arrays("obj")["kernel"], [1.5, 2.5])

  def test_add_prefix_for_a_store_keyed_by_full_names(self):
    path = save_checkpoint(
      os.path.join(self.get_temp_dir(), "p", "model.ckpt"),
      {"member/w": np.float32([4, 5]), "global_step": np.int64(9)},
    )
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        w = tf.get_variable("w", [2])
      store = snapstore.SnapshotStore(var_list=[w], mode="host")  # key "net/w"
    self.assertEqual(store.keys, ("net/w",))
    store.files.load_checkpoint(
      path, tag="t", strip_prefix="member", add_prefix="net", allow_extra=True
    )
    self.assertAllEqual(store.arrays("t")["net/w"], [4, 5])

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_partitioned_variable_from_any_partitioning(self, mode):
    full = np.arange(40, dtype=np.float32).reshape(10, 4)
    path = save_partitioned(
      os.path.join(self.get_temp_dir(), "parts", "model.ckpt"), full, parts=3
    )
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable(
          "emb", [10, 4], partitioner=tf.fixed_size_partitioner(2)
        )
      with tf.variable_scope("whole"):
        tf.get_variable("emb", [10, 4])
      parts = snapstore.SnapshotStore(
        scope="net", mode=mode, name="parts", max_to_keep=2
      )
      whole = snapstore.SnapshotStore(scope="whole", mode=mode, name="whole")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      parts.files.load_checkpoint(path, tag="p", session=sess)
      parts.files.load_checkpoint(
        path,
        tag="mapped",
        mapping={"net/emb": "emb"},
        strip_prefix="",
        session=sess,
      )
      whole.files.load_checkpoint(
        path, tag="w", strip_prefix="net", session=sess
      )
      self.assertEqual(parts.keys, ("emb/part_0", "emb/part_1"))
      arrays = parts.arrays("p", session=sess)
      self.assertAllEqual(arrays["emb/part_0"], full[:5])
      self.assertAllEqual(arrays["emb/part_1"], full[5:])
      self.assertAllEqual(whole.arrays("w", session=sess)["emb"], full)
      helpers.assert_state(parts.arrays("mapped", session=sess), arrays)

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_load_npz_maps_names_the_same_way(self, mode):
    path = os.path.join(self.get_temp_dir(), "named.npz")
    np.savez(path, **{"member/w": np.float32([3, 4]), "step": np.int64(1)})
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("w", [2])
      store = snapstore.SnapshotStore(scope="net", mode=mode)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      with helpers.assert_raises_naming(
        self,
        snapstore.IncompatibleSnapshotError,
        r"variables the store does not have: step\b",
        r"strip_prefix='member'",
        r"allow_extra=True",
      ):
        store.files.load_npz(path, strip_prefix="member", session=sess)
      store.files.load_npz(
        path, tag="n", strip_prefix="member", allow_extra=True, session=sess
      )
      self.assertAllEqual(store.arrays("n", session=sess)["w"], [3, 4])


class CheckpointErrorsTest(_StoreCase):
  """Each bad input: its message, and the store and variables unchanged."""

  def _checkpoint(self, values, name="bad", version=V2):
    return save_checkpoint(
      os.path.join(self.get_temp_dir(), name, "model.ckpt"), values, version
    )

  def _good_values(self):
    return {
      "net/v0_float32": np.full([3, 5], 7, np.float32),
      "net/v1_int32": np.full([3, 5], 7, np.int32),
    }

  def _load(self, path, **kwargs):
    return self.store.files.load_checkpoint(
      path, tag="new", session=self.sess, **kwargs
    )

  @parameterized.named_parameters(*CASES)
  def test_no_checkpoint_at_path(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = os.path.join(self.get_temp_dir(), "nowhere", "model.ckpt")
    with self.assertRaisesRegex(
      snapstore.CheckpointError, r"No checkpoint at \S*nowhere/model\.ckpt\b"
    ):
      self._load(path)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_directory_without_checkpoint_file(self, mode, use_resource):
    self._setup(mode, use_resource)
    with self.assertRaisesRegex(
      snapstore.CheckpointError, r"is a directory with no 'checkpoint' file"
    ):
      self._load(self.get_temp_dir())
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_not_a_checkpoint(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = os.path.join(self.get_temp_dir(), "notes.txt")
    with open(path, "w") as f:
      f.write("not a checkpoint\n" * 100)
    with self.assertRaisesRegex(
      snapstore.CheckpointError, r"notes\.txt is not a TensorFlow checkpoint"
    ):
      self._load(path)
    self.assertIsInstance(
      snapstore.CheckpointError("x"), snapstore.SnapshotFileError
    )
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_one_file_of_a_checkpoint(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = self._checkpoint(self._good_values())
    with self.assertRaisesRegex(
      snapstore.CheckpointError,
      r"model\.ckpt\.index is one file of checkpoint \S*/model\.ckpt\b",
    ):
      self._load(path + ".index")
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_each_mismatch_alone(self, mode, use_resource):
    self._setup(mode, use_resource)
    good = self._good_values()
    # (what the message names, whether it offers allow_extra=True, the values):
    # only names that map to no variable can be skipped.
    cases = [
      (
        r"missing variables: v1_int32\b",
        False,
        {"net/v0_float32": good["net/v0_float32"]},
      ),
      (
        r"variables the store does not have: surplus\b",
        True,
        dict(good, **{"net/surplus": np.zeros([2], np.float32)}),
      ),
      (
        r"v1_int32 has shape \(15,\), the variable has shape \(3, 5\)",
        False,
        dict(good, **{"net/v1_int32": np.zeros([15], np.int32)}),
      ),
      (
        r"v1_int32 has dtype int64, the variable has dtype int32",
        False,
        dict(good, **{"net/v1_int32": np.zeros([3, 5], np.int64)}),
      ),
    ]
    for i, (message, offers_allow_extra, values) in enumerate(cases):
      with self.assertRaisesRegex(
        snapstore.IncompatibleSnapshotError, message
      ) as caught:
        self._load(self._checkpoint(values, "case_%d" % i))
      self.assertEqual(
        "allow_extra=True" in str(caught.exception), offers_allow_extra, message
      )
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_every_mismatch_named_together(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = self._checkpoint(
      {
        "net/v0_float32": np.zeros([5, 3], np.float64),
        "net/other/extra": np.zeros([1], np.int8),
        "beta1_power": np.float32(0.9),
      },
      version=V1,
    )
    with helpers.assert_raises_naming(
      self,
      snapstore.IncompatibleSnapshotError,
      r"Checkpoint \S*bad/model\.ckpt does not match",
      r"missing variables: v1_int32\b",
      r"variables the store does not have: beta1_power, other/extra\b",
      r"v0_float32 has shape \(5, 3\), the variable has shape \(3, 5\)",
      r"v0_float32 has dtype float64, the variable has dtype float32",
    ):
      self._load(path)
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_extra_variables_allowed_when_asked(self, mode, use_resource):
    self._setup(mode, use_resource)
    values = dict(
      self._good_values(),
      **{"net/dense/kernel/Adam": np.zeros([2]), "global_step": np.int64(4)},
    )
    path = self._checkpoint(values)
    with self.assertRaisesRegex(
      snapstore.IncompatibleSnapshotError,
      r"variables the store does not have: dense/kernel/Adam, global_step\b",
    ):
      self._load(path)
    self.assertUnchanged()  # which restores 'good' into the variables
    self.assertEqual(self._load(path, allow_extra=True), "new")
    helpers.assert_state(
      self.store.arrays("new", session=self.sess),
      {
        "v0_float32": values["net/v0_float32"],
        "v1_int32": values["net/v1_int32"],
      },
    )
    helpers.assert_state(self.model.values(self.sess), self.good, "live state")

  @parameterized.named_parameters(*CASES)
  def test_mapping_sends_two_names_to_one_variable(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = self._checkpoint(self._good_values())
    with self.assertRaisesRegex(
      ValueError,
      r"both 'net/v0_float32' and 'net/v1_int32' to variable 'v0_float32'",
    ):
      self._load(
        path,
        mapping={"net/v0_float32": "v0_float32", "net/v1_int32": "v0_float32"},
      )
    # A mapping entry and the prefix rule that send two names to one key.
    with helpers.assert_raises_naming(
      self,
      ValueError,
      r"'net/v0_float32' and 'net/v1_int32' both map to 'v0_float32'",
      r"mapping=\{'net/v1_int32': None\}",
    ):
      self._load(path, mapping={"net/v1_int32": "v0_float32"})
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_bad_mappings(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = self._checkpoint(self._good_values())
    with self.assertRaisesRegex(
      ValueError, r"'net/v0_float32' to 'v9', which is not a key"
    ):
      self._load(path, mapping={"net/v0_float32": "v9"})
    with self.assertRaisesRegex(
      snapstore.IncompatibleSnapshotError,
      r"mapping names net/missing, which the file does not",
    ):
      self._load(
        path, mapping={"net/missing": "v0_float32", "net/v0_float32": None}
      )
    with self.assertRaisesRegex(
      ValueError, r"mapping function or strip_prefix/add_prefix, not both"
    ):
      self._load(path, mapping=lambda name: name, strip_prefix="net")
    with self.assertRaisesRegex(
      TypeError, r"mapping function returned 3 for 'net/v0_float32'"
    ):
      self._load(path, mapping=lambda name: 3)
    with self.assertRaisesRegex(
      TypeError, r"mapping must be a dict .*got \['a'\]"
    ):
      self._load(path, mapping=["a"])
    with self.assertRaisesRegex(
      TypeError, r"mapping entries must be .*got 'a': 1"
    ):
      self._load(path, mapping={"a": 1})
    with self.assertRaisesRegex(TypeError, r"strip_prefix must be a string"):
      self._load(path, strip_prefix=3)
    with self.assertRaisesRegex(
      TypeError, r"checkpoint path must be a string.*got None"
    ):
      self._load(None)
    with self.assertRaisesRegex(
      ValueError, r"checkpoint path must not be empty"
    ):
      self._load("")
    self.assertUnchanged()

  @parameterized.named_parameters(*CASES)
  def test_truncated_data_file(self, mode, use_resource):
    self._setup(mode, use_resource)
    path = self._checkpoint(self._good_values())
    data = path + ".data-00000-of-00001"
    with open(data, "r+b") as f:
      f.truncate(os.path.getsize(data) // 2)
    with self.assertRaisesRegex(
      snapstore.CheckpointError,
      r"Reading 'net/v\d_\w+' from checkpoint \S*bad/model\.ckpt failed",
    ):
      self._load(path)
    self.assertUnchanged()


class PartitionedErrorsTest(tf.test.TestCase, parameterized.TestCase):
  def _store(self):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable(
          "emb", [10, 4], partitioner=tf.fixed_size_partitioner(2)
        )
      return snapstore.SnapshotStore(scope="net", mode="host")

  def test_v1_sliced_variable(self):
    path = save_partitioned(
      os.path.join(self.get_temp_dir(), "v1", "model.ckpt"),
      np.ones([10, 4], np.float32),
      parts=2,
      version=V1,
    )
    store = self._store()
    with helpers.assert_raises_naming(
      self,
      snapstore.CheckpointError,
      r"Reading 'net/emb' .*stored in slices by a V1 checkpoint",
      r"save the checkpoint again in the V2 format",
    ):
      store.files.load_checkpoint(path)
    self.assertEqual(store.tags(), [])

  def test_v1_dtype_the_reader_cannot_read(self):
    path = save_checkpoint(
      os.path.join(self.get_temp_dir(), "half", "model.ckpt"),
      {"net/h": np.ones([2], np.float16)},
      version=V1,
    )
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("h", [2], tf.float16)
      store = snapstore.SnapshotStore(scope="net", mode="host")
    with helpers.assert_raises_naming(
      self,
      snapstore.CheckpointError,
      r"Reading 'net/h' .*cannot read dtype float16 from a V1 checkpoint",
      r"save the checkpoint again in the V2 format",
    ):
      store.files.load_checkpoint(path)
    self.assertEqual(store.tags(), [])

  def test_whole_of_another_shape(self):
    path = save_partitioned(
      os.path.join(self.get_temp_dir(), "v2", "model.ckpt"),
      np.ones([12, 4], np.float32),
      parts=3,
    )
    store = self._store()
    with self.assertRaisesRegex(
      snapstore.IncompatibleSnapshotError,
      r"emb has shape \(12, 4\), the partitioned variable has shape \(10, 4\)",
    ):
      store.files.load_checkpoint(path)
    self.assertEqual(store.tags(), [])


if __name__ == "__main__":
  tf.test.main()
