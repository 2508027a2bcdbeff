"""A parameter-server training cluster (v2) in one process, checked.

Run by tests/eager/test_parameter_server.py as a script of its own (a
`ParameterServerStrategy` connects the process's eager context to the
cluster, which must not leak into the other tests): two workers and two
parameter servers on loopback ports, in-process servers, a
`ClusterCoordinator`, a variable sharded across both servers and one that is
not: a store in each mode, then `MovingAverage` and `Lookahead` over them
(bit for bit against numpy, refused while steps are in flight), `Guard` and
`Trial` rolling scheduled steps back bit for bit (refused on entry while
steps are in flight), `evaluate_with` and `restore` inside a scheduled
function (device mode; a host store refused when traced), and (tf-keras,
Keras 2) `fit` with `SnapshotCallback` on both workers. Each check raises on
failure; on success the script prints one line per check and "ALL OK".

    python tests/eager/ps_cluster.py <spill directory>
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import snapstore  # noqa: E402
from tests import cluster as cluster_ports  # noqa: E402


def in_process_cluster(workers, max_shard_bytes):
  """Servers for `workers` workers and two parameter servers on loopback
  ports, in this process, and a `ParameterServerStrategy` over them that
  shards variables into parts of at most `max_shard_bytes`."""
  ports = cluster_ports.free_ports(workers + 2)  # distinct: bound together
  spec = {
    "worker": ["localhost:%d" % p for p in ports[:workers]],
    "ps": ["localhost:%d" % p for p in ports[workers:]],
  }
  cluster = tf.train.ClusterSpec(spec)
  # In one process, the servers share its CPUs: give each enough threads
  # that a worker's function waiting on a parameter server's ops never
  # starves it (TF's own in-process cluster tests do the same).
  config = tf.compat.v1.ConfigProto(
    inter_op_parallelism_threads=8, intra_op_parallelism_threads=2
  )
  servers = [
    tf.distribute.Server(
      cluster, job_name=job, task_index=i, config=config, start=True
    )
    for job in ("worker", "ps")
    for i in range(len(spec[job]))
  ]
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    cluster, rpc_layer="grpc"
  )
  partitioner = tf.distribute.experimental.partitioners.MaxSizePartitioner(
    max_shard_bytes=max_shard_bytes
  )
  strategy = tf.distribute.experimental.ParameterServerStrategy(
    resolver, variable_partitioner=partitioner
  )
  return servers, strategy


def _cluster():
  # Shards of at most 16 bytes: the 2x3 float32 variable in two shards.
  servers, strategy = in_process_cluster(workers=2, max_shard_bytes=16)
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
    strategy
  )
  return servers, strategy, coordinator


def _parts(variables):
  """Numpy copies of every shard / variable, read where it lives."""
  out = []
  for v in variables:
    for part in getattr(v, "variables", [v]):
      out.append(np.array(part.numpy(), copy=True))
  return out


def _store(variables, mode, spill_dir, name):
  """A store of `variables` in `mode` (disk: spilled at once, in spill_dir)."""
  options = {}
  if mode == "disk":
    options = dict(
      spill_path=os.path.join(spill_dir, name + ".h5"), memory_budget=0
    )
  return snapstore.SnapshotStore(
    var_list=variables, mode=mode, name=name, **options
  )


def _same(expected, actual, what):
  if [a.tobytes() for a in expected] != [a.tobytes() for a in actual]:
    raise AssertionError("%s: %s != %s" % (what, expected, actual))


def _averaged(ema, lookahead):
  return list(ema.store.arrays("ema").values()) + list(
    lookahead.store().arrays("slow").values()
  )


def _averages(strategy, coordinator):
  """MovingAverage and Lookahead over a sharded and a plain variable.

  After each join, each shard's average (slow weights) is what numpy
  computes from the values the shard held, bit for bit; an update while
  scheduled steps may run is refused.
  """
  from tests.eager import common  # noqa: E402 (Keras, after the cluster)

  rng = np.random.RandomState(3)
  wide = rng.choice([-1, 1], [2, 3]) * 10.0 ** rng.uniform(-3, 3, [2, 3])
  with strategy.scope():
    u = tf.Variable(wide.astype(np.float32), name="u")  # in two shards
    c = tf.Variable(np.array([0.3, -2.0, 7.5], np.float32), name="c")
  if len(u.variables) != 2:
    raise AssertionError("u is not sharded: %s" % u)
  keys = ["u/part_0", "u/part_1", "c"]

  def held():
    return dict(zip(keys, _parts([u, c])))

  @tf.function
  def step():
    u.assign(u * 0.75 + tf.fill([2, 3], 0.125))
    c.assign(c * -1.5 + 0.25)

  ema = snapstore.MovingAverage(
    snapstore.SnapshotStore(var_list=[u, c], name="ema"), tau=0.25
  )
  lookahead = snapstore.KerasLookahead(
    common.keras.optimizers.SGD(0.1), k=2, alpha=0.5, var_list=[u, c]
  )
  average = held()
  slow = held()
  tau, alpha = np.float32(0.25), np.float32(0.5)
  for n in range(4):
    coordinator.schedule(step)
    coordinator.join()
    value = held()
    ema.update()
    for key in keys:
      average[key] = average[key] - (average[key] - value[key]) * tau
    _same(
      [average[k] for k in keys],
      [ema.store.arrays("ema")[k] for k in keys],
      "MovingAverage after update %d" % n,
    )
    lookahead.update()
    if (n + 1) % 2 == 0:  # k = 2: synchronized, fast = slow
      for key in keys:
        slow[key] = slow[key] + alpha * (value[key] - slow[key])
      value = dict(slow)
    arrays = lookahead.store().arrays("slow")
    _same([slow[k] for k in keys], [arrays[k] for k in keys], "slow %d" % n)
    _same([value[k] for k in keys], _parts([u, c]), "fast %d" % n)
  for what, update in (
    ("MovingAverage.update", ema.update),
    ("Lookahead.update", lookahead.update),
    ("Lookahead.reset", lookahead.reset),
  ):
    # (Read before scheduling: a store's arrays() is refused meanwhile.)
    before = _averaged(ema, lookahead)
    for _ in range(200):
      coordinator.schedule(step)
    try:
      update()
    except ValueError as e:
      if "%s() while functions scheduled" % what not in str(e) or (
        "coordinator.join() first, then %s()" % what not in str(e)
      ):
        raise
    else:
      raise AssertionError("%s() with steps in flight" % what)
    coordinator.join()
    # Refused before acting: the averages are as they were.
    _same(before, _averaged(ema, lookahead), "%s refused" % what)
  print("averages: OK")


def _refused(enter, what):
  """Asserts that `enter()` raises the refusal of entering `what` (a guard
  or trial) while scheduled steps may run, naming the fix."""
  try:
    enter()
  except ValueError as e:
    for part in (
      "Entering snapstore.%s while functions scheduled on the "
      "ClusterCoordinator may still be running" % what,
      "Call coordinator.join() before the block",
    ):
      if part not in str(e):
        raise
  else:
    raise AssertionError("a %s entered with steps in flight" % what)


def _guards(strategy, coordinator, spill_dir):
  """Guard and Trial over a sharded and a plain variable.

  A block whose scheduled step makes the loss NaN is rolled back bit for
  bit, in every mode, also while the block's other steps still run (the
  rollback waits for them); a retry trains from exactly the state before;
  a step that raises is rolled back; a trial judges (or rejects) the
  block's steps once they have run. Entering a guard or trial while steps
  scheduled before it may run is refused, having done nothing.
  """
  with strategy.scope():
    u = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="gu")
    c = tf.Variable(np.array([0.3, -2.0, 7.5], np.float32), name="gc")
  if len(u.variables) != 2:
    raise AssertionError("u is not sharded: %s" % u)

  def loss():
    return tf.reduce_sum(tf.convert_to_tensor(u)) + tf.reduce_sum(c)

  @tf.function
  def step(x):
    new_u, new_c = u * 0.75 + x, c * -1.5 + 0.25
    u.assign(new_u)
    c.assign(new_c)
    # The loss of what it wrote (another worker may write in between):
    # NaN exactly when x is.
    return {"loss": tf.reduce_sum(new_u) + tf.reduce_sum(new_c)}

  @tf.function
  def checked_step(x):  # raises on the worker when x is NaN
    return step(tf.debugging.check_numerics(x, "x"))

  @tf.function
  def drift():  # writes c only, and keeps it bounded
    c.assign(c * 0.5 + 1.0)

  nan, one = tf.constant(np.nan), tf.constant(1.0)

  def many(n=200):  # steps still running long after the call
    for _ in range(n):
      coordinator.schedule(drift)

  for mode in ("device", "host", "disk"):
    store = _store([u, c], mode, spill_dir, "guards_" + mode)
    before = _parts([u, c])
    with snapstore.Guard(store, watch="loss", reraise=False) as guard:
      guard.run(coordinator.schedule, step, args=(nan,))
    if not guard.failed or not isinstance(
      guard.failures[0], snapstore.NonFiniteError
    ):
      raise AssertionError("%s: failures %s" % (mode, guard.failures))
    _same(before, _parts([u, c]), "%s guard rollback" % mode)
    store.close()

  store = snapstore.SnapshotStore(var_list=[u, c], max_to_keep=3)
  coordinator.schedule(step, args=(one,))
  coordinator.join()
  before = _parts([u, c])
  store.snapshot("before")
  # The NaN step's loss is checked while the block's other steps run.
  with snapstore.Guard(store, watch=True, reraise=False) as guard:
    first = coordinator.schedule(step, args=(nan,))
    many()
    guard.check(first.fetch()["loss"])
  if not guard.failed:
    raise AssertionError("the NaN step passed the guard")
  _same(before, _parts([u, c]), "rollback with steps in flight")
  # A step raising on its worker: the block sees its error, rolled back.
  with snapstore.Guard(store, reraise=False) as guard:
    coordinator.schedule(step, args=(one,))
    coordinator.schedule(checked_step, args=(nan,)).fetch()
  if not isinstance(guard.failures[0], tf.errors.InvalidArgumentError):
    raise AssertionError("failures: %s" % guard.failures)
  _same(before, _parts([u, c]), "rollback of a raising step")
  # A NaN loss while another step of the block fails on its worker: rolled
  # back, then that step's error raised (the next join would have raised
  # it), from the NaN.
  try:
    with snapstore.Guard(store, watch="loss", reraise=False) as guard:
      first = coordinator.schedule(step, args=(nan,))
      coordinator.schedule(checked_step, args=(nan,))
      guard.run(lambda: first)
  except tf.errors.InvalidArgumentError as e:
    if not isinstance(e.__cause__, snapstore.NonFiniteError):
      raise
  else:
    raise AssertionError("the failed step's error was not raised")
  _same(before, _parts([u, c]), "rollback, then the step's error")
  # Retried: the second attempt trains from the state before the first.
  for attempt in snapstore.Guard(store, watch="loss", retries=1):
    with attempt:
      x = nan if attempt.number == 0 else one
      attempt.run(coordinator.schedule, step, args=(x,))
  coordinator.join()
  retried = _parts([u, c])
  store.restore("before")
  coordinator.schedule(step, args=(one,))
  coordinator.join()
  _same(_parts([u, c]), retried, "retried")
  store.restore("before")
  # A trial judges the block's steps after they ran: the NaN one is
  # rejected even though the metric would be finite before it runs.
  with snapstore.Trial(store, metric=loss) as trial:
    coordinator.schedule(step, args=(nan,))
    many()
  if trial.kept or not np.isnan(trial.after) or not np.isfinite(trial.before):
    raise AssertionError(
      "trial kept %s: %s -> %s" % (trial.kept, trial.before, trial.after)
    )
  _same(before, _parts([u, c]), "trial rejected by its metric")
  with snapstore.Trial(store) as trial:
    many()
    trial.reject()
  _same(before, _parts([u, c]), "trial rejected")
  # Entering with steps in flight is refused, before any snapshot.
  guard = snapstore.Guard(store, tag="refused_guard")
  trial = snapstore.Trial(store, tag="refused_trial")
  for what, block in (("Guard", guard), ("Trial", trial)):
    tag = "refused_" + what.lower()
    many()
    _refused(block.__enter__, what)
    coordinator.join()
    if tag in store:
      raise AssertionError("the refused %s took a snapshot" % what)
    with block:  # not left entered: its tag is its own, not "<tag>/1"
      if block.tag != tag:
        raise AssertionError("%s tag %r" % (what, block.tag))
      if what == "Trial":
        block.keep()
  store.close()
  print("guards: OK")


def _fit_two_workers(strategy):
  """tf-keras fit with SnapshotCallback on both workers' steps.

  Each worker reads its own copy of the dataset, whose batch 2 is NaN, and
  which worker runs a step is the coordinator's choice: of 8 steps one
  worker runs at least 4, so 1 or 2 rollbacks (no exact reference here:
  tests/eager/ps_fit.py has one, with one worker). Every rollback happens
  with no step running (the callback joins the coordinator), and training
  ends finite.
  """
  from tests.eager import common  # noqa: E402 (Keras, after the cluster)

  keras = common.keras
  with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
  x = np.concatenate([b[0] for b in common.batches(2)])  # 4 batches of 8
  x[16, 0] = np.nan
  data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8).repeat()
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  model.fit(data, epochs=1, steps_per_epoch=8, callbacks=[callback], verbose=0)
  weights = model.get_weights()
  if callback.rollbacks not in (1, 2) or not all(
    np.isfinite(w).all() for w in weights
  ):
    raise AssertionError(
      "rollbacks %d, weights %s" % (callback.rollbacks, weights)
    )
  print("fit on two workers: OK (%d rollbacks)" % callback.rollbacks)


def _traced(strategy, coordinator, spill_dir):
  """evaluate_with and restore inside a scheduled function (a worker runs
  it): a device store's snapshot, looked up when it runs; host mode refused
  when the function is traced (its arrays are in the coordinator)."""
  with strategy.scope():
    u = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="u")
    c = tf.Variable(np.array([0.5, -2.0, 4.0], np.float32), name="c")
  store = snapstore.SnapshotStore(var_list=[u, c], name="traced")

  @tf.function
  def past():
    return store.evaluate_with(lambda: (u * 2.0, c + 0.0), tag="t")

  @tf.function
  def roll_back():
    store.restore("t")
    return c + 0.0

  for round_ in range(2):
    held = _parts([u, c])
    store.snapshot("t")  # the second round: the same tag, other values
    with strategy.scope():
      u.assign(u + 10.0)
      c.assign(c * -3.0)
    now = _parts([u, c])
    got = coordinator.schedule(past).fetch()
    expected = [np.concatenate(held[:2]) * np.float32(2.0), held[2]]
    _same(expected, [np.asarray(g) for g in got], "traced past %d" % round_)
    _same(now, _parts([u, c]), "traced past left the variables %d" % round_)
  coordinator.schedule(roll_back)
  coordinator.join()
  _same(held, _parts([u, c]), "traced restore")
  store.close()
  host = snapstore.SnapshotStore(var_list=[u, c], mode="host", name="host")
  host.snapshot("t")

  @tf.function
  def host_past():
    return host.evaluate_with(lambda: c + 0.0, tag="t")

  try:
    coordinator.schedule(host_past)
  except snapstore.TracedCallError as e:
    if "use a store with mode='device'" not in str(e):
      raise
  else:
    raise AssertionError("host evaluate_with in a scheduled function ran")
  coordinator.join()
  host.close()
  print("traced: OK")


def main(spill_dir):
  servers, strategy, coordinator = _cluster()
  with strategy.scope():
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
    b = tf.Variable(np.array([1.0, -0.0, np.nan], np.float32), name="b")
  if len(w.variables) != 2 or w.variables[0].device == w.variables[1].device:
    raise AssertionError("w is not sharded across both servers: %s" % w)

  @tf.function
  def step():
    w.assign_add(tf.fill([2, 3], 1.5))
    b.assign(b * 3.0 + 1.0)

  def run_steps(n):
    for _ in range(n):
      coordinator.schedule(step)
    coordinator.join()

  for mode in ("device", "host", "disk"):
    store = _store([w, b], mode, spill_dir, mode)
    if store.keys != ("w/part_0", "w/part_1", "b"):  # var_list order
      raise AssertionError("keys: %s" % (store.keys,))
    if mode == "device":
      # Each shadow on its variable's (its shard's) parameter server.
      for key, shadow in store.slots.shadows(0).items():
        want = store.variables[key].device
        if shadow.device != want or "/job:ps/" not in want:
          raise AssertionError("%s: shadow on %s, not %s" % (key, shadow, want))
    run_steps(1)
    saved = _parts([w, b])
    tag = store.snapshot()
    run_steps(2)
    if [a.tobytes() for a in _parts([w])] == [a.tobytes() for a in saved[:2]]:
      raise AssertionError("the steps did not change w")
    seen = store.evaluate_with(lambda: _parts([w, b]), tag=tag)
    _same(saved, seen, "%s evaluate_with" % mode)
    run_steps(1)
    after = _parts([w, b])
    store.evaluate_with(lambda: None, tag=tag)
    _same(after, _parts([w, b]), "%s put back after evaluate_with" % mode)
    store.restore(tag)
    _same(saved, _parts([w, b]), "%s restore" % mode)
    # A restore while scheduled steps may still run is refused (200 steps:
    # the first call comes long before the last of them has run).
    for _ in range(200):
      coordinator.schedule(step)
    try:
      store.restore(tag)
    except ValueError as e:
      if "coordinator.join() first, then restore()" not in str(e):
        raise
    else:
      raise AssertionError("a restore with steps in flight was not refused")
    coordinator.join()
    store.close()
    print("%s: OK" % mode)
  _averages(strategy, coordinator)
  _guards(strategy, coordinator, spill_dir)
  _traced(strategy, coordinator, spill_dir)
  from tests.eager import common  # noqa: E402 (Keras, after the cluster)

  if not common.KERAS_3:  # Keras 3's fit has no PS support (test's skip)
    _fit_two_workers(strategy)
  print("ALL OK")
  del servers


if __name__ == "__main__":
  main(sys.argv[1])
