"""store.slots.past() over MirroredStrategy variables, on two logical CPUs.

A graph-mode device store shadows each replica component of a distributed
variable separately; `past()` maps each component to its own shadow, so a
copied op reads the shadow of the very component its original read: a
replica's ops its own component, a cross-replica read the component TF
picks (the primary) or the user names, a sync-on-read aggregate every
component.

To see that, the two replicas' components are made to differ on purpose
before training: a copy reading the wrong replica's shadow would compute
another replica's output. Each past output is checked twice: against
numpy's forward pass with the snapshot's values of the component it reads
(close, not bit for bit: numpy and TF's matmul sum in different orders), and
bit for bit against the original tensors run after restoring the snapshot
(the same kernels on the same values).

MirroredStrategy makes resource variables only (its scope overrides
`use_resource=False`, see tests/test_mirrored.py,
`test_the_strategy_makes_resource_variables_only`), so there is no
ref-variable case; the cases are variables made with `tf.get_variable` and
`tf.layers.Dense` layers building theirs in the replica function.
"""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore import errors
from snapstore.engines.graph import variables
from tests import helpers

CONFIG = tf.ConfigProto(device_count={"CPU": 2})
DEVICES = ["/cpu:0", "/cpu:1"]
KINDS = (("get_variable", "get_variable"), ("layers", "layers"))
# numpy's float64 forward pass against TF's float32 matmuls, whose sums run in
# another order: close, not bit for bit.
RTOL = 1e-5


def _run(strategy):
  """`strategy.run` (TF 2.x) or `experimental_run_v2` (TF 1.15)."""
  return getattr(strategy, "run", None) or strategy.experimental_run_v2


def _forward(x, params):
  """The net in numpy, float64: relu(x @ w1 + b1) @ w2 + b2."""
  p = dict((k, v.astype(np.float64)) for k, v in params.items())
  hidden = np.maximum(0.0, x.astype(np.float64) @ p["w1"] + p["b1"])
  return hidden @ p["w2"] + p["b2"]


class _Net(object):
  """A two-layer dense net made and trained under a MirroredStrategy.

  Attributes:
    x, t: The fed input and target (the same batch on both replicas).
    variables: Name -> mirrored variable ("w1", "b1", "w2", "b2").
    per_replica: The output as each replica computes it (a PerReplica).
    cross: The output built in cross-replica context (reads the primary).
    cross_1: The same from replica 1's components, read in cross-replica
      context.
    train_op: One SGD step of every replica, gradients summed.
  """

  def __init__(self, kind):
    self.strategy = tf.distribute.MirroredStrategy(DEVICES)
    self.x = tf.placeholder(tf.float32, [None, 3], name="x")
    self.t = tf.placeholder(tf.float32, [None, 2], name="t")
    self.kind = kind
    with self.strategy.scope():
      self.opt = tf.train.GradientDescentOptimizer(0.05)
      if kind == "get_variable":
        with tf.variable_scope("net"):
          self.variables = {
            "w1": tf.get_variable("w1", [3, 4]),
            "b1": tf.get_variable("b1", [4]),
            "w2": tf.get_variable("w2", [4, 2]),
            "b2": tf.get_variable("b2", [2]),
          }
      else:
        self.layers = [
          tf.layers.Dense(4, tf.nn.relu, name="dense"),
          tf.layers.Dense(2, name="dense_1"),
        ]

      def replica():
        y = self._apply(self.x)
        loss = tf.reduce_mean(tf.square(y - self.t))
        return self.opt.minimize(loss), y

      train, self.per_replica = _run(self.strategy)(replica)
      self.train_op = self.strategy.group(train)
    if kind == "layers":
      self.variables = {
        "w1": self.layers[0].kernel,
        "b1": self.layers[0].bias,
        "w2": self.layers[1].kernel,
        "b2": self.layers[1].bias,
      }
    self.cross = self._apply(self.x)
    # TF 1.15 reads the primary in cross-replica context even under
    # tf.device(DEVICES[1]); replica 1's components are read by name here.
    self.cross_1 = self._dense(
      self.x, dict((k, v.values[1]) for k, v in self.variables.items())
    )
    self._loads = {}
    for v in self.variables.values():
      for part in v.values:
        p = tf.placeholder(tf.float32, v.shape)
        self._loads[part] = (p, part.assign(p, read_value=False))

  def _apply(self, x):
    if self.kind == "layers":
      return self.layers[1](self.layers[0](x))
    return self._dense(x, self.variables)

  @staticmethod
  def _dense(x, v):
    hidden = tf.nn.relu(tf.matmul(x, v["w1"]) + v["b1"])
    return tf.matmul(hidden, v["w2"]) + v["b2"]

  def local(self, per_replica):
    """The tensors of a PerReplica, in replica order."""
    return list(self.strategy.experimental_local_results(per_replica))

  def make_replicas_differ(self, sess, seed):
    """Loads different random values into each replica's components."""
    rng = np.random.RandomState(seed)
    loads = self._loads.values()
    sess.run(
      [op for _, op in loads],
      {
        p: rng.normal(size=p.shape.as_list()).astype(np.float32)
        for p, _ in loads
      },
    )

  def replica_values(self, sess):
    """Per replica, name -> the value of its component."""
    names = sorted(self.variables)
    parts = [[self.variables[n].values[r] for n in names] for r in range(2)]
    return [dict(zip(names, values)) for values in sess.run(parts)]


class PastTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, kind, max_to_keep=1, pack=False):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.net = _Net(kind)
      self.store = snapstore.SnapshotStore(
        var_list=list(self.net.variables.values()),
        mode="device",
        max_to_keep=max_to_keep,
        pack=pack,
      )
    self.addCleanup(self.store.close)
    self.sess = tf.Session(graph=self.graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    rng = np.random.RandomState(3)
    self.feed = {
      self.net.x: rng.normal(size=[5, 3]).astype(np.float32),
      self.net.t: rng.normal(size=[5, 2]).astype(np.float32),
    }
    self.net.make_replicas_differ(self.sess, seed=4)
    return self.net, self.store, self.sess

  def _train(self, steps):
    for _ in range(steps):
      self.sess.run(self.net.train_op, self.feed)

  def _assert_reads_own_shadows(self, past):
    """Each replica's past tensor reads its own components' shadows (found
    by walking its inputs back), and those reads run on its device."""
    shadows = self.store.slots.component_shadows(0).values()
    replica_of = dict(
      (s.op, r) for parts in shadows for r, s in enumerate(parts)
    )
    placed = helpers.placements(self.sess, past, self.feed)
    for r, tensor in enumerate(past):
      reads, seen, todo = [], set(), [tensor.op]
      while todo:
        op = todo.pop()
        if op in seen:
          continue
        seen.add(op)
        for t in op.inputs:
          if t.op in replica_of:
            reads.append((op, replica_of[t.op]))
          todo.append(t.op)
      self.assertLen(reads, 4, tensor.name)  # 2 kernels, 2 biases
      for op, replica in reads:
        self.assertEqual(replica, r, op.name)
        self.assertRegex(placed[op.name], "CPU:%d$" % r, op.name)

  def _check(self, got, params, msg):
    want = _forward(self.feed[self.net.x], params)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6, err_msg=msg)

  @parameterized.named_parameters(*KINDS)
  def test_each_replica_reads_its_own_components_snapshot(self, kind):
    net, store, sess = self._setup(kind)
    with self.graph.as_default():
      past = store.slots.past(net.per_replica)
      past_cross = store.slots.past([net.cross, net.cross_1])
    # A PerReplica in, a PerReplica out: each replica's copy of its ops.
    self.assertIsInstance(past, type(net.per_replica))
    self._assert_reads_own_shadows(net.local(past))
    self._train(2)
    tag = store.snapshot(session=sess)
    snap = net.replica_values(sess)
    helpers.assert_bits_differ(snap[0]["w1"], snap[1]["w1"], "replicas")
    self._train(2)
    now = net.replica_values(sess)
    helpers.assert_bits_differ(now[0]["w1"], snap[0]["w1"], "training")
    fetches = {
      "now": net.local(net.per_replica),
      "past": net.local(past),
      "now_cross": [net.cross, net.cross_1],
      "past_cross": past_cross,
    }
    got = sess.run(fetches, self.feed)
    for r in range(2):
      self._check(got["past"][r], snap[r], "replica %d, past" % r)
      self._check(got["now"][r], now[r], "replica %d, now" % r)
    # Cross-replica reads: the primary, and replica 1's components.
    self._check(got["past_cross"][0], snap[0], "cross-replica, past")
    self._check(got["past_cross"][1], snap[1], "cross-replica on cpu:1, past")
    self._check(got["now_cross"][0], now[0], "cross-replica, now")
    self._check(got["now_cross"][1], now[1], "cross-replica on cpu:1, now")
    # Bit for bit: the original ops on the restored snapshot.
    store.restore(tag, session=sess)
    again = sess.run(fetches, self.feed)
    for r in range(2):
      helpers.assert_bit_equal(
        again["now"][r], got["past"][r], "replica %d" % r
      )
    for i in range(2):
      helpers.assert_bit_equal(again["now_cross"][i], got["past_cross"][i])

  def test_past_tensors_follow_the_slot_after_each_snapshot(self):
    net, store, sess = self._setup("get_variable")
    with self.graph.as_default():
      past = net.local(store.slots.past(net.per_replica))
    for round_ in range(4):
      self._train(1)
      # Refreshed by the store (a new tag evicting the last one from the
      # only slot) and by the user's own run of the slot's copy, in turn.
      if round_ % 2:
        sess.run(store.slots.snapshot_op(0))
      else:
        store.snapshot("s%d" % round_, session=sess)
        self.assertEqual(store.tags(), ["s%d" % round_])
      snap = net.replica_values(sess)
      self._train(1)
      got = sess.run(past, self.feed)
      for r in range(2):
        self._check(got[r], snap[r], "round %d replica %d" % (round_, r))

  def test_evaluate_with_runs_the_rewired_tensors(self):
    net, store, sess = self._setup("get_variable")
    with self.graph.as_default():
      past = net.local(store.slots.past(net.per_replica))
    self._train(1)
    store.snapshot("good", session=sess)
    snap = net.replica_values(sess)
    self._train(1)
    now = net.replica_values(sess)
    nbytes = store.nbytes
    seen = store.evaluate_with(
      net.local(net.per_replica), self.feed, tag="good", session=sess
    )
    # No swap: the scratch shadows a swap sets the variables aside in were
    # never used, and the variables are as they were.
    self.assertEqual(store.nbytes, nbytes)
    after = net.replica_values(sess)
    for r in range(2):
      for name in now[r]:
        helpers.assert_bit_equal(after[r][name], now[r][name], name)
      self._check(seen[r], snap[r], "replica %d" % r)
    # What the rewired tensors give, bit for bit.
    for r, value in enumerate(sess.run(past, self.feed)):
      helpers.assert_bit_equal(seen[r], value, "replica %d" % r)

  def test_no_gradient_flows_into_the_component_shadows(self):
    net, store, sess = self._setup("get_variable")
    shadows = [
      s for parts in store.slots.component_shadows(0).values() for s in parts
    ]
    self.assertLen(shadows, 8)  # 4 variables x 2 replicas
    with self.graph.as_default():
      collected = tf.get_collection(variables.SHADOW_VARIABLES)
      for s in shadows:
        self.assertIn(s, collected)
      past = store.slots.past(net.cross)
      loss = tf.reduce_sum(tf.square(net.cross - past))
      self.assertEqual(tf.gradients(loss, shadows), [None] * len(shadows))
      (grad_x,) = tf.gradients(tf.reduce_sum(past), [net.x])
      (grad_x_now,) = tf.gradients(tf.reduce_sum(net.cross), [net.x])
      step = tf.train.GradientDescentOptimizer(0.1).minimize(
        loss, var_list=[net.variables["w1"].values[0]]
      )
    self._train(1)
    store.snapshot(session=sess)
    before = sess.run(shadows)
    self._train(1)
    gx_past = sess.run(grad_x, self.feed)
    # A step on a loss of the past and current outputs leaves the shadows.
    sess.run(step, self.feed)
    for s, value, was in zip(shadows, sess.run(shadows), before):
      helpers.assert_bit_equal(value, was, s.name)
    # The input gradient through the past net is TF's own: the current
    # net's, bit for bit, once the snapshot is restored.
    store.restore(session=sess)
    helpers.assert_bit_equal(sess.run(grad_x_now, self.feed), gx_past)

  def test_a_sync_on_read_variable_read_in_cross_replica_context(self):
    graph = tf.Graph()
    with graph.as_default():
      strategy = tf.distribute.MirroredStrategy(DEVICES)
      sync = dict(
        synchronization=tf.VariableSynchronization.ON_READ,
        trainable=False,
        initializer=tf.zeros_initializer(),
      )
      with strategy.scope():
        total = tf.get_variable(
          "total", [3], aggregation=tf.VariableAggregation.SUM, **sync
        )
        mean = tf.get_variable(
          "mean", [3], aggregation=tf.VariableAggregation.MEAN, **sync
        )
      store = snapstore.SnapshotStore(var_list=[total, mean], mode="device")
      # In cross-replica context TF aggregates the components; in a
      # replica, each reads its own.
      reads = [total.read_value(), mean.read_value()]
      own = _run(strategy)(lambda: total.read_value() * 1.0)
      past = store.slots.past(reads)
      past_own = strategy.experimental_local_results(store.slots.past(own))
      parts = list(total.values) + list(mean.values)
      holders = [tf.placeholder(tf.float32, [3]) for _ in parts]
      load = [p.assign(h, read_value=False) for p, h in zip(parts, holders)]
    sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(sess.close)
    self.addCleanup(store.close)
    helpers.init(sess)
    rng = np.random.RandomState(5)

    def randomize():
      values = [rng.normal(size=[3]).astype(np.float32) for _ in parts]
      sess.run(load, dict(zip(holders, values)))
      return values

    t0, t1, m0, m1 = snap = randomize()
    store.snapshot(session=sess)
    now = randomize()
    got_past, got_now, got_own = sess.run([past, reads, past_own])
    # AddN of two, and its half: exact in float32, as numpy computes them.
    helpers.assert_bit_equal(got_past[0], t0 + t1, "past SUM")
    helpers.assert_bit_equal(got_past[1], (m0 + m1) / np.float32(2), "MEAN")
    helpers.assert_bit_equal(got_now[0], now[0] + now[1], "current SUM")
    helpers.assert_bit_equal(got_now[1], (now[2] + now[3]) / np.float32(2))
    for r in range(2):
      helpers.assert_bit_equal(got_own[r], snap[r], "replica %d" % r)

  def test_a_distributed_variable_itself_is_refused(self):
    net, store, _ = self._setup("get_variable")
    with self.graph.as_default(), helpers.assert_raises_naming(
      self, TypeError, r"takes tensors", r"pass var\.value\(\)"
    ):
      store.slots.past(net.variables["w1"])

  def test_a_packed_store_refuses_past(self):
    net, store, _ = self._setup("get_variable", pack=True)
    with self.graph.as_default(), helpers.assert_raises_naming(
      self,
      errors.ModeError,
      r"^past\(\) needs a shadow variable per variable",
      r"pack=True",
      r"pack=False",
    ):
      store.slots.past(net.per_replica)

  def test_past_after_finalize_is_refused(self):
    net, store, _ = self._setup("get_variable")
    self.graph.finalize()
    with helpers.assert_raises_naming(
      self,
      errors.RewireError,
      r"must build the ops computing \S+ from slot 0",
      r"graph is finalized",
      r"while building the graph",
    ):
      store.slots.past(net.per_replica)
