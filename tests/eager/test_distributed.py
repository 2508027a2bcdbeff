"""An eager store over MirroredStrategy variables on two logical CPUs.

Every component is checked bit for bit against numpy copies taken before:
replicas identical after a restore, made different on purpose to show each
component is copied on its own, sync-on-read values read as TensorFlow
aggregates them with every component restored as it was, and the in-step
snapshot from replica context.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import keras

pytestmark = pytest.mark.skipif(
  len(tf.config.list_logical_devices("CPU")) < 2,
  reason="needs two logical CPUs (tests/eager/conftest.py)",
)


@pytest.fixture(scope="module")
def strategy():
  return common.mirrored()


def _components(v):
  return [np.array(c.numpy(), copy=True) for c in v.values]


def _make(strategy):
  with strategy.scope():
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    count = tf.Variable(
      0.0,
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
      name="count",
    )
  return w, count


@pytest.mark.parametrize("mode", common.MODES)
def test_every_component_is_restored_and_replicas_stay_identical(
  strategy, mode, tmp_path
):
  w, count = _make(strategy)
  count.values[0].assign(3.0)
  count.values[1].assign(4.0)
  store = snapstore.SnapshotStore(
    var_list=[w, count], mode=mode, **common.mode_options(mode, tmp_path)
  )
  before_w = _components(w)
  tag = store.snapshot()
  with strategy.scope():
    w.assign(tf.fill([2, 3], 9.0))
  count.values[0].assign(10.0)
  count.values[1].assign(20.0)
  for again in range(2):  # the second time from the file, in disk mode
    store.restore(tag)
    after = _components(w)
    assert after[0].tobytes() == after[1].tobytes()  # replicas identical
    for a, b in zip(before_w, after):
      assert a.tobytes() == b.tobytes()
    # The aggregate read back is the snapshot's (7.0), bit for bit, and
    # every mode keeps each component as it was (host and disk mode beside
    # the aggregate, which is none of them).
    assert float(count.read_value().numpy()) == 7.0
    assert [float(c) for c in _components(count)] == [3.0, 4.0]
    store.files.flush()
    count.values[1].assign(-1.0 - again)
  assert store.arrays(tag)["count"] == 7.0
  store.close()


def test_device_copies_each_component_on_its_own_device(strategy):
  w, _ = _make(strategy)
  w.values[1].assign(w.values[1] + 100.0)  # replicas made to differ
  store = snapstore.SnapshotStore(var_list=[w])
  before = _components(w)
  store.snapshot("t")
  with strategy.scope():
    w.assign(tf.zeros([2, 3]))
  store.restore("t")
  for a, b in zip(before, _components(w)):
    assert a.tobytes() == b.tobytes()
  shadows = store.slots.shadows(0)["w"]
  assert [c.device for c in shadows.values] == [c.device for c in w.values]
  assert not shadows.trainable


def test_evaluate_with_sees_the_snapshot_then_puts_current_back(strategy):
  w, _ = _make(strategy)
  store = snapstore.SnapshotStore(var_list=[w], max_to_keep=1)
  past = _components(w)
  store.snapshot("past")
  with strategy.scope():
    w.assign_add(tf.ones([2, 3]))
  current = _components(w)
  seen = store.evaluate_with(lambda: _components(w), tag="past")
  assert [a.tobytes() for a in seen] == [a.tobytes() for a in past]
  assert [a.tobytes() for a in _components(w)] == [a.tobytes() for a in current]


def test_a_keras_model_in_strategy_scope_rolls_back_exactly(strategy):
  with strategy.scope():
    model = common.small_model()
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
  variables = list(store.variables.values())
  step = common.replicated_step(strategy, model, opt, loss=common.keras_mse())

  data = common.batches(3)
  store.snapshot("start")
  saved = [_components(v) for v in variables]
  for x, y in data:
    step(x, y)
  store.restore("start")
  for v, comps in zip(variables, saved):
    got = _components(v)
    assert [a.tobytes() for a in got] == [a.tobytes() for a in comps]


def test_in_step_snapshot_from_replica_context(strategy):
  w, _ = _make(strategy)
  store = snapstore.SnapshotStore(var_list=[w])
  snap = store.slots.snapshot_in_step()

  @tf.function
  def step():
    def replica():
      start = snap.begin()
      w.assign_add(tf.ones([2, 3]) * 5.0)  # the "update"
      start.commit()
      return tf.constant(0)

    return strategy.run(replica)

  before = _components(w)
  with strategy.scope():
    step()
  shadow = store.slots.shadows(0)["w"]
  assert [a.tobytes() for a in _components(shadow)] == [
    a.tobytes() for a in before
  ]
  store.restore("before_step")
  assert [a.tobytes() for a in _components(w)] == [a.tobytes() for a in before]


def test_component_shadows_are_the_shadows_components(strategy):
  w, count = _make(strategy)
  store = snapstore.SnapshotStore(var_list=[w, count])
  shadows = store.slots.shadows(0)
  parts = store.slots.component_shadows(0)
  assert list(parts) == list(shadows) == ["w", "count"]  # var_list order
  for key, shadow in shadows.items():
    assert len(parts[key]) == 2
    assert all(a is b for a, b in zip(parts[key], shadow.values))
    for part, target in zip(store.variables[key].values, parts[key]):
      assert part.device == target.device


class _OwnKeysStrategy(tf.distribute.MirroredStrategy):
  """A MirroredStrategy whose collectives no other test's strategy shares.

  TensorFlow numbers the collective ops of every MirroredStrategy from the
  same group and instance keys, and the process's collective executor
  keeps what it learned of each key: in the whole eager suite, this test's
  all-reduce (shape [1]) got the key an earlier module's strategy had used
  for a gradient all-reduce (shape [57]), "Shape mismatch in the collective
  instance 100", which aborts every later collective of the process.
  `_collective_key_base` is TF's own knob for this, "only set in tests".
  """

  _collective_key_base = 10000


def test_in_step_if_finite_decides_alike_on_every_replica():
  # A loss that is NaN on replica 0 only (each replica checks its own): if
  # replica 1 alone committed, the slot's components would hold the starts
  # of different steps, and a restore would make the replicas differ.
  strategy = _OwnKeysStrategy(["/cpu:0", "/cpu:1"])
  w, _ = _make(strategy)
  store = snapstore.SnapshotStore(var_list=[w])
  snap = store.slots.snapshot_in_step()

  @tf.function
  def step(nan_on_first):
    def replica():
      start = snap.begin()
      first = tf.equal(
        tf.distribute.get_replica_context().replica_id_in_sync_group, 0
      )
      loss = tf.where(
        tf.logical_and(nan_on_first, first),
        tf.constant(np.nan, tf.float32),
        tf.constant(1.0, tf.float32),
      )
      w.assign_add(tf.ones([2, 3]))
      return start.commit(if_finite=loss)

    return strategy.run(replica)

  first_start = _components(w)
  with strategy.scope():
    written = step(tf.constant(False))
    assert [bool(x) for x in written.values] == [True, True]
    written = step(tf.constant(True))  # neither replica writes
  assert [bool(x) for x in written.values] == [False, False]
  shadow = store.slots.shadows(0)["w"]
  common.assert_bits_equal(first_start, _components(shadow))
  store.restore("before_step")
  common.assert_bits_equal(first_start, _components(w))


@pytest.mark.parametrize("mode", common.MODES)
def test_evaluate_with_keeps_components_that_differ(strategy, mode, tmp_path):
  _, count = _make(strategy)
  count.values[0].assign(3.0)
  count.values[1].assign(4.0)
  store = snapstore.SnapshotStore(
    var_list=[count], mode=mode, **common.mode_options(mode, tmp_path)
  )
  store.snapshot("t")
  count.values[0].assign(5.0)
  seen = store.evaluate_with(lambda: float(count.read_value()), tag="t")
  assert seen == 7.0
  # Set aside and put back per component: [5, 4], not the aggregate 9 and
  # -0.0 (which a host-value round trip would leave).
  assert [float(c) for c in _components(count)] == [5.0, 4.0]
  store.close()


@pytest.mark.parametrize("form", ["ema", "lerp"])
def test_moving_average_updates_each_component_from_its_own(strategy, form):
  # The replicas are made to differ on purpose: each shadow component must
  # average its own replica's values (as TF's EMA does under a strategy,
  # through extended.update), every element as numpy computes it. It used
  # to read the first component and write that average to every one.
  from tests.eager.test_averages import _expected

  w, _ = _make(strategy)
  store = snapstore.SnapshotStore(var_list=[w], mode="device")
  ema = snapstore.MovingAverage(store, tau=0.0476, form=form)
  average = _components(w)
  for i in range(3):
    for k, part in enumerate(w.values):
      part.assign(part + np.float32(0.37 * (i + 1) * (k + 1)))
    ema.update()
    average = [
      _expected(form, a, v, np.float32, ("tau", 0.0476), None)
      for a, v in zip(average, _components(w))
    ]
  shadow = store.slots.shadows(ema.slot)["w"]
  got = _components(shadow)
  assert got[0].tobytes() != got[1].tobytes()
  assert [a.tobytes() for a in got] == [a.tobytes() for a in average]


def test_lookahead_synchronizes_each_component_with_its_own(strategy):
  # Replicas made to differ on purpose: each component's slow and fast
  # weights follow phi <- phi + alpha * (theta - phi) with that replica's
  # own values, on its device (they were computed from the first replica's
  # and written to every one).
  w, _ = _make(strategy)
  with strategy.scope():
    opt = keras.optimizers.SGD(0.1)
  lookahead = snapstore.KerasLookahead(opt, k=2, alpha=0.5, var_list=[w])
  phi = _components(w)
  for t in range(1, 5):
    for j, part in enumerate(w.values):
      part.assign(part * np.float32(1.5) + np.float32(0.25 * (j + 1) * t))
    theta = _components(w)
    lookahead.update()
    if t % 2 == 0:
      phi = [p + np.float32(0.5) * (th - p) for p, th in zip(phi, theta)]
      assert [a.tobytes() for a in _components(w)] == [a.tobytes() for a in phi]
  slow = lookahead.store().slots.shadows(0)["w"]
  got = _components(slow)
  assert got[0].tobytes() != got[1].tobytes()
  assert [a.tobytes() for a in got] == [a.tobytes() for a in phi]


@pytest.mark.parametrize("mode", common.MODES)
def test_a_guard_rolls_every_replica_back_from_a_nan_step(
  strategy, mode, tmp_path
):
  # The NaN sample is in the second replica's half of the batch; its
  # gradient reaches both replicas through the all-reduce. The guard's
  # rollback puts every component back, bit for bit.
  with strategy.scope():
    model = common.small_model()
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
  store = snapstore.SnapshotStore(
    var_list=model,
    optimizer=opt,
    mode=mode,
    **common.mode_options(mode, tmp_path),
  )
  variables = list(store.variables.values())

  step = common.replicated_step(strategy, model, opt, reduce=True)

  (x, y), (bad, y2) = common.batches(2, seed=4)
  step(x, y)
  common.spoil(bad, y2, 9)  # the second replica's half
  saved = [_components(v) for v in variables]
  with snapstore.Guard(store, watch=True, reraise=False) as guard:
    guard.run(step, bad, y2)
  assert guard.failed
  for v, comps in zip(variables, saved):
    assert [a.tobytes() for a in _components(v)] == [a.tobytes() for a in comps]


@pytest.mark.parametrize("which", ["average", "lookahead"])
def test_updates_inside_strategy_run_are_refused(strategy, which):
  w, _ = _make(strategy)
  if which == "average":
    store = snapstore.SnapshotStore(var_list=[w], mode="device")
    update, call = snapstore.MovingAverage(store, tau=0.5).update, "Moving"
  else:
    with strategy.scope():
      opt = keras.optimizers.SGD(0.1)
    lookahead = snapstore.KerasLookahead(opt, k=1, alpha=0.5, var_list=[w])
    update, call = lookahead.update, "Lookahead"
  shadow_before = _components(w)

  @tf.function
  def step():
    strategy.run(update)

  with pytest.raises(
    ValueError,
    match=call + r".*update\(\) was called inside strategy.run \(replica "
    r"context\).*Call it after strategy.run returns",
  ):
    step()
  assert [a.tobytes() for a in _components(w)] == [
    a.tobytes() for a in shadow_before
  ]


# -- host mode and mirrored variables whose replicas differ --------------------


def _differing(strategy):
  """A non-trainable mirrored variable (aggregation NONE) whose replicas
  hold different values, as each replica's own write leaves them."""
  with strategy.scope():
    w = tf.Variable(
      np.arange(6, dtype=np.float32).reshape(2, 3), trainable=False, name="w"
    )

  @tf.function
  def step():
    def replica():
      context = tf.distribute.get_replica_context()
      rid = tf.cast(context.replica_id_in_sync_group, tf.float32)
      w.assign_add(tf.fill([2, 3], rid + 1.0))

    strategy.run(replica)

  step()
  return w


# Host and disk mode (spilling at once, or keeping the snapshot in memory).
HOST_MODES = [
  ("host", {}),
  ("disk", dict(memory_budget=1 << 20)),
  ("disk", dict(memory_budget=0)),
]


def _host_store(variables, mode, options, tmp_path, **kwargs):
  kwargs.update(common.mode_options(mode, tmp_path))
  kwargs.update(options)
  return snapstore.SnapshotStore(var_list=variables, mode=mode, **kwargs)


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_host_snapshot_keeps_each_replica_that_differs(
  strategy, mode, options, tmp_path
):
  # Host mode keeps one array per variable, the first replica's, and beside
  # it the other replicas of a variable whose replicas differ: a restore
  # gives each replica its own bits again, from memory or the spill file.
  w = _differing(strategy)
  store = _host_store([w], mode, options, tmp_path)
  before = _components(w)
  assert before[0].tobytes() != before[1].tobytes()
  store.snapshot("differ")
  for again in range(2):  # the second time from the file once spilled
    with strategy.scope():
      w.assign(tf.fill([2, 3], 9.0 + again))
    store.restore("differ")
    common.assert_bits_equal(before, _components(w))
    store.files.flush()
  # What the user sees as the value: the first replica's.
  common.assert_bits_equal([before[0]], [store.arrays("differ")["w"]])
  # The second replica's array is kept in memory beside the snapshot (also
  # when the snapshot is in the file).
  spilled = store.files.tier("differ") == "file"
  assert spilled == (options["memory_budget"] == 0 if options else False)
  assert store.nbytes == (1 if spilled else 2) * store.param_nbytes
  store.close()


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_equal_replicas_cost_nothing_more_and_stay_equal(
  strategy, mode, options, tmp_path
):
  w = _differing(strategy)
  with strategy.scope():
    w.assign(tf.fill([2, 3], 0.5))  # equal again
  store = _host_store([w], mode, options, tmp_path)
  store.snapshot("equal")
  if store.files.tier("equal") == "host":
    assert store.nbytes == store.param_nbytes
  w.values[1].assign(tf.fill([2, 3], 2.0))
  store.restore("equal")
  common.assert_bits_equal(
    [np.full([2, 3], 0.5, np.float32)] * 2, _components(w)
  )
  store.close()


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_evaluate_with_sees_each_replica_of_the_snapshot(
  strategy, mode, options, tmp_path
):
  w = _differing(strategy)
  store = _host_store([w], mode, options, tmp_path)
  past = _components(w)
  store.snapshot("past")
  store.files.flush()
  w.values[0].assign(tf.fill([2, 3], -1.0))
  current = _components(w)
  seen = store.evaluate_with(lambda: _components(w), tag="past")
  common.assert_bits_equal(past, seen)
  common.assert_bits_equal(current, _components(w))
  store.close()


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_a_guard_rolls_each_replica_back_in_host_mode(
  strategy, mode, options, tmp_path
):
  w = _differing(strategy)
  store = _host_store([w], mode, options, tmp_path, max_to_keep=2)
  before = _components(w)

  def bad_step():  # writes one replica, and its loss is NaN
    w.values[1].assign(tf.fill([2, 3], 5.0))
    return tf.constant(np.nan)

  with snapstore.Guard(store, watch=True, reraise=False) as guard:
    guard.run(bad_step)
  assert guard.failed
  common.assert_bits_equal(before, _components(w))
  store.close()


def test_a_device_snapshot_spilled_to_the_file_restores_each_replica(
  strategy, tmp_path
):
  # The file keeps the first replica's value; the other replicas stay in
  # memory beside it, so a restore from the file is exact too.
  w = _differing(strategy)
  store = snapstore.SnapshotStore(
    var_list=[w], mode="device", spill_path=str(tmp_path / "spill.h5")
  )
  before = _components(w)
  store.snapshot("differ")
  store.files.spill("differ")
  for again in range(2):  # on its way to the file, then in it
    with strategy.scope():
      w.assign(tf.fill([2, 3], 9.0 + again))
    store.restore("differ")
    common.assert_bits_equal(before, _components(w))
    store.files.flush()
  assert store.files.tier("differ") == "file"
  common.assert_bits_equal([before[0]], [store.arrays("differ")["w"]])
  store.close()


@pytest.mark.parametrize("mode", ["host", "disk"])
def test_loaded_arrays_go_to_every_replica(strategy, mode, tmp_path):
  w = _differing(strategy)
  store = _host_store([w], mode, {}, tmp_path)
  value = np.arange(6, dtype=np.float32).reshape(2, 3) - 7.0
  tag = store.load_arrays({"w": value})
  store.restore(tag)
  common.assert_bits_equal([value, value], _components(w))
  store.close()


def test_device_snapshot_of_replicas_that_differ_is_exact(strategy):
  w = _differing(strategy)
  store = snapstore.SnapshotStore(var_list=[w], mode="device")
  before = _components(w)
  assert before[0].tobytes() != before[1].tobytes()
  store.snapshot("differ")
  with strategy.scope():
    w.assign(tf.zeros([2, 3]))
  store.restore("differ")
  assert [a.tobytes() for a in _components(w)] == [a.tobytes() for a in before]


# -- host mode and sync-on-read variables -------------------------------------


def _sync_on_read(strategy):
  """Sync-on-read variables of aggregation SUM (a metric's total) and MEAN
  (a tf-keras batch-norm statistic), each component its own value, as each
  replica's writes leave them."""
  made = []
  for name, how in (
    ("total", tf.VariableAggregation.SUM),
    ("mean", tf.VariableAggregation.MEAN),
  ):
    with strategy.scope():
      made.append(
        tf.Variable(
          tf.zeros([3]),
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=how,
          trainable=False,
          name=name,
        )
      )
  rng = np.random.RandomState(0)
  for v in made:
    for c in v.values:
      c.assign(rng.normal(size=[3]).astype(np.float32))
  return made


def _scramble(variables, seed):
  rng = np.random.RandomState(seed)
  for v in variables:
    for c in v.values:
      c.assign(rng.normal(size=[3]).astype(np.float32))


def _aggregates(variables):
  """{name: the aggregate}, as numpy computes TF's cross-replica read."""
  total, mean = (_components(v) for v in variables)
  return {
    "total": total[0] + total[1],
    "mean": (mean[0] + mean[1]) / np.float32(2),
  }


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_host_snapshot_keeps_every_sync_on_read_component(
  strategy, mode, options, tmp_path
):
  # The snapshot's array is the aggregate (what the user sees, and what
  # TF reads); every component is kept beside it, and a restore gives each
  # replica its own bits again, from memory or the spill file.
  variables = _sync_on_read(strategy)
  store = _host_store(variables, mode, options, tmp_path)
  before = [_components(v) for v in variables]
  sums = _aggregates(variables)
  for v in variables:  # numpy's aggregates are TF's reads
    common.assert_bits_equal([sums[v.name.split(":")[0]]], [v.read_value()])
  store.snapshot("t")
  for again in range(2):  # the second time from the file once spilled
    _scramble(variables, seed=1 + again)
    store.restore("t")
    for v, comps in zip(variables, before):
      common.assert_bits_equal(comps, _components(v))
    store.files.flush()
  arrays = store.arrays("t")
  common.assert_bits_equal(
    [sums["total"], sums["mean"]], [arrays["total"], arrays["mean"]]
  )
  # Every component (2 variables, 2 replicas, float32 [3]) in memory, also
  # beside a snapshot in the file.
  spilled = store.files.tier("t") == "file"
  assert store.nbytes == (0 if spilled else store.param_nbytes) + 2 * 2 * 12
  store.close()


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_evaluate_with_and_a_guard_see_every_sync_on_read_component(
  strategy, mode, options, tmp_path
):
  variables = _sync_on_read(strategy)
  store = _host_store(variables, mode, options, tmp_path, max_to_keep=2)
  past = [_components(v) for v in variables]
  store.snapshot("past")
  store.files.flush()
  _scramble(variables, seed=3)
  current = [_components(v) for v in variables]
  seen = store.evaluate_with(
    lambda: [_components(v) for v in variables], tag="past"
  )
  for a, b in zip(past, seen):
    common.assert_bits_equal(a, b)
  for v, comps in zip(variables, current):
    common.assert_bits_equal(comps, _components(v))

  def bad_step():  # writes one replica's component, and its loss is NaN
    variables[1].values[1].assign(tf.fill([3], 5.0))
    return tf.constant(np.nan)

  with snapstore.Guard(store, watch=True, reraise=False) as guard:
    guard.run(bad_step)
  assert guard.failed
  for v, comps in zip(variables, current):
    common.assert_bits_equal(comps, _components(v))
  store.close()


def test_a_device_snapshot_spilled_to_the_file_restores_sync_on_read(
  strategy, tmp_path
):
  variables = _sync_on_read(strategy)
  store = snapstore.SnapshotStore(
    var_list=variables, mode="device", spill_path=str(tmp_path / "spill.h5")
  )
  before = [_components(v) for v in variables]
  sums = _aggregates(variables)
  store.snapshot("t")
  store.files.spill("t")
  for again in range(2):  # on its way to the file, then in it
    _scramble(variables, seed=4 + again)
    store.restore("t")
    for v, comps in zip(variables, before):
      common.assert_bits_equal(comps, _components(v))
    store.files.flush()
  assert store.files.tier("t") == "file"
  arrays = store.arrays("t")
  common.assert_bits_equal(
    [sums["total"], sums["mean"]], [arrays["total"], arrays["mean"]]
  )
  store.close()


@pytest.mark.parametrize("mode", ["host", "disk"])
def test_loaded_arrays_are_spread_over_sync_on_read_components(
  strategy, mode, tmp_path
):
  # One value per variable, no components: written as a host write writes
  # it (`core.distributed.spread`), the aggregate read back is that value.
  variables = _sync_on_read(strategy)
  store = _host_store(variables, mode, {}, tmp_path)
  total = np.array([1.5, -2.0, 0.25], np.float32)
  mean = np.array([0.5, 3.0, -1.0], np.float32)
  tag = store.load_arrays({"total": total, "mean": mean})
  store.restore(tag)
  common.assert_bits_equal(
    [total, np.full([3], -0.0, np.float32)], _components(variables[0])
  )
  common.assert_bits_equal([mean, mean], _components(variables[1]))
  store.close()


@pytest.mark.parametrize("mode", ["host", "disk"])
def test_large_arrays_are_written_into_every_component_as_a_host_write_does(
  strategy, mode, tmp_path
):
  # Variables of copies.DIRECT bytes or more take a host array without a
  # copy, but not a sync-on-read one, whose other components a host write
  # zeroes (a SUM's) or fills (a MEAN's), as for small ones above.
  shape = [512, 1024]  # 2 MiB
  with strategy.scope():
    w = tf.Variable(tf.zeros(shape), name="w")
    total, mean = (
      tf.Variable(
        tf.zeros(shape),
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=how,
        trainable=False,
        name=name,
      )
      for name, how in (
        ("total", tf.VariableAggregation.SUM),
        ("mean", tf.VariableAggregation.MEAN),
      )
    )
  store = _host_store([w, total, mean], mode, {}, tmp_path)
  rng = np.random.RandomState(3)
  given = {k: rng.normal(size=shape).astype(np.float32) for k in store.keys}
  tag = store.load_arrays(dict(given))
  store.restore(tag)
  common.assert_bits_equal([given["w"]] * 2, _components(w))
  common.assert_bits_equal(
    [given["total"], np.full(shape, -0.0, np.float32)], _components(total)
  )
  common.assert_bits_equal([given["mean"]] * 2, _components(mean))
  for c in w.values:  # in place after the restore: the snapshot unchanged
    c.assign_add(tf.ones(shape))
  common.assert_bits_equal([given["w"]], [store.arrays(tag)["w"]])
  store.close()


@pytest.mark.parametrize("mode, options", HOST_MODES)
def test_batch_norm_statistics_are_restored_per_replica_in_host_mode(
  strategy, mode, options, tmp_path
):
  # BatchNormalization updates its moving statistics in each replica from
  # that replica's half of the batch, so after one step of a distributed
  # dataset the replicas differ. tf-keras's (Keras 2's) are sync-on-read
  # (MEAN: a read gives their mean), Keras 3's mirrored of aggregation NONE;
  # host mode keeps each replica's and restores it, in both.
  with strategy.scope():
    model = common.small_model()
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
  store = _host_store(model, mode, options, tmp_path, optimizer=opt)
  step = common.replicated_step(strategy, model, opt, loss=common.keras_mse())
  ((x, y), (x2, y2)) = common.batches(2)

  def run(x, y):
    data = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    )
    for xs, ys in data:
      step(xs, ys)

  run(x, y)
  stats = store.variables["bn/moving_mean"]
  assert stats.synchronization == (
    tf.VariableSynchronization.ON_WRITE
    if common.KERAS_3
    else tf.VariableSynchronization.ON_READ
  )
  parts = _components(stats)
  assert parts[0].tobytes() != parts[1].tobytes()
  variables = list(store.variables.values())
  saved = [_components(v) for v in variables]
  store.snapshot("differ")
  run(x2, y2)
  assert _components(stats)[1].tobytes() != parts[1].tobytes()
  for _ in range(2):  # from memory, then (disk) from the file
    store.restore("differ")
    for v, comps in zip(variables, saved):
      common.assert_bits_equal(comps, _components(v))
    store.files.flush()
    run(x2, y2)
  store.close()


@pytest.mark.parametrize("mode", common.MODES)
def test_plain_variables_with_their_optimizer_in_strategy_scope(
  strategy, mode, tmp_path
):
  # optimizer= with plain variables (a Keras 3 optimizer was refused as
  # covering them twice): a replicated step rolls back on every replica.
  with strategy.scope():
    w = tf.Variable(np.linspace(-1, 1, 3, dtype=np.float32)[:, None], name="w")
    b = tf.Variable(np.float32(0.5), name="b")
    opt = keras.optimizers.Adam(0.01)
    opt.build([w, b])
  store = snapstore.SnapshotStore(
    var_list=[w, b],
    optimizer=opt,
    mode=mode,
    **common.mode_options(mode, tmp_path),
  )
  assert [k for k in store.keys if not k.startswith("optimizer/")] == ["w", "b"]
  variables = list(store.variables.values())
  assert len(variables) > 3  # the iteration and the moments too

  @tf.function
  def step(x, y):
    def replica(x, y):
      with tf.GradientTape() as tape:
        loss = common.mse(y, tf.matmul(x, w) + b)
      grads = tape.gradient(loss, [w, b])
      opt.apply_gradients(zip(grads, [w, b]))

    strategy.run(replica, args=(x, y))

  data = common.batches(3)
  step(*data[0])
  store.snapshot("start")
  saved = [_components(v) for v in variables]
  for x, y in data[1:]:
    step(x, y)
  at_w = list(store.keys).index("w")
  assert _components(w)[0].tobytes() != saved[at_w][0].tobytes()
  store.restore("start")
  for v, comps in zip(variables, saved):
    got = _components(v)
    assert [a.tobytes() for a in got] == [a.tobytes() for a in comps]
  store.close()


@pytest.mark.parametrize(
  "how", [dict(every_n_batches=1), dict(in_step=True)], ids=["every", "in_step"]
)
def test_lookahead_with_a_snapshot_callback_under_the_strategy(strategy, how):
  # A rolled-back batch never happened for Lookahead either (its counter
  # and slow weights), on every replica: as the fit without the batch.
  x = np.random.RandomState(0).randn(128, 3).astype(np.float32)
  y = np.tanh(x.sum(axis=1, keepdims=True))

  def fit(x, y, callback=None):
    with strategy.scope():
      model = common.small_model(seed=3)
      opt = keras.optimizers.Adam(0.01)
      model.compile(optimizer=opt, loss="mse")
    lookahead = snapstore.KerasLookahead(opt, k=2, var_list=model)
    callbacks = [lookahead.callback()] + ([callback] if callback else [])
    model.fit(
      x,
      y,
      batch_size=16,
      epochs=2,
      shuffle=False,
      verbose=0,
      callbacks=callbacks,
    )
    slow = list(lookahead.store().slots.shadows(0).values())
    state = common.state_variables(model, opt) + slow
    components = [c for v in state for c in getattr(v, "values", (v,))]
    return common.values(components), int(lookahead.counter.numpy())

  keep = np.r_[0:48, 64:128]
  expected, counter = fit(x[keep], y[keep])
  assert counter == 14
  bad_x, bad_y = x.copy(), y.copy()
  common.spoil(bad_x, bad_y, 48)
  callback = snapstore.SnapshotCallback(**how)
  got, got_counter = fit(bad_x, bad_y, callback)
  assert callback.rollbacks == 2
  assert got_counter == counter
  common.assert_bits_equal(expected, got)


# -- calls traced into the user's tf.function ----------------------------------


def _differing_and_sync_on_read(strategy):
  """A mirrored variable whose replicas differ (each replica writes its
  own, as batch-norm statistics under Keras 3), and a sync-on-read one."""
  with strategy.scope():
    w = tf.Variable(
      np.arange(6, dtype=np.float32).reshape(2, 3), trainable=False, name="w"
    )
    count = tf.Variable(
      0.0,
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
      name="count",
    )
  w.values[1].assign(w.values[0] + 10.0)
  count.values[0].assign(3.0)
  count.values[1].assign(4.0)
  return w, count


@pytest.mark.parametrize("mode", common.MODES)
def test_traced_calls_use_each_replicas_snapshot(strategy, mode, tmp_path):
  # evaluate_with and restore traced into the step (engines/eager/traced.py): each
  # replica reads its own component of the snapshot, when the step runs.
  w, count = _differing_and_sync_on_read(strategy)
  store = snapstore.SnapshotStore(
    var_list=[w, count], mode=mode, **common.mode_options(mode, tmp_path)
  )
  past_w, past_count = _components(w), _components(count)
  store.snapshot("past")
  with strategy.scope():
    w.assign(tf.fill([2, 3], -1.0))
  count.values[0].assign(0.5)
  count.values[1].assign(0.25)
  current_w, current_count = _components(w), _components(count)

  @tf.function
  def evaluate():
    def replica():
      return store.evaluate_with(lambda: (w * 1.0, count * 1.0), tag="past")

    return strategy.run(replica)

  seen_w, seen_count = evaluate()
  local = strategy.experimental_local_results
  common.assert_bits_equal(past_w, [t.numpy() for t in local(seen_w)])
  common.assert_bits_equal(past_count, [t.numpy() for t in local(seen_count)])
  common.assert_bits_equal(
    current_w + current_count, _components(w) + _components(count)
  )

  @tf.function
  def restore():
    store.restore("past")

  restore()
  common.assert_bits_equal(
    past_w + past_count, _components(w) + _components(count)
  )

  @tf.function
  def restore_in_replica():
    strategy.run(lambda: store.restore("past"))

  with pytest.raises(ValueError, match=r"inside strategy.run"):
    restore_in_replica()
  store.close()
