"""A store over fresh variables, called the way the engine in effect takes it.

    world = worlds.World({"w": ([3, 5], np.float32)}, mode="host")
    world.write({"w": value})        # the variables, outside the store
    tag = world.snapshot()           # store.snapshot(), with the session if any
    world.restore(tag)
    world.evaluate(tag)              # evaluate_with reading every variable
    world.evaluate_failing(tag)      # ... zeroing them, then failing
    world.read()                     # {key: array}, copies
    world.store.delete(tag)          # calls that take no session: the store's
    world.close()

`World` is the graph world or the eager one, chosen once, when this module is
imported: graph mode in the graph run (`tf.compat.v1.disable_v2_behavior()`,
tests/conftest.py), eager execution in the eager run. The graph world builds
a graph (the variables under the scope "net", ref or resource ones), the store
and a session, and finalizes the graph, so that a store call that added an op
would raise; the eager world makes one `tf.Variable` per key and a store over
the dict of them. Keys are the variable names in both, so that arrays, spill
files and the numpy models of the tests line up across engines.
"""

import collections
import contextlib

import numpy as np

import snapstore
from snapstore._tf import builds_eagerly
from snapstore._tf import tf
from snapstore._tf import tf2
from tests import helpers

ENGINE = "eager" if builds_eagerly() else "graph"
# (name, use_resource): eager variables are resource variables.
KINDS = helpers.VARIABLE_KINDS if ENGINE == "graph" else (("resource", True),)


def values(shapes, seed):
  """Random values `{key: array}` for `shapes` (bit patterns: NaN payloads,
  infinities, -0.0 and denormals in float arrays)."""
  rng = np.random.RandomState(seed)
  return collections.OrderedDict(
    (k, helpers.random_value(rng, shape, dtype))
    for k, (shape, dtype) in sorted(shapes.items())
  )


def patterned(shapes, pattern):
  """`{key: array}` holding `pattern` in every element of every array."""
  return collections.OrderedDict(
    (k, np.full(shape, pattern, dtype))
    for k, (shape, dtype) in sorted(shapes.items())
  )


def cases(modes):
  """named_parameters cases (name, mode, use_resource): the modes times the
  engine's variable kinds (`KINDS`)."""
  return [
    ("%s_%s" % (mode, kind), mode, use_resource)
    for mode in modes
    for kind, use_resource in KINDS
  ]


class Failure(Exception):
  """Raised by the eager world's failing `evaluate_with` function."""


class _World(object):
  """What both engines' worlds share (see module doc).

  Args:
    shapes: `{key: (shape, numpy dtype)}`, the variables to make.
    mode: The store's mode.
    max_to_keep: As for `SnapshotStore`.
    use_resource: Graph mode: resource variables (else ref ones). Eager
      variables are resource variables.
    **options: The store's mode options (`spill_path`, `memory_budget`, ...).
  """

  engine = None
  store = None  # so that close() is safe if __init__ raised
  # What `evaluate_failing` raises.
  failure = None

  def __init__(
    self, shapes, mode="device", max_to_keep=None, use_resource=True, **options
  ):
    self.shapes = collections.OrderedDict(sorted(shapes.items()))
    self.keys = list(self.shapes)
    self.mode = mode
    self.max_to_keep = max_to_keep
    self._session = {}
    self._build(mode, max_to_keep, use_resource, options)

  def snapshot(self, tag=None):
    return self.store.snapshot(tag, **self._session)

  def restore(self, tag=None):
    return self.store.restore(tag, **self._session)

  def arrays(self, tag=None):
    return dict(self.store.arrays(tag, **self._session))

  def load_arrays(self, arrays, tag=None):
    return self.store.load_arrays(arrays, tag=tag, **self._session)

  def spill(self, tag=None):
    return self.store.files.spill(tag, **self._session)

  def close(self):
    if self.store is not None:
      self.store.close()


class _GraphWorld(_World):
  """A graph, its session and a store over variables under "net"."""

  engine = "graph"
  sess = None
  failure = tf.errors.InvalidArgumentError

  def _build(self, mode, max_to_keep, use_resource, options):
    self.graph = tf.Graph()
    with self.graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        self.variables = collections.OrderedDict(
          (k, tf.get_variable(k, shape, dtype=tf.as_dtype(dtype)))
          for k, (shape, dtype) in self.shapes.items()
        )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=max_to_keep, **options
      )
      zeroed = [tf.assign(v, tf.zeros_like(v)) for v in self.variables.values()]
      nan = tf.placeholder_with_default(np.float32(np.nan), [])  # not folded
      with tf.control_dependencies(zeroed):
        self._failing = tf.check_numerics(nan, "evaluate_with fails on purpose")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.graph.finalize()  # no store call may add an op
    self.sess = tf.Session(graph=self.graph)
    self.sess.run(init)
    self._session = {"session": self.sess}
    self._fetch = list(self.variables.values())

  def write(self, values):
    for key, variable in self.variables.items():
      variable.load(values[key], self.sess)

  def read(self):
    return dict(zip(self.keys, self.sess.run(self._fetch)))

  def evaluate(self, tag=None):
    got = self.store.evaluate_with(self._fetch, tag=tag, session=self.sess)
    return dict(zip(self.keys, got))

  def evaluate_failing(self, tag=None):
    """`evaluate_with` of a fetch that zeroes the variables, then fails."""
    self.store.evaluate_with(self._failing, tag=tag, session=self.sess)

  @contextlib.contextmanager
  def counting(self):
    """Yields a function giving the ops added to the graph since."""
    before = len(self.graph.get_operations())
    yield lambda: len(self.graph.get_operations()) - before

  def close(self):
    try:
      super(_GraphWorld, self).close()
    finally:
      if self.sess is not None:
        self.sess.close()


class _EagerWorld(_World):
  """One eager `tf.Variable` per key and a store over the dict of them."""

  engine = "eager"
  failure = Failure

  def _build(self, mode, max_to_keep, use_resource, options):
    del use_resource  # eager variables are resource variables
    self.variables = collections.OrderedDict(
      (k, tf2.Variable(np.zeros(shape, dtype), name=k))
      for k, (shape, dtype) in self.shapes.items()
    )
    self.store = snapstore.SnapshotStore(
      var_list=dict(self.variables),
      mode=mode,
      max_to_keep=max_to_keep,
      **options,
    )

  def write(self, values):
    for key, variable in self.variables.items():
      variable.assign(values[key])

  def read(self):
    return dict(
      (k, np.array(v.numpy(), copy=True)) for k, v in self.variables.items()
    )

  def evaluate(self, tag=None):
    return self.store.evaluate_with(self.read, tag=tag)

  def evaluate_failing(self, tag=None):
    """`evaluate_with` of a function that zeroes the variables, then fails."""

    def fn():
      for v in self.variables.values():
        v.assign(tf2.zeros_like(v))
      raise Failure("evaluate_with fails on purpose")

    self.store.evaluate_with(fn, tag=tag)

  @contextlib.contextmanager
  def counting(self):
    """Yields a function giving the functions TensorFlow traced since.

    Counts every trace (a `tf.function`'s, a concrete function's), by
    wrapping the one function that builds a traced graph; TensorFlow keeps no
    public count across functions. Checked on entry with a trace of its own,
    so that a TensorFlow that traced elsewhere fails here, not silently.
    """
    from tensorflow.python.framework import func_graph  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

    real = func_graph.func_graph_from_py_func
    count = [0]

    def counted(*args, **kwargs):
      count[0] += 1
      return real(*args, **kwargs)

    func_graph.func_graph_from_py_func = counted
    try:
      tf2.function(lambda: tf2.constant(0)).get_concrete_function()
      assert count[0] == 1, "the trace counter missed a trace: %d" % count[0]
      count[0] = 0
      yield lambda: count[0]
    finally:
      func_graph.func_graph_from_py_func = real


World = _EagerWorld if ENGINE == "eager" else _GraphWorld
