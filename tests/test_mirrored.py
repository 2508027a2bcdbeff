"""Graph-mode stores over MirroredStrategy variables on two logical CPUs.

Every component is checked bit for bit against numpy values loaded before:
replicas identical after a restore, components made to differ on purpose
copied as they are (device mode), sync-on-read values read as TensorFlow
aggregates them and every component restored as it was (every mode; arrays
loaded or read from another store's file written back so that the aggregate
reads the same), evaluation at a snapshot equal to numpy's. The
semantics are `snapstore/core/distributed.py`'s (the eager engine's, see
tests/eager/test_distributed.py).

MirroredStrategy makes resource variables only (its scope overrides
`use_resource=False` on TF 1.15 and 2.x; `test_the_strategy_makes_resource_
variables_only` checks it), so there is no ref-variable case.
"""

import os
import tempfile
import unittest

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore import errors
from snapstore.engines.graph import copies
from tests import helpers

CONFIG = tf.ConfigProto(device_count={"CPU": 2})
DEVICES = ["/cpu:0", "/cpu:1"]

# (name, mode, pack): device mode with a shadow per component, and packed.
CASES = (
  ("device", "device", False),
  ("device_packed", "device", True),
  ("host", "host", False),
  ("disk", "disk", False),
)
HOST_CASES = tuple(c for c in CASES if c[1] != "device")


def _strategy():
  return tf.distribute.MirroredStrategy(DEVICES)


class _Net(object):
  """Mirrored and sync-on-read variables made in a strategy's scope.

  Attributes:
    w, b: Mirrored float32 and float64 variables.
    steps: A mirrored int64 variable.
    count: Sync-on-read, SUM (a metric's total).
    mean: Sync-on-read, MEAN (a batch-norm statistic).
    x, y: An input and the output `x @ w + b` read in cross-replica context.
  """

  def __init__(self, strategy):
    sync = dict(
      synchronization=tf.VariableSynchronization.ON_READ,
      trainable=False,
    )
    with strategy.scope(), tf.variable_scope("net"):
      self.w = tf.get_variable("w", [3, 4], tf.float32)
      self.b = tf.get_variable("b", [7], tf.float64)
      self.steps = tf.get_variable(
        "steps", [], tf.int64, initializer=tf.zeros_initializer()
      )
      self.count = tf.get_variable(
        "count",
        [2],
        tf.float32,
        initializer=tf.zeros_initializer(),
        aggregation=tf.VariableAggregation.SUM,
        **sync,
      )
      self.mean = tf.get_variable(
        "mean",
        [2],
        tf.float32,
        initializer=tf.zeros_initializer(),
        aggregation=tf.VariableAggregation.MEAN,
        **sync,
      )
    self.x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    self.y = tf.matmul(self.x, self.w)
    self.variables = [self.w, self.b, self.steps, self.count, self.mean]
    self.mirrored = [self.w, self.b, self.steps]
    # TF's own cross-replica reads of the sync-on-read variables.
    self.aggregates = [self.count.read_value(), self.mean.read_value()]
    self._placeholders = {}
    self._loads = {}
    for v in self.variables:
      for part in v.values:
        p = tf.placeholder(v.dtype.base_dtype, v.shape)
        self._placeholders[part] = p
        self._loads[part] = part.assign(p, read_value=False)

  def load(self, sess, values):
    """Writes `{component: array}` into the components (one run)."""
    sess.run(
      [self._loads[p] for p in values],
      {self._placeholders[p]: a for p, a in values.items()},
    )

  def components(self, sess):
    """{component: array} of every component."""
    parts = [p for v in self.variables for p in v.values]
    return dict(zip(parts, sess.run(parts)))

  def randomize(self, sess, seed, differ=False, normal=False):
    """Loads random values and returns them.

    Mirrored variables get random bits (ordinary numbers if `normal`), equal
    in every replica unless `differ`; sync-on-read ones ordinary numbers,
    distinct per replica (their sums and means as numpy computes them).
    """
    rng = np.random.RandomState(seed)
    values = {}
    for v in self.variables:
      dtype = v.dtype.base_dtype.as_numpy_dtype
      shape = v.shape.as_list()
      if any(v is m for m in self.mirrored):
        new = helpers.random_value
        if normal:
          new = lambda r, s, d: (r.normal(size=s) * 10).astype(d)  # noqa: E731
        first = new(rng, shape, dtype)
        values[v.values[0]] = first
        values[v.values[1]] = new(rng, shape, dtype) if differ else first.copy()
      else:  # sums and means of ordinary numbers, as numpy computes them
        for part in v.values:
          values[part] = rng.normal(size=shape).astype(dtype)
    self.load(sess, values)
    return values


class MirroredTest(tf.test.TestCase, parameterized.TestCase):
  def _setup(self, mode, pack=False, max_to_keep=None, spill_path=None):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.strategy = _strategy()
      self.net = _Net(self.strategy)
      options = {"mode": mode, "max_to_keep": max_to_keep}
      if pack:
        options["pack"] = True
      if spill_path:
        options["spill_path"] = spill_path
      if mode == "disk":
        folder = tempfile.mkdtemp()
        options.update(
          spill_path=spill_path or os.path.join(folder, "spill.h5"),
          memory_budget=0,
        )
      self.store = snapstore.SnapshotStore(
        var_list=self.net.variables, **options
      )
    self.addCleanup(self.store.close)
    self.sess = tf.Session(graph=self.graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    return self.net, self.store, self.sess

  def _assert_components(self, expected, msg=""):
    got = self.net.components(self.sess)
    for part, value in expected.items():
      helpers.assert_bit_equal(got[part], value, "%s %s" % (msg, part.name))

  def _host_values(self, values):
    """{key: the value a host read gives} from `{component: array}`."""
    net = self.net
    out = {}
    for key, v in zip(("w", "b", "steps"), net.mirrored):
      out["net/" + key] = values[v.values[0]]
    c0, c1 = (values[p] for p in net.count.values)
    out["net/count"] = c0 + c1
    m0, m1 = (values[p] for p in net.mean.values)
    out["net/mean"] = (m0 + m1) / np.float32(2)
    return out

  @parameterized.named_parameters(*CASES)
  def test_every_component_is_restored_and_replicas_stay_identical(
    self, mode, pack
  ):
    net, store, sess = self._setup(mode, pack)
    before = net.randomize(sess, seed=1)
    tag = store.snapshot(session=sess)
    if mode == "host":
      # Beside one array per variable, host (and disk) mode keep every
      # component of the sync-on-read ones (count and mean, float32 [2]):
      # the aggregate is none of them.
      self.assertEqual(store.nbytes, store.param_nbytes + 2 * 2 * 2 * 4)
    for seed in (2, 3):  # the second time from the file, in disk mode
      changed = net.randomize(sess, seed=seed)
      for part in before:
        helpers.assert_bits_differ(changed[part], before[part], part.name)
      store.restore(tag, session=sess)
      # Every component as it was: mirrored replicas identical, and each
      # sync-on-read component its own bits, not the aggregate spread.
      self._assert_components(before, "restored (seed %d)" % seed)
      store.files.flush()
      if mode == "disk":
        self.assertEqual(store.files.tier(tag), "file")
    # The aggregates read back (as TF reads them) are the snapshot's.
    sums = self._host_values(before)
    count, mean = sess.run(net.aggregates)
    helpers.assert_bit_equal(count, sums["net/count"], "count")
    helpers.assert_bit_equal(mean, sums["net/mean"], "mean")

  @parameterized.named_parameters(("shadows", False), ("packed", True))
  def test_a_device_snapshot_spilled_to_the_file_restores_sync_on_read(
    self, pack
  ):
    # The file keeps the aggregates; every sync-on-read component stays in
    # memory beside it, so that a restore from the file is exact.
    path = os.path.join(tempfile.mkdtemp(), "spill.h5")
    net, store, sess = self._setup("device", pack, spill_path=path)
    before = net.randomize(sess, seed=41)
    store.snapshot("t", session=sess)
    store.files.spill("t", session=sess)
    for seed in (42, 43):  # on its way to the file, then in it
      net.randomize(sess, seed=seed)
      store.restore("t", session=sess)
      self._assert_components(before, "restored (seed %d)" % seed)
      store.files.flush()
    self.assertEqual(store.files.tier("t"), "file")
    arrays = store.arrays("t", session=sess)
    for key, value in self._host_values(before).items():
      helpers.assert_bit_equal(arrays[key], value, key)
    self.assertEqual(store.nbytes, store.param_nbytes + 2 * 2 * 2 * 4)

  def test_a_store_reopening_the_spill_file_spreads_the_aggregates(self):
    # The file holds the aggregates only; the components stayed in the
    # memory of the store that spilled them: another store writes each
    # aggregate back as a host write does (`distributed.spread`).
    path = os.path.join(tempfile.mkdtemp(), "spill.h5")
    net, store, sess = self._setup("disk", spill_path=path)
    sums = self._host_values(net.randomize(sess, seed=44))
    store.snapshot("t", session=sess)
    store.close()
    net, store, sess = self._setup("disk", spill_path=path)
    self.assertEqual(store.tags(), ["t"])
    net.randomize(sess, seed=45)
    store.restore("t", session=sess)
    got = net.components(sess)
    helpers.assert_bit_equal(got[net.count.values[0]], sums["net/count"])
    helpers.assert_bit_equal(
      got[net.count.values[1]], np.full([2], -0.0, np.float32)
    )
    for part in net.mean.values:
      helpers.assert_bit_equal(got[part], sums["net/mean"], part.name)

  @parameterized.named_parameters(("shadows", False), ("packed", True))
  def test_device_mode_copies_components_that_differ_as_they_are(self, pack):
    net, store, sess = self._setup("device", pack)
    before = net.randomize(sess, seed=3, differ=True)
    store.snapshot("t", session=sess)
    net.randomize(sess, seed=4, differ=True)
    store.restore("t", session=sess)
    self._assert_components(before, "restored")
    # A second restore of the same slot, after another change, too.
    net.randomize(sess, seed=5)
    store.restore("t", session=sess)
    self._assert_components(before, "restored again")

  @parameterized.named_parameters(("shadows", False), ("packed", True))
  def test_device_copies_stay_on_each_components_device(self, pack):
    net, store, sess = self._setup("device", pack)
    shadows = self.graph.get_collection(snapstore.SHADOW_VARIABLES)
    devices = set(p.device for v in net.variables for p in v.values)
    self.assertEqual(len(devices), 2)
    # A shadow per component, on that component's device, named under it.
    if not pack:
      for v in net.variables:
        for part in v.values:
          (shadow,) = [
            s
            for s in shadows
            if s.op.name == part.op.name + "/snapstore/slot_0"
          ]
          self.assertEqual(shadow.device, part.device)
          self.assertFalse(shadow.trainable)
    for s in shadows:
      self.assertIn(s.device, devices)
    # Nothing crosses devices: the partition graphs of a snapshot and a
    # restore send only control edges (of the grouped copy, the slot checks).
    with self.graph.as_default():  # a copy across devices, for contrast
      across = net.w.values[1].assign(net.w.values[0].read_value()).op
    for op, sends_data in (
      (store.slots.snapshot_op(0), False),
      (store.slots.restore_op(0), False),
      (across, True),
    ):
      self.assertEqual(_sends_data(sess, op), sends_data, op.name)

  @parameterized.named_parameters(*CASES)
  def test_arrays_give_one_value_per_variable_as_tf_reads_it(self, mode, pack):
    net, store, sess = self._setup(mode, pack)
    before = net.randomize(sess, seed=6)
    tag = store.snapshot(session=sess)
    arrays = store.arrays(tag, session=sess)
    expected = self._host_values(before)
    self.assertEqual(sorted(arrays), sorted(expected))
    for key, value in expected.items():
      helpers.assert_bit_equal(arrays[key], value, key)
    # numpy's sum and mean are TF's own cross-replica reads.
    count, mean = sess.run(net.aggregates)
    helpers.assert_bit_equal(count, expected["net/count"], "TF's count")
    helpers.assert_bit_equal(mean, expected["net/mean"], "TF's mean")
    # save_npz writes those arrays, one per variable.
    path = os.path.join(tempfile.mkdtemp(), "s.npz")
    store.files.save_npz(path, tag, session=sess)
    with np.load(path) as archive:
      self.assertEqual(sorted(archive.files), sorted(expected))
      for key, value in expected.items():
        helpers.assert_bit_equal(archive[key], value, key)

  @parameterized.named_parameters(*CASES)
  def test_loaded_arrays_reach_every_component_as_a_host_restore(
    self, mode, pack
  ):
    net, store, sess = self._setup(mode, pack)
    rng = np.random.RandomState(7)
    arrays = {
      key: helpers.random_value(
        rng, v.shape.as_list(), v.dtype.base_dtype.as_numpy_dtype
      )
      for key, v in store.variables.items()
    }
    # Ordinary numbers for the aggregates: x + (-0.0) is x bit for bit, but
    # an addition quiets a signaling NaN.
    for key in ("net/count", "net/mean"):
      arrays[key] = rng.normal(size=[2]).astype(np.float32)
    tag = store.load_arrays(arrays, session=sess)
    net.randomize(sess, seed=8, differ=True)
    store.restore(tag, session=sess)
    got = net.components(sess)
    for key, v in store.variables.items():
      parts = v.values
      if v is net.count:
        helpers.assert_bit_equal(got[parts[0]], arrays[key], key)
        helpers.assert_bit_equal(
          got[parts[1]], np.full([2], -0.0, np.float32), key
        )
      else:
        for part in parts:
          helpers.assert_bit_equal(got[part], arrays[key], part.name)
    for key, value in store.arrays(tag, session=sess).items():
      helpers.assert_bit_equal(value, arrays[key], key)

  @parameterized.named_parameters(*CASES)
  def test_evaluate_with_reads_the_snapshot_then_puts_current_back(
    self, mode, pack
  ):
    net, store, sess = self._setup(mode, pack, max_to_keep=2)
    past = net.randomize(sess, seed=9, normal=True)
    store.snapshot("past", session=sess)
    current = net.randomize(sess, seed=10, differ=True)
    fetches = {
      "y": net.y,
      "parts": [p.read_value() for p in net.w.values],
      "aggregates": net.aggregates,
      "sync": [p.read_value() for v in (net.count, net.mean) for p in v.values],
    }
    seen = store.evaluate_with(fetches, tag="past", session=sess)
    host = self._host_values(past)
    # Every sync-on-read component as it was, not the aggregate spread.
    parts = [p for v in (net.count, net.mean) for p in v.values]
    for part, value in zip(parts, seen["sync"]):
      helpers.assert_bit_equal(value, past[part], part.name)
    for part, value in zip(net.w.values, seen["parts"]):
      helpers.assert_bit_equal(value, past[part], part.name)
    helpers.assert_bit_equal(seen["aggregates"][0], host["net/count"])
    helpers.assert_bit_equal(seen["aggregates"][1], host["net/mean"])
    x, w = sess.run(net.x), past[net.w.values[0]]
    np.testing.assert_allclose(
      seen["y"], x.astype(np.float64) @ w.astype(np.float64), rtol=1e-6
    )
    self._assert_components(current, "after evaluate_with")

  def test_shadows_are_refused_naming_the_variables(self):
    # past() works (tests/test_past_distributed.py); shadows() has no
    # single shadow per key to give.
    _, store, _ = self._setup("device")
    with self.graph.as_default(), helpers.assert_raises_naming(
      self,
      errors.ModeError,
      r"^shadows\(\) needs a shadow variable per variable",
      # (in the store's key order: the variables' creation order)
      "net/w, net/b, net/steps, net/count, net/mean are a tf.distribute",
      "one per replica component",
      r"store\.slots\.component_shadows\(slot\)",
      r"store\.slots\.past\(outputs, slot\)",
      r"store\.snapshot\(\) and store\.restore\(\)",
    ):
      store.slots.shadows(0)

  def test_the_strategy_makes_resource_variables_only(self):
    # Why the tests have no ref-variable case: the strategy's scope makes
    # resource variables whatever `use_resource` says.
    with tf.Graph().as_default():
      with _strategy().scope():
        v = tf.get_variable("v", [2], use_resource=False)
        u = tf.Variable([1.0], use_resource=False)
      for var in (v, u):
        self.assertLen(var.values, 2)
        for part in var.values:
          self.assertTrue(copies.is_resource(part), part)


def _np_rate(dtype, tau=None, decay=None, n=None):
  """The "ema" form's rate as `averages._rate*` computes it, in numpy."""
  f32 = np.float32
  if decay is not None:
    d = f32(decay)
    if n is not None:
      d = np.minimum(d, (f32(1) + f32(n)) / (f32(10) + f32(n)))
    return dtype(f32(1) - d)
  rate = dtype(tau)
  if n is not None:
    warmup = (f32(1) + f32(n)) / (f32(10) + f32(n))
    rate = np.maximum(rate, dtype(f32(1) - warmup))
  return rate


class ReplicasThatDifferTest(tf.test.TestCase, parameterized.TestCase):
  """Non-trainable mirrored variables of aggregation NONE, whose replicas
  each write their own (TF 2.4 on, in replica context: Keras 3's batch-norm
  statistics), made to differ here by writing components directly. Every
  mode restores each replica exactly; host and disk mode keep the other
  replicas only when they differ."""

  # (name, mode, memory_budget): disk mode keeping the snapshot in memory,
  # and spilling it at once.
  MODES = (
    ("host", "host", None),
    ("disk_in_memory", "disk", 1 << 20),
    ("disk_spilled", "disk", 0),
  )

  def _setup(self, mode, budget=None, spill_path=None, **options):
    graph = tf.Graph()
    with graph.as_default():
      strategy = _strategy()
      with strategy.scope():
        stats = tf.get_variable(  # room for random bits after the specials
          "stats",
          [8],
          tf.float32,
          trainable=False,
          initializer=tf.zeros_initializer(),
        )
        seeds = tf.get_variable(
          "seeds",
          [2, 2],
          tf.int64,
          trainable=False,
          initializer=tf.zeros_initializer(),
        )
        w = tf.get_variable("w", [2], tf.float64)  # trainable: never differs
      self.variables = [seeds, stats, w]  # in key order
      options["mode"] = mode
      if spill_path and mode != "disk":
        options["spill_path"] = spill_path
      if mode == "disk":
        options.update(
          spill_path=spill_path or os.path.join(tempfile.mkdtemp(), "spill.h5"),
          memory_budget=budget,
        )
      store = snapstore.SnapshotStore(var_list=self.variables, **options)
      self.addCleanup(store.close)
      self.parts = [p for v in self.variables for p in v.values]
      self._placeholders = [
        tf.placeholder(p.dtype.base_dtype, p.shape) for p in self.parts
      ]
      self._load = [
        p.assign(x, read_value=False)
        for p, x in zip(self.parts, self._placeholders)
      ]
    sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(sess.close)
    helpers.init(sess)
    return store, sess

  def _randomize(self, sess, seed, differ=("stats", "seeds")):
    """Loads random bits into every component, the replicas of the
    variables named in `differ` different; returns {component: array}."""
    rng = np.random.RandomState(seed)
    values = {}
    for v in self.variables:
      shape, dtype = v.shape.as_list(), v.dtype.base_dtype.as_numpy_dtype
      first = helpers.random_value(rng, shape, dtype)
      name = v.op.name
      for i, part in enumerate(v.values):
        values[part] = (
          helpers.random_value(rng, shape, dtype)
          if i and name in differ
          else first.copy()
        )
      if name in differ:
        helpers.assert_bits_differ(values[v.values[1]], first, name)
    sess.run(
      self._load,
      {x: values[p] for x, p in zip(self._placeholders, self.parts)},
    )
    return values

  def _assert_components(self, sess, expected, msg):
    for part, value in zip(self.parts, sess.run(self.parts)):
      helpers.assert_bit_equal(
        value, expected[part], "%s %s" % (msg, part.name)
      )

  def _first(self, values):
    """{key: array}: each variable's first component, what `arrays` gives."""
    return {v.op.name: values[v.values[0]] for v in self.variables}

  @parameterized.named_parameters(*MODES)
  def test_a_restore_gives_every_replica_its_own_bits(self, mode, budget):
    store, sess = self._setup(mode, budget)
    before = self._randomize(sess, seed=1)
    store.snapshot("differ", session=sess)
    if budget == 0:
      self.assertEqual(store.files.tier("differ"), "host")  # on its way
    self._randomize(sess, seed=2)
    store.restore("differ", session=sess)
    self._assert_components(sess, before, "restored")
    if budget == 0:
      store.files.flush()
      self.assertEqual(store.files.tier("differ"), "file")
    # Again after another change (from the file, once spilled).
    self._randomize(sess, seed=3)
    store.restore("differ", session=sess)
    self._assert_components(sess, before, "restored again")

  @parameterized.named_parameters(*MODES)
  def test_arrays_and_npz_give_the_first_replicas_value(self, mode, budget):
    store, sess = self._setup(mode, budget)
    before = self._randomize(sess, seed=4)
    store.snapshot("differ", session=sess)
    store.files.flush()
    expected = self._first(before)
    arrays = store.arrays("differ", session=sess)
    self.assertEqual(sorted(arrays), sorted(expected))
    for key, value in expected.items():
      helpers.assert_bit_equal(arrays[key], value, key)
    path = os.path.join(tempfile.mkdtemp(), "s.npz")
    store.files.save_npz(path, "differ", session=sess)
    with np.load(path) as archive:
      self.assertEqual(sorted(archive.files), sorted(expected))
      for key, value in expected.items():
        helpers.assert_bit_equal(archive[key], value, key)

  @parameterized.named_parameters(*MODES)
  def test_evaluate_with_sees_every_replica_then_puts_current_back(
    self, mode, budget
  ):
    store, sess = self._setup(mode, budget)
    past = self._randomize(sess, seed=5)
    store.snapshot("past", session=sess)
    store.files.flush()
    current = self._randomize(sess, seed=6)
    with sess.graph.as_default():
      reads = [p.read_value() for p in self.parts]
    seen = store.evaluate_with(reads, tag="past", session=sess)
    for part, value in zip(self.parts, seen):
      helpers.assert_bit_equal(value, past[part], part.name)
    self._assert_components(sess, current, "after evaluate_with")

  @parameterized.named_parameters(("host", "host"), ("disk", "disk"))
  def test_only_replicas_that_differ_are_kept(self, mode):
    store, sess = self._setup(mode, 1 << 20)
    one = store.param_nbytes
    self._randomize(sess, seed=7, differ=())
    store.snapshot("equal", session=sess)
    self.assertEqual(store.nbytes, one)  # equal replicas: nothing more
    before = self._randomize(sess, seed=8, differ=("stats",))
    store.snapshot("stats_differ", session=sess)
    # The second replica of stats (float32 [8]) only.
    self.assertEqual(store.nbytes, 2 * one + 8 * 4)
    self._randomize(sess, seed=9)
    store.restore("stats_differ", session=sess)
    self._assert_components(sess, before, "restored")
    store.delete("stats_differ")
    self.assertEqual(store.nbytes, one)

  @parameterized.named_parameters(("host", "host"), ("disk", "disk"))
  def test_a_snapshot_of_equal_replicas_restores_them_equal(self, mode):
    store, sess = self._setup(mode, 0)
    before = self._randomize(sess, seed=10, differ=())
    store.snapshot("equal", session=sess)
    self._randomize(sess, seed=11)
    store.restore("equal", session=sess)
    self._assert_components(sess, before, "restored")

  @parameterized.named_parameters(("host", "host"), ("disk", "disk"))
  def test_loaded_arrays_go_to_every_replica(self, mode):
    store, sess = self._setup(mode, 0)
    rng = np.random.RandomState(12)
    arrays = {
      key: helpers.random_value(
        rng, v.shape.as_list(), v.dtype.base_dtype.as_numpy_dtype
      )
      for key, v in store.variables.items()
    }
    tag = store.load_arrays(arrays, session=sess)
    self._randomize(sess, seed=13)
    store.restore(tag, session=sess)
    for v in self.variables:
      for part in v.values:
        helpers.assert_bit_equal(sess.run(part), arrays[v.op.name], part.name)

  def test_a_store_reopening_the_spill_file_writes_the_first_to_all(self):
    # The file holds one value per variable, the first replica's; the other
    # replicas stayed in the memory of the store that spilled it.
    path = os.path.join(tempfile.mkdtemp(), "spill.h5")
    store, sess = self._setup("disk", 0, spill_path=path)
    first = self._first(self._randomize(sess, seed=14))
    store.snapshot("differ", session=sess)
    store.close()
    store, sess = self._setup("disk", 0, spill_path=path)
    self.assertEqual(store.tags(), ["differ"])
    self._randomize(sess, seed=15)
    store.restore("differ", session=sess)
    for v in self.variables:
      for part in v.values:
        helpers.assert_bit_equal(sess.run(part), first[v.op.name], part.name)

  @parameterized.named_parameters(("shadows", False), ("packed", True))
  def test_device_mode_copies_them_as_they_are(self, pack):
    store, sess = self._setup("device", pack=pack)
    before = self._randomize(sess, seed=16)
    store.snapshot("differ", session=sess)
    self._randomize(sess, seed=17)
    store.restore("differ", session=sess)
    self._assert_components(sess, before, "restored")

  @parameterized.named_parameters(("shadows", False), ("packed", True))
  def test_a_device_snapshot_spilled_to_the_file_restores_them(self, pack):
    # The file keeps the first replica's value, the other replicas stay in
    # memory beside it: a restore from the file is exact too.
    path = os.path.join(tempfile.mkdtemp(), "spill.h5")
    store, sess = self._setup("device", spill_path=path, pack=pack)
    before = self._randomize(sess, seed=18)
    store.snapshot("differ", session=sess)
    store.files.spill("differ", session=sess)
    for seed in (19, 20):  # on its way to the file, then in it
      self._randomize(sess, seed=seed)
      store.restore("differ", session=sess)
      self._assert_components(sess, before, "restored")
      store.files.flush()
    self.assertEqual(store.files.tier("differ"), "file")
    arrays = store.arrays("differ", session=sess)
    for key, value in self._first(before).items():
      helpers.assert_bit_equal(arrays[key], value, key)
    # The other replica of stats (float32 [8]) and seeds (int64 [2, 2]).
    self.assertEqual(store.nbytes, store.param_nbytes + 8 * 4 + 4 * 8)


class MovingAverageTest(tf.test.TestCase, parameterized.TestCase):
  """MovingAverage over mirrored and sync-on-read variables: every replica's
  component averaged from its own values (components made to differ on
  purpose), bit for bit against numpy."""

  def _setup(self, **kwargs):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.strategy = _strategy()
      self.net = _Net(self.strategy)
      self.store = snapstore.SnapshotStore(
        var_list=self.net.variables, mode="device", max_to_keep=2
      )
      if kwargs.get("num_updates") is not None:  # the warm-up's step count
        kwargs["num_updates"] = tf.constant(kwargs["num_updates"], tf.int64)
      self.ema = snapstore.MovingAverage(self.store, **kwargs)
    self.sess = tf.Session(graph=self.graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    return self.net, self.store, self.ema, self.sess

  @parameterized.named_parameters(
    ("ema_tau", "ema", dict(tau=0.3, tau_non_trainable=0.5)),
    ("ema_decay", "ema", dict(decay=0.75)),
    ("ema_decay_warmup", "ema", dict(decay=0.9, num_updates=3)),
    ("lerp", "lerp", dict(tau=0.3, tau_non_trainable=0.5)),
    ("hard_copy", "ema", dict(tau=1.0)),
  )
  def test_each_component_is_averaged_from_its_own_values(self, form, rates):
    rates = dict(rates)
    n = rates.pop("num_updates", None)
    net, store, ema, sess = self._setup(form=form, num_updates=n, **rates)
    trainable = {id(v) for v in net.mirrored}
    # The averages start at the values the components had at initialization.
    averages = net.components(sess)
    for seed in range(3):
      values = net.randomize(sess, seed=20 + seed, differ=True, normal=True)
      sess.run(ema.update_op)
      for v in net.variables:
        for part in v.values:
          dtype = v.dtype.base_dtype.as_numpy_dtype
          avg, x = averages[part], values[part]
          tau = rates.get("tau")
          if id(v) not in trainable and "tau_non_trainable" in rates:
            tau = rates["tau_non_trainable"]
          if not v.dtype.base_dtype.is_floating or tau == 1.0:
            new = x.copy()
          elif form == "lerp":
            new = dtype(1 - tau) * avg + dtype(tau) * x
          else:
            rate = _np_rate(dtype, tau, rates.get("decay"), n)
            new = avg - (avg - x) * rate
          averages[part] = new
    arrays = sess.run(
      {
        part: shadow
        for v, shadows in zip(
          store.variables.values(),
          store.slots.component_shadows(ema.slot).values(),
        )
        for part, shadow in zip(v.values, shadows)
      }
    )
    for part, value in arrays.items():
      helpers.assert_bit_equal(value, averages[part], part.name)
    # The components differ, so a mix of replicas would not pass.
    for v in net.mirrored:
      helpers.assert_bits_differ(
        averages[v.values[0]], averages[v.values[1]], v.name
      )
    # Restoring the average writes each component's own average back.
    store.restore(ema.tag, session=sess)
    got = net.components(sess)
    for part, value in averages.items():
      helpers.assert_bit_equal(got[part], value, part.name)

  def test_component_shadows_are_on_their_components_devices(self):
    net, store, _, _ = self._setup(tau=0.5)
    shadows = store.slots.component_shadows(0)
    self.assertEqual(list(shadows), list(store.variables))
    for v, parts in zip(store.variables.values(), shadows.values()):
      self.assertLen(parts, 2)
      for part, shadow in zip(v.values, parts):
        self.assertEqual(shadow.device, part.device)
        self.assertEqual(shadow.op.name, part.op.name + "/snapstore/slot_0")
    # shadows() (one variable per key) stays refused, naming this way.
    with self.graph.as_default(), helpers.assert_raises_naming(
      self, errors.ModeError, r"store\.slots\.component_shadows\(slot\)"
    ):
      store.slots.shadows(0)

  def test_component_shadows_of_a_packed_store_are_refused(self):
    _, store, _ = MirroredTest._setup(self, "device", pack=True)
    with self.graph.as_default(), helpers.assert_raises_naming(
      self,
      errors.ModeError,
      r"^component_shadows\(\) needs a shadow variable per variable; this "
      r"store packs",
      "pack=False",
    ):
      store.slots.component_shadows(0)
    with self.graph.as_default(), helpers.assert_raises_naming(
      self, errors.ModeError, r"^component_shadows\(\) needs"
    ):
      snapstore.MovingAverage(store, tau=0.5)
    self.assertEqual(store.slots.pinned(), [])  # nothing pinned

  def test_running_mean_of_each_component_and_a_mirrored_num_updates(self):
    # RunningMean (slot 0) and an EMA warmed up by the strategy's global
    # step (slot 1) over components that differ.
    graph = tf.Graph()
    with graph.as_default():
      strategy = _strategy()
      with strategy.scope():
        w = tf.get_variable("w", [3])
        step = tf.train.get_or_create_global_step()
      store = snapstore.SnapshotStore(var_list=[w], max_to_keep=2)
      swa = snapstore.RunningMean(store, slot=0)
      ema = snapstore.MovingAverage(store, decay=0.9, num_updates=step, slot=1)
      value = tf.placeholder(tf.float32, [3])
      loads = [part.assign(value) for part in w.values]
    sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(sess.close)
    helpers.init(sess)
    rng = np.random.RandomState(40)
    values = [rng.normal(size=[2, 3]).astype(np.float32) for _ in range(3)]
    average = [None, None]
    ema_average = sess.run(list(w.values))
    rate = np.float32(1) - np.minimum(
      np.float32(0.9), np.float32(1) / np.float32(10)
    )
    for n, both in enumerate(values):
      for load, x in zip(loads, both):
        sess.run(load, {value: x})
      sess.run([swa.update_op, ema.update_op])
      for i, x in enumerate(both):
        if n == 0:
          average[i] = x.copy()
        else:
          average[i] = average[i] + (x - average[i]) / np.float32(n + 1)
        ema_average[i] = ema_average[i] - (ema_average[i] - x) * rate
    means = sess.run(store.slots.component_shadows(0)["w"])
    emas = sess.run(store.slots.component_shadows(1)["w"])
    for i in range(2):
      helpers.assert_bit_equal(means[i], average[i], "mean %d" % i)
      helpers.assert_bit_equal(emas[i], ema_average[i], "ema %d" % i)
    self.assertEqual(sess.run(swa.count), 3)

  def test_built_inside_strategy_run_is_refused(self):
    with tf.Graph().as_default():
      strategy = _strategy()
      run = getattr(strategy, "run", None) or strategy.experimental_run_v2
      with strategy.scope():
        w = tf.get_variable("w", [2])
      store = snapstore.SnapshotStore(var_list=[w], mode="device")

      def replica():
        snapstore.MovingAverage(store, tau=0.5)
        return tf.constant(0)

      with strategy.scope(), helpers.assert_raises_naming(
        self,
        ValueError,
        r"MovingAverage was built inside strategy.run \(replica context\)",
        "Build it after strategy.run returns",
      ):
        run(replica)
      self.assertEqual(store.slots.pinned(), [])  # nothing pinned


class LookaheadTest(tf.test.TestCase, parameterized.TestCase):
  """Lookahead around SGD, minimized inside strategy.run: every replica's
  fast and slow weights, bit for bit against numpy, with components made to
  differ (a mix of replicas would show).

  The step is exact in numpy: the gradient of the loss `sum(w * c)` is
  summed over the two replicas, which gives `2 * c` exactly (`c` if the
  loss reduction is MEAN: each loss is scaled by 1/2 first); SGD with a
  learning rate of 0.5 then writes `w - 0.5 * (2 * c)`.
  """

  K = 2
  ALPHA = 0.5

  def _setup(self, inner="sgd"):
    self.graph = graph = tf.Graph()
    rng = np.random.RandomState(30)
    with graph.as_default():
      strategy = _strategy()
      run = getattr(strategy, "run", None) or strategy.experimental_run_v2
      self.c = {
        "w": rng.normal(size=[3, 4]).astype(np.float32),
        "b": rng.normal(size=[5]).astype(np.float64),
      }
      with strategy.scope():
        self.w = tf.get_variable("w", [3, 4], tf.float32)
        self.b = tf.get_variable("b", [5], tf.float64)
        inner_opt = (
          tf.train.GradientDescentOptimizer(0.5)
          if inner == "sgd"
          else tf.train.AdamOptimizer(0.1)
        )
        self.opt = snapstore.Lookahead(inner_opt, k=self.K, alpha=self.ALPHA)

        def replica():
          loss = tf.reduce_sum(self.w * self.c["w"]) + tf.cast(
            tf.reduce_sum(self.b * self.c["b"]), tf.float32
          )
          # The gradients are summed over the replicas; the loss is scaled
          # by 1/2 first if the strategy's loss reduction is MEAN.
          self.scale = (
            1
            if tf.distribute.get_loss_reduction() == tf.distribute.ReduceOp.MEAN
            else 2
          )
          return self.opt.minimize(loss)

        self.train_op = strategy.group(run(replica))
      self.loads = {}
      for v in (self.w, self.b):
        for part in v.values:
          p = tf.placeholder(v.dtype.base_dtype, v.shape)
          self.loads[part] = (p, part.assign(p, read_value=False))
      self.fetch_w = tf.identity(self.w.values[1])
    self.sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.parts = list(self.w.values) + list(self.b.values)

  def _load(self, values):
    self.sess.run(
      [op for _, op in self.loads.values()],
      {self.loads[p][0]: a for p, a in values.items()},
    )

  def test_every_component_synchronizes_with_its_own_slow_weights(self):
    self._setup()
    sess, rng = self.sess, np.random.RandomState(31)
    fast = {}
    for part in self.parts:  # components that differ
      dtype = part.dtype.base_dtype.as_numpy_dtype
      fast[part] = rng.normal(size=part.shape.as_list()).astype(dtype)
    self._load(fast)
    slow = {p: v.copy() for p, v in fast.items()}  # taken at the first step
    for step in range(1, 2 * self.K + 2):
      sess.run(self.train_op)
      for part in self.parts:
        dtype = part.dtype.base_dtype.as_numpy_dtype
        c = self.c["w" if part.shape.ndims == 2 else "b"]
        fast[part] = fast[part] - dtype(0.5) * (c * dtype(self.scale))
        if step % self.K == 0:
          phi = slow[part]
          slow[part] = phi + dtype(self.ALPHA) * (fast[part] - phi)
          fast[part] = slow[part].copy()
      got = dict(zip(self.parts, sess.run(self.parts)))
      shadows = sess.run({p: self.opt.get_slot(p, "slow") for p in self.parts})
      for part in self.parts:
        msg = "%s step %d" % (part.name, step)
        helpers.assert_bit_equal(got[part], fast[part], msg)
        helpers.assert_bit_equal(shadows[part], slow[part], "slow " + msg)
    for v in (self.w, self.b):  # the replicas never mixed
      helpers.assert_bits_differ(fast[v.values[0]], fast[v.values[1]], v.name)
    # evaluate_with reads each replica's slow weights, then puts fast back.
    seen = self.opt.evaluate_with(self.fetch_w, session=sess)
    helpers.assert_bit_equal(seen, slow[self.w.values[1]], "slow w")
    for part, value in zip(self.parts, sess.run(self.parts)):
      helpers.assert_bit_equal(value, fast[part], part.name)

  def test_a_store_over_lookahead_and_adam_restores_every_component(self):
    self._setup(inner="adam")
    sess = self.sess
    with self.graph.as_default():
      store = snapstore.SnapshotStore(
        var_list=[self.w, self.b], optimizer=self.opt
      )
      helpers.init(sess)
    sess.run(self.train_op)
    parts = [
      p for v in store.variables.values() for p in getattr(v, "values", [v])
    ]
    names = [p.name for p in parts]
    self.assertTrue(any("Lookahead_counter" in n for n in names), names)
    self.assertTrue(any("Lookahead/slot_0" in n for n in names), names)
    before = sess.run(parts)
    tag = store.snapshot(session=sess)
    for _ in range(self.K):  # a synchronization too
      sess.run(self.train_op)
    for part, a, b in zip(parts, sess.run(parts), before):
      if "power" not in part.name:
        helpers.assert_bits_differ(a, b, part.name)
    store.restore(tag, session=sess)
    for part, a, b in zip(parts, sess.run(parts), before):
      helpers.assert_bit_equal(a, b, part.name)


class _Trained(tf.test.TestCase, parameterized.TestCase):
  """A model trained under the strategy, with Adam's state, the global step
  and statistics each replica writes its own (as Keras 3 batch norm does:
  the replicas differ), and a store over them."""

  def _setup(self, mode, max_to_keep=None):
    graph = tf.Graph()
    with graph.as_default():
      strategy = _strategy()
      run = getattr(strategy, "run", None) or strategy.experimental_run_v2
      self.x = tf.placeholder(tf.float32, [2, 3])
      with strategy.scope():
        w = tf.get_variable("w", [3, 2])
        self.stats = tf.get_variable(
          "stats", [2], trainable=False, initializer=tf.zeros_initializer()
        )
        # Sync-on-read (tf-keras and Keras 2 batch-norm statistics): each
        # replica writes its own component, a read aggregates them.
        self.mean = tf.get_variable(
          "mean",
          [2],
          trainable=False,
          initializer=tf.zeros_initializer(),
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.MEAN,
        )
        step = tf.train.get_or_create_global_step()
        opt = tf.train.AdamOptimizer(0.1)

        def replica(x):
          loss = tf.reduce_sum(tf.matmul(x, w))
          # This replica's own component: replica i adds (i + 1) * mean(x).
          i = tf.distribute.get_replica_context().replica_id_in_sync_group
          i = i if isinstance(i, int) else int(tf.get_static_value(i))
          own = self.stats.values[i].assign_add(
            tf.fill([2], tf.reduce_mean(x) * (i + 1.0)), read_value=False
          )
          # And replica i adds (i + 3) * mean(x) to its own mean.
          mean = self.mean.values[i].assign_add(
            tf.fill([2], tf.reduce_mean(x) * (i + 3.0)), read_value=False
          )
          train = opt.minimize(loss, global_step=step)
          return tf.group(train, own, mean), loss

        train, loss = run(replica, args=(self.x,))
        self.train_op = strategy.group(train)
        self.loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
      options = {}
      if mode == "disk":
        options.update(
          spill_path=os.path.join(tempfile.mkdtemp(), "spill.h5"),
          memory_budget=0,
        )
      self.store = snapstore.SnapshotStore(
        var_list=[w, self.stats, self.mean],
        optimizer=opt,
        include_global_step=True,
        mode=mode,
        max_to_keep=max_to_keep,
        **options,
      )
    self.addCleanup(self.store.close)
    self.sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.parts = [p for v in self.store.variables.values() for p in v.values]


class GuardTest(_Trained):
  """A guard over a model trained under the strategy, with Adam's state."""

  @parameterized.named_parameters(*[(m, m) for m in ("device", "host", "disk")])
  def test_a_nan_step_is_rolled_back_in_every_replica(self, mode):
    self._setup(mode)
    self.assertEqual(
      self.store.keys,
      (  # the scope's (in creation order), slots, the optimizer's, the step
        "w",
        "stats",
        "mean",
        "w/Adam",
        "w/Adam_1",
        "beta1_power",
        "beta2_power",
        "global_step",
      ),
    )
    ones, nans = np.ones([2, 3]), np.full([2, 3], np.nan)
    sess = self.sess
    sess.run(self.train_op, {self.x: ones})
    before = sess.run(self.parts)
    first, second = sess.run(self.stats.values)
    helpers.assert_bit_equal(first, np.full([2], 1.0, np.float32))
    helpers.assert_bit_equal(second, np.full([2], 2.0, np.float32))
    first, second = sess.run(self.mean.values)
    helpers.assert_bit_equal(first, np.full([2], 3.0, np.float32))
    helpers.assert_bit_equal(second, np.full([2], 4.0, np.float32))
    with snapstore.Guard(
      self.store, watch=self.loss, reraise=False, session=sess
    ) as guard:
      guard.run(self.train_op, {self.x: nans})
      ruined = sess.run(self.parts)
      for part, a, b in zip(self.parts, ruined, before):
        if "power" not in part.name:  # Adam's powers do not see the NaN
          helpers.assert_bits_differ(a, b, part.name)
      guard.run(self.loss, {self.x: ones})
    self.assertLen(guard.failures, 1)
    for part, a, b in zip(self.parts, sess.run(self.parts), before):
      helpers.assert_bit_equal(a, b, part.name)


class _Recorder(tf.train.SessionRunHook):
  """Records every component of `parts` before every run (listed before the
  snapshot hook, so it sees the variables each step starts from)."""

  def __init__(self, parts):
    self.parts = parts
    self.before = []

  def before_run(self, run_context):
    self.before.append(run_context.session.run(self.parts))


class SnapshotHookTest(_Trained):
  """SnapshotHook in a MonitoredTrainingSession training under the strategy:
  a step whose loss is NaN is rolled back in every component."""

  @parameterized.named_parameters(*[(m, m) for m in ("device", "host", "disk")])
  def test_a_nan_step_is_rolled_back_in_every_component(self, mode):
    self._setup(mode, max_to_keep=2)
    self.sess.close()  # the MonitoredTrainingSession's own session instead
    store = self.store
    hook = snapstore.SnapshotHook(store, every_n_steps=1, loss=self.loss)
    recorder = _Recorder(self.parts)
    ones, nans = np.ones([2, 3]), np.full([2, 3], np.nan)
    feeds = [ones, ones, nans, ones]
    with store.graph.as_default(), tf.train.MonitoredTrainingSession(
      hooks=[recorder, hook], config=CONFIG
    ) as sess:
      raw = sess._tf_sess()  # pylint: disable=protected-access
      for i, x in enumerate(feeds):
        sess.run(self.train_op, {self.x: x})
        if i == 2:
          # The snapshot taken before step 2 is dropped (its step's loss is
          # NaN): back to the one before step 1, in every component.
          now = raw.run(self.parts)
          for part, a, b, c in zip(
            self.parts, now, recorder.before[1], recorder.before[2]
          ):
            helpers.assert_bit_equal(a, b, "step 2 " + part.name)
            if "power" not in part.name:  # step 1 changed it
              helpers.assert_bits_differ(c, b, "step 1 " + part.name)
      after = raw.run(self.parts)
    self.assertEqual(hook.rollbacks, 1)
    self.assertEqual(hook.snapshots, 4)
    for part, value in zip(self.parts, after):
      self.assertTrue(np.all(np.isfinite(value)), part.name)
    # The replicas are identical, bit for bit, but those of the statistics
    # each replica writes: steps 0 and 3 remain, replica i adding i + 1 to
    # stats and i + 3 to mean.
    for v in store.variables.values():
      first, second = (after[self.parts.index(p)] for p in v.values)
      if v is self.stats:
        helpers.assert_bit_equal(first, np.full([2], 2.0, np.float32))
        helpers.assert_bit_equal(second, np.full([2], 4.0, np.float32))
      elif v is self.mean:
        helpers.assert_bit_equal(first, np.full([2], 6.0, np.float32))
        helpers.assert_bit_equal(second, np.full([2], 8.0, np.float32))
      else:
        helpers.assert_bit_equal(first, second, v.name)


class _PartsRecorder(tf.train.SessionRunHook):
  """Records every component of the global variables before every run
  (listed before the snapshot hook: what each step starts from)."""

  def begin(self):
    self.parts = [
      p for v in tf.global_variables() for p in getattr(v, "values", [v])
    ]
    self.before = []

  def before_run(self, run_context):
    self.before.append(run_context.session.run(self.parts))


@unittest.skipUnless(
  hasattr(tf, "estimator"), "tf.estimator is gone from TensorFlow 2.16 on"
)
class EstimatorTest(tf.test.TestCase):
  """SnapshotHook in Estimator.train with train_distribute=MirroredStrategy."""

  def test_rolls_back_every_component_inside_estimator_train(self):
    hook = snapstore.SnapshotHook(
      lambda: snapstore.SnapshotStore(
        collection=tf.GraphKeys.GLOBAL_VARIABLES, max_to_keep=2
      ),
      every_n_steps=2,
      loss=lambda: tf.get_collection(tf.GraphKeys.LOSSES)[-1],
    )
    recorder = _PartsRecorder()
    config = tf.estimator.RunConfig(
      log_step_count_steps=None,
      save_summary_steps=None,
      train_distribute=_strategy(),
      session_config=CONFIG,
    )
    estimator = tf.estimator.Estimator(
      helpers.estimator_model_fn,
      model_dir=self.get_temp_dir(),
      config=config,
    )
    estimator.train(
      helpers.estimator_input_fn(bad_batch=5), hooks=[recorder, hook]
    )
    self.assertEqual(hook.rollbacks, 1)
    self.assertEqual(
      hook.store.keys, ("global_step", "net/w", "net/w/Momentum")
    )
    for v in hook.store.variables.values():
      self.assertLen(v.values, 2, v.name)  # mirrored: one per replica
    # Each step takes a batch per replica: step 2 has batch 5, whose loss
    # is infinite. The snapshot before it is dropped: step 3 starts from
    # the one taken before step 0, in every component.
    names = [p.name for p in recorder.parts]
    for name, a, b, c in zip(
      names, recorder.before[3], recorder.before[0], recorder.before[2]
    ):
      helpers.assert_bit_equal(a, b, "step 3 " + name)
      helpers.assert_bits_differ(c, b, "step 2 " + name)
    self.assertEqual(estimator.get_variable_value("global_step"), 5)


class SnapshotBeforeTest(tf.test.TestCase, parameterized.TestCase):
  """An in-step snapshot of a step trained under the strategy."""

  def _setup(self, pack, if_finite):
    graph = tf.Graph()
    with graph.as_default():
      self.strategy = strategy = _strategy()
      run = getattr(strategy, "run", None) or strategy.experimental_run_v2
      self.x = tf.placeholder(tf.float32, [2, 3])
      with strategy.scope():
        self.w = tf.get_variable("w", [3, 2])
        self.b = tf.get_variable("b", [2])
        opt = tf.train.GradientDescentOptimizer(0.1)

        def replica(x):
          loss = tf.reduce_sum(tf.matmul(x, self.w) + self.b)
          return opt.minimize(loss), loss

        # The loss is computed in a run of its own below; `if_finite` takes
        # the cross-replica sum of one built here.
        _, loss = run(replica, args=(self.x,))
        self.loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
      self.store = snapstore.SnapshotStore(var_list=[self.w, self.b], pack=pack)

      def update():
        with strategy.scope():
          return strategy.group(run(replica, args=(self.x,))[0])

      self.train_op = self.store.slots.snapshot_before(
        update, if_finite=self.loss if if_finite else None
      )
    self.sess = tf.Session(graph=graph, config=CONFIG)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    self.parts = list(self.w.values) + list(self.b.values)

  @parameterized.named_parameters(
    ("shadows", False, False),
    ("packed", True, False),
    ("if_finite", False, True),
  )
  def test_restore_undoes_the_step_in_every_replica(self, pack, if_finite):
    self._setup(pack, if_finite)
    sess, ones = self.sess, np.ones([2, 3])
    before = sess.run(self.parts)
    sess.run(self.train_op, {self.x: ones})
    after = sess.run(self.parts)
    for part, a, b in zip(self.parts, after, before):
      helpers.assert_bits_differ(a, b, part.name)
    self.store.restore("before_step", session=sess)
    for part, a, b in zip(self.parts, sess.run(self.parts), before):
      helpers.assert_bit_equal(a, b, part.name)
    if if_finite:  # a step whose loss is NaN does not overwrite the slot
      sess.run(self.train_op, {self.x: ones})
      start = sess.run(self.parts)  # where the newest finite step starts
      sess.run(self.train_op, {self.x: ones})
      sess.run(self.train_op, {self.x: np.full([2, 3], np.nan)})
      self.store.restore("before_step", session=sess)
      for part, a, b in zip(self.parts, sess.run(self.parts), start):
        helpers.assert_bit_equal(a, b, part.name)

  def test_a_component_written_before_the_copy_is_refused(self):
    with tf.Graph().as_default():
      strategy = _strategy()
      with strategy.scope():
        w = tf.get_variable("w", [2])
      store = snapstore.SnapshotStore(var_list=[w])
      early = w.values[1].assign_add([1.0, 1.0]).op  # built beforehand
      with helpers.assert_raises_naming(
        self, ValueError, r"w/replica_1 .*does not wait for the snapshot"
      ):
        store.slots.snapshot_before(lambda: early)
      self.assertEqual(store.slots.pinned(), [])  # nothing pinned

  def test_calling_it_inside_the_strategys_scope_is_refused(self):
    with tf.Graph().as_default():
      strategy = _strategy()
      with strategy.scope():
        w = tf.get_variable("w", [2])
      store = snapstore.SnapshotStore(var_list=[w])
      with strategy.scope(), helpers.assert_raises_naming(
        self,
        ValueError,
        r"inside the scope of a tf.distribute strategy \(MirroredStrategy",
        r"Call it outside `strategy.scope\(\)`",
      ):
        store.slots.snapshot_before(lambda: tf.no_op())
      self.assertEqual(store.slots.pinned(), [])  # nothing pinned


def _sends_data(sess, op):
  """True if running `op` sends a tensor between devices (not only control).

  TF sends a control edge across devices as the value of a dummy constant it
  adds (named `.../_<n>`); a data edge sends the tensor itself.
  """
  metadata = tf.RunMetadata()
  sess.run(
    op,
    options=tf.RunOptions(output_partition_graphs=True),
    run_metadata=metadata,
  )
  for graph in metadata.partition_graphs:
    nodes = {node.name: node for node in graph.node}
    for node in graph.node:
      if node.op not in ("_Send", "_HostSend"):
        continue
      source = nodes[node.input[0].split(":")[0]]
      if not (source.op == "Const" and "/_" in source.name):
        return True
  return False


if __name__ == "__main__":
  tf.test.main()
