"""One worker of a graph-mode MultiWorkerMirroredStrategy, for test_multi_worker_graph.

    python -m tests.mwms_graph_worker PORTS INDEX SCENARIO OUT

PORTS is a JSON list of the workers' loopback ports, INDEX this worker's,
OUT a directory: the worker writes OUT/<INDEX>.npz (arrays the test compares
across workers and against numpy) and OUT/<INDEX>.json (messages, facts),
prints "ok", and serves its server until its stdin closes. Graph mode as a TF1-style program runs it: TF_CONFIG, the
strategy, a `tf.distribute.Server` with the strategy's session config, and
a session on that server. Scenarios:

- `stores`: for each mode, a store over mirrored variables (float32,
  float64, int64), a sync-on-read SUM counter and Adam's state; snapshot,
  training steps (gradients all-reduced), evaluate_with at the snapshot, a
  restore on worker 0 alone and restores of different tags (both refused,
  nothing written), a training step after them, then a coordinated
  restore.
- `hook`: `SnapshotHook(every_n_steps=1)` in a `MonitoredTrainingSession`,
  whose loss is NaN at one step on worker 0's data only; the hook watches
  the loss reduced over both workers, so both roll back at the same step.
- `hook_alone`: the same, the hook watching each worker's own loss: worker
  0's rollback is refused (it would be its alone).
- `training`: `Lookahead` (around SGD, `k=2`) training w and b, with a
  store over them and Lookahead's state, and a second holding a
  `MovingAverage` (beside TF's own `ExponentialMovingAverage` of the same)
  and a `RunningMean`; a third model, u, trained by SGD through
  `snapshot_before(..., if_finite=<its loss all-reduced over the workers>)`.
  Each step's values of every component, slow weight, average and in-step
  slot, for the test to recompute in numpy; then a NaN step of u on worker
  0's data only, rolled back on both by a restore of the in-step snapshot;
  a `Guard` whose step's loss is NaN (worker 0's data), one whose block
  raises and a `Trial` rejected, on both workers.
- `estimator`: `tf.estimator.train_and_evaluate` with
  `RunConfig(train_distribute=MultiWorkerMirroredStrategy())` (TF 1.15,
  2.15) and a SnapshotHook in the TrainSpec; one batch of worker 0's has an
  infinite loss. The Estimator's loss is reduced over the workers, so both
  roll back at that step.

The restore check's timeout (`coordination.TIMEOUT`) is short, so a refusal
costs the test seconds.
"""

import json
import os
import sys

from tests import cluster

_MODES = ("device", "host", "disk")
_TIMEOUT = 2.0  # seconds a refused restore waits for the other worker


def main(ports, index, scenario, out):
  os.environ["TF_CONFIG"] = cluster.worker_config(ports, index)
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
  from snapstore.core import coordination  # pylint: disable=g-import-not-at-top

  tf.disable_v2_behavior()
  coordination.TIMEOUT = _TIMEOUT
  arrays, facts = {}, {"index": index}
  if scenario == "estimator":  # its distribute coordinator starts a server
    _estimator(index, out, arrays, facts)
  else:
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    config = strategy.update_config_proto(tf.ConfigProto())
    server = tf.distribute.Server(
      tf.train.ClusterSpec({"worker": ["127.0.0.1:%d" % p for p in ports]}),
      job_name="worker",
      task_index=index,
      config=config,
    )
    if scenario == "stores":
      _stores(strategy, server, config, index, out, arrays, facts)
    elif scenario == "training":
      _training(strategy, server, config, index, arrays, facts)
    elif scenario in ("hook", "hook_alone"):
      _hook(strategy, server, config, index, arrays, facts, scenario == "hook")
    else:
      raise ValueError("unknown scenario %r" % scenario)
  # Serves until every worker said ok: a worker exiting first could take
  # its server from under the other's last all-reduce.
  cluster.finish_worker(out, index, arrays, facts)


def _run(strategy, fn):
  run = getattr(strategy, "run", None) or strategy.experimental_run_v2
  return run(fn)


def _all_reduced(strategy, fn):
  """The sum over every replica of every worker of `fn()`: an all-reduce in
  replica context (TF 1.15's `strategy.reduce` places its result on a
  device without a job, which a worker's session cannot place)."""
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  def replica():
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, fn())

  return strategy.experimental_local_results(_run(strategy, replica))[0]


def _barrier(strategy):
  """An op both workers' runs meet at: an all-reduce."""
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  return _all_reduced(strategy, lambda: tf.constant(1.0))


def _same(a, b):
  return len(a) == len(b) and all(
    x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in zip(a, b)
  )


def _stores(strategy, server, config, index, out, arrays, facts):
  import numpy as np  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
  from snapstore.core import distributed  # pylint: disable=g-import-not-at-top
  from tests import helpers  # pylint: disable=g-import-not-at-top

  with strategy.scope(), tf.variable_scope("net"):
    w = tf.get_variable("w", [3, 4], tf.float32)
    b = tf.get_variable("b", [4], tf.float32)
    # Not trained: TF 2.x's all-reduce packs every gradient in one tensor,
    # which must be of one dtype.
    d = tf.get_variable("d", [2], tf.float64, trainable=False)
    steps = tf.get_variable(
      "steps",
      [],
      tf.int64,
      initializer=tf.zeros_initializer(),
      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
    # A metric-like counter: each worker's component holds its own count.
    count = tf.get_variable(
      "count",
      [],
      tf.float32,
      initializer=tf.zeros_initializer(),
      synchronization=tf.VariableSynchronization.ON_READ,
      aggregation=tf.VariableAggregation.SUM,
      trainable=False,
    )
    opt = tf.train.AdamOptimizer(0.01)
  x = tf.placeholder(tf.float32, [2, 3])
  # What evaluate_with evaluates: elementwise, so numpy's bits are TF's.
  y = w * 3.0 + b

  def replica_step():
    loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b))
    with tf.control_dependencies([steps.assign_add(1)]):
      return opt.minimize(loss)

  train = strategy.group(_run(strategy, replica_step))
  barrier = _barrier(strategy)
  # The counter summed over the workers, as TF's read of it in cross-replica
  # context would give.
  count_read = _all_reduced(strategy, lambda: tf.identity(count))
  mirrored = [w, b, d, steps]
  parts = [v.values[0] for v in mirrored + [count]]  # one replica per worker
  loads = {}
  for v in mirrored + [count]:
    p = tf.placeholder(v.dtype.base_dtype, v.shape)
    loads[v] = (p, v.values[0].assign(p, read_value=False))
  stores = {}
  for mode in _MODES:
    options = {}
    if mode == "disk":
      options = dict(
        spill_path=os.path.join(out, "spill_%d_%s.h5" % (index, mode)),
        memory_budget=0,
      )
    stores[mode] = snapstore.SnapshotStore(
      var_list=mirrored + [count],
      optimizer=opt,
      mode=mode,
      max_to_keep=2,
      name="mw_" + mode,
      **options,
    )
  sess = tf.Session(server.target, config=config)
  sess.run(
    [tf.global_variables_initializer(), tf.local_variables_initializer()]
  )
  data = np.random.RandomState(1 + index).normal(size=(2, 2, 3))
  data = data.astype(np.float32)  # each worker its own data
  covered = [
    c
    for v in stores["device"].variables.values()
    for c in distributed.components(v)
  ]

  def state():
    return [np.array(a, copy=True) for a in sess.run(covered)]

  for mode in _MODES:
    store = stores[mode]
    # The same values on both workers: ordinary numbers (Adam's update and
    # the evaluation below stay finite), any int64.
    rng = np.random.RandomState(7 + _MODES.index(mode))
    values = {
      v: (rng.normal(size=v.shape.as_list()) * 3).astype(
        v.dtype.base_dtype.as_numpy_dtype
      )
      for v in (w, b, d)
    }
    values[steps] = helpers.random_value(rng, [], np.int64)
    values[count] = np.float32(index + 1)  # the sum over workers is 3
    sess.run(
      [loads[v][1] for v in values], {loads[v][0]: a for v, a in values.items()}
    )
    start = state()
    tag = store.snapshot("start", session=sess)
    for batch in data:
      sess.run(train, {x: batch})
    sess.run(loads[count][1], {loads[count][0]: np.float32(100)})
    trained = state()
    facts[mode + "/trained_differs"] = not _same(start, trained)

    # Evaluation at the snapshot: y as numpy computes it from the arrays.
    seen = store.evaluate_with(y, tag=tag, session=sess)
    held = store.arrays(tag, session=sess)
    want = held["net/w"] * np.float32(3) + held["net/b"]
    arrays[mode + "/evaluated"] = seen
    arrays[mode + "/numpy"] = want
    facts[mode + "/evaluate_put_back"] = _same(trained, state())

    # A restore on worker 0 alone: refused there after the timeout, nothing
    # written; worker 1 waits in the barrier meanwhile (a collective).
    if index == 0:
      facts[mode + "/alone"] = _refused(store, tag, sess, snapstore)
      facts[mode + "/alone_unchanged"] = _same(trained, state())
    sess.run(barrier)
    # Both restore, but different snapshots: refused on both.
    store.snapshot("later", session=sess)
    facts[mode + "/different"] = _refused(
      store, "start" if index == 0 else "later", sess, snapstore
    )
    facts[mode + "/different_unchanged"] = _same(trained, state())
    # Training goes on (no collective was aborted), then both restore.
    sess.run(train, {x: data[0]})
    store.restore("start", session=sess)
    restored = state()
    facts[mode + "/restored_equals_start"] = _same(start, restored)
    facts[mode + "/count"] = float(sess.run(count_read))
    for i, a in enumerate(restored):
      arrays["%s/%d" % (mode, i)] = a
    store.close()
  facts["keys"] = list(stores["device"].variables)
  del parts
  sess.run(barrier)  # both finish together


# The `training` scenario's models, each loss sum(v * (C_v * s)) summed over
# its variables, s a scalar each worker feeds (1, or NaN on worker 0's bad
# step): the gradient of v is C_v * s, times 1/2 per worker when the loss
# reduction is MEAN, so all-reduced over the two workers exactly C_v * SCALE
# (numpy's bits). w and b are trained by Lookahead around SGD; u (a model of
# its own) by SGD through snapshot_before: Lookahead makes its state in its
# train op, which a store over it must follow, while snapshot_before builds
# the train op after its store.
K, ALPHA, LR, DECAY = 2, 0.5, 0.5, 0.75
STEPS = 2 * K + 1


def constants():
  """{name: C_name} of the `training` scenario (the test recomputes with
  them)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.RandomState(30)
  shapes = (("net/w", [3, 4]), ("net/b", [4]), ("net/u", [2, 3]))
  return {n: rng.normal(size=s).astype(np.float32) for n, s in shapes}


def _training(strategy, server, config, index, arrays, facts):
  """The `training` scenario (module doc). Arrays: "<what>/<i>" of this
  worker's component of each variable after initialization ("init") and
  after each step n ("step<n>"), then what the later operations left."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  c = constants()
  s = tf.placeholder(tf.float32, [])
  with strategy.scope(), tf.variable_scope("net"):
    w = tf.get_variable("w", [3, 4], tf.float32)
    b = tf.get_variable("b", [4], tf.float32)
    u = tf.get_variable("u", [2, 3], tf.float32)
    lookahead = snapstore.Lookahead(
      tf.train.GradientDescentOptimizer(LR), k=K, alpha=ALPHA
    )
    sgd = tf.train.GradientDescentOptimizer(LR)

  def loss_of(*variables):
    return tf.add_n(
      [tf.reduce_sum(v * (c[v.name.split(":")[0]] * s)) for v in variables]
    )

  scale = []

  def replica(opt, variables):
    mean = tf.distribute.get_loss_reduction() == tf.distribute.ReduceOp.MEAN
    scale.append(1 if mean else 2)
    return opt.minimize(loss_of(*variables), var_list=list(variables))

  with strategy.scope():
    train = strategy.group(_run(strategy, lambda: replica(lookahead, (w, b))))
  # The losses summed over both workers: the same on each, so both decide
  # the same.
  total = _all_reduced(strategy, lambda: loss_of(w, b))
  total_u = _all_reduced(strategy, lambda: loss_of(u))
  store = snapstore.SnapshotStore(
    var_list=[b, w], optimizer=lookahead, max_to_keep=2, name="mw_trained"
  )
  averaged = snapstore.SnapshotStore(
    var_list=[b, w], max_to_keep=2, name="mw_averaged"
  )
  with tf.control_dependencies([train]):  # as README advises
    ema = snapstore.MovingAverage(averaged, decay=DECAY, slot=0)
  swa = snapstore.RunningMean(averaged, slot=1)
  with strategy.scope():  # TF's EMA of the same, as TF makes it there
    tf_ema = tf.train.ExponentialMovingAverage(DECAY)
    tf_ema_op = tf_ema.apply([w, b])
  in_step = snapstore.SnapshotStore(var_list=[u], name="mw_in_step")

  def update():  # entered in the scope inside, as snapshot_before asks
    with strategy.scope():
      return strategy.group(_run(strategy, lambda: replica(sgd, (u,))))

  train_u = in_step.slots.snapshot_before(update, if_finite=total_u)
  barrier = _barrier(strategy)
  parts = [
    p for v in store.variables.values() for p in getattr(v, "values", [v])
  ]
  facts["keys"] = list(store.variables)
  facts["parts"] = [p.name for p in parts]
  # This worker's one replica of each, in the stores' order (var_list's).
  model = [b.values[0], w.values[0]]
  slow = [lookahead.get_slot(p, "slow") for p in model]
  shadows = averaged.slots.component_shadows
  averages = [a for v in shadows(0).values() for a in v]
  means = [a for v in shadows(1).values() for a in v]
  tf_averages = [tf_ema.average(v).values[0] for v in (b, w)]
  u_part = u.values[0]
  u_slot = in_step.slots.component_shadows(0)["net/u"][0]
  y = w * 3.0 + b  # evaluated at snapshots: elementwise, numpy's bits
  y_u = u * 3.0
  sess = tf.Session(server.target, config=config)
  sess.run(
    [tf.global_variables_initializer(), tf.local_variables_initializer()]
  )

  def put(prefix, tensors):
    for i, a in enumerate(sess.run(tensors)):
      arrays["%s/%d" % (prefix, i)] = a

  facts["scale"] = scale
  put("init/model", model)
  put("init/ema", averages)
  put("init/tf_ema", tf_averages)
  put("init/u", [u_part])
  for n in range(1, STEPS + 1):
    sess.run(ema.update_op, {s: 1.0})  # the step, then the average
    sess.run([swa.update_op, tf_ema_op])
    sess.run(train_u, {s: 1.0})
    step = "step%d/" % n
    put(step + "model", model)
    put(step + "slow", slow)
    put(step + "ema", averages)
    put(step + "swa", means)
    put(step + "tf_ema", tf_averages)
    put(step + "u", [u_part])
    put(step + "u_slot", [u_slot])  # the in-step snapshot: u before step n

  # Lookahead's evaluate_with: the slow weights, then the fast put back.
  arrays["lookahead/evaluated"] = lookahead.evaluate_with(y, session=sess)
  put("lookahead/after", model)

  # A step of u whose loss is NaN on worker 0's data only: the gradients are
  # all-reduced, so u is NaN on both workers; the loss summed over the
  # workers is NaN on both, so neither's slot was written: evaluate_with and
  # restore see u before step STEPS, on both.
  sess.run(train_u, {s: np.nan if index == 0 else 1.0})
  facts["nan_step_ruined"] = not np.all(np.isfinite(sess.run(u_part)))
  put("nan/u_slot", [u_slot])
  arrays["nan/evaluated"] = in_step.evaluate_with(
    y_u, tag="before_step", session=sess
  )
  in_step.restore("before_step", session=sess)
  put("nan/restored", [u_part])
  sess.run(barrier)

  # A guard whose step's loss (the all-reduced one, fetched with the step)
  # is NaN on both workers: both roll back through the coordinated restore.
  put("guard/before", parts)
  with snapstore.Guard(store, watch=total, reraise=False, session=sess) as g:
    g.run(train, {s: np.nan if index == 0 else 1.0})
  facts["guard_failures"] = len(g.failures)
  put("guard/after", parts)
  # A guard whose block raises after a finite step, on both workers.
  with snapstore.Guard(store, reraise=False, session=sess) as g:
    g.run(train, {s: 1.0})
    put("guard/raised_trained", parts)
    raise RuntimeError("the block fails on every worker")
  facts["guard_raised"] = [str(e) for e in g.failures]
  put("guard/raised_after", parts)

  # A trial rejected on both workers.
  with snapstore.Trial(store, session=sess) as trial:
    sess.run(train, {s: 1.0})
    put("trial/trained", parts)
    trial.reject()
  facts["trial_kept"] = trial.kept
  put("trial/after", parts)
  for each in (store, averaged, in_step):
    each.close()
  sess.run(barrier)  # both finish together


def _refused(store, tag, sess, snapstore):
  try:
    store.restore(tag, session=sess)
  except snapstore.CoordinationError as e:
    return str(e)
  return None


def _hook(strategy, server, config, index, arrays, facts, reduced):
  """SnapshotHook(every_n_steps=1) over a loss summed over the workers.

  Worker 0's third batch is NaN; worker 1's are not. The gradients are
  all-reduced, so both workers' variables are ruined at that step, and the
  hook's loss is all-reduced too, so both roll back at that step, to the
  same snapshot (the one before step 1: the one before step 2 is dropped).

  Not `reduced`: the hook watches each worker's own loss, so worker 0 alone
  rolls back at step 2: refused (CoordinationError from that run), nothing
  written; the workers then meet at the last barrier after 3 steps each.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  x = tf.placeholder(tf.float32, [2, 3])
  with strategy.scope():
    w = tf.get_variable("w", [3, 2])
    step = tf.train.get_or_create_global_step()
    opt = tf.train.AdamOptimizer(0.1)

  def replica():
    loss = tf.reduce_sum(tf.matmul(x, w))
    context = tf.distribute.get_replica_context()
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, loss)
    return opt.minimize(loss, global_step=step), total, loss

  train, total, loss = _run(strategy, replica)
  train = strategy.group(train)
  total = strategy.experimental_local_results(total)[0]
  loss = strategy.experimental_local_results(loss)[0]
  store = snapstore.SnapshotStore(
    var_list=[w],
    optimizer=opt,
    include_global_step=True,
    max_to_keep=2,
    name="hooked",
  )
  parts = [
    p for v in store.variables.values() for p in getattr(v, "values", [v])
  ]
  rollbacks = []
  hook = snapstore.SnapshotHook(
    store,
    every_n_steps=1,
    loss=total if reduced else loss,
    on_rollback=lambda sess: rollbacks.append(len(recorder.before) - 1),
  )

  class Recorder(tf.train.SessionRunHook):
    """Records `parts` before every run (listed before the snapshot hook, so
    it sees the variables each step starts from)."""

    before = []
    after = []

    def before_run(self, run_context):
      self.before.append(run_context.session.run(parts))

    def after_run(self, run_context, run_values):
      del run_values  # before the snapshot hook's after_run: no rollback yet
      self.after.append(run_context.session.run(parts))

  recorder = Recorder()
  barrier = _barrier(strategy)  # before the session finalizes the graph
  ones, nans = np.ones([2, 3]), np.full([2, 3], np.nan)
  feeds = [ones, ones, nans if index == 0 else ones, ones][
    : 4 if reduced else 3
  ]
  # Every worker initializes its own replicas (their initial values are
  # broadcast from worker 0 by the initializers): is_chief on both.
  with tf.train.MonitoredTrainingSession(
    master=server.target,
    is_chief=True,
    config=config,
    hooks=[recorder, hook],
    log_step_count_steps=None,
  ) as sess:
    raw = sess._tf_sess()  # pylint: disable=protected-access
    for i, feed in enumerate(feeds):
      try:
        sess.run(train, {x: feed})
      except snapstore.CoordinationError as e:
        facts["refused_at"] = i
        facts["refused"] = str(e)
        facts["unchanged"] = _same(raw.run(parts), recorder.after[i])
      if i == 2 and reduced:
        now = raw.run(parts)
        facts["rolled_back_to_step_1"] = _same(now, recorder.before[1])
        facts["step_1_changed"] = not _same(
          recorder.before[1], recorder.before[2]
        )
    after = raw.run(parts)
  facts["rollbacks"] = rollbacks
  facts["hook_rollbacks"] = hook.rollbacks
  facts["snapshots"] = hook.snapshots
  facts["finite"] = all(bool(np.all(np.isfinite(a))) for a in after)
  facts["steps_run"] = len(recorder.after)
  facts["keys"] = list(store.variables)
  for i, a in enumerate(after):
    arrays["after/%d" % i] = a
  # Both finish together: a last all-reduce, in a session of its own (the
  # variables live on the servers, not in the closed session).
  tf.Session(server.target, config=config).run(barrier)


def _estimator(index, out, arrays, facts):
  """The `estimator` scenario (module doc)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top
  from tests import helpers  # pylint: disable=g-import-not-at-top

  model_fn = helpers.estimator_model_fn

  def input_fn():
    rng = np.random.RandomState(1)
    x = rng.randn(8 * 8, 3).astype(np.float32)
    if index == 0:
      x[5 * 8] = 1e30  # batch 5's squared error overflows: an infinite loss
    y = x.dot([1.0, -2.0, 0.5]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(8)

  class Recorder(tf.train.SessionRunHook):
    """Every global variable's components after each run (listed after the
    snapshot hook: after its rollback)."""

    after = []

    def begin(self):
      self.parts = [
        p for v in tf.global_variables() for p in getattr(v, "values", [v])
      ]

    def after_run(self, run_context, run_values):
      del run_values
      self.after.append(run_context.session.run(self.parts))

  hook = snapstore.SnapshotHook(
    lambda: snapstore.SnapshotStore(
      collection=tf.GraphKeys.GLOBAL_VARIABLES, max_to_keep=2
    ),
    every_n_steps=1,
    loss=lambda: tf.get_collection(tf.GraphKeys.LOSSES)[-1],
  )
  recorder = Recorder()
  strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
  config = tf.estimator.RunConfig(
    train_distribute=strategy,
    log_step_count_steps=None,
    save_summary_steps=None,
  )
  estimator = tf.estimator.Estimator(
    model_fn, model_dir=os.path.join(out, "model_%d" % index), config=config
  )
  tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(input_fn, hooks=[hook, recorder]),
    tf.estimator.EvalSpec(input_fn, steps=1),
  )
  facts["rollbacks"] = hook.rollbacks
  facts["steps"] = len(recorder.after)
  facts["keys"] = list(hook.store.keys)
  for step, values in enumerate(recorder.after):
    for i, a in enumerate(values):
      arrays["%d/%d" % (step, i)] = a


if __name__ == "__main__":
  main(json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
