"""Stores under MultiWorkerMirroredStrategy: two worker processes on loopback.

Each scenario runs `tests/eager/mwms_worker.py` as two processes (TF_CONFIG
per process, free loopback ports), which write what they saw; the tests
check it bit for bit: every component restored on both workers, the workers
identical after a coordinated restore, evaluation at a snapshot equal to
numpy's, a restore on one worker alone and restores of different tags
refused (the message, nothing written), training going on after a refusal,
and a `fit` whose NaN batch (on one worker's data) is rolled back at the
same batch on both workers. See `snapstore/engines/eager/multi_worker.py`.
"""

import pytest

from tests import cluster
from tests.eager import common


def _run(scenario, out):
  """Runs both workers of `scenario` (`cluster.run_workers`)."""
  return cluster.run_workers("tests.eager.mwms_worker", scenario, out)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  return _run("stores", str(tmp_path_factory.mktemp("stores")))


@pytest.fixture(scope="module")
def averaged(tmp_path_factory):
  return _run("averages", str(tmp_path_factory.mktemp("averages")))


@pytest.fixture(scope="module", params=["every_n_batches", "in_step"])
def fitted(request, tmp_path_factory):
  if common.KERAS_3:
    pytest.skip(
      "Keras 3's fit fails under MultiWorkerMirroredStrategy without "
      "snapstore (ValueError: Attempt to convert a value (PerReplica...) "
      "to a Tensor; keras-team/keras#20585); tf-keras and Keras 2 run it"
    )
  scenario = "fit_in_step" if request.param == "in_step" else "fit"
  return request.param, _run(scenario, str(tmp_path_factory.mktemp(scenario)))


@pytest.mark.parametrize("mode", common.MODES)
def test_every_component_is_restored_on_both_workers(stores, mode):
  facts, _ = stores
  for worker in facts:
    assert worker[mode + "/trained_differs"]  # the restore had work to do
    assert worker[mode + "/restored_equals_start"]
    # Each worker restored its own counter (1 and 2), so TF's read of the
    # sum over the workers is what it was.
    assert worker[mode + "/count"] == 3.0


@pytest.mark.parametrize("mode", common.MODES)
def test_workers_are_identical_after_a_coordinated_restore(stores, mode):
  _, arrays = stores
  keys = sorted(k for k in arrays[0] if k.startswith(mode + "/"))
  assert keys and keys == sorted(k for k in arrays[1] if k.startswith(mode))
  # Mirrored variables only: the counter's components differ by design.
  keys = [k for k in keys if not k.startswith(mode + "/count/")]
  common.assert_bits_equal(
    [arrays[0][k] for k in keys], [arrays[1][k] for k in keys]
  )


@pytest.mark.parametrize("mode", common.MODES)
def test_evaluate_with_at_a_snapshot_equals_numpy_and_puts_back(stores, mode):
  facts, _ = stores
  for worker in facts:
    assert worker[mode + "/evaluate_equals_numpy"]
    assert worker[mode + "/evaluate_put_back"]


@pytest.mark.parametrize("mode", common.MODES)
def test_a_restore_on_one_worker_alone_is_refused(stores, mode):
  facts, _ = stores
  message = facts[0][mode + "/alone"]
  assert message and "worker worker:1 did not restore within 2 s" in message
  assert "call restore on every worker, with the same tag" in message
  assert "Nothing was written" in message
  assert facts[0][mode + "/alone_unchanged"]
  assert mode + "/alone" not in facts[1]  # worker 1 never called it


def test_a_device_store_built_on_one_worker_alone_is_refused(stores):
  facts, _ = stores
  message = facts[0]["build_alone"]
  assert "worker worker:1 did not build it within 2 s" in message
  assert "every worker must build the same store" in message
  assert "Nothing was built" in message
  assert "build_alone" not in facts[1]


@pytest.mark.parametrize("mode", common.MODES)
def test_restores_of_different_tags_are_refused_on_both(stores, mode):
  facts, _ = stores
  for worker in facts:
    message = worker[mode + "/different"]
    assert message and "the workers restore different snapshots" in message
    assert "worker:0 'start'#0, worker:1 'later'#1" in message
    assert worker[mode + "/different_unchanged"]


def test_a_nan_batch_in_fit_is_rolled_back_identically(fitted):
  how, (facts, arrays) = fitted
  # The NaN is in worker 0's data only; the logged loss is reduced over
  # every replica, so both workers decide the rollback at the same batch.
  assert facts[0]["losses"] == facts[1]["losses"]
  assert "nan" in facts[0]["losses"] or how == "in_step"
  assert facts[0]["rollbacks"] == facts[1]["rollbacks"] == [3]
  # Both restored the same snapshot (a restore is coordinated: a worker
  # restoring another tag would have been refused).
  assert facts[0]["restored"] == facts[1]["restored"]
  assert facts[0]["restored"][0] is not None
  for worker in facts:
    assert worker["finite"]
    # Weights, batch-norm statistics, Adam's slots and iterations: as if
    # the NaN batch had not been there.
    assert worker["equals_reference"]
  keys = sorted(arrays[0])
  assert keys and keys == sorted(arrays[1])
  common.assert_bits_equal(
    [arrays[0][k] for k in keys], [arrays[1][k] for k in keys]
  )


def test_guard_and_trial_roll_back_on_both_workers(averaged):
  facts, _ = averaged
  for worker in facts:
    # The loss is NaN on worker 0's data only, and summed over every
    # replica of every worker: both guards fail and restore (coordinated),
    # each worker's components exactly as they were.
    assert worker["guard/failed"] and worker["guard/restored"]
    # The same step in a trial: the metric after it is NaN on both.
    assert worker["trial/rejected"] and worker["trial/restored"]
    # A good step in a trial is kept.
    assert worker["trial/kept"] and worker["trial/changed"]


def test_in_step_snapshot_on_both_workers(averaged):
  facts, arrays = averaged
  for worker in facts:
    # Each replica copied its own components at the top of the step.
    assert worker["in_step/slot_is_start"]
    assert worker["in_step/step_changed"]
    # The loss was NaN on worker 0's data only: neither worker wrote its
    # slot (a worker deciding alone would restore another step's start).
    assert worker["in_step/nan_kept_slot"]
    assert worker["in_step/restored"]
  keys = sorted(k for k in arrays[0] if k.startswith("in_step/"))
  assert keys
  common.assert_bits_equal(
    [arrays[0][k] for k in keys], [arrays[1][k] for k in keys]
  )


def test_moving_average_on_both_workers_equals_numpy(averaged):
  facts, arrays = averaged
  tau = 0.25
  for worker, held in zip(facts, arrays):
    count = len(worker["ema/keys"])
    average = [held["ema/start/%d" % i] for i in range(count)]
    for n in range(4):
      for i in range(count):
        value = held["ema/value/%d/%d" % (n, i)]
        if value.dtype.kind == "f":
          rate = value.dtype.type(tau)
          average[i] = average[i] - (average[i] - value) * rate
        else:
          average[i] = value.copy()
        common.assert_bits_equal(
          [average[i]], [held["ema/average/%d/%d" % (n, i)]]
        )
  # The workers' trainable weights stay identical: their averages too.
  # (Batch-norm statistics hold each worker's own batches' values, and so
  # do their averages: each component is averaged from its own.)
  trainable = facts[0]["ema/trainable"]
  assert trainable == facts[1]["ema/trainable"] and any(trainable)
  keys = [
    "ema/average/%d/%d" % (n, i)
    for n in range(4)
    for i, same in enumerate(trainable)
    if same
  ]
  common.assert_bits_equal(
    [arrays[0][k] for k in keys], [arrays[1][k] for k in keys]
  )


def test_lookahead_on_both_workers_equals_numpy(averaged):
  _, arrays = averaged
  for held in arrays:
    count = len([k for k in held if k.startswith("slow/start/")])
    slow = [held["slow/start/%d" % i] for i in range(count)]
    for n in range(4):
      for i in range(count):
        fast = held["lookahead/fast/%d/%d" % (n, i)]
        after = fast
        if (n + 1) % 2 == 0:  # k = 2: synchronized
          alpha = fast.dtype.type(0.5)
          slow[i] = slow[i] + alpha * (fast - slow[i])
          after = slow[i]
        common.assert_bits_equal(
          [slow[i], after],
          [
            held["lookahead/slow/%d/%d" % (n, i)],
            held["lookahead/after/%d/%d" % (n, i)],
          ],
        )
  keys = sorted(k for k in arrays[0] if k.startswith("lookahead/"))
  common.assert_bits_equal(
    [arrays[0][k] for k in keys], [arrays[1][k] for k in keys]
  )
