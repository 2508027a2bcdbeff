"""One worker of a two-worker MultiWorkerMirroredStrategy, for test_multi_worker.

    python -m tests.eager.mwms_worker PORTS INDEX SCENARIO OUT

PORTS is a JSON list of the workers' loopback ports, INDEX this worker's,
OUT a directory: the worker writes OUT/<INDEX>.npz (arrays the test compares
across workers and against numpy) and OUT/<INDEX>.json (messages, counts),
prints "ok", and serves until its stdin closes (`cluster.run_workers`). Scenarios:

- `stores`: for each mode, a store over a Keras model and its optimizer,
  snapshot, training steps (gradients all-reduced), a coordinated restore;
  evaluate_with at the snapshot; a restore on worker 0 alone and restores of
  different tags on the two workers, both refused with nothing written, and
  training and a coordinated restore working after them.
- `averages`: an in-step snapshot (`snapshot_in_step()` inside
  `strategy.run`, a step whose loss is NaN on worker 0's data only), then
  `MovingAverage.update()` and `Lookahead.update()` after steps; each
  worker records its components before and after each update for the test
  to check against numpy. Then a `Guard` and two `Trial`s over a step whose
  loss is NaN on worker 0's data only (and one without).
- `fit`, `fit_in_step`: Keras `fit` with `SnapshotCallback(every_n_batches=1)`
  (`in_step=True`) over the same batches on both workers (sharding off), one
  of them NaN on worker 0; then a reference `fit` without that batch.

A worker process is its own TensorFlow program: it sets TF_CONFIG before
TensorFlow starts, and the restore check's timeout (`coordination.TIMEOUT`)
short, so that a refusal costs the test seconds.
"""

import json
import os
import sys

from tests import cluster

_MODES = ("device", "host", "disk")
_TIMEOUT = 2.0  # seconds a refused restore waits for the other worker


def main(ports, index, scenario, out):
  os.environ["TF_CONFIG"] = cluster.worker_config(ports, index)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from snapstore.core import coordination  # pylint: disable=g-import-not-at-top

  coordination.TIMEOUT = _TIMEOUT
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  arrays, facts = {}, {"index": index}
  if scenario == "stores":
    _stores(strategy, index, out, arrays, facts, np, tf)
  elif scenario in ("fit", "fit_in_step"):
    _fit(strategy, index, arrays, facts, np, tf, scenario == "fit_in_step")
  elif scenario == "averages":
    _averages(strategy, index, arrays, facts, np, tf)
  else:
    raise ValueError("unknown scenario %r" % scenario)
  # Serves until every worker said ok: the coordination service's leader
  # (worker 0) and each server must outlive the other's last call.
  cluster.finish_worker(out, index, arrays, facts)


def _components(v):
  import numpy as np  # pylint: disable=g-import-not-at-top

  return [np.array(c.numpy(), copy=True) for c in v.values]


def _state(store):
  """Every local component of every covered variable, in key order."""
  return [c for v in store.variables.values() for c in _components(v)]


def _same(a, b):
  return len(a) == len(b) and all(
    x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b)
  )


def _stores(strategy, index, out, arrays, facts, np, tf):
  import snapstore  # pylint: disable=g-import-not-at-top
  from tests.eager import common  # pylint: disable=g-import-not-at-top

  keras = common.keras
  with strategy.scope():
    model = common.small_model()
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
    # A metric-like counter: each worker's component holds its own count.
    count = tf.Variable(
      0.0,
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
      name="count",
    )
  step = common.replicated_step(strategy, model, opt, loss=common.keras_mse())

  data = common.batches(2, seed=1 + index)  # each worker its own data
  # A device store built on worker 0 alone: refused, not a hang; worker 1
  # waits in a collective meanwhile (it works after the refusal).
  if index == 0:
    try:
      snapstore.SnapshotStore(var_list=model, name="lonely")
    except snapstore.CoordinationError as e:
      facts["build_alone"] = str(e)
  strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
  for mode in _MODES:
    options = common.mode_options(mode, _Path(out, index, mode))
    count.values[0].assign(float(index + 1))  # the sum over workers is 3
    store = snapstore.SnapshotStore(
      var_list=list(model.variables) + [count],
      optimizer=opt,
      mode=mode,
      max_to_keep=2,
      name="mw_" + mode,
      **options,
    )
    start = _state(store)
    tag = store.snapshot("start")
    for x, y in data:
      step(x, y)
    count.values[0].assign(100.0)
    trained = _state(store)
    facts[mode + "/trained_differs"] = not _same(start, trained)

    # Evaluation at the snapshot: every value times 3, as numpy computes it.
    facts[mode + "/evaluate_equals_numpy"] = _evaluated(store, tag)
    facts[mode + "/evaluate_put_back"] = _same(trained, _state(store))

    # A restore on worker 0 alone: refused there, nothing written.
    if index == 0:
      facts[mode + "/alone"] = _refused(store, tag, snapstore)
      facts[mode + "/alone_unchanged"] = _same(trained, _state(store))
    # Worker 1 waits in a collective meanwhile: worker 0's collectives work
    # after the refusal (a timed-out collective would have aborted them).
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    # Both restore, but different snapshots: refused on both.
    store.snapshot("later")
    facts[mode + "/different"] = _refused(
      store, "start" if index == 0 else "later", snapstore
    )
    facts[mode + "/different_unchanged"] = _same(trained, _state(store))
    # Training goes on (no collective was aborted), then both restore.
    step(*data[0])
    store.restore("start")
    restored = _state(store)
    facts[mode + "/restored_equals_start"] = _same(start, restored)
    facts[mode + "/count"] = float(count.read_value())  # all-reduced
    for key, v in store.variables.items():
      for i, a in enumerate(_components(v)):
        arrays["%s/%s/%d" % (mode, key, i)] = a
    store.close()


def _averages(strategy, index, arrays, facts, np, tf):
  import snapstore  # pylint: disable=g-import-not-at-top
  from tests.eager import common  # pylint: disable=g-import-not-at-top

  keras = common.keras
  with strategy.scope():
    model = common.small_model()
    opt = keras.optimizers.SGD(0.05)
    opt.build(model.trainable_variables)
  data = common.batches(3, seed=1 + index)  # each worker its own data

  # The in-step snapshot: each replica copies its own components at the
  # top of its step, if the loss is finite on every replica of every worker.
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt, name="in")
  snap = store.slots.snapshot_in_step()
  step = common.replicated_step(strategy, model, opt, in_step=snap)
  start = _state(store)
  step(*data[0])
  facts["in_step/slot_is_start"] = _same(start, _shadow_state(store))
  second = _state(store)
  facts["in_step/step_changed"] = not _same(start, second)
  x, y = data[1]
  if index == 0:  # NaN on worker 0 only: neither worker's slot is written
    x, y = x.copy(), y.copy()
    common.spoil(x, y, 0)
  step(x, y)
  # The slot still holds the start of the newest step whose loss was
  # finite everywhere: the first.
  facts["in_step/nan_kept_slot"] = _same(start, _shadow_state(store))
  store.restore("before_step")  # coordinated: both workers
  facts["in_step/restored"] = _same(start, _state(store))
  for i, a in enumerate(_state(store)):
    arrays["in_step/%d" % i] = a
  store.close()

  # MovingAverage and Lookahead, updated after each step (cross-replica).
  ema_store = snapstore.SnapshotStore(var_list=model, name="ema")
  ema = snapstore.MovingAverage(ema_store, tau=0.25)
  lookahead = snapstore.KerasLookahead(opt, k=2, alpha=0.5, var_list=model)
  step = common.replicated_step(strategy, model, opt)
  keys = list(ema_store.variables)
  for i, a in enumerate(_shadow_state(ema_store)):
    arrays["ema/start/%d" % i] = a
  for i, a in enumerate(_shadow_state(lookahead.store())):
    arrays["slow/start/%d" % i] = a
  for n in range(4):
    step(*data[n % len(data)])
    for i, a in enumerate(_state(ema_store)):
      arrays["ema/value/%d/%d" % (n, i)] = a
    ema.update()
    for i, a in enumerate(_shadow_state(ema_store)):
      arrays["ema/average/%d/%d" % (n, i)] = a
    fast = [
      c for v in lookahead.store().variables.values() for c in _components(v)
    ]
    for i, a in enumerate(fast):
      arrays["lookahead/fast/%d/%d" % (n, i)] = a
    lookahead.update()
    for i, a in enumerate(_state(lookahead.store())):
      arrays["lookahead/after/%d/%d" % (n, i)] = a
    for i, a in enumerate(_shadow_state(lookahead.store())):
      arrays["lookahead/slow/%d/%d" % (n, i)] = a
  facts["ema/keys"] = keys
  # Batch-norm statistics hold each worker's own values (sync-on-read in
  # tf-keras; in Keras 3 mirrored, but each replica assigns its own batch's
  # statistics to its component): only the trainable weights, written from
  # all-reduced gradients, are equal across workers.
  facts["ema/trainable"] = [
    bool(v.trainable) for v in ema_store.variables.values()
  ]
  _guards(strategy, index, model, opt, data, facts, np, tf)


def _guards(strategy, index, model, opt, data, facts, np, tf):
  """Guard and Trial: a step whose loss is NaN on worker 0's data only.

  The step returns the loss summed over every replica of every worker, so
  both workers' guards (and trials' metrics) see NaN and roll back
  together; a rollback is a restore, coordinated across the workers.
  """
  import snapstore  # pylint: disable=g-import-not-at-top
  from tests.eager import common  # pylint: disable=g-import-not-at-top

  store = snapstore.SnapshotStore(var_list=model, optimizer=opt, name="g")
  step = common.replicated_step(strategy, model, opt, reduce=True)

  @tf.function
  def held_out():  # the metric: every worker's loss on its first batch
    x, y = data[0]
    losses = strategy.run(lambda x, y: common.mse(y, model(x)), args=(x, y))
    return strategy.reduce("SUM", losses, axis=None)

  x, y = data[2]
  bad_x, bad_y = x.copy(), y.copy()
  if index == 0:
    common.spoil(bad_x, bad_y, 0)
  before = _state(store)
  with snapstore.Guard(store, watch=True, reraise=False) as guard:
    guard.run(step, bad_x, bad_y)
  facts["guard/failed"] = bool(guard.failed)
  facts["guard/restored"] = _same(before, _state(store))
  with snapstore.Trial(store, metric=held_out) as trial:
    step(bad_x, bad_y)
  facts["trial/rejected"] = not trial.kept
  facts["trial/restored"] = _same(before, _state(store))
  finite = lambda before, after: bool(np.isfinite(after))  # noqa: E731
  with snapstore.Trial(store, metric=held_out, accept=finite) as trial:
    step(x, y)
  facts["trial/kept"] = bool(trial.kept)
  facts["trial/changed"] = not _same(before, _state(store))
  store.close()


def _shadow_state(store):
  """Every local component of every shadow of slot 0, in key order."""
  return [c for s in store.slots.shadows(0).values() for c in _components(s)]


def _evaluated(store, tag):
  """evaluate_with at `tag` gives what numpy computes from its arrays."""
  keys = [k for k, v in store.variables.items() if v.dtype.is_floating]

  def fn():
    return [(store.variables[k].values[0] * 3.0).numpy() for k in keys]

  seen = store.evaluate_with(fn, tag=tag)
  held = store.arrays(tag)
  want = [held[k] * held[k].dtype.type(3) for k in keys]
  return bool(keys) and all(
    w.dtype == s.dtype and w.tobytes() == s.tobytes()
    for w, s in zip(want, seen)
  )


def _refused(store, tag, snapstore):
  try:
    store.restore(tag)
  except snapstore.CoordinationError as e:
    return str(e)
  return None


class _Path(object):
  """`tmp_path / name` for `common.mode_options`, one file per worker."""

  def __init__(self, out, index, mode):
    self._base = os.path.join(out, "%s_%d" % (mode, index))

  def __truediv__(self, name):
    return self._base + "_" + name


def _fit(strategy, index, arrays, facts, np, tf, in_step=False):
  """`fit` with the callback over a NaN batch, then the reference `fit`.

  The reference trains the same model (same initial weights) on the same
  batches without the NaN one: a rollback is exact when the callback's run
  ends with the same weights and optimizer state, bit for bit.
  """
  import snapstore  # pylint: disable=g-import-not-at-top
  from tests.eager import common  # pylint: disable=g-import-not-at-top

  keras = common.keras

  def fitted(x, y, callbacks):
    with strategy.scope():
      model = common.small_model()
      # Adam: its slots and `iterations` must be rolled back too.
      model.compile(keras.optimizers.Adam(0.01), "mse")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.OFF
    )
    data = data.with_options(options)
    model.fit(data, epochs=1, callbacks=callbacks(model), verbose=0)
    return [
      np.array(v.numpy(), copy=True)
      for v in common.state_variables(model, model.optimizer)
    ]

  # Batches of 16, sharding off: each step, each worker's replica takes the
  # next 8 rows of the whole dataset (the global batch split in two), so
  # step k trains on rows 8k..8k+7 on both workers; 5 steps use rows 0..39.
  x = np.concatenate([b[0] for b in common.batches(5)])
  y = np.concatenate([b[1] for b in common.batches(5)])
  good = x.copy()
  if index == 0:  # step 2 NaN on worker 0 only: worker 1 sees it through
    common.spoil(x, y, 16)  # the all-reduced gradients and loss
  losses, rollbacks, restored = [], [], []
  options = dict(in_step=True) if in_step else dict(every_n_batches=1)
  callback = snapstore.SnapshotCallback(
    on_rollback=lambda: (
      rollbacks.append(len(losses)),
      restored.append(callback.trusted),
    ),
    **options,
  )

  def callbacks(model):
    del model

    class Losses(keras.callbacks.Callback):
      def on_train_batch_end(self, batch, logs=None):
        losses.append(float(logs["loss"]))

    return [Losses(), callback]

  state = fitted(x, y, callbacks)
  facts["losses"] = [repr(x) for x in losses]
  facts["rollbacks"] = rollbacks
  facts["restored"] = restored
  facts["finite"] = all(np.isfinite(w).all() for w in state)
  # Without step 2's rows, on both workers: 4 steps (64 rows).
  reference = fitted(
    np.delete(good, range(16, 24), axis=0)[:64],
    np.delete(y, range(16, 24), axis=0)[:64],
    lambda model: [],
  )
  facts["equals_reference"] = _same(reference, state)
  for i, w in enumerate(state):
    arrays["fit/%d" % i] = w


if __name__ == "__main__":
  main(json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
