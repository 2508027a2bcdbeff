"""Shared test helpers: parameter cases, small models, bit-exact and graph checks."""

import contextlib
import itertools
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top

from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

tf.logging.set_verbosity(tf.logging.ERROR)

MODES = ("device", "host")

# What TensorFlow writes that is not a program's own output: a C++ log line
# (absl's format, TF 2.16+, or TensorFlow's own), absl's banner before its
# logging starts, a Python warning, a line of TensorFlow's Python logger.
_TENSORFLOW_LINE = re.compile(
  r"(?:[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
  r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "
  r"|WARNING: All log messages before absl::InitializeLog"
  r"|.*\b\w*Warning: "
  r"|(?:INFO|WARNING|ERROR):tensorflow:)"
)


def tensorflow_lines(text):
  """The lines of a program's output `text` that TensorFlow wrote."""
  return [line for line in text.splitlines() if _TENSORFLOW_LINE.match(line)]


VARIABLE_KINDS = (("ref", False), ("resource", True))


def mode_and_kind_cases(modes=MODES):
  """named_parameters cases: (name, mode, use_resource) for modes x variable kinds."""
  return [
    ("%s_%s" % (mode, kind), mode, use_resource)
    for mode, (kind, use_resource) in itertools.product(modes, VARIABLE_KINDS)
  ]


def kind_cases():
  return [(kind, use_resource) for kind, use_resource in VARIABLE_KINDS]


# Values a bit-exact restore must keep: signed zeros, NaN payloads, infinities
# and denormals, not just "nearby" floats.
_SPECIALS = {
  np.float16: [0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8],
  np.float32: [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45],
  np.float64: [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324],
}


def random_value(rng, shape, dtype):
  """Random values of `dtype`, including special floats where they exist."""
  dtype = np.dtype(dtype)
  if dtype.kind == "f":
    # Random bit patterns cover every float, NaN payloads included.
    bits = rng.randint(0, 2**16, size=int(np.prod(shape)) * dtype.itemsize // 2)
    value = bits.astype(np.uint16).view(dtype).reshape(shape).copy()
    flat = value.reshape(-1)
    for i, special in enumerate(_SPECIALS[dtype.type][: flat.size]):
      flat[i] = special
    return value
  if dtype.kind == "b":
    return rng.randint(0, 2, size=shape).astype(bool)
  info = np.iinfo(dtype)
  return rng.randint(info.min, info.max, size=shape, dtype=np.int64).astype(
    dtype
  )


def assert_bit_equal(actual, expected, msg=""):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype, "%s dtype %s != %s" % (
    msg,
    actual.dtype,
    expected.dtype,
  )
  assert actual.shape == expected.shape, "%s shape %s != %s" % (
    msg,
    actual.shape,
    expected.shape,
  )
  assert actual.tobytes() == expected.tobytes(), (
    "%s values differ bitwise" % msg
  )


def assert_bits_differ(actual, expected, msg=""):
  assert np.asarray(actual).tobytes() != np.asarray(expected).tobytes(), (
    "%s: values are equal, the test would not see a restore" % msg
  )


DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64, tf.bool)


def change_op(variables, use_resource):
  """An op that adds random values to every float and int variable and flips the bools."""
  updates = []
  for var in variables:
    if var.dtype.base_dtype == tf.bool:
      updates.append(
        tf.assign(var, tf.logical_not(var))
        if not use_resource
        else var.assign(tf.logical_not(var.read_value()))
      )
    else:
      noise = tf.cast(
        tf.random.uniform(var.shape, 1, 100, dtype=tf.int32),
        var.dtype.base_dtype,
      )
      updates.append(
        tf.assign_add(var, noise) if not use_resource else var.assign_add(noise)
      )
  return tf.group(*updates)


class Model(object):
  """Variables of several dtypes under scope `scope`, plus ops to change them.

  Attributes:
    variables: OrderedDict key -> variable (keys relative to the scope).
    train_op: Adds random values to every float and int variable and flips
      the bools; a new change every run, built once.
  """

  def __init__(
    self, scope="net", use_resource=False, dtypes=DTYPES, devices=None
  ):
    self.scope = scope
    self.variables = {}
    with tf.variable_scope(scope, use_resource=use_resource):
      for i, dtype in enumerate(dtypes):
        device = devices[i % len(devices)] if devices else None
        with tf.device(device):
          self.variables["v%d_%s" % (i, dtype.name)] = tf.get_variable(
            "v%d_%s" % (i, dtype.name),
            shape=[3, 5],
            dtype=dtype,
            initializer=tf.ones_initializer()
            if dtype != tf.bool
            else tf.zeros_initializer(),
          )
    self.train_op = change_op(self.variables.values(), use_resource)

  def randomize(self, sess, seed):
    """Loads random bit patterns into every variable (no new ops).

    Returns:
      The values loaded, as `values(sess)` gives them.
    """
    rng = np.random.RandomState(seed)
    for var in self.variables.values():
      var.load(
        random_value(
          rng, var.shape.as_list(), var.dtype.base_dtype.as_numpy_dtype
        ),
        sess,
      )
    return self.values(sess)

  def values(self, sess):
    return dict(zip(self.variables, sess.run(list(self.variables.values()))))


def dense_net(
  x,
  scope="net",
  use_resource=False,
  hidden=8,
  outputs=2,
  activation=tf.nn.relu,
  seed=None,
  with_hidden=False,
):
  """The small network many tests share: two dense layers under a variable scope.

  The variables are `<scope>/dense/{kernel,bias}` (the hidden layer) and
  `<scope>/dense_1/{kernel,bias}` (the output layer); `dense_net_numpy`
  computes the same function.

  Args:
    x: The input, a float tensor of shape [batch, features].
    scope: The variable scope to build in, or None to build in the current
      one (which then also decides the variable kind).
    use_resource: Whether the variables are resource variables (ref if not).
    hidden: The width of the hidden layer.
    outputs: The width of the output layer.
    activation: The hidden layer's activation; the output layer has none.
    seed: None for the layers' default initializer, or a seed for a Glorot
      uniform initializer of both kernels.
    with_hidden: Whether to return the hidden layer's output as well.

  Returns:
    The output tensor, or (hidden output, output) if `with_hidden`.
  """
  init = tf.glorot_uniform_initializer(seed=seed) if seed is not None else None
  with (
    tf.variable_scope(scope, use_resource=use_resource)
    if scope is not None
    else contextlib.nullcontext()
  ):
    hidden_out = tf.layers.dense(
      x, hidden, activation=activation, kernel_initializer=init
    )
    out = tf.layers.dense(hidden_out, outputs, kernel_initializer=init)
  return (hidden_out, out) if with_hidden else out


def dense_net_data(examples=16, seed=0):
  """Inputs and targets for a `dense_net` of 4 features and 2 outputs.

  Args:
    examples: How many rows to draw.
    seed: The seed of the draw.

  Returns:
    (x, y): float32 arrays of shapes [examples, 4] and [examples, 2], drawn
    from a standard normal with `seed`.
  """
  rng = np.random.RandomState(seed)
  x = rng.randn(examples, 4).astype(np.float32)
  return x, rng.randn(examples, 2).astype(np.float32)


def dense_net_placeholders():
  """Placeholders to feed `dense_net_data` through: x [None, 4] and y [None, 2]."""
  return (
    tf.placeholder(tf.float32, [None, 4], name="x"),
    tf.placeholder(tf.float32, [None, 2], name="y"),
  )


def dense_net_numpy(x, params, activation=lambda h: np.maximum(0.0, h)):
  """`dense_net` in numpy.

  Args:
    x: The input array, [batch, features].
    params: The values of the net's variables, keyed relative to its scope.
    activation: The hidden layer's activation, in numpy.

  Returns:
    The output array, [batch, outputs].
  """
  hidden = activation(x.dot(params["dense/kernel"]) + params["dense/bias"])
  return hidden.dot(params["dense_1/kernel"]) + params["dense_1/bias"]


@contextlib.contextmanager
def new_ops(graph):
  """Collects the ops that the block adds to `graph`.

  Yields:
    A list, empty inside the block, that holds the new ops once it exits.
  """
  start = len(graph.get_operations())
  added = []
  yield added
  added.extend(graph.get_operations()[start:])


@contextlib.contextmanager
def assert_no_new_ops(graph):
  """Asserts that the block adds no op to `graph`.

  Raises:
    AssertionError: On leaving the block, if it added ops; names them.
  """
  with new_ops(graph) as added:
    yield
  if added:
    raise AssertionError(
      "%d new ops in the graph: %s"
      % (len(added), ", ".join(op.name for op in added[:20]))
    )


@contextlib.contextmanager
def assert_raises_naming(test, error, *fragments):
  """Asserts that the block raises `error` with a message matching each regex.

  For messages that must name several things (every mismatch, the problem and
  its fix), in whatever order and words the rest of the message uses.

  Args:
    test: The running `tf.test.TestCase`.
    error: The exception type the block must raise.
    *fragments: Regexes each of which must match part of the message.

  Yields:
    The `assertRaises` context; `.exception` is the error raised.
  """
  with test.assertRaises(error) as caught:
    yield caught
  for fragment in fragments:
    test.assertRegex(str(caught.exception), fragment)


class CountingSession(object):
  """A session wrapper that counts the runs and the callables made through it.

  Stores accept it as a session: it has `graph`, `run` and (unless hidden)
  `make_callable`, as `snapstore.engines.graph.sessions.run_cached` needs.

  Attributes:
    runs: Steps run through this wrapper: calls of `run` and of the callables
      it made.
    made: Callables made with `make_callable`.
  """

  def __init__(self, sess, with_callables=True):
    """Wraps `sess`.

    Args:
      sess: The `tf.Session` to run in.
      with_callables: If False the wrapper has no `make_callable`, so a store
        falls back to `run` and every step goes through `run`.
    """
    self._sess = sess
    self.graph = sess.graph
    self.runs = 0
    self.made = 0
    if with_callables:
      self.make_callable = self._make_callable

  def run(self, *args, **kwargs):
    self.runs += 1
    return self._sess.run(*args, **kwargs)

  def _make_callable(self, *args, **kwargs):
    self.made += 1
    fn = self._sess.make_callable(*args, **kwargs)

    def counted(*values, **options):
      self.runs += 1
      return fn(*values, **options)

    return counted


class CountingHook(tf.train.SessionRunHook):
  """A session hook that counts the runs it sees (`runs`)."""

  def __init__(self):
    self.runs = 0

  def before_run(self, run_context):
    self.runs += 1


def placements(sess, fetch, feed_dict=None):
  """{node name: device it ran on} for one traced run of `fetch`."""
  metadata = tf.RunMetadata()
  sess.run(
    fetch,
    feed_dict,
    options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
    run_metadata=metadata,
  )
  placed = {}
  for dev in metadata.step_stats.dev_stats:
    if dev.device.endswith("/host:CPU"):  # host-side records, not a placement
      continue
    for node in dev.node_stats:
      placed[node.node_name] = dev.device
  return placed


def init(sess):
  with sess.graph.as_default():
    sess.run(
      [tf.global_variables_initializer(), tf.local_variables_initializer()]
    )


def assert_state(values, expected, msg=""):
  assert set(values) == set(expected)
  for key in expected:
    assert_bit_equal(values[key], expected[key], "%s %s" % (msg, key))


def assert_state_differs(values, expected):
  assert any(
    np.asarray(values[k]).tobytes() != np.asarray(expected[k]).tobytes()
    for k in expected
  ), "state did not change; the test would not see a restore"


def estimator_model_fn(features, labels, mode):
  """An Estimator's model_fn: `x . w` fit by Momentum to `labels`."""
  with tf.variable_scope("net"):
    w = tf.get_variable("w", [3], initializer=tf.zeros_initializer())
  loss = tf.reduce_mean(tf.square(tf.tensordot(features["x"], w, 1) - labels))
  train_op = tf.train.MomentumOptimizer(0.01, 0.9).minimize(
    loss, global_step=tf.train.get_global_step()
  )
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def estimator_input_fn(bad_batch):
  """An input_fn of 16 batches of 8 for `estimator_model_fn`; batch
  `bad_batch` (or None) has an infinite loss."""

  def input_fn():
    rng = np.random.RandomState(1)
    x = rng.randn(16 * 8, 3).astype(np.float32)
    if bad_batch is not None:
      x[bad_batch * 8] = 1e30  # its squared error overflows: an infinite loss
    y = x.dot([1.0, -2.0, 0.5]).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(8)

  return input_fn
