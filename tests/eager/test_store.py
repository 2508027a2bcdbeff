"""The eager engine's store: snapshot, restore, evaluate, arrays and files.

Every restore is checked bit for bit against values copied before (numpy),
in the three modes, on tf.Variables, a tf.Module and a Keras model with its
optimizer.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from snapstore import _keras
from snapstore.engines.eager import copies
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import MODES
from tests.eager.common import mode_options
from tests.eager.common import values


def _variables():
  return [
    tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w"),
    tf.Variable(np.float64(2.5), name="b"),
    tf.Variable(np.array([1, -2, 3], np.int64), name="n"),
    tf.Variable(np.array([True, False]), name="flag"),
  ]


def _update(variables):
  variables[0].assign_add(tf.ones([2, 3]))
  variables[1].assign(variables[1] * 3.0)
  variables[2].assign_add(tf.constant([5, 5, 5], tf.int64))
  variables[3].assign(tf.logical_not(variables[3]))


@pytest.mark.parametrize("mode", MODES)
def test_restore_is_bit_exact_and_the_snapshot_survives(mode, tmp_path):
  vs = _variables()
  store = snapstore.SnapshotStore(
    var_list=vs, mode=mode, **mode_options(mode, tmp_path)
  )
  assert store.keys == ("w", "b", "n", "flag")  # the list's order
  assert store.graph is None
  before = values(vs)
  tag = store.snapshot()
  _update(vs)
  assert not np.array_equal(before[0], vs[0].numpy())
  assert store.restore() == tag
  assert_bits_equal(before, values(vs))
  _update(vs)
  store.restore(tag)  # restoring twice: the snapshot is intact
  assert_bits_equal(before, values(vs))
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_nan_payloads_negative_zero_and_denormals_survive(mode, tmp_path):
  bits = np.array(
    [0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x7F800000],
    np.uint32,
  )
  v = tf.Variable(bits.view(np.float32), name="odd")
  store = snapstore.SnapshotStore(
    var_list={"odd": v}, mode=mode, **mode_options(mode, tmp_path)
  )
  store.snapshot("t")
  v.assign(tf.zeros([6]))
  store.restore("t")
  assert v.numpy().view(np.uint32).tolist() == bits.tolist()
  assert store.arrays("t")["odd"].view(np.uint32).tolist() == bits.tolist()
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_evaluate_with_calls_fn_on_the_snapshot_and_puts_current_back(
  mode, tmp_path
):
  vs = _variables()
  store = snapstore.SnapshotStore(
    var_list=vs, mode=mode, max_to_keep=2, **mode_options(mode, tmp_path)
  )
  past = values(vs)
  store.snapshot("past")
  _update(vs)
  current = values(vs)
  seen = store.evaluate_with(lambda: values(vs), tag="past")
  assert_bits_equal(past, seen)
  assert_bits_equal(current, values(vs))
  assert store.evaluate_with(lambda: 7, past=False) == 7

  def fails():
    vs[0].assign(tf.fill([2, 3], 99.0))  # a write inside fn is undone too
    raise KeyError("inside fn")

  with pytest.raises(KeyError, match="inside fn"):
    store.evaluate_with(fails, tag="past")
  assert_bits_equal(current, values(vs))
  held = store.arrays("past")
  assert_bits_equal(past, [held[k] for k in ("w", "b", "n", "flag")])
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_evaluate_each_visits_every_snapshot(mode, tmp_path):
  v = tf.Variable(0.0, name="v")
  store = snapstore.SnapshotStore(
    var_list=[v], mode=mode, max_to_keep=3, **mode_options(mode, tmp_path)
  )
  for i in range(3):
    v.assign(float(i))
    store.snapshot(i)
  v.assign(42.0)
  got = store.evaluate_each(lambda: float(v.numpy()))
  assert list(got.items()) == [(0, 0.0), (1, 1.0), (2, 2.0)]
  assert v.numpy() == 42.0
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_arrays_load_arrays_and_npz_round_trip(mode, tmp_path):
  vs = _variables()
  store = snapstore.SnapshotStore(
    var_list=vs, mode=mode, max_to_keep=3, **mode_options(mode, tmp_path)
  )
  before = values(vs)
  store.snapshot("a")
  arrays = store.arrays("a")
  assert list(arrays) == list(store.keys)
  assert not arrays["w"].flags.writeable
  _update(vs)
  assert_bits_equal(before, [arrays[k] for k in ("w", "b", "n", "flag")])
  path = str(tmp_path / "a.npz")
  store.files.save_npz(path, "a")
  store.load_arrays({k: np.array(a) for k, a in arrays.items()}, tag="b")
  store.files.load_npz(path, tag="c")
  for tag in ("b", "c"):
    _update(vs)
    store.restore(tag)
    assert_bits_equal(before, values(vs))
  store.close()


def test_load_arrays_refuses_another_dtype_before_anything_changes():
  v = tf.Variable(np.zeros(3, np.float32), name="v")
  store = snapstore.SnapshotStore(var_list=[v], mode="device")
  with pytest.raises(
    snapstore.IncompatibleSnapshotError, match="v has dtype float64"
  ):
    store.load_arrays({"v": np.ones(3, np.float64)})
  assert store.tags() == []
  big_endian = np.arange(3, dtype=">f4")
  store.load_arrays({"v": big_endian}, tag="be")
  store.restore("be")
  assert v.numpy().tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("mode", ["device", "host"])
def test_a_spill_file_under_an_eager_store(mode, tmp_path):
  v = tf.Variable(np.arange(4, dtype=np.float32), name="v")
  path = str(tmp_path / "s.h5")
  store = snapstore.SnapshotStore(var_list=[v], mode=mode, spill_path=path)
  store.snapshot("x")
  store.files.spill("x")
  store.files.flush()
  assert store.files.tier("x") == "file"
  v.assign(tf.zeros([4]))
  store.restore("x")
  assert v.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
  store.close()
  again = snapstore.SnapshotStore(var_list=[v], mode="host", spill_path=path)
  assert again.tags() == ["x"]
  again.close()


@pytest.mark.parametrize("mode", MODES)
def test_copies_are_traced_once_never_per_call(mode, tmp_path, monkeypatch):
  v = tf.Variable(np.ones(5, np.float32), name="v")
  store = snapstore.SnapshotStore(
    var_list=[v], mode=mode, max_to_keep=2, **mode_options(mode, tmp_path)
  )
  store.snapshot(0)
  store.evaluate_with(lambda: None, tag=0)  # first use of lazy functions
  store.arrays(0)
  store.load_arrays({"v": np.zeros(5, np.float32)}, tag=1)
  traced = []
  real = copies.traced

  def counting(body, name, signature=None):
    traced.append(name)
    return real(body, name, signature)

  monkeypatch.setattr(copies, "traced", counting)
  for i in range(5):
    v.assign_add(tf.ones([5]))
    store.snapshot(i % 2)
    store.restore(i % 2)
    store.evaluate_with(lambda: None, tag=0)
    store.arrays(0)
    store.load_arrays({"v": np.zeros(5, np.float32)}, tag=1)
  assert traced == []
  store.close()


def test_a_tf_module_is_keyed_by_attribute_path():
  class Net(tf.Module):
    def __init__(self):
      super().__init__()
      self.layers = [tf.Module(), tf.Module()]
      for i, layer in enumerate(self.layers):
        layer.w = tf.Variable(float(i), name="w")
      self.alias = self.layers[0].w

  net = Net()
  store = snapstore.SnapshotStore(var_list=net)
  # layers[0].w is reachable twice: keyed by its shortest path, as a TF2
  # checkpoint names it.
  assert store.keys == ("alias", "layers/1/w")


def test_a_subclassed_keras_model_is_a_keras_model():
  # A keras.Model subclass defined outside Keras: taken as a model (its
  # weights, and the optimizer built for its trainable variables), as a
  # Sequential is; it was refused as "not a list or dict of variables".
  class Net(keras.Model):
    def __init__(self):
      super(Net, self).__init__(name="net")
      self.hidden = keras.layers.Dense(4, name="hidden")
      self.out = keras.layers.Dense(1, name="out")

    def call(self, x):
      return self.out(self.hidden(x))

  model = Net()
  model(np.zeros((1, 3), np.float32))
  opt = keras.optimizers.Adam(0.01)
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
  state = common.state_variables(model, opt)
  store.snapshot("before")
  saved = values(state)
  grads = [tf.ones_like(v) for v in model.trainable_variables]
  opt.apply_gradients(zip(grads, model.trainable_variables))
  changed = [a.tobytes() != b.tobytes() for a, b in zip(saved, values(state))]
  assert sum(changed) >= 3 * len(grads)  # weights, both moments (and more)
  store.restore("before")
  assert_bits_equal(saved, values(state))


def _optimizer(kind):
  if kind == "adam":
    return keras.optimizers.Adam(0.01)
  if kind == "nadam":  # tf-keras: its momentum product is no `variables` one
    return keras.optimizers.Nadam(0.01)
  # tf-keras: the loss scale and its count of good steps are neither
  return common.loss_scale_optimizer(keras.optimizers.Adam(0.01))


@pytest.mark.parametrize("kind", ["adam", "nadam", "loss_scale"])
@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_tape_loop_rolls_back_weights_and_optimizer(
  mode, kind, tmp_path
):
  model = common.small_model()
  opt = _optimizer(kind)
  store = snapstore.SnapshotStore(
    var_list=model, optimizer=opt, mode=mode, **mode_options(mode, tmp_path)
  )
  state = common.state_variables(model, opt)
  if kind != "adam" and not common.KERAS_3:
    listed = opt.variables() if callable(opt.variables) else opt.variables
    names = [v.name for v in common.optimizer_extras(opt, listed)]
    if kind == "nadam":
      assert names == ["Variable:0"]  # tf-keras's `_u_product`
    else:
      assert sorted(names) == ["current_loss_scale:0", "good_steps:0"]
  loss_fn = keras.losses.MeanSquaredError()

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  data = common.batches(4)
  step(*data[0])
  store.snapshot("good")
  saved = values(state)
  for x, y in data[1:]:
    step(x, y)
  changed = [
    i
    for i, (a, b) in enumerate(zip(saved, values(state)))
    if a.tobytes() != b.tobytes()
  ]
  assert len(changed) >= len(model.trainable_variables)
  store.restore("good")
  assert_bits_equal(saved, values(state))
  # The steps after the rollback are those of an uninterrupted run.
  after = [float(step(x, y)) for x, y in data[1:]]
  store.restore("good")
  assert [float(step(x, y)) for x, y in data[1:]] == after
  store.close()


def test_host_snapshot_reuses_only_arrays_nobody_else_holds():
  v = tf.Variable(np.zeros(4, np.float32), name="v")
  store = snapstore.SnapshotStore(var_list=[v], mode="host", max_to_keep=1)
  store.snapshot(0)
  held = store.arrays(0)["v"]  # the caller keeps the snapshot's array
  v.assign(tf.ones([4]))
  store.snapshot(0)  # replaces tag 0: its old array must not be overwritten
  assert held.tolist() == [0.0, 0.0, 0.0, 0.0]
  first = store.arrays(0)["v"]
  address = first.ctypes.data
  del first
  v.assign(tf.fill([4], 2.0))
  store.snapshot(1)  # evicts 0, whose array nobody holds: reused
  again = store.arrays(1)["v"]
  assert again.tolist() == [2.0, 2.0, 2.0, 2.0]
  assert again.ctypes.data == address
  assert not again.flags.writeable


def _plain_step(w, b, opt):
  """A GradientTape step of a linear model on the plain variables w, b."""

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = common.mse(y, tf.matmul(x, w) + b)
    grads = tape.gradient(loss, [w, b])
    opt.apply_gradients(zip(grads, [w, b]))
    return loss

  return step


@pytest.mark.parametrize("form", ["list", "dict"])
@pytest.mark.parametrize("kind", ["adam", "loss_scale"])
@pytest.mark.parametrize("mode", MODES)
def test_plain_variables_with_their_optimizer_roll_back_exactly(
  mode, kind, form, tmp_path
):
  # The plainest GradientTape program: a Keras 3 optimizer tracks the
  # variables it trains, which were taken for its state and refused as
  # "covered twice". The variables are covered once, under their own keys.
  w = tf.Variable(np.linspace(-1, 1, 3, dtype=np.float32)[:, None], name="w")
  b = tf.Variable(np.float32(0.5), name="b")
  opt = _optimizer(kind)
  opt.build([w, b])
  store = snapstore.SnapshotStore(
    var_list=[w, b] if form == "list" else {"w": w, "b": b},
    optimizer=opt,
    mode=mode,
    **mode_options(mode, tmp_path),
  )
  covered = store.variables
  assert covered["w"] is w and covered["b"] is b
  assert len(set(id(v) for v in covered.values())) == len(covered)
  # The optimizer's state: what a checkpoint of it saves, but the variables
  # it trains and its learning rates.
  listed = [
    _keras.keras_variable_value(v) if common.KERAS_3 else v
    for v in (opt.variables() if callable(opt.variables) else opt.variables)
  ]
  state = [
    v
    for v in listed + common.optimizer_extras(opt, listed + [w, b])
    if "learning_rate" not in v.name
  ]
  assert set(id(v) for v in state) == set(
    id(v) for k, v in covered.items() if k.startswith("optimizer/")
  )
  step = _plain_step(w, b, opt)
  data = common.batches(4)
  step(*data[0])
  store.snapshot("good")
  saved = values([w, b] + state)
  for x, y in data[1:]:
    step(x, y)
  assert values([w])[0].tobytes() != saved[0].tobytes()
  store.restore("good")
  assert_bits_equal(saved, values([w, b] + state))
  after = [float(step(x, y)) for x, y in data[1:]]
  store.restore("good")
  assert [float(step(x, y)) for x, y in data[1:]] == after
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_unnamed_variables_in_a_list_are_keyed_by_position(mode, tmp_path):
  # TensorFlow names every unnamed variable "Variable": such a list was
  # refused as two variables under one key.
  def program():
    return [tf.Variable(np.float32(1.0)), tf.Variable(np.arange(3.0))]

  vs = program()
  store = snapstore.SnapshotStore(
    var_list=vs, mode=mode, **mode_options(mode, tmp_path)
  )
  assert store.keys == ("Variable/0", "Variable/1")
  assert store.variables["Variable/0"] is vs[0]
  assert store.variables["Variable/1"] is vs[1]
  before = values(vs)
  store.snapshot("a")
  vs[0].assign(5.0)
  vs[1].assign([7.0, 8.0, 9.0])
  store.restore("a")
  assert_bits_equal(before, values(vs))
  # The same program gets the same keys: an archive loads into another
  # run's store, each array into the variable at its position.
  path = str(tmp_path / "a.npz")
  store.files.save_npz(path, "a")
  store.close()
  again = program()
  again[0].assign(-1.0)
  other = snapstore.SnapshotStore(var_list=again, mode="host")
  assert other.keys == store.keys
  other.files.load_npz(path, tag="a")
  other.restore("a")
  assert_bits_equal(before, values(again))


def test_only_names_that_collide_are_keyed_by_position():
  # Names unique in the list keep their keys (as archives and spill files
  # key them); a key made by position is never another variable's name.
  w = tf.Variable(0.0, name="w")
  taken = tf.Variable(1.0, name="Variable/1")
  first, second = tf.Variable(2.0), tf.Variable(3.0)
  store = snapstore.SnapshotStore(var_list=[w, first, second, taken])
  assert dict((k, float(v.numpy())) for k, v in store.variables.items()) == {
    "w": 0.0,
    "Variable/1": 1.0,
    "Variable/1_": 2.0,
    "Variable/2": 3.0,
  }
  named = snapstore.SnapshotStore(var_list=[w, taken, first])
  assert named.keys == ("w", "Variable/1", "Variable")


@pytest.mark.parametrize("mode", MODES)
def test_unnamed_variables_with_their_optimizer_roll_back_exactly(
  mode, tmp_path
):
  # The optimizer's slots of unnamed variables share their names too: they
  # are keyed by their position in `optimizer.variables`.
  w = tf.Variable(np.linspace(-1, 1, 3, dtype=np.float32)[:, None])
  b = tf.Variable(np.float32(0.5))
  opt = keras.optimizers.Adam(0.01)
  opt.build([w, b])
  store = snapstore.SnapshotStore(
    var_list=[w, b], optimizer=opt, mode=mode, **mode_options(mode, tmp_path)
  )
  listed = [
    _keras.keras_variable_value(v) if common.KERAS_3 else v
    for v in (opt.variables() if callable(opt.variables) else opt.variables)
  ]
  slots = [  # all but the iteration count and the learning rate
    v
    for v in listed
    if "iteration" not in v.name and "learning_rate" not in v.name
  ]
  assert len(slots) == 4
  covered = store.variables
  assert covered["Variable/0"] is w and covered["Variable/1"] is b
  for v in slots:
    (key,) = [k for k, c in covered.items() if c is v]
    (position,) = [i for i, u in enumerate(listed) if u is v]
    assert key.endswith("/%d" % position), key
  step = _plain_step(w, b, opt)
  data = common.batches(4)
  step(*data[0])
  store.snapshot("good")
  saved = values([w, b] + slots)
  for x, y in data[1:]:
    step(x, y)
  store.restore("good")
  assert_bits_equal(saved, values([w, b] + slots))
  after = [float(step(x, y)) for x, y in data[1:]]
  store.restore("good")
  assert [float(step(x, y)) for x, y in data[1:]] == after
  store.close()


def test_a_nested_model_whose_layers_share_names_is_keyed_by_position():
  # tf-keras names a nested model's weights without the model's name: two
  # inner models with a layer "d" gave two "d/kernel" and were refused.
  # Keras 3 keys them by path. Either way the fit state rolls back.
  keras.utils.set_random_seed(0)
  inner = [
    keras.Sequential([keras.layers.Dense(2, name="d")], name=n)
    for n in ("a", "b")
  ]
  model = keras.Sequential([keras.Input((3,))] + inner, name="m")
  opt = keras.optimizers.Adam(0.01)
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
  weights = [k for k in store.keys if not k.startswith("optimizer/")]
  if common.KERAS_3:
    assert weights == ["a/d/kernel", "a/d/bias", "b/d/kernel", "b/d/bias"]
  else:  # (in model.weights order: get_weights()'s)
    assert weights == ["d/kernel/0", "d/bias/1", "d/kernel/2", "d/bias/3"]
    for key, v in zip(["d/kernel/0", "d/bias/1"], inner[0].weights):
      assert store.variables[key] is v
  state = common.state_variables(model, opt)
  assert len(set(id(v) for v in store.variables.values())) == len(store.keys)
  store.snapshot("good")
  saved = values(state)
  grads = [tf.ones_like(v) for v in model.trainable_variables]
  opt.apply_gradients(zip(grads, model.trainable_variables))
  changed = [a.tobytes() != b.tobytes() for a, b in zip(saved, values(state))]
  assert sum(changed) >= 3 * len(grads)  # weights and both moments
  store.restore("good")
  assert_bits_equal(saved, values(state))


@pytest.mark.parametrize("adopts", [True, False], ids=["direct", "traced"])
@pytest.mark.parametrize("mode", ["host", "disk"])
def test_a_host_restore_leaves_its_snapshot_intact_under_in_place_updates(
  mode, adopts, tmp_path, monkeypatch
):
  # A variable of copies.DIRECT bytes or more is restored by one
  # AssignVariableOp fed the snapshot's array: the variable takes the
  # converted tensor's buffer. In-place updates after it (assign_add, an
  # optimizer's apply) must never reach the snapshot's array.
  assert copies.adopts_converted_arrays()  # this TensorFlow converts by copy
  monkeypatch.setattr(copies, "_adopts", [adopts])
  direct = []

  def assign_array(variable, value):
    direct.append(variable)
    original(variable, value)

  original = copies.assign_array
  monkeypatch.setattr(copies, "assign_array", assign_array)
  rng = np.random.RandomState(5)
  big = tf.Variable(rng.randn(512, 1024).astype(np.float32))  # 2 MiB
  small = tf.Variable(rng.randn(8).astype(np.float32))
  store = snapstore.SnapshotStore(
    var_list=[big, small], mode=mode, **mode_options(mode, tmp_path)
  )
  tag = store.snapshot()
  saved = [big.numpy(), small.numpy()]
  opt = keras.optimizers.SGD(0.5)
  for _ in range(3):
    store.restore(tag)
    assert_bits_equal(saved, values([big, small]))
    big.assign_add(np.ones((512, 1024), np.float32))
    small.assign_add(np.ones(8, np.float32))
    opt.apply_gradients(
      [(tf.ones_like(big), big), (tf.ones_like(small), small)]
    )
    expected = [saved[0] + np.float32(1) - np.float32(0.5), saved[1] + 1 - 0.5]
    np.testing.assert_array_equal(big.numpy(), expected[0])
    assert_bits_equal(saved, [store.arrays(tag)[k] for k in store.keys])
  assert direct == ([big] * 3 if adopts else [])
  store.close()
