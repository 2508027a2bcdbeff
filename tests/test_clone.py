"""snapstore.clone: copies of a subgraph with new or shared variables."""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import resource_variable_ops
from snapstore._tf import tf
from snapstore._tf import tf_variables
from tensorflow.python.compiler.xla import xla  # pylint: disable=g-direct-tensorflow-import
from tests import helpers

KINDS = helpers.kind_cases()


def _values(sess, variables):
  return [np.asarray(v) for v in sess.run(list(variables))]


def _assert_all_bit_equal(actual, expected, msg):
  for i, (a, e) in enumerate(zip(actual, expected)):
    helpers.assert_bit_equal(a, e, "%s %d" % (msg, i))


def _initializer_ops():
  return [tf.global_variables_initializer(), tf.local_variables_initializer()]


class MotivatingCasesTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*KINDS)
  def test_new_variables_train_alone_and_are_saved(self, use_resource):
    x_value, y_value = helpers.dense_net_data()
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=use_resource)
      originals = tf.global_variables("net")
      c = snapstore.clone(out, inputs=[x], scope="copy")
      copies = list(c.variables.values())
      loss = tf.reduce_mean(tf.square(c.outputs - y_value))
      train = tf.train.AdamOptimizer(0.05).minimize(loss, var_list=copies)
      perturb = tf.group(
        *[
          tf.assign_add(v, tf.ones_like(v))
          if not use_resource
          else v.assign_add(tf.ones_like(v))
          for v in originals
        ]
      )
      saver = tf.train.Saver()
      init = _initializer_ops()
    self.assertEqual(c.scope, "copy")
    self.assertEqual(c.inputs[x].name, "copy/x:0")
    self.assertEqual(
      sorted(v.op.name for v in copies),
      [
        "copy/dense/bias",
        "copy/dense/kernel",
        "copy/dense_1/bias",
        "copy/dense_1/kernel",
      ],
    )
    self.assertEqual(list(c.variables), sorted(originals, key=lambda v: v.name))
    for v in copies:
      # The base class: TF 2.x's ResourceVariable is not a tf.compat.v1.Variable.
      self.assertIsInstance(v, tf_variables.Variable)
      self.assertEqual(
        resource_variable_ops.is_resource_variable(v), use_resource
      )
      self.assertIn(v, graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES))
      self.assertIn(v, graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES))
    path = os.path.join(self.get_temp_dir(), "model")
    with tf.Session(graph=graph) as sess:
      sess.run(init)  # one run: the copies start from the originals' values
      copies = [c.variables[v] for v in originals]  # in the originals' order
      start = _values(sess, originals)
      _assert_all_bit_equal(_values(sess, copies), start, "initial copy")
      helpers.assert_bit_equal(
        sess.run(c.outputs, {c.inputs[x]: x_value}),
        sess.run(out, {x: x_value}),
        "copy output",
      )
      losses = [
        sess.run([train, loss], {c.inputs[x]: x_value})[1] for _ in range(20)
      ]
      self.assertLess(losses[-1], losses[0] / 2)
      _assert_all_bit_equal(
        _values(sess, originals), start, "original after training"
      )
      trained = _values(sess, copies)
      for a, b in zip(trained, start):
        helpers.assert_bits_differ(a, b, "trained copy")
      sess.run(perturb)  # independent after initialization
      _assert_all_bit_equal(
        _values(sess, copies), trained, "copy after perturb"
      )
      saver.save(sess, path)
      sess.run(c.initializer)  # the originals' current values, again
      _assert_all_bit_equal(
        _values(sess, copies), _values(sess, originals), "re-init"
      )
    saved = dict(tf.train.list_variables(path))
    self.assertIn("copy/dense/kernel", saved)
    with tf.Session(graph=graph) as sess:
      saver.restore(sess, path)
      _assert_all_bit_equal(_values(sess, copies), trained, "restored copy")

  @parameterized.named_parameters(*KINDS)
  def test_initial_value_from_the_initializers(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=use_resource, seed=3)
      originals = tf.global_variables("net")
      c = snapstore.clone(
        out, inputs=[x], scope="copy", initial_value="initializer"
      )
      copies = list(c.variables.values())
      perturb = tf.group(
        *[
          tf.assign_add(v, tf.ones_like(v))
          if not use_resource
          else v.assign_add(tf.ones_like(v))
          for v in originals
        ]
      )
    by_name = dict((v.op.name, v) for v in copies)
    self.assertIn(
      "copy/dense/kernel/Initializer/random_uniform/RandomUniform",
      [op.name for op in graph.get_operations()],
    )
    with tf.Session(graph=graph) as sess:
      sess.run(tf.variables_initializer(originals))
      start = dict(
        (v.op.name, value)
        for v, value in zip(originals, _values(sess, originals))
      )
      sess.run(perturb)
      sess.run(c.initializer)
      # Seeded initializers give, on their first run, what the originals
      # started from, not their current values.
      for name, value in start.items():
        helpers.assert_bit_equal(
          sess.run(by_name[name.replace("net/", "copy/")]), value, name
        )

  @parameterized.named_parameters(*KINDS)
  def test_shared_variables_on_new_inputs(self, use_resource):
    x_value = np.random.RandomState(0).randn(5, 4).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=use_resource)
      c = snapstore.clone(out, inputs=[x], scope="shared", share_variables=True)
      other = tf.placeholder(tf.float32, [None, 4], name="other")
      twice = other * 2.0
      doubled = snapstore.clone(
        out, inputs=[x], replacements={x: twice}, share_variables=True
      )
      (grad,) = tf.gradients(
        tf.reduce_sum(c.outputs), [tf.trainable_variables("net")[0]]
      )
      init = _initializer_ops()
    self.assertEqual(len(c.variables), 0)
    self.assertIs(doubled.inputs[x], twice)
    self.assertLen(graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES), 4)
    self.assertIsNotNone(grad)  # the copy trains the shared variables
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      helpers.assert_bit_equal(
        sess.run(c.outputs, {c.inputs[x]: x_value}), sess.run(out, {x: x_value})
      )
      helpers.assert_bit_equal(
        sess.run(doubled.outputs, {other: x_value}),
        sess.run(out, {x: 2.0 * x_value}),
      )

  @parameterized.named_parameters(*KINDS)
  def test_a_variable_replaced_by_another(self, use_resource):
    x_value = np.random.RandomState(0).randn(5, 4).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=use_resource)
      kernel = tf.trainable_variables("net")[0]
      self.assertEqual(kernel.op.name, "net/dense/kernel")
      # Initialized in the same run as the kernel, from the same tensor: the
      # same values (TF 2.x's resource variables have no initialized_value()).
      other = tf.get_variable(
        "other", initializer=kernel.initial_value, use_resource=use_resource
      )
      c = snapstore.clone(out, inputs=[x], replacements={kernel: other})
      bump = (
        other.assign_add(tf.ones_like(other))
        if use_resource
        else tf.assign_add(other, tf.ones_like(other))
      )
      init = _initializer_ops()
    self.assertNotIn(kernel, c.variables)
    self.assertLen(c.variables, 3)
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      feed = {x: x_value, c.inputs[x]: x_value}
      a, b = sess.run([out, c.outputs], feed)
      helpers.assert_bit_equal(b, a)
      sess.run(bump)  # the copy reads `other`
      a2, b2 = sess.run([out, c.outputs], feed)
      helpers.assert_bit_equal(a2, a)
      helpers.assert_bits_differ(b2, b, "copy after changing its kernel")


class ConstructsTest(tf.test.TestCase, parameterized.TestCase):
  """Copies compute what the originals compute, with the same values."""

  def _check(self, build, feeds, use_resource, inputs, var_list=None):
    graph = tf.Graph()
    with graph.as_default():
      tf.set_random_seed(0)
      with tf.variable_scope("net", use_resource=use_resource):
        out = build()
      new = snapstore.clone(out, inputs=inputs(), scope="copy")
      shared = snapstore.clone(
        out, inputs=inputs(), scope="shared", share_variables=True
      )
      variables = var_list() if var_list else tf.global_variables("net")
      init = _initializer_ops()
    self.assertCountEqual(list(new.variables), variables)
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      for feed in feeds():
        copy_feed = dict(feed)
        for t in inputs():
          copy_feed[new.inputs[t]] = copy_feed[shared.inputs[t]] = feed[t]
        # One run: random ops in the copies draw their first numbers, as the
        # originals do, with the same seeds.
        a, b, c = sess.run([out, new.outputs, shared.outputs], copy_feed)
        helpers.assert_bit_equal(b, a, "new variables")
        helpers.assert_bit_equal(c, a, "shared variables")
    return graph, new

  @parameterized.named_parameters(*KINDS)
  def test_conv_and_embedding(self, use_resource):
    images = np.random.RandomState(0).randn(2, 6, 6, 1).astype(np.float32)
    words = np.array([[1, 2], [4, 0]], np.int32)
    holders = {}

    def build():
      holders["images"] = tf.placeholder(
        tf.float32, [None, 6, 6, 1], name="images"
      )
      holders["words"] = tf.placeholder(tf.int32, [None, 2], name="words")
      h = tf.layers.flatten(tf.layers.conv2d(holders["images"], 2, 3))
      emb = tf.get_variable("emb", [5, 3])
      looked_up = (
        tf.nn.embedding_lookup(emb, holders["words"])
        if use_resource
        else tf.gather(emb.op.outputs[0], holders["words"])
      )
      return tf.layers.dense(tf.concat([h, tf.layers.flatten(looked_up)], 1), 2)

    self._check(
      build,
      lambda: [{holders["images"]: images, holders["words"]: words}],
      use_resource,
      lambda: [holders["images"], holders["words"]],
    )

  @parameterized.named_parameters(*KINDS)
  def test_batch_norm_dropout_and_their_updates(self, use_resource):
    x_value = np.random.RandomState(0).randn(8, 4).astype(np.float32)
    holders = {}

    def build():
      holders["x"] = tf.placeholder(tf.float32, [None, 4], name="x")
      holders["training"] = tf.placeholder(tf.bool, [], name="training")
      h = tf.layers.dense(holders["x"], 6, activation=tf.nn.relu)
      h = tf.layers.batch_normalization(h, training=holders["training"])
      h = tf.layers.dropout(h, 0.5, training=holders["training"], seed=1)
      return tf.layers.dense(h, 2)

    feeds = lambda: [
      {holders["x"]: x_value, holders["training"]: flag}
      for flag in (False, True)
    ]
    self._check(build, feeds, use_resource, lambda: [holders["x"]])

    # The copied update ops update the copy's moving statistics only, and
    # gradients through the copied conds are the originals'.
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        out = build()
      updates = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
      self.assertLen(updates, 2)
      c = snapstore.clone([out, updates], inputs=[holders["x"]], scope="copy")
      moving = [v for v in tf.global_variables("net") if "moving" in v.name]
      trainable = tf.trainable_variables("net")
      grads = tf.gradients(tf.reduce_sum(tf.square(out)), trainable)
      copy_grads = tf.gradients(
        tf.reduce_sum(tf.square(c.outputs[0])),
        [c.variables[v] for v in trainable],
      )
      init = _initializer_ops()
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      feed = {holders["x"]: x_value, c.inputs[holders["x"]]: x_value}
      for flag in (True, False):  # the first run draws the same dropout masks
        feed[holders["training"]] = flag
        expected, got = sess.run([grads, copy_grads], feed)
        _assert_all_bit_equal(got, expected, "gradients, training=%s" % flag)
      before = _values(sess, moving)
      feed[holders["training"]] = True
      sess.run(c.outputs[1], feed)
      _assert_all_bit_equal(
        _values(sess, moving), before, "original statistics"
      )
      for copied, original in zip(
        _values(sess, [c.variables[v] for v in moving]), before
      ):
        helpers.assert_bits_differ(copied, original, "copy's statistics")

  def test_keras_sequential(self):
    x_value = np.random.RandomState(0).randn(8, 6).astype(np.float32)
    holders = {}

    def build():
      holders["x"] = tf.placeholder(tf.float32, [None, 6], name="x")
      holders["model"] = tf.keras.Sequential(
        [
          tf.keras.layers.Dense(8, activation="relu", input_shape=(6,)),
          tf.keras.layers.BatchNormalization(),
          tf.keras.layers.Dense(3),
        ]
      )
      return holders["model"](holders["x"])

    graph, _ = self._check(
      build,
      lambda: [{holders["x"]: x_value}],
      True,
      lambda: [holders["x"]],
      var_list=lambda: holders["model"].variables,
    )
    with graph.as_default():
      self.assertEqual(len(tf.trainable_variables("copy")), 6)

  def test_partitioned_variable_saved_as_one(self):
    graph = tf.Graph()
    with graph.as_default():
      ids = tf.placeholder(tf.int32, [None], name="ids")
      with tf.variable_scope("net"):
        emb = tf.get_variable(
          "emb", [10, 3], partitioner=tf.fixed_size_partitioner(2)
        )
        out = tf.nn.embedding_lookup(emb, ids)
      c = snapstore.clone(out, scope="copy")
      saver = tf.train.Saver()
      init = _initializer_ops()
    self.assertLen(c.variables, 2)
    path = os.path.join(self.get_temp_dir(), "model")
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      saver.save(sess, path)
      helpers.assert_bit_equal(
        sess.run(c.outputs, {ids: [0, 9, 4]}), sess.run(out, {ids: [0, 9, 4]})
      )
    self.assertEqual(dict(tf.train.list_variables(path))["copy/emb"], [10, 3])

  def test_names_devices_and_unique_scopes(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=True)
      first = snapstore.clone(out, inputs=[x], scope="copy")
      with tf.device("/cpu:1"):
        second = snapstore.clone(out, inputs=[x], scope="copy")
      init = _initializer_ops()
    self.assertEqual(second.scope, "copy_1")
    self.assertEqual(second.outputs.name, "copy_1/dense_1/BiasAdd:0")
    for v in second.variables.values():
      self.assertEqual(v.device, "/device:CPU:1")
    matmul = graph.get_operation_by_name("copy_1/dense/MatMul")
    self.assertEqual(matmul.device, "/device:CPU:1")
    self.assertEqual(
      graph.get_operation_by_name("copy/dense/MatMul").device, ""
    )
    with tf.Session(
      graph=graph, config=tf.ConfigProto(device_count={"CPU": 2})
    ) as sess:
      sess.run(init)
      feed = {
        x: np.ones([1, 4]),
        first.inputs[x]: np.ones([1, 4]),
        second.inputs[x]: np.ones([1, 4]),
      }
      a, b, c = sess.run([out, first.outputs, second.outputs], feed)
      helpers.assert_bit_equal(b, a)
      helpers.assert_bit_equal(c, a)


class ErrorsTest(tf.test.TestCase):
  def _graph(self):
    graph = tf.Graph()
    with graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 4], name="x")
      self.out = helpers.dense_net(self.x)
    return graph

  def assertRefused(self, graph, error, fragments, *args, **kwargs):
    """clone(*args, **kwargs) raises `error` naming `fragments`, builds nothing.

    Args:
      graph: The graph cloned in.
      error: The exception type.
      fragments: A regex, or a tuple of them, the message must match.
      *args: Passed to clone().
      **kwargs: Passed to clone().
    """
    if isinstance(fragments, str):
      fragments = (fragments,)
    variables = len(graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES))
    with helpers.assert_no_new_ops(graph), graph.as_default():
      with helpers.assert_raises_naming(self, error, *fragments):
        snapstore.clone(*args, **kwargs)
    self.assertEqual(
      len(graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)), variables
    )

  def test_while_loop(self):
    graph = self._graph()
    with graph.as_default(), tf.variable_scope("rnn"):
      _, state = tf.nn.dynamic_rnn(
        tf.nn.rnn_cell.BasicRNNCell(3),
        tf.expand_dims(self.out, 1),
        dtype=tf.float32,
      )
    self.assertRefused(
      graph,
      snapstore.CloneError,
      (
        r"rnn/rnn/while/Exit_3:0.*op 'rnn/rnn/while/[^']*'.*tf\.while_loop",
        r"Pass its outputs as inputs",
      ),
      state,
      inputs=[self.x],
    )

  def test_xla_compile_context(self):
    graph = self._graph()
    with graph.as_default():
      (out,) = xla.compile(lambda: self.out * 2.0)
    self.assertRefused(
      graph,
      snapstore.CloneError,
      (
        r"control-flow context XLACompileContext",
        r"Pass its outputs as inputs",
      ),
      out,
      inputs=[self.x],
    )

  def test_finalized_graph(self):
    graph = self._graph()
    graph.finalize()
    with self.assertRaisesRegex(
      snapstore.CloneError, r"the graph is finalized"
    ):
      snapstore.clone(self.out, inputs=[self.x])

  def test_variable_op_without_a_variable(self):
    graph = self._graph()
    with graph.as_default():
      hidden = tf.Variable(
        tf.ones([4, 4]), collections=[], trainable=False, name="loose"
      )
      out = tf.matmul(self.out, tf.ones([2, 4])) + tf.reduce_sum(hidden)
    self.assertRefused(
      graph,
      snapstore.CloneError,
      (
        r"variable op 'loose' a copy: no tf\.Variable .*owns it",
        r"share_variables=True",
      ),
      out,
      inputs=[self.x],
    )

  def test_initializer_of_a_variable_rebuilt_from_a_variable_def(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 2])
      w = tf.Variable(
        tf.ones([2, 2]), collections=[], trainable=False, name="w"
      )
      proto = w.to_proto()
      proto.ClearField("initial_value_name")
      rebuilt = tf.Variable(variable_def=proto)
      tf.add_to_collection(tf.GraphKeys.GLOBAL_VARIABLES, rebuilt)
      out = tf.matmul(x, rebuilt)
    self.assertRefused(
      graph,
      snapstore.CloneError,
      (r"initializer of w:0: it has none", r"initial_value='current'"),
      out,
      inputs=[x],
      initial_value="initializer",
    )

  def test_variable_read_through_an_alias_handle(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4], name="x")
      out = helpers.dense_net(x, use_resource=True)
      kernel = tf.trainable_variables("net")[0]
      alias = tf.raw_ops.VarHandleOp(
        dtype=tf.float32,
        shape=kernel.shape,
        shared_name=kernel.op.get_attr("shared_name"),
      )
      out += tf.reduce_sum(
        tf.raw_ops.ReadVariableOp(resource=alias, dtype=tf.float32)
      )
    self.assertRefused(
      graph,
      snapstore.CloneError,
      r"'VarHandleOp'.*the variable net/dense/kernel:0 under another op",
      out,
      inputs=[x],
    )

  def test_bad_arguments(self):
    graph = self._graph()
    with graph.as_default():
      ints = tf.placeholder(tf.int32, [None, 4])
      wide = tf.placeholder(tf.float32, [None, 5])
      unrelated = tf.placeholder(tf.float32, [None, 4], name="other")
      kernel = tf.trainable_variables("net")[0]
      resource = tf.get_variable("r", kernel.shape, use_resource=True)
    cases = [
      (TypeError, r"outputs must be tensors or ops.*got 3", [3], {}),
      (ValueError, r"got no outputs", [], {}),
      (
        ValueError,
        r"Invalid initial_value 'zeros'; must be one of current, initializer",
        self.out,
        {"initial_value": "zeros"},
      ),
      (
        ValueError,
        r"scope must be a non-empty string",
        self.out,
        {"scope": "/"},
      ),
      (
        TypeError,
        r"inputs must be a tensor or a list of tensors",
        self.out,
        {"inputs": "x"},
      ),
      (
        ValueError,
        r"other:0 is given as an input .*do not depend on it",
        self.out,
        {"inputs": [unrelated]},
      ),
      (
        TypeError,
        r"replacements must be a dict",
        self.out,
        {"replacements": [1]},
      ),
      (
        ValueError,
        r"replacements\[x:0\] has dtype int32; x:0 has dtype float32",
        self.out,
        {"replacements": {self.x: ints}},
      ),
      (
        ValueError,
        r"replacements\[x:0\] has shape \(\?, 5\), incompatible",
        self.out,
        {"replacements": {self.x: wide}},
      ),
      (
        TypeError,
        r"replacements\[x:0\] must be a tensor",
        self.out,
        {"replacements": {self.x: kernel}},
      ),
      (
        ValueError,
        r"net/dense/kernel:0 is a ref variable and r:0 is not",
        self.out,
        {"replacements": {kernel: resource}},
      ),
      (
        ValueError,
        r"Nothing to copy: the outputs depend on no input",
        self.out,
        {"share_variables": True},
      ),
    ]
    for error, regex, outputs, kwargs in cases:
      self.assertRefused(graph, error, regex, outputs, **kwargs)
    with tf.Graph().as_default():
      other = tf.placeholder(tf.float32, [None, 4])
    self.assertRefused(
      graph,
      snapstore.GraphMismatchError,
      r"Placeholder:0 belongs to another graph",
      self.out,
      inputs=[other],
    )


if __name__ == "__main__":
  tf.test.main()
