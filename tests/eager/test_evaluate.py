"""`evaluate_with` on the eager engine: a value at a snapshot, nothing more.

What it must hold, in every mode, called eagerly and inside the user's own
`tf.function`:

- the result takes no gradient (a separate target network's output would
  take none to the online network's variables);
- the current values are back afterwards, also when calls nest and when the
  evaluated function fails while it runs;
- inside a `tf.function`, the tag is looked up each time the function runs,
  not once when it is traced; calls that cannot work there are refused.
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import MODES
from tests.eager.common import mode_options
from tests.eager.common import values

WHERE = ["eagerly", "in_function"]


def _called(where, fn):
  """`fn`, or `fn` as a `tf.function` (the store call is then traced)."""
  return fn if where == "eagerly" else tf.function(fn)


def _store(variables, mode, tmp_path, **kwargs):
  return snapstore.SnapshotStore(
    var_list=variables, mode=mode, **kwargs, **mode_options(mode, tmp_path)
  )


# -- no gradient through a value at a snapshot --------------------------------


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", MODES)
def test_a_value_at_a_snapshot_takes_no_gradient(mode, where, tmp_path):
  w = tf.Variable([[1.0, -2.0], [0.5, 3.0]], name="w")
  b = tf.Variable([0.25, -0.75], name="b")
  store = _store([w, b], mode, tmp_path)
  store.snapshot("target")
  past_w, past_b = w.numpy(), b.numpy()
  w.assign_add(tf.fill([2, 2], 0.5))
  b.assign_add([1.0, 1.0])
  x = tf.constant([[1.0, 2.0], [-1.0, 0.5]])

  def forward():
    return tf.matmul(x, w) + b

  def grads():
    with tf.GradientTape() as tape:
      target = store.evaluate_with(forward, tag="target")
      loss = tf.reduce_sum(tf.square(forward() - target))
    return tape.gradient(loss, [w, b]), target

  (grad_w, grad_b), target = _called(where, grads)()
  # As with a separate target network's output: a constant for the tape.
  expected_target = x.numpy() @ past_w + past_b
  assert_bits_equal([expected_target], [target.numpy()])
  error = 2.0 * (x.numpy() @ w.numpy() + b.numpy() - expected_target)
  np.testing.assert_allclose(grad_w.numpy(), x.numpy().T @ error, rtol=1e-6)
  np.testing.assert_allclose(grad_b.numpy(), error.sum(axis=0), rtol=1e-6)
  # Bit for bit what the same step computes with the target as a constant.
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(forward() - tf.constant(expected_target)))
  assert_bits_equal(
    [g.numpy() for g in tape.gradient(loss, [w, b])],
    [grad_w.numpy(), grad_b.numpy()],
  )
  store.close()


# -- nesting -------------------------------------------------------------------


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", MODES)
def test_nested_calls_each_put_back_what_they_found(mode, where, tmp_path):
  v = tf.Variable(1.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("A")
  v.assign(2.0)
  store.snapshot("B")
  v.assign(3.0)

  def outer():
    before = tf.identity(v.read_value())
    inner = store.evaluate_with(lambda: v.read_value() * 1.0, tag="B")
    after = tf.identity(v.read_value())
    return before, inner, after

  def evaluate():
    return store.evaluate_with(outer, tag="A")

  before, inner, after = _called(where, evaluate)()
  assert (float(before), float(inner), float(after)) == (1.0, 2.0, 1.0)
  assert v.numpy() == 3.0
  assert store.arrays("A")["v"] == 1.0 and store.arrays("B")["v"] == 2.0
  store.close()


# -- inside a tf.function: looked up when it runs ------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_evaluate_with_sees_the_snapshot_of_each_run(mode, tmp_path):
  v = tf.Variable(10.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("e")

  @tf.function
  def f():
    return store.evaluate_with(lambda: v * 2.0, tag="e")

  v.assign(1.0)
  assert float(f()) == 20.0
  v.assign(20.0)
  store.snapshot("e")  # the same tag, new values
  v.assign(1.0)
  assert float(f()) == 40.0
  assert v.numpy() == 1.0
  assert f.experimental_get_tracing_count() == 1
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_evaluate_each_sees_each_snapshot(mode, tmp_path):
  v = tf.Variable(1.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("a")
  v.assign(2.0)
  store.snapshot("b")
  v.assign(3.0)

  @tf.function
  def f():
    return store.evaluate_each(lambda: v * 10.0, tags=["b", "a"])

  got = f()
  assert list(got) == ["b", "a"]
  assert [float(x) for x in got.values()] == [20.0, 10.0]
  assert v.numpy() == 3.0
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_restore_writes_the_snapshot_of_each_run(mode, tmp_path):
  v = tf.Variable(10.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("a")

  @tf.function
  def f():
    store.restore("a")
    return v.read_value()

  v.assign(1.0)
  assert float(f()) == 10.0
  v.assign(20.0)
  store.snapshot("a")
  v.assign(1.0)
  assert float(f()) == 20.0
  assert v.numpy() == 20.0
  assert f.experimental_get_tracing_count() == 1
  store.close()


@pytest.mark.parametrize("call", ["restore", "evaluate_with"])
def test_a_tag_that_moved_to_another_slot_is_followed(call):
  v = tf.Variable(0.0, name="v")
  store = snapstore.SnapshotStore(var_list=[v], max_to_keep=2)
  v.assign(1.0)
  store.snapshot("a")  # slot 0
  v.assign(2.0)
  store.snapshot("b")  # slot 1

  @tf.function
  def f():
    if call == "restore":
      store.restore("b")
      return v.read_value()
    return store.evaluate_with(lambda: v + 0.0, tag="b")

  v.assign(-1.0)
  assert float(f()) == 2.0
  store.delete("a")
  store.delete("b")
  v.assign(5.0)
  store.snapshot("b")  # now in slot 0
  assert store.slots.slot_of("b") == 0
  v.assign(-1.0)
  assert float(f()) == 5.0
  store.close()


@pytest.mark.parametrize("call", ["restore", "evaluate_with"])
@pytest.mark.parametrize("mode", MODES)
def test_a_tag_deleted_after_tracing_is_an_error_when_it_runs(
  mode, call, tmp_path
):
  v = tf.Variable(1.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("a")
  store.snapshot("b")

  @tf.function
  def f():
    if call == "restore":
      store.restore("b")
      return v.read_value()
    return store.evaluate_with(lambda: v + 0.0, tag="b")

  f()
  store.delete("b")
  v.assign(7.0)
  held = "in a device slot now" if mode == "device" else r"now \(it holds: a\)"
  with pytest.raises(
    tf.errors.InvalidArgumentError,
    match=r"UnknownTagError: the store snapstore holds no snapshot under "
    r"tag b " + held,
  ):
    f()
  assert v.numpy() == 7.0
  assert store.tags() == ["a"]
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_evaluate_with_that_fails_leaves_the_variables(mode, tmp_path):
  v = tf.Variable([1.0, 2.0], name="v")
  store = _store([v], mode, tmp_path)
  store.snapshot("t")
  v.assign([3.0, 4.0])

  @tf.function
  def f(index):
    # Fails in an op on the variable itself: with the swap, the put-back
    # was ordered after it and never ran.
    return store.evaluate_with(lambda: v.sparse_read(index) * 2.0, tag="t")

  with pytest.raises(tf.errors.InvalidArgumentError, match="indices"):
    f(tf.constant(5))
  assert v.numpy().tolist() == [3.0, 4.0]
  assert store.arrays("t")["v"].tolist() == [1.0, 2.0]
  assert float(f(tf.constant(1))) == 4.0
  assert v.numpy().tolist() == [3.0, 4.0]
  store.restore("t")
  assert v.numpy().tolist() == [1.0, 2.0]
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_traced_evaluate_with_that_writes_leaves_snapshot_and_variables(
  mode, tmp_path
):
  """Batch norm in training mode writes its statistics: the evaluation's
  writes go to a copy of the snapshot, as the swap wrote the loaded copy."""
  model = common.small_model()
  store = _store(model, mode, tmp_path)
  x = tf.constant(np.random.RandomState(0).rand(8, 3).astype(np.float32))
  store.snapshot("t")
  past = values(store.variables.values())
  for v in model.trainable_variables:
    v.assign_add(tf.ones_like(v) * 0.125)
  current = values(model.variables)

  @tf.function
  def f():
    return store.evaluate_with(lambda: model(x, training=True), tag="t")

  got = f()
  assert_bits_equal(current, values(model.variables))
  assert_bits_equal(past, list(store.arrays("t").values()))
  # What the same call gives on a copy of the model holding the snapshot.
  twin = common.small_model()
  store.restore("t")
  for variable, value in zip(twin.variables, values(model.variables)):
    variable.assign(value)
  expected = tf.function(lambda: twin(x, training=True))()
  assert_bits_equal([expected.numpy()], [got.numpy()])
  store.close()


@pytest.mark.parametrize("mode", MODES)
def test_calls_that_cannot_run_in_a_traced_function_are_refused(mode, tmp_path):
  v = tf.Variable(1.0, name="v")
  store = _store([v], mode, tmp_path, max_to_keep=2)
  store.snapshot("a")
  way = (
    "store.slots.snapshot_in_step()"
    if mode == "device"
    else "call store.snapshot() outside the tf.function"
  )
  cases = [
    ("snapshot", lambda: store.snapshot("b"), way),
    ("delete", lambda: store.delete("a"), "outside the tf.function"),
    ("arrays", lambda: store.arrays("a"), "outside the tf.function"),
    (
      "load_arrays",
      lambda: store.load_arrays({"v": np.float32(2.0)}, "b"),
      "outside the tf.function",
    ),
    ("tags", store.tags, "outside the tf.function"),
    ("__len__", lambda: len(store), "len(store) outside the tf.function"),
    (
      "save_npz",
      lambda: store.files.save_npz(str(tmp_path / "a.npz"), "a"),
      "outside the tf.function",
    ),
    ("restore", lambda: store.restore(), "pass tag="),
    ("evaluate_with", lambda: store.evaluate_with(lambda: v + 0), "pass tag="),
    ("evaluate_each", lambda: store.evaluate_each(lambda: v + 0), "tags=[...]"),
  ]
  if mode == "device":
    cases.append(
      ("slots.pin", lambda: store.slots.pin(1, "p"), "outside the tf.function")
    )
  for what, call, fix in cases:

    @tf.function
    def f():
      call()
      return tf.constant(0)

    with pytest.raises(snapstore.TracedCallError, match=what) as raised:
      f()
    assert fix in str(raised.value), (what, str(raised.value))
  assert store.tags() == ["a"]
  assert v.numpy() == 1.0
  store.close()


_AUTOGRAPH_PROBE = """
import tensorflow as tf
import snapstore

v = tf.Variable(1.0, name="v")
store = snapstore.SnapshotStore(var_list=[v], mode=%r)
store.snapshot("t")


@tf.function
def f():
  store.restore("t")
  return store.evaluate_with(lambda: v * 2.0, tag="t")


assert float(f()) == 2.0
"""


@pytest.mark.parametrize("mode", ["device", "host"])
def test_autograph_does_not_convert_the_store(mode, tmp_path):
  # In a new process (AutoGraph warns once per function and process), from
  # a file: AutoGraph converts only functions whose source it can read.
  probe = tmp_path / "probe.py"
  probe.write_text(_AUTOGRAPH_PROBE % mode)
  done = subprocess.run(
    [sys.executable, str(probe)],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 0, done.stderr
  assert "AutoGraph could not transform" not in done.stderr
  assert "AutoGraph could not transform" not in done.stdout
