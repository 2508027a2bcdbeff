"""Graph-mode stores under MultiWorkerMirroredStrategy: two workers on loopback.

Each scenario runs `tests/mwms_graph_worker.py` as two processes (TF_CONFIG
per process, a `tf.distribute.Server` each on a free loopback port), which
write what they saw; the tests check it bit for bit: every local component
restored on both workers (Adam's state too), the workers identical after a
coordinated restore, evaluation at a snapshot equal to numpy's, a restore on
one worker alone and restores of different tags refused (the message,
nothing written), training going on after a refusal; Lookahead, averages
(against numpy and TF's own EMA), an in-step snapshot gated on an
all-reduced loss, guards and a trial on both workers. See
`snapstore/engines/graph/multi_worker.py`; the eager engine's counterpart is
tests/eager/test_multi_worker.py. Runs on TF 1.15 and TF 2.x (graph mode).
"""

import json
import os
import time

import numpy as np
import pytest

from tests import cluster

_MODES = ("device", "host", "disk")


def _run(scenario, out):
  """Runs both workers of `scenario` (`cluster.run_workers`)."""
  return cluster.run_workers("tests.mwms_graph_worker", scenario, out)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  return _run("stores", str(tmp_path_factory.mktemp("stores")))


@pytest.mark.parametrize("mode", _MODES)
def test_every_component_is_restored_on_both_workers(stores, mode):
  facts, _ = stores
  for worker in facts:
    assert worker[mode + "/trained_differs"]  # the restore had work to do
    assert worker[mode + "/restored_equals_start"]
    # Each worker restored its own counter (1 and 2), so their sum over the
    # workers (an all-reduce) is what it was.
    assert worker[mode + "/count"] == 3.0
  # Adam's slots and powers are covered too.
  assert {"net/w/Adam", "net/w/Adam_1", "beta1_power"} <= set(facts[0]["keys"])


@pytest.mark.parametrize("mode", _MODES)
def test_workers_are_identical_after_a_coordinated_restore(stores, mode):
  facts, arrays = stores
  keys = facts[0]["keys"]
  assert keys == facts[1]["keys"]
  names = sorted(k for k in arrays[0] if k.startswith(mode + "/"))
  names = [n for n in names if n.split("/")[1].isdigit()]
  assert len(names) == len(keys)
  for name in names:
    if keys[int(name.split("/")[1])] == "net/count":
      continue  # each worker's own count, by design
    assert arrays[0][name].dtype == arrays[1][name].dtype
    assert arrays[0][name].tobytes() == arrays[1][name].tobytes(), name


@pytest.mark.parametrize("mode", _MODES)
def test_evaluate_with_at_a_snapshot_equals_numpy_and_puts_back(stores, mode):
  facts, arrays = stores
  for worker, held in zip(facts, arrays):
    seen, want = held[mode + "/evaluated"], held[mode + "/numpy"]
    assert seen.dtype == want.dtype and seen.tobytes() == want.tobytes()
    assert worker[mode + "/evaluate_put_back"]


@pytest.mark.parametrize("mode", _MODES)
def test_a_restore_on_one_worker_alone_is_refused(stores, mode):
  facts, _ = stores
  message = facts[0][mode + "/alone"]
  assert message and "worker worker:1 did not restore within 2 s" in message
  assert "call restore on every worker, with the same tag" in message
  assert "Nothing was written" in message
  assert facts[0][mode + "/alone_unchanged"]
  assert mode + "/alone" not in facts[1]  # worker 1 never called it


@pytest.mark.parametrize("mode", _MODES)
def test_restores_of_different_tags_are_refused_on_both(stores, mode):
  facts, _ = stores
  for worker in facts:
    message = worker[mode + "/different"]
    assert message and "the workers restore different snapshots" in message
    assert "worker:0 'start'#0, worker:1 'later'#1" in message
    assert worker[mode + "/different_unchanged"]


@pytest.mark.parametrize("mode", ["device", "host"])
def test_a_store_builds_before_the_servers_are_up(mode):
  """The coordination needs the first worker's server at the first restore
  only: a store is built (and its ops added to the user's graph) with no
  server running, as in a program that builds its graph first."""
  from unittest import mock  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  # TF 1.15's strategy takes no cluster_resolver: TF_CONFIG, as a worker.
  config = {
    "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
    "task": {"type": "worker", "index": 1},
  }
  graph = tf.Graph()
  with graph.as_default(), mock.patch.dict(
    os.environ, {"TF_CONFIG": json.dumps(config)}
  ):
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    with strategy.scope():
      w = tf.get_variable("w", [2], tf.float32)
    store = snapstore.SnapshotStore(var_list=[w], mode=mode, name="early")
    assert store.variables["w"] is w
    # No op of the coordination in the user's graph: it has its own.
    assert not [
      op for op in graph.get_operations() if "snapstore_coordination" in op.name
    ]
    store.close()


@pytest.fixture(scope="module")
def hooked(tmp_path_factory):
  return _run("hook", str(tmp_path_factory.mktemp("hook")))


def test_snapshot_hook_rolls_back_both_workers_at_the_same_step(hooked):
  facts, arrays = hooked
  for worker in facts:
    # The NaN batch was worker 0's only; the hook's loss is summed over the
    # workers, so both rolled back at step 2, to the snapshot before step 1.
    assert worker["rollbacks"] == [2]
    assert worker["hook_rollbacks"] == 1 and worker["snapshots"] == 4
    assert worker["step_1_changed"]
    assert worker["rolled_back_to_step_1"]
    assert worker["finite"]
  assert facts[0]["keys"] == facts[1]["keys"]
  assert "w/Adam" in facts[0]["keys"] and "global_step" in facts[0]["keys"]
  names = sorted(arrays[0])
  assert names and names == sorted(arrays[1])
  for name in names:  # the workers identical after training went on
    assert arrays[0][name].tobytes() == arrays[1][name].tobytes(), name


@pytest.fixture(scope="module")
def hooked_alone(tmp_path_factory):
  return _run("hook_alone", str(tmp_path_factory.mktemp("hook_alone")))


def test_snapshot_hook_on_each_workers_own_loss_is_refused_alone(hooked_alone):
  facts, _ = hooked_alone
  first, second = facts
  # Worker 0's own loss was NaN at step 2, worker 1's was not: worker 0's
  # rollback would have been its alone, and was refused, nothing written.
  assert first["refused_at"] == 2
  message = first["refused"]
  assert "worker worker:1 did not restore within 2 s" in message
  assert "Nothing was written" in message
  assert first["unchanged"]
  assert first["rollbacks"] == [] and first["hook_rollbacks"] == 0
  assert "refused" not in second and second["rollbacks"] == []
  assert first["steps_run"] == second["steps_run"] == 3


class _Strategy(object):
  """What `_VariableExchange` reads of a strategy: no collective timeout."""

  extended = None


@pytest.fixture(scope="module")
def first_worker():
  """A loopback server for the first worker's task: the rows live there."""
  try:
    servers = cluster.LoopbackCluster({"worker": 1})
  except cluster.ClusterError as e:
    pytest.skip("loopback tf.train.Server did not start: %s" % e)
  yield servers
  servers.close()


def _exchanges(first_worker, name, timeout=2.0):
  """Two workers' exchanges of store `name` (rows on the first's server;
  the second worker's address is never dialled). Both are this process's
  first exchange of that store, as each would be in its own worker."""
  from unittest import mock  # pylint: disable=g-import-not-at-top

  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
  from snapstore.core import coordination  # pylint: disable=g-import-not-at-top
  from snapstore.engines.graph import multi_worker as graph_multi_worker  # pylint: disable=g-import-not-at-top

  spec = tf.train.ClusterSpec(
    {"worker": [first_worker.spec["worker"][0], "127.0.0.1:1"]}
  )
  tasks = ["worker:0", "worker:1"]
  with mock.patch.object(coordination, "TIMEOUT", timeout), mock.patch.object(
    coordination, "count", lambda what, name: 0
  ):
    return [
      graph_multi_worker._VariableExchange(  # pylint: disable=protected-access
        (_Strategy(), spec, me, tasks), name
      )
      for me in tasks
    ]


def _agree_together(exchanges, values):
  """Each exchange's `agree(value)` in a thread of its own; their results
  (or exceptions)."""
  import threading  # pylint: disable=g-import-not-at-top

  results = [None] * len(exchanges)

  def agree(i):
    try:
      results[i] = exchanges[i].agree(values[i])
    except Exception as e:  # pylint: disable=broad-except
      results[i] = e

  threads = [
    threading.Thread(target=agree, args=(i,)) for i in range(len(exchanges))
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  return results


def test_rounds_pair_the_workers_calls_in_order(first_worker):
  exchanges = _exchanges(first_worker, "rounds")
  for n in range(6):  # even and odd slots, reused
    values = ["a%d" % n, "b%d" % n]
    got = _agree_together(exchanges, values)
    want = {"worker:0": values[0], "worker:1": values[1]}
    assert got == [want, want], n
  assert [e.round for e in exchanges] == [6, 6]


def test_a_round_one_worker_runs_alone_times_out_and_is_withdrawn(
  first_worker,
):
  from snapstore.core import coordination  # pylint: disable=g-import-not-at-top

  exchanges = _exchanges(first_worker, "alone", timeout=0.5)
  start = time.time()
  with pytest.raises(coordination.Late) as caught:
    exchanges[0].agree("lonely")
  assert 0.5 <= time.time() - start < 5
  assert caught.value.task == "worker:1"
  assert "no value of round 0" in caught.value.why
  assert exchanges[0].round == 0  # not counted
  # The late worker does not see the withdrawn value: it times out too.
  with pytest.raises(coordination.Late):
    exchanges[1].agree("late")
  # A later round of both pairs them, round 0 on each.
  want = {"worker:0": "x", "worker:1": "y"}
  assert _agree_together(exchanges, ["x", "y"]) == [want, want]


def test_an_unreachable_first_worker_is_a_bounded_refusal():
  from unittest import mock  # pylint: disable=g-import-not-at-top

  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
  from snapstore.core import coordination  # pylint: disable=g-import-not-at-top
  from snapstore.engines.graph import multi_worker as graph_multi_worker  # pylint: disable=g-import-not-at-top

  port = cluster.free_ports(1)[0]  # nothing listens there
  spec = tf.train.ClusterSpec(
    {"worker": ["127.0.0.1:%d" % port, "127.0.0.1:1"]}
  )
  with mock.patch.object(coordination, "TIMEOUT", 1.0):
    exchange = graph_multi_worker._VariableExchange(  # pylint: disable=protected-access
      (_Strategy(), spec, "worker:1", ["worker:0", "worker:1"]), "gone"
    )
  start = time.time()
  with pytest.raises(coordination.Late) as caught:
    exchange.agree("v")
  assert time.time() - start < 10
  assert caught.value.task == "worker:0"
  assert "Error" in caught.value.why  # the TensorFlow error's class


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  if not hasattr(tf, "estimator"):
    pytest.skip("tf.estimator is gone from TensorFlow 2.16 on")
  return _run("estimator", str(tmp_path_factory.mktemp("estimator")))


def test_snapshot_hook_in_an_estimator_rolls_back_both_workers(estimated):
  facts, arrays = estimated
  for worker, held in zip(facts, arrays):
    # Batch 5's loss is infinite on worker 0's data only; the Estimator's
    # loss is reduced over the workers: both roll back at run 5, to the
    # snapshot before run 4 (the state after run 3).
    assert worker["rollbacks"] == 1
    assert worker["steps"] == 8
    count = len([k for k in held if k.startswith("0/")])
    after = [[held["%d/%d" % (s, i)] for i in range(count)] for s in range(8)]
    assert any(a.tobytes() != b.tobytes() for a, b in zip(after[4], after[3]))
    for a, b in zip(after[5], after[3]):
      assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert all(np.all(np.isfinite(a)) for a in after[-1])
  assert facts[0]["keys"] == facts[1]["keys"]
  assert "net/w" in facts[0]["keys"]
  assert sorted(arrays[0]) == sorted(arrays[1])
  for name in arrays[0]:  # the workers identical at every step
    assert arrays[0][name].tobytes() == arrays[1][name].tobytes(), name


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  return _run("training", str(tmp_path_factory.mktemp("training")))


def _parts(held, prefix):
  """The arrays "<prefix>/0", "<prefix>/1"... of one worker, in order."""
  count = len([k for k in held if k.rsplit("/", 1)[0] == prefix])
  return [held["%s/%d" % (prefix, i)] for i in range(count)]


def _assert_bits(got, want, what):
  assert got.dtype == want.dtype, what
  assert got.shape == want.shape, what
  assert got.tobytes() == want.tobytes(), "%s:\n%r\n%r" % (what, got, want)


def test_training_leaves_both_workers_identical(trained):
  facts, arrays = trained
  assert facts[0]["keys"] == facts[1]["keys"]
  # Lookahead's state is covered: its slow weights and step counter.
  assert {"net/w", "net/w/Lookahead/slot_0", "Lookahead_counter"} <= set(
    facts[0]["keys"]
  )
  names = sorted(arrays[0])
  assert names == sorted(arrays[1])
  assert len(names) > 80
  for name in names:  # every step's every value, bit for bit
    _assert_bits(arrays[0][name], arrays[1][name], name)


def test_lookahead_and_averages_of_each_component_equal_numpy(trained):
  """Lookahead's fast and slow weights, MovingAverage, TF's own
  ExponentialMovingAverage and RunningMean, per worker, after every step,
  against numpy from the weights' initial values."""
  from tests import mwms_graph_worker as worker  # pylint: disable=g-import-not-at-top

  facts, arrays = trained
  c = worker.constants()
  f32 = np.float32
  rate = f32(1) - f32(worker.DECAY)  # TF's EMA: 1 - decay, in float32
  for facts_, held in zip(facts, arrays):
    # The gradient all-reduced: C, or 2 C when the loss reduction is SUM.
    scale = set(facts_["scale"])
    assert len(scale) == 1 and scale <= {1, 2}
    scale = f32(scale.pop())
    grads = [c[n] * scale for n in ("net/b", "net/w")]  # key order
    grad_u = c["net/u"] * scale
    fast = _parts(held, "init/model")
    # Every average starts at the initial values (worker 0's, broadcast).
    for name in ("init/ema", "init/tf_ema"):
      for got, want in zip(_parts(held, name), fast):
        _assert_bits(got, want, name)
    slow = [a.copy() for a in fast]  # taken at the first step
    ema = [a.copy() for a in fast]
    swa = None
    u = held["init/u/0"]
    for n in range(1, worker.STEPS + 1):
      fast = [a - f32(worker.LR) * g for a, g in zip(fast, grads)]
      if n % worker.K == 0:
        slow = [p + f32(worker.ALPHA) * (a - p) for a, p in zip(fast, slow)]
        fast = [p.copy() for p in slow]
      ema = [e - (e - x) * rate for e, x in zip(ema, fast)]
      if swa is None:
        swa = [a.copy() for a in fast]
      else:
        swa = [m + (x - m) / f32(n) for m, x in zip(swa, fast)]
      step = "step%d/" % n
      for what, want in (
        ("model", fast),
        ("slow", slow),
        ("ema", ema),
        ("tf_ema", ema),
        ("swa", swa),
      ):
        got = _parts(held, step + what)
        assert len(got) == 2
        for i, (a, b) in enumerate(zip(got, want)):
          _assert_bits(
            a, b, "worker %d %s%s/%d" % (facts_["index"], step, what, i)
          )
      # The in-step snapshot holds u as the step started, the update after.
      _assert_bits(held[step + "u_slot/0"], u, step + "u_slot")
      u = u - f32(worker.LR) * grad_u
      _assert_bits(held[step + "u/0"], u, step + "u")
    # Lookahead's evaluate_with: y = 3 w + b at the slow weights, then the
    # fast weights put back.
    _assert_bits(
      held["lookahead/evaluated"], slow[1] * f32(3) + slow[0], "evaluated"
    )
    for got, want in zip(_parts(held, "lookahead/after"), fast):
      _assert_bits(got, want, "lookahead/after")


def test_a_nan_step_rolls_back_to_the_in_step_snapshot_on_both(trained):
  """u's loss is NaN on worker 0's data only; the all-reduced gradients make
  u NaN on both workers, and the all-reduced loss kept both slots: the slot
  still holds u as the last finite step (STEPS) started."""
  from tests import mwms_graph_worker as worker  # pylint: disable=g-import-not-at-top

  facts, arrays = trained
  for facts_, held in zip(facts, arrays):
    assert facts_["nan_step_ruined"]
    start = held["step%d/u_slot/0" % worker.STEPS]
    _assert_bits(start, held["step%d/u/0" % (worker.STEPS - 1)], "start")
    _assert_bits(held["nan/u_slot/0"], start, "slot after the NaN step")
    _assert_bits(held["nan/evaluated"], start * np.float32(3), "evaluated")
    _assert_bits(held["nan/restored/0"], start, "restored")


def test_a_guard_and_a_trial_roll_back_both_workers(trained):
  facts, arrays = trained
  for facts_, held in zip(facts, arrays):
    # The guarded step's loss, all-reduced, was NaN on both workers.
    assert facts_["guard_failures"] == 1
    before = _parts(held, "guard/before")
    assert len(before) == len(facts_["keys"])
    assert all(np.all(np.isfinite(a)) for a in before)
    for name, got, want in zip(
      facts_["keys"], _parts(held, "guard/after"), before
    ):
      _assert_bits(got, want, "guard " + name)
    # The guard whose block raised after a step (a synchronization, which
    # moved the slow weights and the counter) put it all back.
    assert facts_["guard_raised"] == ["the block fails on every worker"]
    _moved_then_put_back(
      facts_["keys"], held, "guard/raised_trained", "guard/raised_after", before
    )
    # The rejected trial's step (step STEPS + 1, a synchronization) moved
    # the slow weights and the counter. (The fast weights come back to
    # where they were: with a constant gradient g, k = 2 and alpha = 1/2,
    # slow + (fast - 2 g - slow) / 2 = fast - g, as numpy's test above
    # follows bit for bit.)
    assert not facts_["trial_kept"]
    _moved_then_put_back(
      facts_["keys"], held, "trial/trained", "trial/after", before
    )


def _moved_then_put_back(keys, held, trained, after, before):
  """The rolled-back step (arrays `trained`) moved the slow weights and the
  counter, and the arrays `after` the rollback are `before`, bit for bit."""
  for name, got, want in zip(keys, _parts(held, trained), before):
    if "slot_0" in name or "counter" in name:
      assert got.tobytes() != want.tobytes(), name
  for name, got, want in zip(keys, _parts(held, after), before):
    _assert_bits(got, want, "%s %s" % (after, name))
