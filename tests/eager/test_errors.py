"""Every refusal of the eager engine, one test each, with its message."""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import keras


def _v(name="v"):
  return tf.Variable(np.zeros(3, np.float32), name=name)


def test_session_is_refused():
  store = snapstore.SnapshotStore(var_list=[_v()])
  with pytest.raises(
    TypeError,
    match=r"snapshot\(\) got session=.*runs "
    "eagerly.*without session=",
  ):
    store.snapshot(session=object())
  assert store.tags() == []


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(scope="net"), "scope= is for graph mode"),
    (dict(collection="trainable_variables"), "collection= is for graph mode"),
    (dict(include_global_step=True), "include_global_step=True is for graph"),
  ],
)
def test_graph_only_arguments_are_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    snapstore.SnapshotStore(var_list=[_v()], **kwargs)


def test_chief_only_false_is_refused():
  # Between-graph replication's opt-in; an eager store shares nothing so.
  with pytest.raises(
    ValueError,
    match=r"^chief_only=False is for graph mode's between-graph "
    r"replication, .* Leave chief_only out\.$",
  ):
    snapstore.SnapshotStore(var_list=[_v()], chief_only=False)


def test_no_var_list_is_refused():
  with pytest.raises(ValueError, match="An eager store needs var_list="):
    snapstore.SnapshotStore()


def test_a_single_variable_is_refused():
  with pytest.raises(TypeError, match=r"single variable v.*var_list=\[v\]"):
    snapstore.SnapshotStore(var_list=_v())


def test_non_variables_are_refused():
  with pytest.raises(TypeError, match="which is not a tf.Variable"):
    snapstore.SnapshotStore(var_list=[tf.constant(1.0)])


def test_duplicate_keys_are_refused_with_the_fix():
  # A list's names that collide are keyed by position; a name that is an
  # optimizer's key is still two variables under one key.
  w = _v("w")
  opt = keras.optimizers.SGD(0.1)
  opt.build([w])
  with pytest.raises(
    ValueError, match="both have the key 'optimizer/iteration'.*as a dict"
  ):
    snapstore.SnapshotStore(
      var_list=[w, _v("optimizer/iteration")], optimizer=opt
    )


def test_a_variable_listed_twice_is_refused():
  v = _v()
  with pytest.raises(ValueError, match="names variable v:0 twice"):
    snapstore.SnapshotStore(var_list={"a": v, "b": v})
  with pytest.raises(
    ValueError,
    match="names variable v:0 twice: at position 0 and at position 2",
  ):
    snapstore.SnapshotStore(var_list=[v, _v("w"), v])


def test_the_optimizer_state_in_var_list_too_is_refused():
  w = _v("w")
  opt = keras.optimizers.Adam(0.1)
  opt.build([w])
  iterations = opt.iterations
  if common.KERAS_3:
    iterations = iterations.value
  with pytest.raises(
    ValueError,
    match=r"is covered twice \(as '(\w+/)?iteration' and 'optimizer/iteration'\).*"
    "List each variable once",
  ):
    snapstore.SnapshotStore(var_list=[w, iterations], optimizer=opt)


def test_a_graph_variable_is_refused():
  with tf.Graph().as_default():
    g = tf.compat.v1.Variable(1.0, name="g", use_resource=True)
  with pytest.raises(ValueError, match="belongs to a TF1 graph"):
    snapstore.SnapshotStore(var_list=[g])


def test_building_inside_a_tf_function_is_refused():
  v = _v()

  @tf.function
  def build():
    snapstore.SnapshotStore(var_list=[v])
    return 0

  with pytest.raises(snapstore.ModeError, match="inside a tf.function"):
    build()


@pytest.mark.parametrize(
  "option, match",
  [
    ("pack", "pack=True is for graph mode"),
    ("saveable", "saveable=True puts graph-mode"),
  ],
)
def test_graph_only_device_options_are_refused(option, match):
  with pytest.raises(ValueError, match=match):
    snapstore.SnapshotStore(var_list=[_v()], **{option: True})


def test_evaluate_with_needs_a_callable_and_no_feed_dict():
  v = _v()
  store = snapstore.SnapshotStore(var_list=[v])
  store.snapshot()
  with pytest.raises(TypeError, match="takes a Python callable"):
    store.evaluate_with(v)
  with pytest.raises(TypeError, match="takes no feed_dict"):
    store.evaluate_with(lambda: 1, feed_dict={"x": 1})
  with pytest.raises(TypeError, match="takes a Python callable"):
    store.evaluate_each([v])


@pytest.mark.parametrize(
  "call, match",
  [
    (lambda s: s.initializer, "initialized when the store makes them"),
    (lambda s: s.snapshot_op(0), r"store.snapshot\(\)"),
    (lambda s: s.restore_op(0), r"store.restore\(\)"),
    (lambda s: s.snapshot_before(lambda: None), "snapshot_in_step"),
  ],
)
def test_graph_only_slot_calls_name_the_eager_way(call, match):
  store = snapstore.SnapshotStore(var_list=[_v()])
  with pytest.raises(snapstore.ModeError, match="is for graph mode.*" + match):
    call(store.slots)


def test_host_mode_has_no_slots():
  store = snapstore.SnapshotStore(var_list=[_v()], mode="host")
  with pytest.raises(snapstore.ModeError, match="mode='device' has them"):
    store.slots  # pylint: disable=pointless-statement


def test_an_unbuilt_optimizer_without_a_model_is_refused():
  v = _v()
  opt = keras.optimizers.Adam(0.1)
  with pytest.raises(ValueError, match=r"has not built its state.*build\("):
    snapstore.SnapshotStore(var_list=[v], optimizer=opt)


def test_a_v1_optimizer_is_refused():
  with pytest.raises(TypeError, match="takes a Keras optimizer"):
    snapstore.SnapshotStore(
      var_list=[_v()], optimizer=tf.compat.v1.train.AdamOptimizer()
    )


@pytest.mark.skipif(
  common.KERAS_3, reason="legacy optimizers are tf-keras/Keras 2 only"
)
def test_an_unbuilt_legacy_optimizer_is_refused():
  model = common.small_model()
  opt = keras.optimizers.legacy.Adam(0.1)
  with pytest.raises(ValueError, match="legacy Keras optimizer.*first step"):
    snapstore.SnapshotStore(var_list=model, optimizer=opt)


def test_an_unbuilt_model_is_refused():
  model = keras.Sequential([keras.layers.Dense(2)])
  with pytest.raises(ValueError, match="no variables yet; build it first"):
    snapstore.SnapshotStore(var_list=model)


def test_clone_names_the_eager_way():
  with pytest.raises(snapstore.CloneError, match="clone_model"):
    snapstore.clone([tf.constant(1.0)])


def test_ensemble_names_the_eager_way():
  store = snapstore.SnapshotStore(var_list=[_v()])
  with pytest.raises(snapstore.ModeError, match="store.evaluate_each"):
    snapstore.Ensemble(store, tf.constant(1.0))
