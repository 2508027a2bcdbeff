"""TF2 object-based checkpoints and name-based ones, loaded by an eager store."""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values


def _trained(seed):
  model = common.small_model(seed=seed)
  opt = keras.optimizers.Adam(0.01)
  model.compile(opt, "mse")
  x, y = common.batches(1, seed=seed)[0]
  model.fit(x, y, epochs=2, verbose=0)
  return model, opt


@pytest.mark.parametrize("mode", common.MODES)
def test_an_object_based_checkpoint_loads_by_its_object_graph(mode, tmp_path):
  model, opt = _trained(0)
  path = tf.train.Checkpoint(model=model, optimizer=opt).write(
    str(tmp_path / "ckpt")
  )
  store = snapstore.SnapshotStore(
    var_list=model,
    optimizer=opt,
    mode=mode,
    **common.mode_options(mode, tmp_path),
  )
  state = list(store.variables.values())
  written = values(state)
  x, y = common.batches(1, seed=5)[0]
  model.fit(x, y, epochs=1, verbose=0)  # the live values move on
  tag = store.files.load_checkpoint(
    path, root={"model": model, "optimizer": opt}
  )
  store.restore(tag)
  assert_bits_equal(written, values(state))
  store.close()


def test_root_with_a_name_based_checkpoint_is_refused(tmp_path):
  v = tf.Variable(np.ones(3, np.float32), name="v")
  with tf.Graph().as_default():
    g = tf.compat.v1.Variable(np.ones(3, np.float32), name="v")
    saver = tf.compat.v1.train.Saver([g])
    with tf.compat.v1.Session() as sess:
      sess.run(g.initializer)
      path = saver.save(sess, str(tmp_path / "named"))
  store = snapstore.SnapshotStore(var_list=[v])
  with pytest.raises(snapstore.CheckpointError, match="name-based checkpoint"):
    store.files.load_checkpoint(path, root={"v": v})
  tag = store.files.load_checkpoint(path)  # names are keys: "v"
  v.assign(tf.zeros([3]))
  store.restore(tag)
  assert v.numpy().tolist() == [1.0, 1.0, 1.0]


def test_root_with_a_mapping_is_refused(tmp_path):
  v = tf.Variable(1.0, name="v")
  path = tf.train.Checkpoint(v=v).write(str(tmp_path / "c"))
  store = snapstore.SnapshotStore(var_list=[v])
  with pytest.raises(TypeError, match="pass no mapping"):
    store.files.load_checkpoint(path, root={"v": v}, mapping={"a": "v"})
