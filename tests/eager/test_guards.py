"""snapstore.Guard and snapstore.Trial on an eager store, and RollbackOptimizer.

Every rollback is checked bit for bit against numpy copies of the model's
variables and the Keras optimizer's state (moments, iteration count) taken
before the block, in the three modes. The eager guard calls the step
(`guard.run(fn, ...)`) and checks what `watch` picks of its result; an eager
guard or trial always snapshots on entry and refuses a pinned tag (an in-step
snapshot's slot), which it cannot vouch for.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import values

MODES = common.MODES


class _Setup(object):
  """A trained-a-little model, its Adam, a store over both and a step."""

  def __init__(self, mode, tmp_path, max_to_keep=None, store=True):
    self.model = common.small_model()
    self.opt = keras.optimizers.Adam(0.01)
    self.loss_fn = keras.losses.MeanSquaredError()
    self.step = tf.function(self._step)
    for x, y in common.batches(2, seed=5):  # Adam's moments and count move
      self.step(x, y)
    # What a rollback restores: all but the learning rate, which the store
    # leaves out (a rollback never undoes a learning-rate change).
    self.state = [
      v
      for v in common.state_variables(self.model, self.opt)
      if "learning_rate" not in v.name
    ]
    self.store = None
    if store:
      self.store = snapstore.SnapshotStore(
        var_list=self.model,
        optimizer=self.opt,
        mode=mode,
        max_to_keep=max_to_keep,
        **common.mode_options(mode, tmp_path),
      )
      assert len(self.store.variables) == len(self.state)

  def _step(self, x, y):
    with tf.GradientTape() as tape:
      loss = self.loss_fn(y, self.model(x, training=True))
    grads = tape.gradient(loss, self.model.trainable_variables)
    self.opt.apply_gradients(zip(grads, self.model.trainable_variables))
    return loss

  def values(self):
    return values(self.state)

  def covered(self):
    """The store's variables' values, in the order of `store.arrays`."""
    return values(self.store.variables.values())

  def loss(self, x, y):
    return self.loss_fn(y, self.model(x, training=False))


GOOD, NAN = common.batches(2, seed=7, nan_at=(1,))


def _differs(a, b):
  return any(x.tobytes() != y.tobytes() for x, y in zip(a, b))


# -- Guard: rollbacks --------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_loss_rolls_model_and_optimizer_back_exactly(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  start = s.values()
  with snapstore.Guard(s.store, watch=True, reraise=False) as guard:
    result = guard.run(s.step, *GOOD)
    assert np.isfinite(result.numpy())  # run returns what the step returned
    guard.run(s.step, *NAN)
  assert guard.failed
  (failure,) = guard.failures
  assert isinstance(failure, snapstore.NonFiniteError)
  assert "Result is nan (attempt 1 of 1)" in str(failure)
  assert "back to snapshot 'guard'" in str(failure)
  assert_bits_equal(start, s.values())


@pytest.mark.parametrize("mode", MODES)
def test_a_gradient_tape_loop_with_a_nan_step_ends_as_without_it(
  mode, tmp_path
):
  data = common.batches(6, seed=3, nan_at=(3,))
  guarded = _Setup(mode, tmp_path)
  guard = snapstore.Guard(guarded.store, watch=True, reraise=False)
  rolled_back = []
  for i, (x, y) in enumerate(data):
    with guard:
      guard.run(guarded.step, x, y)
    if guard.failed:
      rolled_back.append(i)
  assert rolled_back == [3]
  reference = _Setup(mode, tmp_path, store=False)
  start = reference.values()
  for i, (x, y) in enumerate(data):
    if i != 3:
      reference.step(x, y)
  # Weights, batch-norm statistics, Adam's moments and iteration count.
  assert_bits_equal(reference.values(), guarded.values())
  assert _differs(start, guarded.values())


@pytest.mark.parametrize("mode", MODES)
def test_retries_start_again_from_the_snapshot(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  start = s.values()
  seen = []
  guard = snapstore.Guard(s.store, watch=True, retries=3)
  for attempt in guard:
    with attempt:
      seen.append((attempt.number, s.values()))
      attempt.run(s.step, *(NAN if attempt.number < 2 else GOOD))
  assert [n for n, _ in seen] == [0, 1, 2]
  for _, held in seen:
    assert_bits_equal(start, held)
  assert len(guard.failures) == 2 and not guard.failed
  retried = s.values()
  s.store.restore("guard")
  s.step(*GOOD)
  assert_bits_equal(retried, s.values())


def test_retries_exhausted_reraise_after_restoring(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  guard = snapstore.Guard(s.store, watch=True, retries=1)
  attempts = []
  with pytest.raises(
    snapstore.NonFiniteError, match=r"Result is nan \(attempt 2 of 2\)"
  ):
    for attempt in guard:
      with attempt:
        attempts.append(attempt.number)
        attempt.run(s.step, *NAN)
  assert attempts == [0, 1] and guard.failed and len(guard.failures) == 2
  assert_bits_equal(start, s.values())


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_in_the_block_restores_and_propagates(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  start = s.values()
  with pytest.raises(ValueError, match="user code failed"):
    with snapstore.Guard(s.store):
      s.step(*GOOD)  # outside guard.run: the rollback covers it too
      raise ValueError("user code failed")
  assert_bits_equal(start, s.values())


def test_an_error_raised_in_the_tf_function_after_its_update_restores(
  tmp_path,
):
  s = _Setup("device", tmp_path)
  start = s.values()

  @tf.function
  def checked_step(x, y):
    loss = s._step(x, y)  # pylint: disable=protected-access
    # Runs after the update (automatic control dependencies keep the order).
    tf.debugging.check_numerics(s.model.trainable_variables[0], "kernel")
    return loss

  with pytest.raises(tf.errors.InvalidArgumentError, match="kernel"):
    with snapstore.Guard(s.store) as guard:  # watch=None: no check of its own
      guard.run(checked_step, *NAN)
  assert isinstance(guard.failures[0], tf.errors.InvalidArgumentError)
  assert_bits_equal(start, s.values())


def test_an_exception_outside_catch_is_not_rolled_back(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(KeyError, match="not caught"):
    with snapstore.Guard(s.store, catch=ValueError) as guard:
      guard.run(s.step, *GOOD)
      stepped = s.values()
      raise KeyError("not caught")
  assert guard.failures == []
  assert_bits_equal(stepped, s.values())
  assert _differs(start, stepped)


@pytest.mark.parametrize("mode", MODES)
def test_success_keeps_the_update_and_the_snapshot(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  start = s.covered()
  with snapstore.Guard(s.store, watch=True) as guard:
    guard.run(s.step, *GOOD)
  assert not guard.failed and guard.failures == []
  assert _differs(start, s.covered())
  assert_bits_equal(start, list(s.store.arrays("guard").values()))


def test_watch_picks_what_is_checked(tmp_path):
  s = _Setup("device", tmp_path)

  @tf.function
  def step(x, y):
    return {"loss": s._step(x, y), "aux": tf.constant(np.nan, tf.float32)}  # pylint: disable=protected-access

  def as_tuple(x, y):
    out = step(x, y)
    return out["loss"], out["aux"]

  cases = [
    ("loss", step, None),
    ("aux", step, r"Result\['aux'\] is nan"),
    (True, step, r"Result\['aux'\] is nan"),
    (0, as_tuple, None),
    (1, as_tuple, r"Result\[1\] is nan"),
    (lambda out: out["aux"], step, r"Watch\(result\) is nan"),
    (None, step, None),
    (False, step, None),
  ]
  for watch, fn, message in cases:
    before = s.values()
    with snapstore.Guard(s.store, watch=watch, reraise=False) as guard:
      guard.run(fn, *GOOD)
    if message is None:
      assert not guard.failed, watch
      assert _differs(before, s.values())
    else:
      assert guard.failed, watch
      assert pytest.raises(
        snapstore.NonFiniteError, _raise, guard.failures[0]
      ).match(message)
      assert_bits_equal(before, s.values())


def _raise(exc):
  raise exc


def test_watch_none_lets_a_nan_step_through(tmp_path):
  # As in graph mode, a guard without watch rolls back only on exceptions.
  s = _Setup("device", tmp_path)
  with snapstore.Guard(s.store) as guard:
    loss = guard.run(s.step, *NAN)
  assert np.isnan(loss.numpy()) and not guard.failed
  assert np.isnan(s.model.trainable_variables[0].numpy()).any()


def test_check_fails_on_values_the_user_computed(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(snapstore.NonFiniteError, match="Value 1 is inf"):
    with snapstore.Guard(s.store) as guard:
      s.step(*GOOD)
      guard.check(s.loss(*GOOD), np.float32(np.inf))
  assert_bits_equal(start, s.values())


def test_call_checks_the_result_with_retries(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  guard = snapstore.Guard(s.store, watch=True, retries=1, reraise=False)
  assert guard.call(s.step, *NAN) is None
  assert guard.failed and len(guard.failures) == 2
  assert_bits_equal(start, s.values())
  loss = guard.call(s.step, *GOOD)
  assert np.isfinite(loss.numpy()) and not guard.failed
  assert _differs(start, s.values())


# -- Guard: errors -----------------------------------------------------------------


def test_a_session_is_refused(tmp_path):
  s = _Setup("device", tmp_path)
  for make in (snapstore.Guard, snapstore.Trial):
    with pytest.raises(
      TypeError,
      match=r"snapstore.%s\(\) got session=.*this store runs eagerly"
      % make.__name__,
    ):
      make(s.store, session=object())
  assert s.store.tags() == []


@pytest.mark.parametrize(
  "watch", [tf.constant(1.0), [tf.constant(1.0)], 1.5], ids=str
)
def test_watch_of_the_graph_form_is_refused(tmp_path, watch):
  s = _Setup("device", tmp_path)
  with pytest.raises(TypeError, match="On an eager store, watch picks"):
    snapstore.Guard(s.store, watch=watch)


def test_an_empty_key_is_refused(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(TypeError, match="watch='' picks nothing"):
    snapstore.Guard(s.store, watch="")


def test_a_missing_key_fails_the_block(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(
    TypeError, match=r"watch='lost' picks result\['lost'\], but the function"
  ):
    with snapstore.Guard(s.store, watch="lost") as guard:
      guard.run(lambda *b: {"loss": s.step(*b)}, *GOOD)
  assert_bits_equal(start, s.values())


def test_a_non_float_result_fails_the_block(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(TypeError, match=r"Result is not a float value \(dtype"):
    with snapstore.Guard(s.store, watch=True) as guard:
      guard.run(lambda *b: (s.step(*b), 3)[1], *GOOD)
  assert_bits_equal(start, s.values())


def test_run_takes_a_function(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(TypeError, match=r"calls a function with its arguments"):
    with snapstore.Guard(s.store) as guard:
      s.step(*GOOD)
      guard.run("train_op", {"x": GOOD[0]})
  assert_bits_equal(start, s.values())


def test_run_and_check_outside_the_block(tmp_path):
  s = _Setup("device", tmp_path)
  guard = snapstore.Guard(s.store)
  with pytest.raises(RuntimeError, match=r"guard.run\(\) runs inside"):
    guard.run(s.step, *GOOD)
  with pytest.raises(RuntimeError, match=r"guard.check\(\) runs inside"):
    guard.check(np.nan)


def test_a_with_statement_cannot_retry(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(ValueError, match="retries=2 needs the block to run"):
    with snapstore.Guard(s.store, retries=2):
      pass
  assert s.store.tags() == []


def test_attempts_must_be_entered(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(RuntimeError, match="as a context manager"):
    for _ in snapstore.Guard(s.store, retries=1):
      pass


def test_the_in_step_tag_is_refused_on_entry(tmp_path):
  s = _Setup("device", tmp_path, max_to_keep=2)
  s.store.slots.snapshot_in_step()  # pins "before_step" to slot 0
  start = s.values()
  for make in (snapstore.Guard, snapstore.Trial):
    with pytest.raises(
      ValueError,
      match=r"%s\(tag='before_step'\): that tag is pinned to slot 0, which "
      r"your own code writes: an in-step snapshot" % make.__name__.lower(),
    ):
      with make(s.store, tag="before_step"):
        s.step(*GOOD)  # never runs
  assert_bits_equal(start, s.values())
  assert s.store.tags() == ["before_step"]


def test_a_guard_beside_an_in_step_snapshot_rolls_back_to_its_own(tmp_path):
  # The in-step copy writes its slot at every step, inside the guard too; the
  # guard's own snapshot (slot 1) is what it restores.
  s = _Setup("device", tmp_path, max_to_keep=2)
  snap = s.store.slots.snapshot_in_step()

  @tf.function
  def step(x, y):
    start = snap.begin()
    loss = s._step(x, y)  # pylint: disable=protected-access
    start.commit()
    return loss

  step(*GOOD)
  start = s.values()
  with snapstore.Guard(s.store, watch=True, reraise=False) as guard:
    guard.run(step, *GOOD)
    after_one = s.covered()
    guard.run(step, *NAN)
  assert guard.failed and s.store.slots.slot_of("guard") == 1
  assert_bits_equal(start, s.values())
  # The in-step slot holds the NaN step's start: one step later than the guard.
  assert_bits_equal(after_one, list(s.store.arrays("before_step").values()))


def test_a_nested_snapshot_that_would_evict_the_outer_one_is_refused(
  tmp_path,
):
  s = _Setup("device", tmp_path, max_to_keep=1)
  with snapstore.Guard(s.store):
    with pytest.raises(ValueError, match=r"would evict 'guard'"):
      with snapstore.Guard(s.store):
        pass
    assert s.store.tags() == ["guard"]


# -- nesting -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_nested_guards_roll_back_to_their_own_entry(mode, tmp_path):
  s = _Setup(mode, tmp_path, max_to_keep=None if mode == "disk" else 2)
  start = s.values()
  with pytest.raises(ZeroDivisionError):
    with snapstore.Guard(s.store) as outer:
      outer.run(s.step, *GOOD)
      middle = s.values()
      with snapstore.Guard(s.store, watch=True, reraise=False) as inner:
        assert inner.tag == "guard/1" and outer.tag == "guard"
        inner.run(s.step, *GOOD)
        inner.run(s.step, *NAN)
      assert inner.failed
      assert_bits_equal(middle, s.values())
      1 / 0  # pylint: disable=pointless-statement
  assert_bits_equal(start, s.values())


@pytest.mark.parametrize("mode", MODES)
def test_trials_and_guards_nest_in_each_other(mode, tmp_path):
  s = _Setup(mode, tmp_path, max_to_keep=None if mode == "disk" else 2)
  start = s.values()
  with snapstore.Trial(s.store) as trial:
    s.step(*GOOD)
    middle = s.values()
    with snapstore.Guard(s.store, watch=True, reraise=False) as guard:
      guard.run(s.step, *NAN)
    assert guard.failed
    assert_bits_equal(middle, s.values())
    trial.reject()
  assert trial.kept is False
  assert_bits_equal(start, s.values())


# -- Trial ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_the_metric_decides(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  metric = lambda: s.loss(*GOOD)  # noqa: E731
  with snapstore.Trial(s.store, metric=metric) as trial:
    s.step(*GOOD)
  assert trial.kept and trial.after < trial.before
  assert isinstance(trial.before, np.generic)  # numbers, as sess.run gives
  kept = s.values()
  s.opt.learning_rate.assign(5.0)
  with snapstore.Trial(s.store, metric=metric) as trial:
    s.step(*GOOD)
  assert not trial.kept and trial.after > trial.before
  assert_bits_equal(kept, s.values())  # the learning rate is not covered


def test_a_non_finite_metric_is_rejected(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with snapstore.Trial(s.store, metric=lambda: s.loss(*GOOD)) as trial:
    s.step(*NAN)
  assert not trial.kept and np.isnan(trial.after)
  assert_bits_equal(start, s.values())


def test_a_custom_accept_gets_numbers(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  calls = []

  def accept(before, after):
    calls.append((before, after))
    return after["loss"] < before["loss"] - 1e6  # no step does that

  metric = lambda: {"loss": s.loss(*GOOD)}  # noqa: E731
  with snapstore.Trial(s.store, metric=metric, accept=accept) as trial:
    s.step(*GOOD)
  assert not trial.kept and len(calls) == 1
  assert isinstance(calls[0][1]["loss"], np.generic)
  assert_bits_equal(start, s.values())


def test_explicit_decisions(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with snapstore.Trial(s.store) as trial:
    s.step(*GOOD)
    trial.reject()
  assert trial.kept is False
  assert_bits_equal(start, s.values())
  s.opt.learning_rate.assign(5.0)
  with snapstore.Trial(s.store, metric=lambda: s.loss(*GOOD)) as trial:
    s.step(*GOOD)
    trial.keep()  # wins over the metric
  assert trial.kept and trial.after is None
  assert _differs(start, s.values())


def test_no_decision_rolls_back_and_raises(tmp_path):
  s = _Setup("device", tmp_path)
  start = s.values()
  with pytest.raises(snapstore.TrialError, match="without a decision"):
    with snapstore.Trial(s.store):
      s.step(*GOOD)
  assert_bits_equal(start, s.values())


@pytest.mark.parametrize("mode", MODES)
def test_an_exception_in_a_trial_rolls_back(mode, tmp_path):
  s = _Setup(mode, tmp_path)
  start = s.values()
  with pytest.raises(ZeroDivisionError):
    with snapstore.Trial(s.store) as trial:
      s.step(*GOOD)
      trial.keep()
      1 / 0  # pylint: disable=pointless-statement
  assert trial.kept is False
  assert_bits_equal(start, s.values())


def test_a_metric_that_is_not_a_function_is_refused(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(
    TypeError, match="On an eager store, a trial's metric is a function"
  ):
    snapstore.Trial(s.store, metric=s.loss(*GOOD))


def test_a_feed_dict_is_refused(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(TypeError, match="a trial takes no feed_dict"):
    snapstore.Trial(s.store, metric=lambda: 0.0, feed_dict={"x": GOOD[0]})


def test_accept_needs_a_metric(tmp_path):
  s = _Setup("device", tmp_path)
  with pytest.raises(ValueError, match="pass metric= too"):
    snapstore.Trial(s.store, accept=lambda b, a: True)


# -- RollbackOptimizer: refused eagerly, with the recipe that replaces it ---------------


def test_rollback_optimizer_refuses_eager_execution():
  inner = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  with pytest.raises(
    snapstore.ModeError, match=r"RollbackOptimizer is for graph mode.*Trial"
  ):
    snapstore.RollbackOptimizer(inner)


def test_rollback_optimizer_refuses_a_keras_optimizer():
  with pytest.raises(
    TypeError, match=r"got the Keras optimizer .*snapstore\.Trial"
  ):
    snapstore.RollbackOptimizer(keras.optimizers.SGD(0.1))


@pytest.mark.parametrize("mode", MODES)
def test_the_eager_recipe_for_rollback_optimizer(mode, tmp_path):
  # The recipe of rollback_optimizer.py's docstring and the README: a trial
  # per step on the step's batch, the learning rate cut after a rollback.
  s = _Setup(mode, tmp_path)
  tolerance, rtol, backoff = 0.0, 0.0, 0.5
  decisions = []
  for rate, batch in ((None, GOOD), (5.0, GOOD), (None, NAN)):
    if rate is not None:
      s.opt.learning_rate.assign(rate)
    x, y = batch
    start = s.values()
    loss_at_start = s.loss(x, y).numpy()
    with snapstore.Trial(
      s.store,
      metric=lambda: s.loss(x, y),  # noqa: B023
      accept=lambda b, a: bool(
        np.isfinite(a) and a - b <= tolerance + rtol * abs(b)
      ),
    ) as trial:
      s.step(x, y)
    if not trial.kept:
      s.opt.learning_rate.assign(s.opt.learning_rate * backoff)
      assert_bits_equal(start, s.values())
    assert trial.before.tobytes() == loss_at_start.tobytes()
    decisions.append(bool(trial.kept))
  # A blow-up (lr 5.0) and a NaN batch are rolled back, each halving the rate.
  assert decisions[1:] == [False, False]
  assert float(s.opt.learning_rate.numpy()) == 1.25
