"""Keys that follow the model, a slot from another model, a slot in checkpoints.

- `store.keys` (and `arrays()`, `slots.shadows()`) come in `model.weights`
  order, so that `zip(store.keys, model.get_weights())` pairs each key with
  its own weight; `key_of` and `variable_of` map weights to keys and back.
- `load_arrays(other_model)` stores a second model's values, paired by
  where each variable sits in the model (not by its automatic name).
- `slots.trackable(k)` puts a slot in a `tf.train.Checkpoint`, under the
  model's own structure: it restores into a network built with other names.
"""

import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras


def _net(seed, dropout=False):
  keras.utils.set_random_seed(seed)
  layers = [
    keras.Input((4,)),
    keras.layers.Dense(6, activation="relu"),
    keras.layers.BatchNormalization(),
  ]
  if dropout:
    layers.append(keras.layers.Dropout(0.5, seed=seed))
  layers.append(keras.layers.Dense(2))
  return keras.Sequential(layers)


def _unwrapped(w):
  return getattr(w, "value", w) if common.KERAS_3 else w


def test_keys_come_in_model_weights_order_and_pair_with_get_weights():
  model = _net(0, dropout=True)
  store = snapstore.SnapshotStore(var_list=model)
  weights = model.weights
  assert list(store.keys[: len(weights)]) == [store.key_of(w) for w in weights]
  # (Keras 3's seed state comes after the weights: not in get_weights())
  assert len(store.keys) == len(model.variables)
  arrays = store.arrays(store.snapshot())
  for key, value in zip(store.keys, model.get_weights()):
    assert_bits_equal([value], [arrays[key]])
  assert list(store.slots.shadows(0)) == list(store.keys)


def test_key_of_and_variable_of_go_both_ways():
  model = _net(0)
  store = snapstore.SnapshotStore(var_list=model)
  for w in model.weights:
    key = store.key_of(w)
    assert store.variable_of(key) is w
    assert store.key_of(_unwrapped(w)) == key
    assert store.variables[key] is _unwrapped(w)


def test_key_of_a_variable_the_store_does_not_cover_is_refused():
  store = snapstore.SnapshotStore(var_list=_net(0))
  stranger = tf.Variable(1.0, name="stranger")
  with pytest.raises(ValueError, match="does not cover .*stranger.*store.keys"):
    store.key_of(stranger)


def test_variable_of_an_unknown_key_names_the_close_ones():
  model = _net(0)
  store = snapstore.SnapshotStore(var_list=model)
  near = store.keys[0] + "x"
  with pytest.raises(KeyError, match="Did you mean '%s'" % store.keys[0]):
    store.variable_of(near)


def test_zip_of_keys_and_get_weights_loads_every_weight_where_it_belongs():
  model, other = _net(0), _net(1)
  store = snapstore.SnapshotStore(var_list=model)
  tag = store.load_arrays(dict(zip(store.keys, other.get_weights())))
  store.restore(tag)
  assert_bits_equal(other.get_weights(), model.get_weights())


def test_a_dict_var_list_keeps_its_own_order():
  a, b, c = (tf.Variable(float(i)) for i in range(3))
  store = snapstore.SnapshotStore(var_list={"z": a, "m": b, "a": c})
  assert store.keys == ("z", "m", "a")


@pytest.mark.parametrize("mode", common.MODES)
def test_load_arrays_from_a_model_built_by_the_same_code(mode, tmp_path):
  model = _net(0)
  _net(5)  # other automatic names for the next one
  other = _net(1)
  assert store_names(model) != store_names(other)
  store = snapstore.SnapshotStore(
    var_list=model, mode=mode, **common.mode_options(mode, tmp_path)
  )
  tag = store.load_arrays(other, tag="from_other")
  arrays = store.arrays(tag)
  assert_bits_equal(other.get_weights(), [arrays[k] for k in store.keys])
  store.restore(tag)
  assert_bits_equal(other.get_weights(), model.get_weights())
  store.close()


def store_names(model):
  return [getattr(w, "path", w.name) for w in model.weights]


def test_load_arrays_from_a_list_pairs_by_position():
  model, other = _net(0), _net(1)
  store = snapstore.SnapshotStore(var_list=model.weights)
  store.restore(store.load_arrays(other.weights))
  assert_bits_equal(other.get_weights(), model.get_weights())


def test_a_model_of_another_structure_is_refused_with_every_place_named():
  model = _net(0)
  store = snapstore.SnapshotStore(var_list=model)
  keras.utils.set_random_seed(3)
  smaller = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)])
  with pytest.raises(
    snapstore.IncompatibleSnapshotError,
    match="does not have the structure of store .*nothing where the store "
    "has .*gamma",
  ):
    store.load_arrays(smaller)
  assert len(store) == 0


def test_a_model_of_other_shapes_is_refused_before_anything_is_stored():
  model = _net(0)
  store = snapstore.SnapshotStore(var_list=model)
  keras.utils.set_random_seed(3)
  wider = keras.Sequential(
    [
      keras.Input((4,)),
      keras.layers.Dense(7, activation="relu"),
      keras.layers.BatchNormalization(),
      keras.layers.Dense(2),
    ]
  )
  with pytest.raises(snapstore.IncompatibleSnapshotError, match="shape"):
    store.load_arrays(wider)
  assert len(store) == 0


def test_a_list_of_another_length_is_refused():
  model = _net(0)
  store = snapstore.SnapshotStore(var_list=model)
  with pytest.raises(
    snapstore.IncompatibleSnapshotError, match="list of 2 variables"
  ):
    store.load_arrays(model.weights[:2])


def test_a_model_for_a_store_over_a_list_is_refused_with_the_list_way():
  model, other = _net(0), _net(1)
  store = snapstore.SnapshotStore(var_list=model.weights)
  with pytest.raises(TypeError, match="Pass a list of its variables"):
    store.load_arrays(other)


def test_something_else_is_refused_with_the_accepted_forms():
  store = snapstore.SnapshotStore(var_list=_net(0))
  with pytest.raises(TypeError, match=r"takes a dict \{key: numpy array\}"):
    store.load_arrays(42)


def test_the_old_zip_form_of_a_list_of_arrays_names_the_safe_form():
  model, other = _net(0), _net(1)
  store = snapstore.SnapshotStore(var_list=model)
  shuffled = dict(zip(sorted(store.keys), other.get_weights()))
  with pytest.raises(
    snapstore.IncompatibleSnapshotError, match=r"store.load_arrays\(model\)"
  ):
    store.load_arrays(shuffled)


def _trained_slot(seed):
  """(model, store, expected): slot 1 of a store over a model holds other
  values than the model ("target"), and `expected` in the store's order."""
  model = _net(seed)
  store = snapstore.SnapshotStore(var_list=model, max_to_keep=2)
  store.slots.pin(1, "target")
  store.load_arrays(_net(seed + 10), tag="target")
  return model, store, [store.arrays("target")[k] for k in store.keys]


def test_a_slot_survives_a_checkpoint_into_a_model_with_other_names(tmp_path):
  model, store, expected = _trained_slot(0)
  path = tf.train.Checkpoint(model=model, target=store.slots.trackable(1)).save(
    str(tmp_path / "ckpt")
  )
  for _ in range(3):
    _net(7)  # later networks get other automatic names
  fresh = _net(20)
  fresh_store = snapstore.SnapshotStore(
    var_list=fresh, max_to_keep=2, name="fresh"
  )
  assert store_names(fresh) != store_names(model)
  fresh_store.slots.pin(1, "target")
  status = tf.train.Checkpoint(
    model=fresh, target=fresh_store.slots.trackable(1)
  ).restore(path)
  status.assert_existing_objects_matched()
  got = fresh_store.arrays("target")
  assert_bits_equal(expected, [got[k] for k in fresh_store.keys])
  assert_bits_equal(model.get_weights(), fresh.get_weights())


def test_a_checkpoint_of_a_slot_is_keyed_by_the_model_structure(tmp_path):
  model, store, _ = _trained_slot(0)
  path = tf.train.Checkpoint(target=store.slots.trackable(1)).write(
    str(tmp_path / "ckpt")
  )
  names = [n for n, _ in tf.train.list_variables(path)]
  of_model = tf.train.Checkpoint(target=model).write(str(tmp_path / "model"))
  assert sorted(names) == sorted(
    n for n, _ in tf.train.list_variables(of_model)
  )


def test_trackable_of_a_list_store_names_each_shadow_by_its_key(tmp_path):
  w, b = tf.Variable([1.0, 2.0], name="w"), tf.Variable([3.0], name="b")
  store = snapstore.SnapshotStore(var_list=[w, b])
  tag = store.snapshot()
  w.assign([5.0, 6.0])
  path = tf.train.Checkpoint(slot=store.slots.trackable(0)).write(
    str(tmp_path / "ckpt")
  )
  reader = tf.train.load_checkpoint(path)
  assert reader.get_tensor("slot/w/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [
    1.0,
    2.0,
  ]
  assert store.slots.trackable(0) is store.slots.trackable(0)
  del tag


def test_trackable_of_a_slot_that_does_not_exist_is_refused():
  store = snapstore.SnapshotStore(var_list=_net(0))
  with pytest.raises(ValueError, match="slot"):
    store.slots.trackable(3)
