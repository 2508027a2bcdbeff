"""A store over variables of `ParameterServerStrategy` v1, in graph mode.

`tf.compat.v1.distribute.experimental.ParameterServerStrategy` (TF 1.15, and
TF 2.x through tf.compat.v1) places each variable made in its scope on a ps
task, round-robin (`replica_device_setter`), and shards one made with a
partitioner (a `PartitionedVariable` of parts on several tasks). With one
replica per worker a variable is a plain resource variable; with several
(one per GPU of the worker) it is an `AggregatingVariable` wrapping one. The
scope makes resource variables whatever `use_resource` asks for, so there is
no ref-variable case to test.

The cluster is two ps tasks and one worker (`tests/cluster.py`). Two replicas
need two GPUs on the worker: the strategy is told the worker has two
(`num_accelerators`) and soft placement runs their ops on its CPU, which is
how the strategy makes `AggregatingVariable`s on a CPU-only machine.
Checked: every shadow sits on its variable's (or part's) ps task, device
copies run there with no parameter data crossing tasks, a host snapshot
reads each variable once on its task in one run, and snapshot, restore,
`evaluate_with` and an in-step snapshot are bit-exact. Training helpers
(`PsTrainingTest`): `MovingAverage` (both forms, a separate non-trainable
rate, the warm-up on the strategy's step) and `Lookahead` (around SGD on a
linear loss) bit for bit against numpy, their updates run on each
variable's ps task; a `Guard` rolling a NaN step back (also with a retry,
and of an in-step tag) and a `Trial` rejecting or keeping a step, bit for
bit.
"""

import contextlib
import re

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import cluster as cluster_lib
from tests import helpers
from tests import test_distributed as traced_runs

_CONFIG = tf.ConfigProto(  # fail, never hang; "GPU" replicas on the CPU
  operation_timeout_in_ms=60000, allow_soft_placement=True
)
_V1 = getattr(
  getattr(tf.distribute, "experimental", None), "ParameterServerStrategy", None
)
_CASES = [("one_replica", 1), ("two_replicas", 2)]


@contextlib.contextmanager
def _nothing():
  yield


def strategy_for(spec, replicas):
  """A PS v1 strategy for worker 0 of `spec`, with `replicas` replicas."""
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(spec),
    task_type="worker",
    task_id=0,
    num_accelerators={"GPU": replicas} if replicas > 1 else {},
  )
  return _V1(resolver)


class Model(object):
  """A sharded dense layer, Adam and a counter, made in the strategy's scope."""

  def __init__(
    self,
    spec,
    scope,
    replicas,
    use_resource=None,
    store_in_scope=False,
    **store_options,
  ):
    self.strategy = strategy_for(spec, replicas)
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 6])
      self.y = tf.placeholder(tf.float32, [None, 3])
      with self.strategy.scope():
        with tf.variable_scope(scope, use_resource=use_resource):
          self.w = tf.get_variable(
            "w", [6, 3], partitioner=tf.fixed_size_partitioner(2)
          )
          self.b = tf.get_variable("b", [3])
          self.count = tf.get_variable(
            "count",
            [],
            tf.int64,
            initializer=tf.zeros_initializer(),
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
          )
        self.opt = self._optimizer()
        self.train = self.strategy.group(
          self.strategy.extended.call_for_each_replica(self._step)
        )
      self.out = self._forward()
      self.loss = tf.reduce_mean(tf.square(self.out - self.y))
      with self.strategy.scope() if store_in_scope else _nothing():
        # In the scope, as an Estimator's hook builds it.
        self.store = snapstore.SnapshotStore(
          scope=scope, optimizer=self.opt, max_to_keep=2, **store_options
        )
      self.init = tf.global_variables_initializer()
    self.variables = self.store.variables

  def _optimizer(self):
    return tf.train.AdamOptimizer(0.1)

  def _forward(self):
    return tf.nn.tanh(tf.matmul(self.x, tf.concat(list(self.w), 0)) + self.b)

  def _step(self):
    loss = tf.reduce_mean(tf.square(self._forward() - self.y))
    return self.opt.minimize(loss, global_step=self.count)

  def session(self, target):
    return tf.Session(target, graph=self.graph, config=_CONFIG)

  def feed(self, seed):
    rng = np.random.RandomState(seed)
    return {
      self.x: rng.randn(8, 6).astype(np.float32),
      self.y: rng.randn(8, 3).astype(np.float32),
    }

  def load(self, sess, seed, finite=True):
    """Loads random values into every covered variable; returns them."""
    rng = np.random.RandomState(seed)
    values = {}
    for key, var in self.variables.items():
      shape = var.shape.as_list()
      dtype = var.dtype.base_dtype.as_numpy_dtype
      if finite or dtype == np.int64:
        value = np.asarray(rng.randn(*shape) * 0.5, dtype)
      else:
        value = helpers.random_value(rng, shape, dtype)
      values[key] = value
    self.put(sess, values)
    return values

  def put(self, sess, values):
    """Loads `values` ({key: array}) into the covered variables."""
    for key, value in values.items():
      self.variables[key].load(value, sess)

  def values(self, sess):
    return dict(zip(self.variables, sess.run(list(self.variables.values()))))


class LookaheadModel(Model):
  """Model's variables trained by Lookahead around SGD on a linear loss,
  `sum(w * c_w) + sum(b * c_b)`, whose gradient is `c` exactly: each
  replica's, summed over the replicas (each loss scaled by 1/replicas first
  when the strategy's loss reduction is MEAN). So numpy computes every
  inner step bit for bit: `fast - 0.5 * (c * gradient_scale)`."""

  K = 2
  ALPHA = 0.5
  RATE = 0.5

  def __init__(self, *args, **kwargs):
    rng = np.random.RandomState(50)
    c_w = rng.randn(6, 3).astype(np.float32)
    c_b = rng.randn(3).astype(np.float32)
    self.c = (c_w, c_b)
    # w's two parts hold rows 0-2 and 3-5 (fixed_size_partitioner(2)).
    self.gradients = {"w/part_0": c_w[:3], "w/part_1": c_w[3:], "b": c_b}
    super(LookaheadModel, self).__init__(*args, **kwargs)

  def _optimizer(self):
    return snapstore.Lookahead(
      tf.train.GradientDescentOptimizer(self.RATE), k=self.K, alpha=self.ALPHA
    )

  def _step(self):
    c_w, c_b = self.c
    loss = tf.reduce_sum(tf.concat(list(self.w), 0) * c_w) + tf.reduce_sum(
      self.b * c_b
    )
    mean = tf.distribute.get_loss_reduction() == tf.distribute.ReduceOp.MEAN
    self.gradient_scale = 1 if mean else self.strategy.num_replicas_in_sync
    return self.opt.minimize(loss, global_step=self.count)


def _numpy_out(feed, model, values):
  """The model's output at `values`, in numpy."""
  w = np.concatenate([values["w/part_0"], values["w/part_1"]], 0)
  return np.tanh(feed[model.x].dot(w) + values["b"])


class PsStrategyTestBase(
  cluster_lib.ClusterTestMixin, tf.test.TestCase, parameterized.TestCase
):
  JOBS = {"ps": 2, "worker": 1}
  SCOPE = "ps1_"

  @classmethod
  def unavailable(cls):
    if _V1 is None:
      return (
        "tf.compat.v1.distribute.experimental.ParameterServerStrategy is "
        "missing from this TensorFlow"
      )
    return None

  def _model(self, replicas, **options):
    return Model(self.cluster.spec, self.scope, replicas, **options)

  def _session(self, model):
    sess = model.session(self.cluster.target("worker", 0))
    self.addCleanup(sess.close)
    sess.run(model.init)
    return sess


class PsStrategyTest(PsStrategyTestBase):
  @parameterized.named_parameters(
    *[
      ("%s_asked_%s" % (name, kind), replicas, use_resource)
      for name, replicas in _CASES
      for kind, use_resource in helpers.VARIABLE_KINDS
    ]
  )
  def test_variables_are_what_the_strategy_makes(self, replicas, use_resource):
    # The scope makes resource variables even when ref ones are asked for.
    model = self._model(replicas, use_resource=use_resource)
    self.assertEqual(
      model.store.keys,
      (  # the scope's in creation order, then the optimizer's state
        "w/part_0",
        "w/part_1",
        "b",
        "count",
        "w/part_0/Adam",
        "w/part_0/Adam_1",
        "w/part_1/Adam",
        "w/part_1/Adam_1",
        "b/Adam",
        "b/Adam_1",
        "beta1_power",
        "beta2_power",
      ),
    )
    kind = "AggregatingVariable" if replicas > 1 else "ResourceVariable"
    for key, var in model.variables.items():
      self.assertEqual(type(var).__name__, kind, key)
    self.assertEqual(
      set(traced_runs._task(v.device) for v in model.variables.values()),  # pylint: disable=protected-access
      {("ps", 0), ("ps", 1)},
    )
    self.assertNotEqual(  # the shards of w sit on both tasks
      traced_runs._task(model.variables["w/part_0"].device),  # pylint: disable=protected-access
      traced_runs._task(model.variables["w/part_1"].device),  # pylint: disable=protected-access
    )

  @parameterized.named_parameters(
    *[
      (
        "%s%s" % (name, "_store_in_scope" if in_scope else ""),
        replicas,
        in_scope,
      )
      for name, replicas in _CASES
      for in_scope in (False, True)
    ]
  )
  def test_every_shadow_and_copy_on_its_variables_ps_task(
    self, replicas, in_scope
  ):
    model = self._model(replicas, store_in_scope=in_scope)
    store = model.store
    shadows = model.graph.get_collection(snapstore.SHADOW_VARIABLES)
    self.assertLen(shadows, 3 * len(store.keys))  # two slots and the scratch
    primaries = dict((v.op.name, v) for v in store.variables.values())
    for shadow in shadows:
      primary = primaries[shadow.op.name.rsplit("/", 2)[0]]
      self.assertEqual(shadow.device, primary.device, shadow.name)
      # A plain variable, whatever the scope: the store's, not the strategy's.
      self.assertNotEqual(type(shadow).__name__, "AggregatingVariable")
    sess = self._session(model)
    traced = traced_runs.TracingSession(sess)
    for copy in (store.slots.snapshot_op(1), store.slots.restore_op(1)):
      traced.run(copy)
      ran = traced_runs._ran_on(traced.runs[-1])  # pylint: disable=protected-access
      by_target = traced_runs._assigns(copy)  # pylint: disable=protected-access
      self.assertLen(by_target, len(store.keys))
      for assign in by_target.values():
        value = assign.inputs[1].op
        while value.name not in ran and value.type == "Identity":
          value = value.inputs[0].op  # optimized away: the read under it
        home = traced_runs._task(assign.inputs[0].op.device)  # pylint: disable=protected-access
        self.assertEqual(home[0], "ps")
        self.assertEqual(ran[assign.name], home, assign.name)
        self.assertEqual(ran[value.name], home, value.name)
      self.assertEqual(traced_runs._data_crossing(traced.runs[-1]), set())  # pylint: disable=protected-access

  @parameterized.named_parameters(*_CASES)
  def test_host_snapshot_reads_each_variable_once_on_its_task(self, replicas):
    model = self._model(replicas, mode="host")
    sess = self._session(model)
    expected = model.load(sess, seed=4)
    traced = traced_runs.TracingSession(sess)
    model.store.snapshot(session=traced)
    self.assertLen(traced.runs, 1)
    covered = set(v.op.name for v in model.variables.values())
    reads = {}
    for name, task in traced_runs._ran_on(traced.runs[0]).items():  # pylint: disable=protected-access
      op = traced_runs._graph_op(model.graph, name)  # pylint: disable=protected-access
      if (
        op is not None
        and op.type == "ReadVariableOp"
        and op.inputs[0].op.name in covered
      ):
        reads.setdefault(op.inputs[0].op.name, []).append(task)
    self.assertEqual(sorted(reads), sorted(covered))
    for var in model.variables.values():
      self.assertEqual(
        reads[var.op.name],
        [traced_runs._task(var.device)],  # pylint: disable=protected-access
        var.op.name,
      )
    helpers.assert_state(model.store.arrays(), expected)
    sess.run(model.train, model.feed(5))
    helpers.assert_state_differs(model.values(sess), expected)
    model.store.restore(session=sess)
    helpers.assert_state(model.values(sess), expected)

  @parameterized.named_parameters(
    *[
      ("%s_%s" % (mode, name), mode, replicas)
      for mode in ("device", "host", "disk")
      for name, replicas in _CASES
    ]
  )
  def test_snapshot_restore_evaluate_with_are_exact(self, mode, replicas):
    options = {"mode": mode}
    if mode == "disk":  # every snapshot in the file
      options.update(spill_path=self.get_temp_dir() + "/ps.h5", memory_budget=0)
    model = self._model(replicas, **options)
    store = model.store
    sess = self._session(model)
    bits = model.load(sess, seed=1, finite=False)  # NaN payloads, -0.0, ...
    store.snapshot("bits", session=sess)
    good = model.load(sess, seed=2)
    feed = model.feed(3)
    good_out = sess.run(model.out, feed)
    self.assertAllClose(good_out, _numpy_out(feed, model, good), atol=1e-5)
    store.snapshot("good", session=sess)
    for _ in range(3):
      sess.run(model.train, feed)
    current = model.values(sess)
    self.assertEqual(current["count"], good["count"] + 3)
    helpers.assert_state_differs(current, good)
    past = store.evaluate_with(model.out, feed, tag="good", session=sess)
    helpers.assert_bit_equal(past, good_out)
    helpers.assert_state(model.values(sess), current, "after evaluate_with")
    for tag, expected in (("bits", bits), ("good", good)):
      store.restore(tag, session=sess)
      helpers.assert_state(model.values(sess), expected, tag)
      helpers.assert_state(store.arrays(tag, session=sess), expected, tag)
    # Training goes on from the restored values as from the loaded ones.
    sess.run(model.train, feed)
    after = model.values(sess)
    model.load(sess, seed=2)
    sess.run(model.train, feed)
    helpers.assert_state(model.values(sess), after)

  @parameterized.named_parameters(*_CASES)
  def test_in_step_snapshot_holds_the_values_before_the_update(self, replicas):
    model = self._model(replicas)
    store = model.store
    with model.graph.as_default():

      def update():
        with model.strategy.scope():
          return model.strategy.group(
            model.strategy.extended.call_for_each_replica(model._step)  # pylint: disable=protected-access
          )

      train = store.slots.snapshot_before(update)
      init = tf.global_variables_initializer()
    sess = self._session(model)
    sess.run(init)
    before = model.load(sess, seed=6)
    sess.run(train, model.feed(7))
    helpers.assert_state_differs(model.values(sess), before)
    shadows = store.slots.shadows(store.slots.slot_of("before_step"))
    helpers.assert_state(
      dict(zip(shadows, sess.run(list(shadows.values())))), before
    )
    store.restore("before_step", session=sess)
    helpers.assert_state(model.values(sess), before)


class PsTrainingTest(PsStrategyTestBase):
  """MovingAverage, Lookahead, Guard and Trial over the strategy's
  variables: averages and slow weights bit for bit against numpy, computed
  on each variable's (part's) ps task; rollbacks bit for bit."""

  SCOPE = "ps1t_"
  FAST = ("b", "w/part_0", "w/part_1")  # the trained variables' keys

  def _on_own_tasks(self, sess, fetch, assigns, feed=None):
    """Runs `fetch` traced; asserts that it ran every op of `assigns` on
    the ps task of the variable that op writes."""
    traced = traced_runs.TracingSession(sess)
    traced.run(fetch, feed)
    ran = traced_runs._ran_on(traced.runs[-1])  # pylint: disable=protected-access
    self.assertNotEqual(assigns, [])
    for assign in assigns:
      target = assign.inputs[0].op
      while target.type in ("Switch", "Identity"):  # into a tf.cond branch
        target = target.inputs[0].op
      home = traced_runs._task(target.device)  # pylint: disable=protected-access
      self.assertEqual(home[0], "ps", assign.name)
      self.assertEqual(ran[assign.name], home, assign.name)

  @parameterized.named_parameters(*_CASES)
  def test_moving_averages_of_every_variable_on_its_task(self, replicas):
    model = self._model(replicas)
    store = model.store
    with model.graph.as_default():
      with tf.control_dependencies([model.train]):  # after each step
        ema = snapstore.MovingAverage(
          store, tau=0.25, tau_non_trainable=0.5, slot=0
        )
        lerp = snapstore.MovingAverage(
          store,
          tau=0.125,
          num_updates=model.count,
          form="lerp",
          slot=1,
          tag="lerp",
        )
      update = tf.group(ema.update_op, lerp.update_op)
      local_init = tf.local_variables_initializer()  # the shadows
    shadows = {ema: store.slots.shadows(0), lerp: store.slots.shadows(1)}
    for key, var in model.variables.items():
      for average in (ema, lerp):
        self.assertEqual(shadows[average][key].device, var.device, key)
    sess = self._session(model)
    sess.run(local_init)
    # Both averages start at the variables' initial values.
    averages = sess.run(shadows)
    helpers.assert_state(averages[ema], model.values(sess), "initial")
    helpers.assert_state(averages[lerp], model.values(sess), "initial")
    f32 = np.float32
    for step in range(3):
      if step == 0:
        assigns = []
        for average in (ema, lerp):
          assigns += traced_runs._assigns(average.update_op).values()  # pylint: disable=protected-access
        self._on_own_tasks(sess, update, assigns, model.feed(10))
      else:
        sess.run(update, model.feed(10 + step))
      values = model.values(sess)  # what the updates read, after the step
      n = f32(values["count"])
      warm = (f32(1) + n) / (f32(10) + n)  # TF's warm-up, in float32
      early = warm < f32(1 - 0.125)
      keep = warm if early else f32(1 - 0.125)
      rate = f32(1) - warm if early else f32(0.125)
      for key, x in values.items():
        if x.dtype == np.int64:  # copied, not averaged
          averages[ema][key] = averages[lerp][key] = x
          continue
        tau = f32(0.25) if key in self.FAST else f32(0.5)
        a = averages[ema][key]
        averages[ema][key] = a - (a - x) * tau
        a = averages[lerp][key]
        averages[lerp][key] = keep * a + rate * x
      for average in (ema, lerp):
        helpers.assert_state(
          sess.run(shadows[average]),
          averages[average],
          "%s after step %d" % (average.tag, step),
        )
    self.assertEqual(values["count"], 3)
    # evaluate_with runs with the average in place, then puts back the
    # current values; restoring the average writes it into the variables.
    feed = model.feed(20)
    current = model.values(sess)
    seen = ema.evaluate_with(model.out, feed, session=sess)
    helpers.assert_state(model.values(sess), current, "after evaluate_with")
    store.restore(ema.tag, session=sess)
    helpers.assert_state(model.values(sess), averages[ema], "restored")
    helpers.assert_bit_equal(seen, sess.run(model.out, feed))

  @parameterized.named_parameters(*_CASES)
  def test_lookahead_fast_and_slow_weights_on_their_tasks(self, replicas):
    model = LookaheadModel(self.cluster.spec, self.scope, replicas)
    opt = model.opt
    parts = dict((key, model.variables[key]) for key in self.FAST)
    slots = dict((key, opt.get_slot(var, "slow")) for key, var in parts.items())
    for key, var in parts.items():  # each slow weight beside its fast one
      self.assertEqual(slots[key].device, var.device, key)
      self.assertEqual(traced_runs._task(var.device)[0], "ps", key)  # pylint: disable=protected-access
    sess = self._session(model)
    fast = dict((k, v) for k, v in model.values(sess).items() if k in parts)
    slow = dict(fast)  # taken at the first step
    f32, scale = np.float32, np.float32(model.gradient_scale)
    for step in range(1, 2 * model.K + 2):
      if step == model.K:  # a synchronization: it runs on the ps tasks
        synchronize = [
          op
          for op in model.graph.get_operations()
          if op.type == "AssignVariableOp" and "/synchronize/" in op.name
        ]
        self._on_own_tasks(sess, model.train, synchronize)
      else:
        sess.run(model.train)
      for key in parts:
        fast[key] = fast[key] - f32(model.RATE) * (model.gradients[key] * scale)
        if step % model.K == 0:
          slow[key] = slow[key] + f32(model.ALPHA) * (fast[key] - slow[key])
          fast[key] = slow[key]
      now = model.values(sess)
      helpers.assert_state(
        dict((k, now[k]) for k in parts), fast, "fast, step %d" % step
      )
      helpers.assert_state(sess.run(slots), slow, "slow, step %d" % step)
    self.assertEqual(model.values(sess)["count"], 2 * model.K + 1)
    # evaluate_with runs with the slow weights, then puts the fast back.
    feed = model.feed(21)
    current = model.values(sess)
    seen = opt.evaluate_with(model.out, feed, session=sess)
    helpers.assert_state(model.values(sess), current, "after evaluate_with")
    helpers.assert_bits_differ(seen, sess.run(model.out, feed), "slow")
    opt.store().restore("slow", session=sess)  # the slow weights, as fast
    helpers.assert_bit_equal(seen, sess.run(model.out, feed))

  def _trained(self, replicas, **options):
    """A model, its session and the state after one step."""
    model = self._model(replicas, **options)
    sess = self._session(model)
    sess.run(model.train, model.feed(30))
    return model, sess, model.values(sess)

  def _nan_feed(self, model):
    feed = model.feed(31)
    feed[model.x][0, 0] = np.nan  # its step writes NaN into w, b and Adam's
    return feed

  def _options(self, mode):
    options = {"mode": mode}
    if mode == "disk":  # every snapshot in the file
      options.update(spill_path=self.get_temp_dir() + "/ps.h5", memory_budget=0)
    return options

  @parameterized.named_parameters(
    *[
      ("%s_%s" % (mode, name), mode, replicas)
      for mode in ("device", "host", "disk")
      for name, replicas in _CASES
    ]
  )
  def test_guard_rolls_a_nan_step_back(self, mode, replicas):
    model, sess, before = self._trained(replicas, **self._options(mode))
    good = model.feed(32)
    with snapstore.Guard(
      model.store, watch=model.loss, reraise=False, session=sess
    ) as guard:
      guard.run(model.train, self._nan_feed(model))
      ruined = model.values(sess)
      for key in self.FAST:
        self.assertTrue(np.isnan(ruined[key]).any(), key)
      guard.run(model.loss, good)  # NaN: the guard rolls back
    self.assertTrue(guard.failed)
    self.assertIsInstance(guard.failures[0], snapstore.NonFiniteError)
    helpers.assert_state(model.values(sess), before, "rolled back")
    # With a retry: the NaN attempt is rolled back and the second trains
    # from exactly the state before it, as a step without the NaN one.
    for attempt in snapstore.Guard(
      model.store, watch=model.loss, retries=1, session=sess
    ):
      with attempt:
        feed = self._nan_feed(model) if attempt.number == 0 else good
        attempt.run(model.train, feed)
        attempt.run(model.loss, good)
    retried = model.values(sess)
    model.put(sess, before)
    sess.run(model.train, good)
    helpers.assert_state(retried, model.values(sess), "retried")
    helpers.assert_state_differs(retried, before)

  @parameterized.named_parameters(*_CASES)
  def test_guard_of_an_in_step_snapshot_rolls_back(self, replicas):
    model = self._model(replicas)
    with model.graph.as_default():

      def update():
        with model.strategy.scope():
          return model.strategy.group(
            model.strategy.extended.call_for_each_replica(model._step)  # pylint: disable=protected-access
          )

      train = model.store.slots.snapshot_before(update, tag="guard")
      init = tf.global_variables_initializer()
    sess = self._session(model)
    sess.run(init)
    sess.run(train, model.feed(30))
    before = model.values(sess)
    with snapstore.Guard(
      model.store, watch=model.loss, reraise=False, session=sess
    ) as guard:
      guard.run(train, self._nan_feed(model))  # the snapshot, in its run
      guard.run(model.loss, model.feed(32))
    self.assertTrue(guard.failed)
    helpers.assert_state(model.values(sess), before, "rolled back")

  @parameterized.named_parameters(
    *[
      ("%s_%s" % (mode, name), mode, replicas)
      for mode in ("device", "host")
      for name, replicas in _CASES
    ]
  )
  def test_trial_keeps_or_rolls_back_a_step(self, mode, replicas):
    model, sess, before = self._trained(replicas, mode=mode)
    held_out = model.feed(33)
    with snapstore.Trial(
      model.store, metric=model.loss, feed_dict=held_out, session=sess
    ) as trial:
      sess.run(model.train, self._nan_feed(model))
    self.assertFalse(trial.kept)
    self.assertTrue(np.isfinite(trial.before))
    self.assertTrue(np.isnan(trial.after))
    helpers.assert_state(model.values(sess), before, "rejected")
    with snapstore.Trial(model.store, session=sess) as trial:
      sess.run(model.train, model.feed(34))
      trial.reject()
    self.assertFalse(trial.kept)
    helpers.assert_state(model.values(sess), before, "rejected")
    with snapstore.Trial(model.store, session=sess) as trial:
      sess.run(model.train, model.feed(34))
      trial.keep()
    self.assertTrue(trial.kept)
    kept = model.values(sess)
    model.put(sess, before)
    sess.run(model.train, model.feed(34))
    helpers.assert_state(kept, model.values(sess), "kept")
    helpers.assert_state_differs(kept, before)


class ChiefOnlyHookTest(tf.test.TestCase, parameterized.TestCase):
  """SnapshotHook's refusal on a task that is not the chief (no servers
  needed: the strategy only reads the cluster spec)."""

  _SPEC = {
    "chief": ["127.0.0.1:1"],
    "worker": ["127.0.0.1:2", "127.0.0.1:3"],
    "ps": ["127.0.0.1:4"],
  }

  def setUp(self):
    super(ChiefOnlyHookTest, self).setUp()
    if _V1 is None:
      self.skipTest(PsStrategyTestBase.skip_reason or "no PS strategy v1")

  def _begin(self, task_type, task_id):
    strategy = _V1(
      tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(self._SPEC), task_type=task_type, task_id=task_id
      )
    )
    built = []

    def build():
      built.append(snapstore.SnapshotStore(scope="net", max_to_keep=2))
      return built[-1]

    hook = snapstore.SnapshotHook(build, every_n_steps=1)
    with tf.Graph().as_default(), strategy.scope():
      with tf.variable_scope("net"):
        tf.get_variable("w", [2])
      hook.begin()
    return hook, built

  @parameterized.named_parameters(("worker_0", 0), ("worker_1", 1))
  def test_refused_on_a_worker(self, task_id):
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "SnapshotHook runs on task worker:%d" % task_id,
      "not the chief",
      "overwrite the chief's",
      re.escape("EstimatorSpec(training_chief_hooks=[hook])"),
    ):
      self._begin("worker", task_id)

  def test_refusal_builds_nothing(self):
    hook = snapstore.SnapshotHook(
      lambda: self.fail("the store was built"), every_n_steps=1
    )
    strategy = _V1(
      tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(self._SPEC), task_type="worker", task_id=0
      )
    )
    with tf.Graph().as_default(), strategy.scope():
      with self.assertRaisesRegex(ValueError, "not the chief"):
        hook.begin()
    self.assertIsNone(hook.store)

  def test_runs_on_the_chief(self):
    hook, built = self._begin("chief", 0)
    self.assertLen(built, 1)
    self.assertIs(hook.store, built[0])
    self.assertEqual(hook.store.keys, ("w",))
