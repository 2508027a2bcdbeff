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
`evaluate_with` and an in-step snapshot are bit-exact.
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
        self.opt = tf.train.AdamOptimizer(0.1)
        self.train = self.strategy.group(
          self.strategy.extended.call_for_each_replica(self._step)
        )
      self.out = self._forward()
      with self.strategy.scope() if store_in_scope else _nothing():
        # In the scope, as an Estimator's hook builds it.
        self.store = snapstore.SnapshotStore(
          scope=scope, optimizer=self.opt, max_to_keep=2, **store_options
        )
      self.init = tf.global_variables_initializer()
    self.variables = self.store.variables

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
      var.load(value, sess)
    return values

  def values(self, sess):
    return dict(zip(self.variables, sess.run(list(self.variables.values()))))


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
      (
        "b",
        "b/Adam",
        "b/Adam_1",
        "beta1_power",
        "beta2_power",
        "count",
        "w/part_0",
        "w/part_0/Adam",
        "w/part_0/Adam_1",
        "w/part_1",
        "w/part_1/Adam",
        "w/part_1/Adam_1",
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
