"""A store in a real TF cluster: two ps tasks and two workers on loopback.

Variables are placed by `tf.train.replica_device_setter` (round-robin over the
two ps tasks); the store is driven from a worker's session, as in a
between-graph replicated job. Checked: every device shadow sits on its
primary's ps task, in the graph and at run time (step stats), and no parameter
data crosses tasks for a device snapshot or restore (partition graphs); a host
snapshot gathers from both ps tasks in one run; snapshot, restore and
evaluate_with are bit-exact; and the documented between-graph pattern (the
chief owns the snapshots, other workers build the same graph and only read)
holds, including a non-chief worker's MonitoredSession start.
"""

import re

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import cluster as cluster_lib
from tests import helpers

_CONFIG = tf.ConfigProto(operation_timeout_in_ms=60000)  # fail, never hang
_ASSIGNS = ("Assign", "AssignVariableOp")


class TracingSession(object):
  """Runs through `sess`, tracing every run; `runs` holds their RunMetadata.

  It has no `make_callable`, so the store calls `run` once per copy.
  """

  def __init__(self, sess):
    self._sess = sess
    self.graph = sess.graph
    self.runs = []

  def run(self, fetches, feed_dict=None):
    metadata = tf.RunMetadata()
    options = tf.RunOptions(
      trace_level=tf.RunOptions.FULL_TRACE, output_partition_graphs=True
    )
    out = self._sess.run(
      fetches, feed_dict=feed_dict, options=options, run_metadata=metadata
    )
    self.runs.append(metadata)
    return out


def _task(device):
  spec = tf.DeviceSpec.from_string(device)
  return spec.job, spec.task


def _ran_on(metadata):
  """{node name: (job, task)} of the nodes a traced run executed."""
  placed = {}
  for dev in metadata.step_stats.dev_stats:
    if "/job:" in dev.device:  # not the "/host:CPU" duplicates
      for node in dev.node_stats:
        placed[node.node_name] = _task(dev.device)
  return placed


def _graph_op(graph, name):
  """The graph's op `name`, or None for nodes TF added at run time (_SOURCE, ...)."""
  try:
    return graph.get_operation_by_name(name)
  except KeyError:
    return None


def _crossing(metadata):
  """Names of the graph ops whose outputs a traced run sent between tasks."""
  sources = set()
  for partition in metadata.partition_graphs:
    for node in partition.node:
      if node.op == "_Send":
        tensor = node.attr["tensor_name"].s.decode()  # "edge_<id>_<op name>"
        sources.add(tensor.split("_", 2)[2].split(":")[0])
  return sources


def _data_crossing(metadata):
  """Names of the graph ops whose output data a traced run sent between tasks.

  A control edge between tasks is sent too, as a dummy tensor: its `_Send`
  takes a node TF adds for it, not the op's output.
  """
  sources = set()
  for partition in metadata.partition_graphs:
    for node in partition.node:
      if node.op == "_Send":
        tensor = node.attr["tensor_name"].s.decode()  # "edge_<id>_<op name>"
        if tensor.startswith("edge_"):
          tensor = tensor.split("_", 2)[2]
        source = tensor.split(":")[0]
        if node.input and node.input[0].split(":")[0] == source:
          sources.add(source)
  return sources


def _assigns(op):
  """The assign ops a grouped copy op runs: {written variable op name: assign}."""
  found, stack, seen = {}, [op], set()
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type in _ASSIGNS:
      found[op.inputs[0].op.name] = op
    stack.extend(op.control_inputs)
  return found


class Replica(object):
  """One worker's graph: a two-layer net on the ps tasks, Adam, a store."""

  def __init__(
    self,
    spec,
    worker,
    scope,
    use_resource,
    mode="device",
    extra_after_store=False,
    with_store=True,
    pack=False,
    job="worker",
    chief_only=True,
  ):
    self.graph = tf.Graph()
    setter = tf.train.replica_device_setter(
      worker_device="/job:%s/task:%d" % (job, worker), cluster=spec
    )
    with self.graph.as_default(), tf.device(setter):
      self.x = tf.placeholder(tf.float32, [None, 6])
      self.y = tf.placeholder(tf.float32, [None, 3])
      self.out = helpers.dense_net(
        self.x,
        scope=scope,
        use_resource=use_resource,
        outputs=3,
        activation=tf.nn.tanh,
      )
      loss = tf.reduce_mean(tf.square(self.out - self.y))
      opt = tf.train.AdamOptimizer(0.1)
      # Adam names beta1_power and beta2_power outside any variable scope:
      # a name scope of the test's own keeps them (and their shadows, whose
      # initializers check the first shadow on each ps task) from being
      # the ps tasks' variables of an earlier test.
      with tf.name_scope(scope + "_adam"):
        self.train = opt.minimize(loss)
      self.store = None
      if with_store:
        options = {"pack": True} if pack else {}
        self.store = snapstore.SnapshotStore(
          scope=scope,
          optimizer=opt,
          mode=mode,
          max_to_keep=2,
          chief_only=chief_only,
          **options,
        )
        if mode == "device" and not pack:
          self.past = self.store.slots.past(self.out, slot=0)
      if extra_after_store:  # placed after the store: must not shift
        with tf.variable_scope(scope + "_after", use_resource=use_resource):
          self.after = [tf.get_variable("a%d" % i, [2]) for i in range(3)]
      self.init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.variables = self.store.variables if self.store is not None else None

  def session(self, target):
    return tf.Session(target, graph=self.graph, config=_CONFIG)

  def feed(self, seed):
    rng = np.random.RandomState(seed)
    return {
      self.x: rng.randn(16, 6).astype(np.float32),
      self.y: rng.randn(16, 3).astype(np.float32),
    }

  def load(self, sess, seed, finite=True):
    """Loads random values into every covered variable; returns them."""
    rng = np.random.RandomState(seed)
    values = {}
    for key, var in self.variables.items():
      shape = var.shape.as_list()
      dtype = var.dtype.base_dtype.as_numpy_dtype
      values[key] = (
        np.asarray(rng.randn(*shape), dtype)
        if finite
        else helpers.random_value(rng, shape, dtype)
      )
      var.load(values[key], sess)
    return values

  def values(self, sess):
    return dict(zip(self.variables, sess.run(list(self.variables.values()))))


class DistributedTest(
  cluster_lib.ClusterTestMixin, tf.test.TestCase, parameterized.TestCase
):
  JOBS = {"ps": 2, "worker": 2}
  SCOPE = "net_"

  def _replica(self, worker=0, **kwargs):
    return Replica(self.cluster.spec, worker, self.scope, **kwargs)

  def _session(self, replica, worker=0):
    sess = replica.session(self.cluster.target("worker", worker))
    self.addCleanup(sess.close)
    return sess

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_every_shadow_on_its_primarys_ps_task(self, use_resource):
    replica = self._replica(use_resource=use_resource)
    store = replica.store
    shadows = replica.graph.get_collection(snapstore.SHADOW_VARIABLES)
    self.assertLen(shadows, 3 * len(store.keys))  # two slots and the scratch
    primaries = dict((v.op.name, v) for v in store.variables.values())
    tasks = set()
    for shadow in shadows:
      primary = primaries[shadow.op.name.rsplit("/", 2)[0]]
      self.assertEqual(shadow.device, primary.device, shadow.name)
      self.assertEqual(_task(primary.device)[0], "ps")
      tasks.add(_task(primary.device))
    self.assertEqual(tasks, {("ps", 0), ("ps", 1)})

    sess = self._session(replica)
    sess.run(replica.init)
    traced = TracingSession(sess)
    for copy in (store.slots.snapshot_op(1), store.slots.restore_op(1)):
      traced.run(copy)
      ran = _ran_on(traced.runs[-1])
      by_target = _assigns(copy)
      self.assertLen(by_target, len(store.keys))
      for assign in by_target.values():
        value = assign.inputs[1].op  # the colocated read of the source
        while value.name not in ran and value.type == "Identity":
          value = value.inputs[0].op  # optimized away: the read under it
        written = assign.inputs[0].op
        home = _task(written.device)
        self.assertEqual(ran[assign.name], home, assign.name)
        self.assertEqual(ran[value.name], home, value.name)
      # Only control edges cross tasks (the group's, and a restore's wait
      # for each task's check that the slot is initialized): no parameter data.
      self.assertEqual(_data_crossing(traced.runs[-1]), set())
      for name in _crossing(traced.runs[-1]):
        self.assertIn(
          replica.graph.get_operation_by_name(name).type,
          ("NoOp", "Assert"),
          name,
        )

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_packed_buffers_and_copies_stay_on_each_ps_task(self, use_resource):
    replica = self._replica(use_resource=use_resource, pack=True)
    store = replica.store
    graph = replica.graph
    buffers = [
      v
      for v in graph.get_collection(snapstore.SHADOW_VARIABLES)
      if "/packed_" in v.op.name
    ]
    # The variables (and Adam's slots) of each ps task, in one buffer per slot
    # and the scratch, on that task.
    tasks = set(
      _task(v.device)
      for v in store.variables.values()
      if v.dtype.base_dtype == tf.float32
    )
    self.assertEqual(tasks, {("ps", 0), ("ps", 1)})
    self.assertLen(buffers, 3 * len(tasks))
    self.assertEqual(set(_task(b.device) for b in buffers), tasks)
    sess = self._session(replica)
    sess.run(replica.init)
    expected = replica.load(sess, seed=1, finite=False)
    traced = TracingSession(sess)
    for copy in (store.slots.snapshot_op(1), store.slots.restore_op(1)):
      traced.run(copy)
      # Only control edges cross tasks (one per task: grappler drops a
      # grouping no-op with one input), no parameter data.
      self.assertTrue(_crossing(traced.runs[-1]))
      self.assertEqual(_data_crossing(traced.runs[-1]), set())
    ran = _ran_on(traced.runs[-1])
    for name, task in ran.items():
      op = _graph_op(graph, name)
      if op is not None and "/packed_" in name:
        self.assertIn(task, tasks, name)
        self.assertEqual(
          task,
          _task(
            graph.get_operation_by_name(
              op.colocation_groups()[0].decode()[len("loc:@") :]
            ).device
          ),
          name,
        )
    store.snapshot("a", session=sess)
    sess.run(replica.train, replica.feed(2))
    store.restore("a", session=sess)
    helpers.assert_state(replica.values(sess), expected)

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_snapshot_restore_evaluate_with_are_exact(self, mode, use_resource):
    replica = self._replica(use_resource=use_resource, mode=mode)
    store = replica.store
    sess = self._session(replica)
    sess.run(replica.init)
    bits = replica.load(sess, seed=1, finite=False)  # NaN payloads, -0.0, ...
    store.snapshot("bits", session=sess)
    good = replica.load(sess, seed=2)
    feed = replica.feed(3)
    good_out = sess.run(replica.out, feed)
    store.snapshot("good", session=sess)
    for _ in range(3):
      sess.run(replica.train, feed)
    current = replica.values(sess)
    helpers.assert_state_differs(current, good)
    past_out = store.evaluate_with(replica.out, feed, tag="good", session=sess)
    helpers.assert_bit_equal(past_out, good_out)
    helpers.assert_state(replica.values(sess), current, "after evaluate_with")
    for tag, expected in (("bits", bits), ("good", good)):
      store.restore(tag, session=sess)
      helpers.assert_state(replica.values(sess), expected, tag)
      helpers.assert_state(store.arrays(tag, session=sess), expected, tag)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_host_snapshot_gathers_from_every_ps_task_in_one_run(
    self, use_resource
  ):
    replica = self._replica(use_resource=use_resource, mode="host")
    sess = self._session(replica)
    sess.run(replica.init)
    expected = replica.load(sess, seed=4)
    traced = TracingSession(sess)
    replica.store.snapshot(session=traced)
    self.assertLen(traced.runs, 1)
    covered = set(v.op.name for v in replica.variables.values())
    read_tasks = {}
    for name, task in _ran_on(traced.runs[0]).items():
      op = _graph_op(replica.graph, name)
      if (
        op is not None
        and op.type in ("Identity", "ReadVariableOp")
        and op.inputs[0].op.name in covered
      ):
        read_tasks[op.inputs[0].op.name] = task
    self.assertEqual(sorted(read_tasks), sorted(covered))
    for var in replica.variables.values():
      self.assertEqual(read_tasks[var.op.name], _task(var.device))
    self.assertEqual(set(read_tasks.values()), {("ps", 0), ("ps", 1)})
    helpers.assert_state(replica.store.arrays(), expected)
    sess.run(replica.train, replica.feed(5))
    traced.runs = []
    replica.store.restore(session=traced)
    self.assertLen(traced.runs, 1)  # one feed, one grouped assign on both tasks
    helpers.assert_state(replica.values(sess), expected)

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_between_graph_replication_chief_owns_the_snapshots(
    self, use_resource
  ):
    chief = self._replica(0, use_resource=use_resource, extra_after_store=True)
    other = self._replica(1, use_resource=use_resource, extra_after_store=True)
    # The store places nothing by round-robin: variables built after it land
    # where they would without it, so every worker's graph places alike.
    bare = self._replica(
      0, use_resource=use_resource, with_store=False, extra_after_store=True
    )
    self.assertEqual(
      [v.device for v in chief.after], [v.device for v in bare.after]
    )
    self.assertEqual(
      [v.device for v in chief.store.variables.values()],
      [v.device for v in other.store.variables.values()],
    )

    chief_sess = self._session(chief, 0)
    chief_sess.run(chief.init)
    good = chief.load(chief_sess, seed=6)
    feed = other.feed(7)
    good_out = chief_sess.run(chief.out, {chief.x: feed[other.x]})
    chief.store.snapshot("good", session=chief_sess)
    self.assertEqual(chief.store.slots.slot_of("good"), 0)
    chief.load(chief_sess, seed=8)  # training went on

    # The other worker starts as a MonitoredTrainingSession worker does: it
    # waits for the chief's initialization, then runs its local_init_op,
    # which must not reset the shared shadows, and trains.
    creator = tf.train.WorkerSessionCreator(
      master=self.cluster.target("worker", 1), config=_CONFIG
    )
    with other.graph.as_default():
      with tf.train.MonitoredSession(session_creator=creator) as worker_sess:
        for _ in range(3):
          worker_sess.run(other.train, feed)
        raw = worker_sess._tf_sess()  # pylint: disable=protected-access
        self.assertEqual(other.store.tags(), [])  # its store holds no tags
        # It reads the chief's snapshot: the shadows are shared ps variables.
        shadows = other.store.slots.shadows(0)
        helpers.assert_state(
          dict(zip(shadows, raw.run(list(shadows.values())))), good
        )
        helpers.assert_bit_equal(raw.run(other.past, feed), good_out)
        trained = other.values(raw)
    helpers.assert_state_differs(trained, good)
    helpers.assert_state(chief.values(chief_sess), trained)  # shared, on the ps

    chief.store.restore("good", session=chief_sess)
    helpers.assert_state(chief.values(chief_sess), good)
    with other.session(self.cluster.target("worker", 1)) as later:
      helpers.assert_state(other.values(later), good)  # every worker sees it

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_a_worker_that_is_not_the_chief_is_refused_every_write(self, mode):
    # The same program on every worker: worker 1's store would replace the
    # chief's device snapshot on the ps tasks, or roll every worker back.
    chief = self._replica(0, use_resource=True, mode=mode)
    other = self._replica(1, use_resource=True, mode=mode)
    chief_sess = self._session(chief, 0)
    chief_sess.run(chief.init)
    good = chief.load(chief_sess, seed=6)
    chief.store.snapshot("good", session=chief_sess)
    current = chief.load(chief_sess, seed=8)
    other_sess = self._session(other, 1)
    feed = other.feed(7)
    calls = [
      ("snapshot", lambda: other.store.snapshot(session=other_sess)),
      ("restore", lambda: other.store.restore("good", session=other_sess)),
      (
        "evaluate_with",
        lambda: other.store.evaluate_with(
          other.out, feed, tag="good", session=other_sess
        ),
      ),
      (
        "load_arrays",
        lambda: other.store.load_arrays(current, session=other_sess),
      ),
    ]
    for what, call in calls:
      with self.assertRaisesRegex(
        snapstore.NotChiefError, "^%s$" % re.escape(_not_chief(what))
      ):
        call()
    # Nothing ran: the variables and the chief's snapshot are as they were.
    helpers.assert_state(chief.values(chief_sess), current)
    helpers.assert_state(chief.store.arrays("good", session=chief_sess), good)
    self.assertEqual(other.store.tags(), [])
    # What only reads still runs there.
    self.assertAllEqual(
      other.store.evaluate_with(
        other.out, feed, past=False, session=other_sess
      ),
      other_sess.run(other.out, feed),
    )

  def test_chief_only_false_lets_a_worker_write(self):
    chief = self._replica(0, use_resource=True)
    other = self._replica(1, use_resource=True, chief_only=False)
    chief_sess = self._session(chief, 0)
    chief_sess.run(chief.init)
    chief.load(chief_sess, seed=6)
    chief.store.snapshot("good", session=chief_sess)
    other_sess = self._session(other, 1)
    mine = other.load(other_sess, seed=9)
    self.assertEqual(other.store.snapshot("mine", session=other_sess), "mine")
    self.assertEqual(other.store.slots.slot_of("mine"), 0)
    # Into the slot the chief's "good" is in: the shadows are shared, which
    # is what chief_only=True guards against.
    shadows = chief.store.slots.shadows(0)
    helpers.assert_state(
      dict(zip(shadows, chief_sess.run(list(shadows.values())))), mine
    )


def _not_chief(what, me="worker", chief="worker", shared=("ps", 2)):
  """NotChiefError's message for `what` on task 1 of `me`'s job."""
  return (
    "%s() runs on /job:%s/task:1, which is not the chief of its cluster "
    "(/job:%s/task:0): the store's variables live on %s, shared by every "
    "worker, and so do its device shadows. Every worker runs the same "
    "program, but a store call that writes on this one would write what "
    "all share: its device snapshots replace the chief's in the shared "
    "slots, its restores and evaluate_with's swaps rewrite the variables "
    "every worker trains. Nothing was run. Call %s() on the chief only "
    "(e.g. under `if is_chief:`); other workers may read the chief's "
    "snapshots with store.slots.past() and store.slots.shadows(). To let "
    "this task write anyway (the writer by a rule of your own, or one "
    "client driving in-graph replication), build its store with "
    "SnapshotStore(..., chief_only=False)."
    % (
      what,
      me,
      chief,
      ", ".join("/job:%s/task:%d" % (shared[0], i) for i in range(shared[1])),
      what,
    )
  )


class ChiefJobTest(
  cluster_lib.ClusterTestMixin, tf.test.TestCase, parameterized.TestCase
):
  """A cluster with a "chief" job: its task 0 is the chief, not worker 0."""

  JOBS = {"ps": 1, "chief": 1, "worker": 1}
  SCOPE = "chief_"

  def test_the_chief_job_writes_and_worker_0_is_refused(self):
    spec = self.cluster.spec
    chief = Replica(spec, 0, self.scope, True, job="chief")
    worker = Replica(spec, 0, self.scope, True)
    chief_sess = chief.session(self.cluster.target("chief", 0))
    self.addCleanup(chief_sess.close)
    worker_sess = worker.session(self.cluster.target("worker", 0))
    self.addCleanup(worker_sess.close)
    chief_sess.run(chief.init)
    good = chief.load(chief_sess, seed=1)
    chief.store.snapshot("good", session=chief_sess)
    chief.load(chief_sess, seed=2)
    message = _not_chief("restore", chief="chief", shared=("ps", 1))
    message = message.replace("/job:worker/task:1", "/job:worker/task:0")
    with self.assertRaisesRegex(
      snapstore.NotChiefError, "^%s$" % re.escape(message)
    ):
      worker.store.restore("good", session=worker_sess)
    chief.store.restore("good", session=chief_sess)
    helpers.assert_state(chief.values(chief_sess), good)


if __name__ == "__main__":
  tf.test.main()
