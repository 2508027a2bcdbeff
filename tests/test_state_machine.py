"""Property test: random sequences of store calls against a pure-numpy model.

A hypothesis `RuleBasedStateMachine` drives a store through random sequences
of snapshot (auto, int and string tags), load_arrays, restore, delete, spill,
flush, evaluate_with and random parameter updates (bit patterns with NaN
payloads, infinities and -0.0). A model in plain Python and numpy holds what
the variables and the store must hold: the variables' values, each tag's
arrays, the tags' order, which are spilled, and the tier rules (eviction of
the oldest, `max_to_keep`, the disk budget, spilled snapshots outside the
fast tier's bound). After every step the store's tags, tiers and arrays and
the variables are compared with the model, bit for bit.

Configurations: device, host and disk stores, and device and host stores with
a spill file (`spill_path=`), each with ref and resource variables. Each
configuration builds its graph once; every example starts by emptying the
store.

By default each configuration runs a fixed (derandomized) set of examples
that keeps the whole file under a minute. For a longer, random search:

    SNAPSTORE_HYPOTHESIS_PROFILE=long python -m pytest tests/test_state_machine.py

(`long`: 300 examples of up to 60 steps per configuration; or set
SNAPSTORE_HYPOTHESIS_EXAMPLES=N for N examples.)
"""

import os

import hypothesis
from hypothesis import stateful
from hypothesis import strategies as st
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers

_SHAPES = {"w": ([3, 5], tf.float32), "n": ([4], tf.int64)}
_NBYTES = 3 * 5 * 4 + 4 * 8
# (fast-tier mode, spill file, max_to_keep); disk keeps at most two snapshots
# in memory (its budget) and `max_to_keep` in all tiers.
_CONFIGS = {
  "device": ("device", False, 3),
  "host": ("host", False, 3),
  "disk": ("disk", True, 4),
  "device_spill": ("device", True, 2),
  "host_spill": ("host", True, 2),
}
_BUDGET = 2 * _NBYTES
_TAGS = st.one_of(
  st.none(), st.integers(0, 6), st.sampled_from(["a", "b", "../x"])
)


def _settings():
  profile = os.environ.get("SNAPSTORE_HYPOTHESIS_PROFILE", "default")
  examples = int(os.environ.get("SNAPSTORE_HYPOTHESIS_EXAMPLES", 0))
  long_run = profile == "long" or examples > 0
  return hypothesis.settings(
    max_examples=examples or (300 if long_run else 8),
    stateful_step_count=60 if long_run else 25,
    derandomize=not long_run,  # the suite runs the same examples each time
    deadline=None,  # TensorFlow's first runs are slow
    database=None,  # nothing written into the source tree
    suppress_health_check=list(hypothesis.HealthCheck),
  )


class _World(object):
  """A graph, session and store for one configuration, built once."""

  _built = {}

  @classmethod
  def get(cls, name, use_resource):
    key = (name, use_resource)
    if key not in cls._built:
      cls._built[key] = cls(name, use_resource)
    return cls._built[key]

  @classmethod
  def close_all(cls):
    for world in cls._built.values():
      world.store.close()
      world.sess.close()
    cls._built.clear()

  def __init__(self, name, use_resource):
    mode, spills, self.max_to_keep = _CONFIGS[name]
    self.mode, self.spills = mode, spills
    self.graph = tf.Graph()
    with self.graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        self.variables = dict(
          (k, tf.get_variable(k, shape, dtype=dtype))
          for k, (shape, dtype) in _SHAPES.items()
        )
      options = {}
      if spills:
        options["spill_path"] = os.path.join(
          tf.test.get_temp_dir(),
          "state_machine_%s_%s.h5" % (name, use_resource),
        )
        if os.path.exists(options["spill_path"]):
          os.remove(options["spill_path"])
      if mode == "disk":
        options["memory_budget"] = _BUDGET
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=self.max_to_keep, **options
      )
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.graph.finalize()  # no call may add ops
    self.sess = tf.Session(graph=self.graph)
    self.sess.run(init)
    self.keys = sorted(self.variables)
    self.fetch = [self.variables[k] for k in self.keys]


def _values(seed):
  rng = np.random.RandomState(seed)
  return dict(
    (k, helpers.random_value(rng, shape, dtype.as_numpy_dtype))
    for k, (shape, dtype) in _SHAPES.items()
  )


class StoreMachine(stateful.RuleBasedStateMachine):
  """The store of one configuration against the model (see module doc)."""

  config = None
  use_resource = False

  @stateful.initialize(seed=st.integers(0, 2**16))
  def start(self, seed):
    self.world = _World.get(self.config, self.use_resource)
    self.store = self.world.store
    for tag in self.store.tags():
      self.store.delete(tag)
    self.store.files.flush()
    # The store's next automatic tag is whatever the examples before left.
    probe = self.store.snapshot(session=self.world.sess)
    self.store.delete(probe)
    self.next_auto = probe + 1
    self.values = {}
    self._load(seed)
    self.order = []  # tags, oldest first
    self.snaps = {}  # tag -> arrays
    self.spilled = set()
    self.flushed = True

  # -- the model's rules ---------------------------------------------------------

  def _fast(self):
    return [t for t in self.order if t not in self.spilled]

  def _store_in_model(self, tag, arrays):
    """What snapshot/load_arrays do: eviction, order, disk budget."""
    if tag is None:
      tag = self.next_auto
    if isinstance(tag, int):
      self.next_auto = max(self.next_auto, tag + 1)
    if self.world.spills and self.world.mode != "disk":
      counted = self._fast()  # spilled snapshots are outside the bound
    else:
      counted = list(self.order)
    if tag not in counted and len(counted) >= self.world.max_to_keep:
      self._drop(counted[0])
    if tag in self.order:
      self.order.remove(tag)
    self.order.append(tag)
    self.spilled.discard(tag)
    self.snaps[tag] = dict((k, v.copy()) for k, v in arrays.items())
    if self.world.mode == "disk":
      in_memory = self._fast()
      while len(in_memory) * _NBYTES > _BUDGET:
        self.spilled.add(in_memory.pop(0))
    self.flushed = False
    return tag

  def _drop(self, tag):
    self.order.remove(tag)
    del self.snaps[tag]
    self.spilled.discard(tag)

  def _load(self, seed):
    self.values = _values(seed)
    for key, value in self.values.items():
      self.world.variables[key].load(value, self.world.sess)

  def _pick(self, data, allow_missing=True):
    """A held tag, None (the newest) or a tag the store does not hold."""
    choices = list(self.order) + [None]
    if allow_missing:
      choices.append("missing")
    return data.draw(st.sampled_from(choices), label="tag")

  def _target(self, tag):
    """The held tag a call given `tag` acts on (None: the newest), or None."""
    if tag is None:
      return self.order[-1] if self.order else None
    return tag if tag in self.snaps else None

  # -- rules -------------------------------------------------------------------------

  @stateful.rule(seed=st.integers(0, 2**16))
  def update(self, seed):
    self._load(seed)

  @stateful.rule(tag=_TAGS)
  def snapshot(self, tag):
    got = self.store.snapshot(tag, session=self.world.sess)
    assert got == self._store_in_model(tag, self.values), (got, tag)

  @stateful.rule(tag=_TAGS, seed=st.integers(0, 2**16))
  def load_arrays(self, tag, seed):
    arrays = _values(seed)
    got = self.store.load_arrays(arrays, tag=tag, session=self.world.sess)
    assert got == self._store_in_model(tag, arrays), (got, tag)

  @stateful.rule(data=st.data())
  def restore(self, data):
    tag = self._pick(data)
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.store.restore(tag, session=self.world.sess)
      return
    got = self.store.restore(tag, session=self.world.sess)
    assert got == target
    self.values = dict((k, v.copy()) for k, v in self.snaps[got].items())

  @stateful.rule(data=st.data())
  def evaluate_with(self, data):
    tag = self._pick(data)
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.store.evaluate_with(
          self.world.fetch, tag=tag, session=self.world.sess
        )
      return
    got = self.store.evaluate_with(
      self.world.fetch, tag=tag, session=self.world.sess
    )
    expected = self.snaps[target]
    for key, value in zip(self.world.keys, got):
      helpers.assert_bit_equal(value, expected[key], "evaluate_with %s" % key)

  @stateful.rule(data=st.data())
  def delete(self, data):
    tag = self._pick(data)
    if tag not in self.snaps:  # None is no tag here
      with _raises(snapstore.UnknownTagError):
        self.store.delete(tag)
      return
    self.store.delete(tag)
    self._drop(tag)

  @stateful.rule(data=st.data())
  def spill(self, data):
    tag = self._pick(data)
    if not self.world.spills:
      with _raises(snapstore.ModeError):
        self.store.files.spill(tag, session=self.world.sess)
      return
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.store.files.spill(tag, session=self.world.sess)
      return
    got = self.store.files.spill(tag, session=self.world.sess)
    assert got == target
    self.spilled.add(got)
    self.flushed = False

  @stateful.rule()
  def flush(self):
    self.store.files.flush()
    self.flushed = True

  # -- what must hold after every step ----------------------------------------------

  @stateful.invariant()
  def store_matches_model(self):
    if not hasattr(self, "world"):
      return
    assert self.store.tags() == self.order, (self.store.tags(), self.order)
    live = dict(zip(self.world.keys, self.world.sess.run(self.world.fetch)))
    helpers.assert_state(live, self.values, "variables")
    fast = self.world.mode if self.world.mode != "disk" else "host"
    for tag in self.order:
      tier = self.store.files.tier(tag)
      if tag not in self.spilled:
        assert tier == fast, (tag, tier)
      elif self.flushed:
        assert tier == "file", (tag, tier)
      else:
        assert tier in ("host", "file"), (tag, tier)
      helpers.assert_state(
        self.store.arrays(tag, session=self.world.sess),
        self.snaps[tag],
        "snapshot %r" % (tag,),
      )

  def teardown(self):
    if hasattr(self, "store"):
      self.store.files.flush()  # a failed write must show in this example


class _raises(object):
  """`with _raises(error):` fails unless the block raises `error`."""

  def __init__(self, error):
    self.error = error

  def __enter__(self):
    return self

  def __exit__(self, kind, value, traceback):
    if kind is None:
      raise AssertionError("%s not raised" % self.error.__name__)
    return issubclass(kind, self.error)


def _case(config, use_resource):
  machine = type(
    "StoreMachine_%s_%s" % (config, "resource" if use_resource else "ref"),
    (StoreMachine,),
    {"config": config, "use_resource": use_resource},
  )
  case = machine.TestCase
  case.settings = _settings()
  return case


for _config in sorted(_CONFIGS):
  for _kind, _use_resource in helpers.VARIABLE_KINDS:
    _name = "Test_%s_%s" % (_config, _kind)
    globals()[_name] = _case(_config, _use_resource)
    globals()[_name].__name__ = _name


def tearDownModule():
  _World.close_all()
