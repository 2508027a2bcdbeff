"""store.slots.past(): outputs computed from a device slot, next to the current ones.

Each supported construct is checked against the swap-based evaluation
(`evaluate_with` of a fetch that has no rewired version), bit for bit: the
rewired graph runs the same kernels on the same values.
"""

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.engines.graph import copies
from tensorflow.python.compiler.xla import xla  # pylint: disable=g-direct-tensorflow-import
from tests import helpers

KINDS = helpers.kind_cases()


def _perturb_op(variables, seed):
  """One op adding fresh positive noise to every variable (built once).

  Positive, so that batch-norm variances stay variances.
  """
  updates = []
  for i, v in enumerate(variables):
    noise = tf.random.uniform(
      v.shape, 0.05, 0.3, seed=seed + i, dtype=v.dtype.base_dtype
    )
    updates.append(
      v.assign_add(noise, read_value=False)
      if copies.is_resource(v)
      else tf.assign_add(v, noise)
    )
  return tf.group(*updates)


class _Case(tf.test.TestCase, parameterized.TestCase):
  """Builds a model with `build()` under scope "net", a store and its past.

  `self.swap_fetch` is an identity of the output that has no rewired version,
  so `evaluate_with` evaluates it with the swap: the reference.
  """

  def _setup(self, build, use_resource, feed_fn, var_list=None, scope="net"):
    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(1)
      with tf.variable_scope(scope, use_resource=use_resource):
        self.out = build()
      if var_list is None:
        self.store = snapstore.SnapshotStore(scope=scope, max_to_keep=2)
      else:
        self.store = snapstore.SnapshotStore(var_list=var_list(), max_to_keep=2)
      self.past = self.store.slots.past(self.out, slot=0)
      self.swap_fetch = tf.identity(self.out)
      self.perturb = _perturb_op(list(self.store.variables.values()), seed=7)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    self.sess.run(init)
    self.feed_fn = feed_fn

  def assertPastMatchesSwap(self, feeds=None):
    tag = self.store.snapshot(session=self.sess)
    self.assertEqual(self.store.slots.slot_of(tag), 0)
    self.sess.run(self.perturb)
    for feed in feeds or [self.feed_fn()]:
      past, current = self.sess.run([self.past, self.out], feed)
      swapped = self.store.evaluate_with(
        self.swap_fetch, feed, tag=tag, session=self.sess
      )
      helpers.assert_bits_differ(past, current, "past vs current")
      helpers.assert_bit_equal(past, swapped, "rewired vs swap")
      # The rewired path of evaluate_with gives the same, without the swap.
      helpers.assert_bit_equal(
        self.store.evaluate_with(self.out, feed, tag=tag, session=self.sess),
        past,
      )

  def assertFirstTrainingRunMatchesSwap(self, training_feed, inference_feed):
    """In training mode (batch statistics, dropout) in a fresh session.

    Dropout in the copy draws from the copy's own generator, seeded like the
    original's: the first draw of each is the same mask.
    """
    tag = self.store.snapshot(session=self.sess)
    self.sess.run(self.perturb)
    swapped = self.store.evaluate_with(
      self.swap_fetch, training_feed, tag=tag, session=self.sess
    )
    past = self.sess.run(self.past, training_feed)
    helpers.assert_bit_equal(past, swapped, "first training-mode run")
    helpers.assert_bits_differ(
      past, self.sess.run(self.past, inference_feed), "training flag"
    )


class ConstructsTest(_Case):
  @parameterized.named_parameters(*KINDS)
  def test_dense_layers(self, use_resource):
    x = np.random.RandomState(0).randn(8, 6).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 6])
      return helpers.dense_net(self.x, scope=None, hidden=16, outputs=3)

    self._setup(build, use_resource, lambda: {self.x: x})
    self.assertPastMatchesSwap()

  @parameterized.named_parameters(*KINDS)
  def test_conv_layers(self, use_resource):
    x = np.random.RandomState(0).randn(2, 8, 8, 3).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 8, 8, 3])
      h = tf.layers.conv2d(self.x, 4, 3, padding="same", activation=tf.nn.relu)
      h = tf.layers.max_pooling2d(h, 2, 2)
      return tf.layers.dense(tf.layers.flatten(h), 2)

    self._setup(build, use_resource, lambda: {self.x: x})
    self.assertPastMatchesSwap()

  @parameterized.named_parameters(*KINDS)
  def test_embedding_lookup_consuming_the_variable(self, use_resource):
    ids = np.array([[1, 4], [7, 1]], np.int32)

    def build():
      self.ids = tf.placeholder(tf.int32, [None, 2])
      emb = tf.get_variable("emb", [10, 5])
      if use_resource:
        looked_up = tf.nn.embedding_lookup(
          emb, self.ids
        )  # ResourceGather(handle)
      else:
        # A Gather taking the variable's ref itself, as graphs loaded from
        # old meta graphs do, not its `read` snapshot.
        looked_up = tf.gather(emb.op.outputs[0], self.ids)
      consumers = [op.type for op in emb.op.outputs[0].consumers()]
      self.assertIn("ResourceGather" if use_resource else "GatherV2", consumers)
      return tf.reduce_sum(looked_up, axis=1)

    self._setup(build, use_resource, lambda: {self.ids: ids})
    self.assertPastMatchesSwap()

  def test_partitioned_embedding(self):
    ids = np.array([0, 3, 9, 5], np.int32)

    def build():
      self.ids = tf.placeholder(tf.int32, [None])
      emb = tf.get_variable(
        "emb", [10, 4], partitioner=tf.fixed_size_partitioner(3)
      )
      return tf.nn.embedding_lookup(emb, self.ids)

    self._setup(build, False, lambda: {self.ids: ids})
    self.assertLen(self.store.variables, 3)
    self.assertPastMatchesSwap()

  @parameterized.named_parameters(*KINDS)
  def test_batch_norm_and_dropout_driven_by_a_fed_flag(self, use_resource):
    x = np.random.RandomState(0).randn(8, 6).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 6])
      self.training = tf.placeholder(tf.bool, [])
      h = tf.layers.dense(self.x, 16, activation=tf.nn.relu)
      h = tf.layers.batch_normalization(h, training=self.training)
      h = tf.layers.dropout(h, 0.5, training=self.training, seed=3)
      return tf.layers.dense(h, 3)

    self._setup(build, use_resource, None)
    self.assertIn("batch_normalization/moving_mean", self.store.keys)
    self.assertPastMatchesSwap([{self.x: x, self.training: False}])
    self._setup(build, use_resource, None)
    self.assertFirstTrainingRunMatchesSwap(
      {self.x: x, self.training: True}, {self.x: x, self.training: False}
    )

  @parameterized.named_parameters(*KINDS)
  def test_batch_norm_moving_statistics_come_from_the_slot(self, use_resource):
    x = np.random.RandomState(0).randn(8, 6).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 6])
      return tf.layers.batch_normalization(self.x, training=False)

    self._setup(build, use_resource, lambda: {self.x: x})
    self.assertPastMatchesSwap()

  def test_keras_sequential_with_batch_norm_and_dropout(self):
    x = np.random.RandomState(0).randn(8, 6).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 6])
      self.model = tf.keras.Sequential(
        [
          tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)),
          tf.keras.layers.BatchNormalization(),
          tf.keras.layers.Dropout(0.5, seed=2),
          tf.keras.layers.Dense(3),
        ]
      )
      return self.model(self.x)

    self._setup(build, True, None, var_list=lambda: self.model.variables)
    self.assertLen(self.store.variables, 8)  # moving statistics included
    with self.graph.as_default():
      phase = tf.keras.backend.learning_phase()
    self.assertPastMatchesSwap([{self.x: x}, {self.x: x, phase: False}])
    self._setup(build, True, None, var_list=lambda: self.model.variables)
    with self.graph.as_default():
      phase = tf.keras.backend.learning_phase()
    self.assertFirstTrainingRunMatchesSwap(
      {self.x: x, phase: True}, {self.x: x}
    )

  @parameterized.named_parameters(*KINDS)
  def test_keras_layers_with_a_training_argument(self, use_resource):
    x = np.random.RandomState(0).randn(8, 6).astype(np.float32)

    def build():
      self.x = tf.placeholder(tf.float32, [None, 6])
      self.training = tf.placeholder_with_default(False, [])
      h = tf.keras.layers.Dense(8, activation="relu")(self.x)
      h = tf.keras.layers.BatchNormalization()(h, training=self.training)
      h = tf.keras.layers.Dropout(0.5, seed=4)(h, training=self.training)
      return tf.keras.layers.Dense(3)(h)

    self._setup(build, use_resource, None)
    self.assertIn("batch_normalization/moving_variance", self.store.keys)
    self.assertPastMatchesSwap([{self.x: x}])
    self._setup(build, use_resource, None)
    self.assertFirstTrainingRunMatchesSwap(
      {self.x: x, self.training: True}, {self.x: x}
    )

  def test_keras_functional_model_with_conv_and_embedding(self):
    images = np.random.RandomState(0).randn(2, 6, 6, 1).astype(np.float32)
    words = np.array([[1, 2, 3], [4, 5, 0]], np.int32)

    def build():
      image_in = tf.keras.Input(shape=(6, 6, 1))
      word_in = tf.keras.Input(shape=(3,), dtype="int32")
      h = tf.keras.layers.Conv2D(2, 3, activation="relu")(image_in)
      h = tf.keras.layers.Flatten()(h)
      e = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(8, 4)(word_in))
      out = tf.keras.layers.Dense(2)(tf.keras.layers.concatenate([h, e]))
      self.model = tf.keras.Model([image_in, word_in], out)
      self.images = tf.placeholder(tf.float32, [None, 6, 6, 1])
      self.words = tf.placeholder(tf.int32, [None, 3])
      return self.model([self.images, self.words])

    self._setup(
      build,
      True,
      lambda: {self.images: images, self.words: words},
      var_list=lambda: self.model.variables,
    )
    self.assertPastMatchesSwap()


class NetworkBTest(tf.test.TestCase, parameterized.TestCase):
  """The motivating case: network_B past and current in one run."""

  @parameterized.named_parameters(*KINDS)
  def test_past_and_current_in_one_run(self, use_resource):
    x_value, r_value = helpers.dense_net_data()
    graph = tf.Graph()
    with graph.as_default():
      x, reward = helpers.dense_net_placeholders()
      out = helpers.dense_net(x, scope="network_B", use_resource=use_resource)
      b_vars = tf.trainable_variables("network_B")
      store = snapstore.SnapshotStore(scope="network_B")
      past_out = store.slots.past(out, slot=0)
      # A TD-style loss: the past network gives the target.
      loss = tf.reduce_mean(tf.square(out - (reward + 0.9 * past_out)))
      train = tf.train.GradientDescentOptimizer(0.05).minimize(
        loss, var_list=b_vars
      )
      grads = tf.gradients(loss, list(store.slots.shadows(0).values()))
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.assertEqual(grads, [None] * len(grads))
    self.assertCountEqual(
      graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES), b_vars
    )
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      previous = None
      for _ in range(10):
        params = dict(zip(store.keys, sess.run(list(store.variables.values()))))
        current_value, past_value = sess.run([out, past_out], {x: x_value})
        self.assertAllClose(
          current_value,
          helpers.dense_net_numpy(x_value, params),
          rtol=1e-5,
          atol=1e-5,
        )
        self.assertAllClose(
          past_value,
          helpers.dense_net_numpy(x_value, previous or params),
          rtol=1e-5,
          atol=1e-5,
        )
        if previous is not None:
          helpers.assert_bits_differ(past_value, current_value, "past")
        sess.run(
          store.slots.snapshot_op(0)
        )  # the past: parameters before the step
        shadows_before = sess.run(list(store.slots.shadows(0).values()))
        sess.run(train, {x: x_value, reward: r_value})
        # The step changed only the current variables.
        for before, after in zip(
          shadows_before, sess.run(list(store.slots.shadows(0).values()))
        ):
          helpers.assert_bit_equal(after, before, "shadow")
        previous = params


class CachingAndEvaluateWithTest(tf.test.TestCase, parameterized.TestCase):
  def _build(self, use_resource=False, max_to_keep=2):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 3])
      self.hidden, self.out = helpers.dense_net(
        self.x,
        use_resource=use_resource,
        hidden=4,
        activation=tf.nn.tanh,
        with_hidden=True,
      )
      self.loss = tf.losses.mean_squared_error(
        tf.zeros_like(self.out), self.out
      )
      self.store = snapstore.SnapshotStore(scope="net", max_to_keep=max_to_keep)
      self.perturb = _perturb_op(list(self.store.variables.values()), seed=3)
      self.init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.feed = {
      self.x: np.random.RandomState(0).randn(5, 3).astype(np.float32)
    }

  def _session(self):
    sess = tf.Session(graph=self.graph)
    self.addCleanup(sess.close)
    sess.run(self.init)
    return sess

  def test_cached_per_op_and_slot(self):
    self._build()
    with self.graph.as_default():
      with helpers.new_ops(self.graph) as built:
        past = self.store.slots.past(self.out)
      self.assertTrue(built)  # the first call builds the copy
      with helpers.assert_no_new_ops(self.graph):
        self.assertIs(self.store.slots.past(self.out), past)
        # A tensor inside the earlier copy: already there.
        past_hidden = self.store.slots.past({"h": self.hidden, "o": self.out})
        self.assertIs(past_hidden["o"], past)
      # Another slot gets its own copy.
      self.assertIsNot(self.store.slots.past(self.out, slot=1), past)
      # New outputs copy only the ops not copied yet.
      with helpers.new_ops(self.graph) as added:
        self.store.slots.past(self.loss)
      added = [op.name for op in added]
      self.assertFalse([n for n in added if "dense" in n], added)
    self.assertTrue(
      past.name.startswith("snapstore/past_0/net/dense_1/"), past.name
    )
    # The copies join no collection: the past loss is not a LOSSES member.
    self.assertLen(self.graph.get_collection(tf.GraphKeys.LOSSES), 1)

  def test_outputs_not_depending_on_the_variables_are_returned_as_is(self):
    self._build()
    with self.graph.as_default():
      doubled = self.x * 2.0
      self.assertIs(self.store.slots.past(doubled), doubled)
      past = self.store.slots.past([doubled, self.out])
    sess = self._session()
    self.store.snapshot(session=sess)
    fetched = self.store.evaluate_with(
      [doubled, self.out], self.feed, session=sess
    )
    helpers.assert_bit_equal(fetched[1], sess.run(past[1], self.feed))
    self.assertEqual(self.store.nbytes, 2 * self.store.param_nbytes)  # no swap

  @parameterized.named_parameters(*KINDS)
  def test_evaluate_with_uses_rewired_tensors_and_falls_back(
    self, use_resource
  ):
    self._build(use_resource)
    with self.graph.as_default():
      past = self.store.slots.past(self.out, slot=1)
    sess = self._session()
    self.store.snapshot("a", session=sess)  # slot 0: no rewired tensors
    sess.run(self.perturb)
    self.store.snapshot("b", session=sess)  # slot 1
    self.assertEqual(self.store.slots.slot_of("b"), 1)
    sess.run(self.perturb)
    current = sess.run(self.out, self.feed)
    got = self.store.evaluate_with(
      {"o": self.out}, self.feed, tag="b", session=sess
    )
    helpers.assert_bit_equal(got["o"], sess.run(past, self.feed))
    helpers.assert_bits_differ(got["o"], current, "past")
    # The rewired path sets nothing aside: the scratch shadows stay unused.
    self.assertEqual(self.store.nbytes, 2 * self.store.param_nbytes)
    # Tag "a" lives in slot 0, which has no rewired version: the swap.
    swapped = self.store.evaluate_with(
      self.out, self.feed, tag="a", session=sess
    )
    self.assertEqual(self.store.nbytes, 3 * self.store.param_nbytes)
    helpers.assert_bits_differ(swapped, got["o"], "slot 0 vs slot 1")
    helpers.assert_bit_equal(sess.run(self.out, self.feed), current)

  def test_a_fed_intermediate_tensor_is_fed_to_its_copy(self):
    self._build()
    with self.graph.as_default():
      self.store.slots.past(self.out)
      reference = tf.identity(self.out)  # no rewired version: the swap
    sess = self._session()
    self.store.snapshot(session=sess)
    sess.run(self.perturb)
    feed = dict(self.feed)
    feed[self.hidden] = np.full([5, 4], 0.5, np.float32)
    helpers.assert_bit_equal(
      self.store.evaluate_with(self.out, feed, session=sess),
      self.store.evaluate_with(reference, feed, session=sess),
    )

  def test_fetch_by_name_and_unknown_feed_keys(self):
    self._build()
    with self.graph.as_default():
      past = self.store.slots.past(self.out)
    sess = self._session()
    self.store.snapshot(session=sess)
    sess.run(self.perturb)
    got = self.store.evaluate_with(
      self.out.name, {self.x.name: self.feed[self.x]}, session=sess
    )
    helpers.assert_bit_equal(got, sess.run(past, self.feed))
    self.assertEqual(self.store.nbytes, 2 * self.store.param_nbytes)

  def test_thousand_evaluations_on_a_finalized_graph(self):
    self._build()
    with self.graph.as_default():
      past = self.store.slots.past(self.out)
    sess = self._session()
    self.graph.finalize()
    with helpers.assert_no_new_ops(self.graph):
      tag = self.store.snapshot(session=sess)
      expected = sess.run(past, self.feed)
      for _ in range(1000):
        got = self.store.evaluate_with(
          self.out, self.feed, tag=tag, session=sess
        )
      helpers.assert_bit_equal(got, expected)
    self.assertIs(
      self.store.slots.past(self.out), past
    )  # cached: fine when finalized

  def test_rewired_reads_run_on_the_variables_device(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 3])
      with tf.device("/cpu:1"), tf.variable_scope("net", use_resource=True):
        w = tf.get_variable("w", [3, 2])
      out = tf.matmul(x, w)
      store = snapstore.SnapshotStore(scope="net")
      past = store.slots.past(out)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    reads = [
      op.name
      for op in graph.get_operations()
      if op.name.startswith("snapstore/past_0/") and op.type == "ReadVariableOp"
    ]
    self.assertLen(reads, 1)
    config = tf.ConfigProto(device_count={"CPU": 2})
    with tf.Session(graph=graph, config=config) as sess:
      sess.run(init)
      meta = tf.RunMetadata()
      sess.run(
        past,
        {x: np.ones([1, 3], np.float32)},
        options=tf.RunOptions(output_partition_graphs=True),
        run_metadata=meta,
      )
    placed = {}
    for partition in meta.partition_graphs:
      for node in partition.node:
        placed[node.name] = node.device
    self.assertRegex(placed[reads[0]], "CPU:1$")


class GradientsTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*KINDS)
  def test_no_gradient_into_shadows_and_input_gradients_match_swap(
    self, use_resource
  ):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4])
      training = tf.placeholder(tf.bool, [])
      ids = tf.placeholder(tf.int32, [None])
      with tf.variable_scope("net", use_resource=use_resource):
        emb = tf.get_variable("emb", [6, 4])
        h = tf.layers.dense(x + tf.nn.embedding_lookup(emb, ids), 5, tf.nn.relu)
        h = tf.layers.batch_normalization(h, training=training)
        out = tf.layers.dense(h, 1)
      store = snapstore.SnapshotStore(scope="net")
      past = store.slots.past(out)
      shadows = list(store.slots.shadows(0).values())
      self.assertEqual(
        tf.gradients(tf.reduce_sum(past), shadows), [None] * len(shadows)
      )
      (grad_x_past,) = tf.gradients(tf.reduce_sum(past), [x])
      (grad_x,) = tf.gradients(tf.reduce_sum(out), [x])
      perturb = _perturb_op(list(store.variables.values()), seed=5)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    feed = {x: np.random.RandomState(1).randn(6, 4), ids: [0, 1, 2, 3, 4, 5]}
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      store.snapshot(session=sess)
      sess.run(perturb)
      for flag in (True, False):
        feed[training] = flag
        self.assertAllClose(
          sess.run(grad_x_past, feed),
          store.evaluate_with(grad_x, feed, session=sess),
          rtol=1e-6,
          atol=1e-6,
        )

  @parameterized.named_parameters(*KINDS)
  def test_optimizer_on_a_loss_of_past_and_current_updates_only_current(
    self, use_resource
  ):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        out = tf.layers.dense(x, 2)
      store = snapstore.SnapshotStore(scope="net", saveable=True)
      past = store.slots.past(out)
      loss = tf.reduce_mean(tf.square(out - past + 1.0)) + tf.reduce_mean(past)
      # Shadows are not trainable, and even as global variables get no gradient.
      grads = tf.train.AdamOptimizer(0.1).compute_gradients(
        loss, var_list=tf.global_variables()
      )
      train = tf.train.AdamOptimizer(0.1).minimize(loss)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with_grad = [v for g, v in grads if g is not None]
    self.assertCountEqual(
      with_grad, graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    )
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      store.snapshot(session=sess)
      shadows = sess.run(list(store.slots.shadows(0).values()))
      current = sess.run(list(store.variables.values()))
      feed = {x: np.ones([4, 3], np.float32)}
      for _ in range(3):
        sess.run(train, feed)
      for before, after in zip(
        shadows, sess.run(list(store.slots.shadows(0).values()))
      ):
        helpers.assert_bit_equal(after, before, "shadow")
      for before, after in zip(
        current, sess.run(list(store.variables.values()))
      ):
        helpers.assert_bits_differ(after, before, "current")


def _reenter_net(use_resource=False):
  """Scope "net" again, with op names under "net/" too (not "net_1/")."""
  scope = tf.variable_scope(
    "net", use_resource=use_resource, auxiliary_name_scope=False
  )
  return _Both(scope, tf.name_scope("net/"))


class _Both(object):
  def __init__(self, first, second):
    self._first, self._second = first, second

  def __enter__(self):
    self._first.__enter__()
    self._second.__enter__()

  def __exit__(self, *exc_info):
    self._second.__exit__(*exc_info)
    self._first.__exit__(*exc_info)


class RefusedTest(tf.test.TestCase, parameterized.TestCase):
  """Each refused construct: a RewireError naming the op, nothing built."""

  def _graph(self, use_resource=False):
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 3])
      with tf.variable_scope("net", use_resource=use_resource):
        self.out = tf.layers.dense(self.x, 2)
    return graph

  def assertRefused(self, graph, store, outputs, *fragments):
    with helpers.assert_no_new_ops(graph):
      with helpers.assert_raises_naming(
        self, snapstore.RewireError, *fragments
      ):
        store.slots.past(outputs)

  def test_a_stateless_function_op_whose_body_writes_a_variable(self):
    # tf.function and tf.cond build a stateful op around a body that writes
    # (refused as stateful); a PartitionedCall built by hand is stateless, so
    # only its body tells. Its copy would write the slot it reads.
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=True):
        v = tf.get_variable("v", initializer=np.zeros(4, np.float32))

      @tf.function
      def bump(h):
        tf.raw_ops.AssignAddVariableOp(
          resource=h, value=tf.constant(np.ones(4, np.float32))
        )
        return tf.reduce_sum(
          tf.raw_ops.ReadVariableOp(resource=h, dtype=tf.float32)
        )

      out = tf.raw_ops.PartitionedCall(
        args=[v.handle],
        Tout=[tf.float32],
        f=bump.get_concrete_function(tf.TensorSpec([], tf.resource)),
      )[0]
      store = snapstore.SnapshotStore(var_list=[v], scope="net")
    self.assertRefused(
      graph,
      store,
      out,
      "PartitionedCall",
      "writes net/v",
      "AssignAddVariableOp",
    )

  @parameterized.named_parameters(*KINDS)
  def test_batch_norm_updates_as_control_dependency(self, use_resource):
    graph = self._graph(use_resource)
    with graph.as_default():
      with _reenter_net(use_resource):
        h = tf.layers.batch_normalization(self.out, training=True)
      with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
        out = tf.identity(h)
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(
      graph,
      store,
      out,
      r"op 'net/batch_normalization/AssignMovingAvg[^']*' .*writes a variable",
      r"fetch it separately",
      r"evaluate_with\(past=True\)",
    )

  def test_assign_in_the_outputs_path(self):
    graph = self._graph()
    with graph.as_default():
      counter = tf.get_variable(
        "net/counter", [], initializer=tf.zeros_initializer()
      )
      out = self.out + tf.assign_add(counter, tf.reduce_sum(self.out))
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(graph, store, out, r"op 'AssignAdd' .*writes a variable")

  def test_while_loop(self):
    graph = self._graph()
    with graph.as_default():
      with _reenter_net():
        cell = tf.nn.rnn_cell.BasicRNNCell(3)
        _, state = tf.nn.dynamic_rnn(
          cell, tf.expand_dims(self.x, 1), dtype=tf.float32
        )
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(
      graph,
      store,
      state,
      r"op 'net/rnn/while/.*' \(type .*\).*part of a tf.while_loop",
    )

  def test_xla_compile_context(self):
    graph = self._graph()
    with graph.as_default():
      kernel = tf.trainable_variables("net")[0]
      (out,) = xla.compile(lambda: tf.matmul(self.x, kernel))
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(
      graph, store, out, r"control-flow context XLACompileContext"
    )

  def test_unknown_stateful_op(self):
    graph = self._graph()
    with graph.as_default():
      out = tf.py_func(lambda a: a, [self.out], tf.float32, stateful=True)
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(
      graph, store, out, r"op 'PyFunc' \(type PyFunc\).*stateful"
    )

  def test_variable_read_through_an_alias_handle(self):
    graph = self._graph(use_resource=True)
    with graph.as_default():
      kernel = tf.trainable_variables("net")[0]
      alias = tf.raw_ops.VarHandleOp(
        dtype=tf.float32,
        shape=kernel.shape,
        shared_name=kernel.op.get_attr("shared_name"),
      )
      out = tf.matmul(
        self.x, tf.raw_ops.ReadVariableOp(resource=alias, dtype=tf.float32)
      )
      store = snapstore.SnapshotStore(scope="net")
    self.assertRefused(
      graph,
      store,
      out,
      r"'VarHandleOp'.*the variable net/dense/kernel:0 under another op",
    )

  def test_finalized_graph(self):
    graph = self._graph()
    with graph.as_default():
      store = snapstore.SnapshotStore(scope="net")
    graph.finalize()
    with self.assertRaisesRegex(
      snapstore.RewireError,
      r"graph is finalized.*store\.slots\.past\(\) while building",
    ):
      store.slots.past(self.out)

  def test_refused_fetches_use_the_swap(self):
    graph = self._graph()
    with graph.as_default():
      counter = tf.get_variable(
        "net/counter", [], initializer=tf.zeros_initializer()
      )
      out = self.out + tf.assign_add(counter, 1.0)
      store = snapstore.SnapshotStore(scope="net")
      with self.assertRaises(snapstore.RewireError):
        store.slots.past(out)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      store.snapshot(session=sess)
      store.evaluate_with(out, {self.x: np.ones([1, 3])}, session=sess)
      self.assertEqual(
        store.nbytes, 2 * store.param_nbytes
      )  # the scratch: a swap
      self.assertEqual(
        sess.run(counter), 0.0
      )  # written in the swap, then put back

  def test_bad_arguments(self):
    graph = self._graph()
    with graph.as_default():
      store = snapstore.SnapshotStore(scope="net", max_to_keep=2)
      host = snapstore.SnapshotStore(scope="net", mode="host", name="host")
      kernel = tf.trainable_variables("net")[0]
    with self.assertRaisesRegex(
      snapstore.ModeError, r"store\.slots: this store uses mode 'host'"
    ):
      host.slots.past(self.out)
    with self.assertRaisesRegex(ValueError, r"slot must be <= 1"):
      store.slots.past(self.out, slot=2)
    with self.assertRaisesRegex(TypeError, r"takes tensors.*got <tf.Variable"):
      store.slots.past(kernel)
    with self.assertRaisesRegex(TypeError, r"takes tensors.*got <tf.Operation"):
      store.slots.past(self.out.op)
    with self.assertRaisesRegex(
      ValueError, r"net/dense/kernel:0, a variable's reference; pass the value"
    ):
      store.slots.past(kernel.op.outputs[0])
    with self.assertRaisesRegex(ValueError, r"got no tensors"):
      store.slots.past([])
    with tf.Graph().as_default():
      other = tf.zeros([1])
    with self.assertRaisesRegex(
      snapstore.GraphMismatchError, r"zeros:0 belongs to another graph"
    ):
      store.slots.past(other)


if __name__ == "__main__":
  tf.test.main()
