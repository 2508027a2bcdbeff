"""`snapstore.MovingAverage` on an eager device store.

Every update is checked element by element, bit for bit, against both forms
computed in numpy (float16, float32, float64, a non-trainable variable with
its own rate, an integer copied), eagerly and inside a `tf.function`; the swap
for evaluation against the variables' and the slot's bits (NaN payloads,
-0.0, denormals, infinities); and the RL target-network updates (hard and
soft) against a hand-written reference over many steps.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values

# name, dtype, trainable
FLOATS = (
  ("b", np.float64, True),
  ("h", np.float16, True),
  ("moving", np.float32, False),
  ("w", np.float32, True),
)
KEYS = ("b", "h", "moving", "w", "count")  # the store's order: the dict's


def _variables():
  rng = np.random.RandomState(3)
  out = {}
  for name, dtype, trainable in FLOATS:
    out[name] = tf.Variable(
      rng.randn(2, 3).astype(dtype), trainable=trainable, name=name
    )
  out["count"] = tf.Variable([0, 0], dtype=tf.int32, name="count")
  return out


def _wide(rng, dtype):
  """Both signs, magnitudes 1e-3 to 1e3: the two forms round apart."""
  return (
    rng.choice([-1, 1], [2, 3]) * 10.0 ** rng.uniform(-3, 3, [2, 3])
  ).astype(dtype)


def _expected(form, average, value, dtype, rate, n):
  """One update of either form in numpy, as the graph version computes it.

  `rate` is ("tau", tau) or ("decay", decay); `n` the warm-up count or None.
  """
  t = dtype
  d32 = None if n is None else np.float32(1 + n) / np.float32(10 + n)
  kind, r = rate
  if form == "lerp":
    keep, weight = t(1 - r), t(r)
    if d32 is not None and t(d32) < keep:
      keep, weight = t(d32), t(np.float32(1) - d32)
    return keep * average + weight * value
  if kind == "decay":
    decay = np.float32(r)
    if d32 is not None:
      decay = min(decay, d32)
    weight = t(np.float32(1) - decay)
  else:
    weight = t(r)
    if d32 is not None:
      weight = max(weight, t(np.float32(1) - d32))
  return average - (average - value) * weight


CASES = [
  ("ema", {"tau": 0.0476}),
  ("ema", {"decay": 0.9}),
  ("ema", {"tau": 0.0476, "tau_non_trainable": 0.2517}),
  ("lerp", {"tau": 0.0476}),
  ("lerp", {"tau": 0.0476, "tau_non_trainable": 0.2517}),
]


@pytest.mark.parametrize("inside", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("warmup", [False, True], ids=["", "num_updates"])
@pytest.mark.parametrize(
  "form,kwargs", CASES, ids=["%s-%s" % (f, "-".join(k)) for f, k in CASES]
)
def test_every_element_equals_numpy_in_both_forms(form, kwargs, warmup, inside):
  vs = _variables()
  store = snapstore.SnapshotStore(var_list=vs, mode="device")
  assert store.keys == KEYS
  step = tf.Variable(165, dtype=tf.int64, name="step")  # warm-up ends at 180
  ema = snapstore.MovingAverage(
    store, form=form, num_updates=step if warmup else None, **kwargs
  )
  assert ema.form == form and store.slots.pinned() == ["ema"]
  rate = ("decay", kwargs["decay"]) if "decay" in kwargs else ("tau", 0.0476)
  rate_nt = (
    ("tau", kwargs["tau_non_trainable"])
    if "tau_non_trainable" in (kwargs)
    else rate
  )
  ordered = [vs[k] for k in KEYS]

  def load_and_update(*fresh):
    # The new values are written first: the update must see them.
    for var, value in zip(ordered, fresh):
      var.assign(value)
    ema.update()
    step.assign_add(1)

  run = tf.function(load_and_update) if inside else load_and_update
  expected = {k: v.numpy() for k, v in vs.items()}  # the shadows' start
  rng = np.random.RandomState(11)
  differs = 0
  for i in range(30):
    fresh = {name: _wide(rng, dtype) for name, dtype, _ in FLOATS}
    fresh["count"] = np.array([i, -i], np.int32)
    n = int(step.numpy()) if warmup else None
    run(*[fresh[k] for k in KEYS])
    for name, dtype, trainable in FLOATS:
      previous = expected[name]
      expected[name] = _expected(
        form, previous, fresh[name], dtype, rate if trainable else rate_nt, n
      )
      other = _expected(
        "lerp" if form == "ema" else "ema",
        previous,
        fresh[name],
        dtype,
        ("tau", 1 - rate[1]) if rate[0] == "decay" else rate,
        n,
      )
      differs += int(np.sum(other != expected[name]))
    expected["count"] = fresh["count"]
    averages = store.arrays("ema")
    for key in KEYS:
      assert averages[key].tobytes() == expected[key].tobytes(), (key, i)
  assert differs > 0  # the data tell the forms apart: a wrong form would fail
  if inside:
    assert run.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("form", ["ema", "lerp"])
def test_tau_one_is_an_exact_hard_copy(form):
  bits = np.array(
    [0x7FC00001, 0xFFC12345, 0x80000000, 0x00000001, 0x7F800000, 0xFF800000],
    np.uint32,
  )
  v = tf.Variable(np.zeros([6], np.float32), name="v")
  store = snapstore.SnapshotStore(var_list={"v": v}, mode="device")
  copy = snapstore.MovingAverage(store, tau=1.0, form=form, tag="target")
  v.assign(bits.view(np.float32))
  copy.update()
  assert store.arrays("target")["v"].view(np.uint32).tolist() == bits.tolist()


def _train_step(model, opt, after_update):
  loss_fn = keras.losses.MeanSquaredError()

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    after_update()
    return loss

  return step


@pytest.mark.parametrize("form", ["ema", "lerp"])
def test_inside_a_keras_train_step_after_the_update(form):
  # Batch-norm statistics take tau_non_trainable; the update runs after the
  # optimizer's and the forward pass's writes, in the step's own function.
  model = common.small_model()
  opt = keras.optimizers.Adam(0.01)
  store = snapstore.SnapshotStore(var_list=model, mode="device")
  ema = snapstore.MovingAverage(
    store, tau=0.1, tau_non_trainable=0.5, form=form
  )
  trainable = {k: v.trainable for k, v in store.variables.items()}
  assert not trainable["bn/moving_mean"] and trainable["d1/kernel"]
  step = _train_step(model, opt, ema.update)
  expected = {k: v.numpy() for k, v in store.variables.items()}
  traces = None
  for x, y in common.batches(8):
    step(x, y)
    # The first call may trace twice (the optimizer makes its slots then).
    traces = traces or step.experimental_get_tracing_count()
    for key, var in store.variables.items():
      tau = 0.1 if trainable[key] else 0.5
      expected[key] = _expected(
        form, expected[key], var.numpy(), np.float32, ("tau", tau), None
      )
    held = store.arrays("ema")
    assert_bits_equal([expected[k] for k in store.keys], list(held.values()))
  assert step.experimental_get_tracing_count() == traces


def test_exact_after_an_xla_compiled_step():
  # XLA fuses the update's multiply-add inside a jit_compile=True function
  # (documented); called after the compiled step, the update stays exact.
  model = common.small_model()
  opt = keras.optimizers.SGD(0.05)
  store = snapstore.SnapshotStore(var_list=model.trainable_variables)
  ema = snapstore.MovingAverage(store, tau=0.0476, form="lerp")
  loss_fn = keras.losses.MeanSquaredError()

  @tf.function(jit_compile=True)
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))

  expected = values(store.variables.values())
  for x, y in common.batches(6, seed=8):
    step(x, y)
    ema.update()
    now = values(store.variables.values())
    expected = [
      _expected("lerp", a, b, np.float32, ("tau", 0.0476), None)
      for a, b in zip(expected, now)
    ]
    assert_bits_equal(expected, list(store.arrays("ema").values()))


def test_evaluate_with_swaps_the_average_in_exactly_also_when_fn_raises():
  odd = np.array(
    [0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x7F800000],
    np.uint32,
  ).view(np.float32)
  v = tf.Variable(odd, name="v")
  w = tf.Variable(odd[::-1].copy(), name="w")
  store = snapstore.SnapshotStore(var_list={"v": v, "w": w}, mode="device")
  ema = snapstore.MovingAverage(store, tau=0.01)
  average = {"v": odd[::-1].copy(), "w": np.float32([1e8, -0.0, 3, 1, 0, 2])}
  store.load_arrays(average, "ema")  # what the slot holds, any bits
  current = values([v, w])
  seen = ema.evaluate_with(lambda: values([v, w]))
  assert_bits_equal([average["v"], average["w"]], seen)
  assert_bits_equal(current, values([v, w]))

  def fails():
    v.assign(tf.zeros([6]))
    raise RuntimeError("inside fn")

  with pytest.raises(RuntimeError, match="inside fn"):
    store.evaluate_with(fails, tag=ema.tag)
  assert_bits_equal(current, values([v, w]))
  held = store.arrays("ema")
  assert_bits_equal([average["v"], average["w"]], [held["v"], held["w"]])


@common.needs_keras_3
def test_keras_swap_ema_weights_changes_bits_where_the_store_does_not():
  # Keras 3's SwapEMAWeights swaps by a += b; b = a - b; a -= b
  # (docs/design/eager.md, "An exact swap"): swapped there and back, the
  # weights and averages below change. The store's swap keeps every bit.
  from keras.src.callbacks import swap_ema_weights  # pylint: disable=g-import-not-at-top

  weights = np.float32([1e8, -0.0, 3.0, 0.1])
  averages = np.float32([1.0, 0.0, np.inf, 0.3])
  layer = keras.layers.Dense(4, use_bias=False, name="d")
  layer.build((1,))
  opt = keras.optimizers.SGD(0.1, use_ema=True)
  opt.build(layer.trainable_variables)
  layer.kernel.assign(weights[None, :])
  opt._model_variables_moving_average[0].assign(averages[None, :])  # pylint: disable=protected-access
  swap = swap_ema_weights.SwapEMAWeights()
  swap._tf_swap_variables(opt)  # pylint: disable=protected-access
  swap._tf_swap_variables(opt)  # pylint: disable=protected-access
  kernel = layer.kernel.numpy()[0]
  assert kernel.tobytes() != weights.tobytes()  # 1 - 1e8 + 1e8 == 0, -0.0 -> 0

  layer.kernel.assign(weights[None, :])
  store = snapstore.SnapshotStore(var_list={"k": layer.kernel}, mode="device")
  ema = snapstore.MovingAverage(store, tau=0.01)
  store.load_arrays({"k": averages[None, :]}, ema.tag)
  inside = ema.evaluate_with(lambda: layer.kernel.numpy()[0])
  assert inside.tobytes() == averages.tobytes()
  ema.evaluate_with(lambda: None)
  assert layer.kernel.numpy()[0].tobytes() == weights.tobytes()
  assert store.arrays(ema.tag)["k"][0].tobytes() == averages.tobytes()


# -- target networks (DQN, DDPG, SAC) ------------------------------------------


def _online():
  model = common.small_model(seed=4)
  opt = keras.optimizers.SGD(0.05)
  store = snapstore.SnapshotStore(var_list=model.trainable_variables)
  return model, opt, store


@pytest.mark.parametrize("how", ["snapshot", "in_step"])
def test_hard_target_update_every_n_steps(how):
  model, opt, store = _online()
  online = list(store.variables.values())
  if how == "snapshot":
    store.slots.pin(0, "target")
    copy = None
  else:
    copy = store.slots.snapshot_in_step(0, "target")
  every = 4
  counter = tf.Variable(0, dtype=tf.int64)

  def after_update():
    if copy is not None:  # in the step: a copy when the counter says so
      counter.assign_add(1)
      tf.cond(tf.equal(counter % every, 0), copy, lambda: tf.constant(False))

  step = _train_step(model, opt, after_update)
  target = values(online)  # the slot starts as the online network
  traces = None
  for i, (x, y) in enumerate(common.batches(13, seed=5), 1):
    step(x, y)
    traces = traces or step.experimental_get_tracing_count()
    if how == "snapshot" and i % every == 0:
      store.snapshot("target")  # one traced copy
    if i % every == 0:
      target = values(online)
    assert_bits_equal(target, list(store.arrays("target").values()))
  assert store.slots.pinned() == ["target"]
  assert step.experimental_get_tracing_count() == traces


def test_soft_target_update_equals_the_rl_libraries_every_step():
  # trfl's update_target_variables / tf-agents' soft_variables_update,
  # written by hand on variables of their own: (1 - tau) * target + tau *
  # online, tau a Python float.
  model, opt, store = _online()
  online = list(store.variables.values())
  tau = 0.0476
  soft = snapstore.MovingAverage(store, tau=tau, form="lerp", tag="target")
  reference = [tf.Variable(v.numpy(), trainable=False) for v in online]

  def both():
    soft.update()
    for t, s in zip(reference, online):
      t.assign((1 - tau) * t + tau * s)

  step = _train_step(model, opt, both)
  expected = values(online)
  for x, y in common.batches(40, seed=6):
    step(x, y)
    now = values(online)
    expected = [
      np.float32(1 - tau) * t + np.float32(tau) * s
      for t, s in zip(expected, now)
    ]
    held = list(store.arrays("target").values())
    assert_bits_equal(expected, held)
    assert_bits_equal(values(reference), held)
  x = common.batches(1)[0][0]
  current = values(online)
  with_target = store.evaluate_with(lambda: model(x).numpy(), tag="target")
  assert_bits_equal(current, values(online))
  store.restore("target")
  assert with_target.tobytes() == model(x).numpy().tobytes()


# -- errors --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["host", "disk"])
def test_a_host_or_disk_store_is_refused(mode, tmp_path):
  store = snapstore.SnapshotStore(
    var_list=[tf.Variable([1.0], name="v")],
    mode=mode,
    **common.mode_options(mode, tmp_path),
  )
  with pytest.raises(
    snapstore.ModeError, match="MovingAverage keeps its average in device"
  ):
    snapstore.MovingAverage(store, tau=0.1)
  assert store.tags() == []


def _store():
  return snapstore.SnapshotStore(var_list=[tf.Variable([1.0], name="v")])


def test_update_op_is_graph_modes():
  ema = snapstore.MovingAverage(_store(), tau=0.1)
  with pytest.raises(snapstore.ModeError, match="update_op is graph mode's"):
    ema.update_op  # pylint: disable=pointless-statement


def test_running_mean_is_graph_modes():
  store = _store()
  with pytest.raises(snapstore.ModeError, match="RunningMean is graph mode's"):
    snapstore.RunningMean(store)
  assert store.slots.pinned() == []


def test_num_updates_must_be_a_variable():
  store = _store()
  with pytest.raises(TypeError, match="num_updates on an eager store must"):
    snapstore.MovingAverage(store, tau=0.1, num_updates=tf.constant(3))
  assert store.slots.pinned() == []


def test_not_built_inside_a_tf_function():
  store = _store()

  @tf.function
  def build():
    snapstore.MovingAverage(store, tau=0.1)

  with pytest.raises(snapstore.ModeError, match="cannot be built inside"):
    build()
  assert store.slots.pinned() == []


# -- rates that change: per update, or in a variable -----------------------------

RATES = (0.0476, 0.2517, 1.0, 0.731)


def _expected_at(form, average, value, dtype, tau, how):
  """One update at rate `tau` given `how`: a Python number (rounded once
  to `dtype`, 1.0 a copy), or a float32 tensor (`1 - tau` in float32)."""
  if how == "number":
    if tau == 1.0:
      return value.copy()
    return _expected(form, average, value, dtype, ("tau", tau), None)
  t32 = np.float32(tau)
  if form == "lerp":
    return dtype(np.float32(1) - t32) * average + dtype(t32) * value
  return average - (average - value) * dtype(t32)


@pytest.mark.parametrize("inside", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("how", ["number", "tensor", "variable"])
@pytest.mark.parametrize("form", ["ema", "lerp"])
def test_a_rate_that_changes_equals_the_formula_at_every_rate(
  form, how, inside
):
  vs = _variables()
  store = snapstore.SnapshotStore(var_list=vs, mode="device")
  rate = tf.Variable(0.5, dtype=tf.float32, name="rate")
  ema = snapstore.MovingAverage(
    store,
    tau=rate if how == "variable" else 0.1,
    tau_non_trainable=0.3,
    form=form,
  )
  ordered = [vs[k] for k in KEYS]

  def load_and_update(tau, *fresh):
    for var, value in zip(ordered, fresh):
      var.assign(value)
    if how == "variable":
      rate.assign(tau)
      ema.update()
    else:
      ema.update(tau=tau)

  run = tf.function(load_and_update) if inside else load_and_update
  expected = {k: v.numpy() for k, v in vs.items()}
  rng = np.random.RandomState(12)
  for i in range(12):
    tau = RATES[i % len(RATES)]
    fresh = {name: _wide(rng, dtype) for name, dtype, _ in FLOATS}
    fresh["count"] = np.array([i, -i], np.int32)
    given = tau if how == "number" else tf.constant(tau, tf.float32)
    run(given, *[fresh[k] for k in KEYS])
    for name, dtype, trainable in FLOATS:
      if trainable:
        expected[name] = _expected_at(
          form, expected[name], fresh[name], dtype, tau, how
        )
      else:  # its own rate, a number
        expected[name] = _expected(
          form, expected[name], fresh[name], dtype, ("tau", 0.3), None
        )
    expected["count"] = fresh["count"]
    averages = store.arrays("ema")
    for key in KEYS:
      assert averages[key].tobytes() == expected[key].tobytes(), (key, i)
  if inside and how != "number":
    assert run.experimental_get_tracing_count() == 1


def test_a_number_rate_per_update_rounds_once_to_float16():
  # A float64 tensor cast to float16 rounds twice (through float32) for
  # some rates: a number must be rounded as a Python float constant is.
  w = tf.Variable(np.random.RandomState(0).randn(4000).astype(np.float16))
  store = snapstore.SnapshotStore(var_list=[w])
  soft = snapstore.MovingAverage(store, tau=0.5, form="lerp", tag="t")
  rng = np.random.RandomState(1)
  taus = rng.uniform(0.01, 0.99, 10**6)
  twice = (
    taus.astype(np.float32).astype(np.float16) != taus.astype(np.float16)
  ) | (
    (1 - taus).astype(np.float32).astype(np.float16)
    != (1 - taus).astype(np.float16)
  )
  assert twice.sum() >= 10  # rates where rounding twice would show
  for tau in list(taus[twice][:10]) + list(taus[:10]):
    w.assign_add(rng.randn(4000).astype(np.float16))
    before = store.arrays("t")["Variable"].copy()
    soft.update(tau=float(tau))
    expected = np.float16(1 - tau) * before + np.float16(tau) * w.numpy()
    assert store.arrays("t")["Variable"].tobytes() == expected.tobytes()


def test_update_is_a_cond_branch_inside_a_function():
  v = tf.Variable([1.0, 2.0], name="v")
  store = snapstore.SnapshotStore(var_list=[v])
  soft = snapstore.MovingAverage(store, tau=0.5, form="lerp", tag="target")

  @tf.function
  def step(update_now):
    v.assign_add([2.0, 2.0])
    # TF-Agents' periodic update: tf.cond(period_reached, update, tf.no_op)
    tf.cond(update_now, soft.update, tf.no_op)

  step(tf.constant(False))
  assert store.arrays("target")["v"].tolist() == [1.0, 2.0]
  step(tf.constant(True))
  assert store.arrays("target")["v"].tolist() == [3.0, 4.0]  # (1+5)/2, (2+6)/2
  assert soft.update() is None  # eagerly, as tf.group


def test_update_inside_control_dependencies_orders_what_follows():
  v = tf.Variable(1.0, name="v")
  store = snapstore.SnapshotStore(var_list=[v])
  soft = snapstore.MovingAverage(store, tau=1.0, tag="target")
  shadow = store.slots.shadows(0)["v"]

  @tf.function
  def step():
    v.assign(7.0)
    with tf.control_dependencies([soft.update()]):
      return shadow.read_value()

  assert float(step()) == 7.0


def test_rate_errors_per_update():
  v = tf.Variable([1.0], name="v")
  store = snapstore.SnapshotStore(var_list=[v], max_to_keep=2)
  soft = snapstore.MovingAverage(store, tau=0.1, form="lerp", tag="soft")
  with pytest.raises(ValueError, match=r"tau must be in \(0, 1\]"):
    soft.update(tau=1.5)
  with pytest.raises(TypeError, match="tau must be a number or a scalar"):
    soft.update(tau="0.1")
  with pytest.raises(TypeError, match="scalar float tensor, got dtype float32"):
    soft.update(tau=tf.constant([0.1, 0.2]))
  with pytest.raises(
    ValueError, match=r"tau_non_trainable must be in \(0, 1\]"
  ):
    soft.update(tau_non_trainable=0.0)
  with pytest.raises(tf.errors.InvalidArgumentError, match="tau must be in"):
    soft.update(tau=tf.constant(2.0))
  assert store.arrays("soft")["v"].tolist() == [1.0]  # none of them ran
  by_decay = snapstore.MovingAverage(store, decay=0.9, slot=1, tag="decay")
  with pytest.raises(ValueError, match="built with decay=.*build it with tau="):
    by_decay.update(tau=0.1)


def test_rate_errors_when_built():
  store = snapstore.SnapshotStore(var_list=[tf.Variable([1.0], name="v")])
  with pytest.raises(TypeError, match="scalar float variable"):
    snapstore.MovingAverage(store, tau=tf.Variable(1, dtype=tf.int32))
  with pytest.raises(TypeError, match="scalar float variable"):
    snapstore.MovingAverage(store, tau=tf.Variable([0.1, 0.2]))
  assert store.slots.pinned() == []
