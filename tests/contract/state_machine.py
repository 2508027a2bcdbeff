"""Property test: random sequences of store calls against a pure-numpy model.

A hypothesis `RuleBasedStateMachine` drives a store through random sequences
of snapshot (auto, int and string tags, replacing held ones), load_arrays,
restore, delete, spill, flush, evaluate_with (also of a function that writes
the variables and fails), pinning device slots
(`store.slots.pin`) and random parameter updates (bit patterns with NaN
payloads, infinities and -0.0). A model in plain Python and numpy holds what
the variables and the store must hold: the variables' values, each tag's
arrays, the tags' order, which are spilled and which pinned, what each device
slot holds, and the tier rules (eviction of the oldest unpinned snapshot,
`max_to_keep`, the disk budget, spilled snapshots outside the fast tier's
bound). After every step the store's tags, tiers, slots and arrays and the
variables are compared with the model, bit for bit.

Configurations: device, host and disk stores, and device and host stores with
a spill file (`spill_path=`); in graph mode each with ref and resource
variables. Each configuration builds its store once (`worlds.World`); every
example starts by emptying it, and a device store that holds pinned tags
(which cannot be deleted) is built again.

By default each configuration runs a fixed (derandomized) set of examples
that keeps each suite's file under a minute. For a longer, random search:

    SNAPSTORE_HYPOTHESIS_PROFILE=long python -m pytest tests/test_state_machine.py

(`long`: 300 examples of up to 60 steps per configuration; or set
SNAPSTORE_HYPOTHESIS_EXAMPLES=N for N examples; the same for tests/eager.)
"""

import itertools
import os
import re
import tempfile

import hypothesis
from hypothesis import stateful
from hypothesis import strategies as st
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests.contract import worlds

_SHAPES = {"w": ([3, 5], np.float32), "n": ([4], np.int64)}
_NBYTES = 3 * 5 * 4 + 4 * 8
# (fast-tier mode, spill file, max_to_keep); disk keeps at most two snapshots
# in memory (its budget) and `max_to_keep` in all tiers.
CONFIGS = {
  "device": ("device", False, 3),
  "host": ("host", False, 3),
  "disk": ("disk", True, 4),
  "device_spill": ("device", True, 2),
  "host_spill": ("host", True, 2),
}
_BUDGET = 2 * _NBYTES
_NEW_TAGS = st.one_of(st.integers(0, 6), st.sampled_from(["a", "b", "../x"]))
_AUTO_FLOOR = 7  # automatic tags are above the ints drawn
_TAGS = st.one_of(st.none(), _NEW_TAGS)


def _settings():
  profile = os.environ.get("SNAPSTORE_HYPOTHESIS_PROFILE", "default")
  examples = int(os.environ.get("SNAPSTORE_HYPOTHESIS_EXAMPLES", 0))
  long_run = profile == "long" or examples > 0
  return hypothesis.settings(
    max_examples=examples or (300 if long_run else 20),
    stateful_step_count=60 if long_run else 40,
    derandomize=not long_run,  # the suite runs the same examples each time
    deadline=None,  # TensorFlow's first runs are slow
    database=None,  # nothing written into the source tree
    suppress_health_check=list(hypothesis.HealthCheck),
  )


class _Worlds(object):
  """The world of each configuration, built once (again after pins)."""

  _built = {}
  _count = itertools.count()

  @classmethod
  def get(cls, name, use_resource):
    key = (name, use_resource)
    world = cls._built.get(key)
    if world is not None and world.mode == "device":
      if world.store.slots.pinned():  # pinned tags cannot be deleted
        world.close()
        world = None
    if world is None:
      world = cls._built[key] = cls._build(name, use_resource)
    return world

  @classmethod
  def _build(cls, name, use_resource):
    mode, spills, max_to_keep = CONFIGS[name]
    options = {}
    if spills:
      options["spill_path"] = os.path.join(
        tempfile.mkdtemp(prefix="snapstore_machine_"),
        "%s_%d.h5" % (name, next(cls._count)),
      )
    if mode == "disk":
      options["memory_budget"] = _BUDGET
    return worlds.World(
      _SHAPES, mode, max_to_keep, use_resource=use_resource, **options
    )

  @classmethod
  def close_all(cls):
    for world in cls._built.values():
      world.close()
    cls._built.clear()


class StoreMachine(stateful.RuleBasedStateMachine):
  """The store of one configuration against the model (see module doc)."""

  config = None
  use_resource = True

  @stateful.initialize(seed=st.integers(0, 2**16))
  def start(self, seed):
    self.world = _Worlds.get(self.config, self.use_resource)
    self.store = self.world.store
    self.spills = CONFIGS[self.config][1]
    for tag in self.store.tags():
      self.store.delete(tag)
    self.store.files.flush()
    # The store's next automatic tag is whatever the examples before left;
    # it starts above the tags drawn (0-6), so that no example depends on it
    # (hypothesis replays an example and needs the same draws).
    probe = self.world.snapshot()
    self.store.delete(probe)
    if probe < _AUTO_FLOOR:
      self.store.delete(self.world.snapshot(_AUTO_FLOOR))
      probe = _AUTO_FLOOR
    self.next_auto = probe + 1
    self.values = {}
    self._load(seed)
    self.order = []  # tags, oldest first
    self.snaps = {}  # tag -> arrays
    self.spilled = set()
    self.pinned = set()
    self.slot_of = {}  # tag in a device slot -> its slot
    self.slot_data = {}  # slot -> the arrays it holds, once the model knows
    self.flushed = True

  # -- the model's rules ---------------------------------------------------------

  def _fast(self):
    return [t for t in self.order if t not in self.spilled]

  def _slotted(self):
    return self.world.mode == "device"

  def _victim(self, tag):
    """The held tag that storing `tag` evicts; None if none; False if every
    counted tag is pinned (the call raises PinnedTagError)."""
    if self.spills and self.world.mode != "disk":
      counted = self._fast()  # spilled snapshots are outside the bound
    else:
      counted = list(self.order)
    if tag in counted or len(counted) < self.world.max_to_keep:
      return None
    for held in counted:
      if held not in self.pinned:
        return held
    return False

  def _store_in_model(self, tag, arrays, stored):
    """What snapshot/load_arrays do: eviction, order, slots, disk budget.

    Args:
      tag: The tag given (None: the next automatic one).
      arrays: What the snapshot holds.
      stored: `fn(tag)` making the call with the tag given, returning the
        tag it stored.
    """
    given = tag
    if tag is None:
      tag = self.next_auto
    victim = self._victim(tag)
    if victim is False:
      with _raises(snapstore.PinnedTagError):
        stored(given)
      return
    got = stored(given)
    assert got == tag, (got, given, tag)
    if isinstance(tag, int):
      self.next_auto = max(self.next_auto, tag + 1)
    if victim is not None:
      self._drop(victim)
    if tag in self.order:
      self.order.remove(tag)
    self.order.append(tag)
    self.spilled.discard(tag)
    self.snaps[tag] = dict((k, v.copy()) for k, v in arrays.items())
    if self._slotted():
      slot = self.store.slots.slot_of(tag)
      if tag in self.slot_of:  # a held tag is written in its own slot
        assert slot == self.slot_of[tag], (tag, slot, self.slot_of[tag])
      assert slot not in [s for t, s in self.slot_of.items() if t != tag], (
        "slot %d of %r holds another snapshot" % (slot, tag)
      )
      self.slot_of[tag] = slot
      self.slot_data[slot] = self.snaps[tag]
    if self.world.mode == "disk":
      in_memory = self._fast()
      while len(in_memory) * _NBYTES > _BUDGET:
        self.spilled.add(in_memory.pop(0))
    self.flushed = False

  def _drop(self, tag):
    self.order.remove(tag)
    del self.snaps[tag]
    self.spilled.discard(tag)
    self.pinned.discard(tag)
    self.slot_of.pop(tag, None)

  def _load(self, seed):
    self.values = worlds.values(_SHAPES, seed)
    self.world.write(self.values)

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
    self._store_in_model(tag, self.values, self.world.snapshot)

  @stateful.rule(tag=_TAGS, seed=st.integers(0, 2**16))
  def load_arrays(self, tag, seed):
    arrays = worlds.values(_SHAPES, seed)
    self._store_in_model(
      tag, arrays, lambda t: self.world.load_arrays(arrays, tag=t)
    )

  @stateful.rule(data=st.data())
  def restore(self, data):
    tag = self._pick(data)
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.world.restore(tag)
      return
    got = self.world.restore(tag)
    assert got == target
    self.values = dict((k, v.copy()) for k, v in self.snaps[got].items())

  @stateful.rule(data=st.data())
  def evaluate_with(self, data):
    tag = self._pick(data)
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.world.evaluate(tag)
      return
    got = self.world.evaluate(tag)
    helpers.assert_state(got, self.snaps[target], "evaluate_with %r" % (tag,))

  @stateful.rule(data=st.data())
  def evaluate_with_failing(self, data):
    """A function (a fetch) that writes the variables, then fails: the call
    raises its error, and the variables and snapshots are as they were."""
    tag = self._pick(data)
    if self._target(tag) is None:
      with _raises(snapstore.UnknownTagError):
        self.world.evaluate_failing(tag)
      return
    with _raises(self.world.failure, "evaluate_with fails on purpose"):
      self.world.evaluate_failing(tag)

  @stateful.rule(data=st.data())
  def delete(self, data):
    tag = self._pick(data)
    if tag not in self.snaps:  # None is no tag here
      with _raises(snapstore.UnknownTagError):
        self.store.delete(tag)
      return
    if tag in self.pinned:
      with _raises(snapstore.PinnedTagError):
        self.store.delete(tag)
      return
    self.store.delete(tag)
    self._drop(tag)

  @stateful.rule(data=st.data())
  def spill(self, data):
    tag = self._pick(data)
    if not self.spills:
      with _raises(snapstore.ModeError):
        self.world.spill(tag)
      return
    target = self._target(tag)
    if target is None:
      with _raises(snapstore.UnknownTagError):
        self.world.spill(tag)
      return
    if target in self.pinned:
      with _raises(snapstore.PinnedTagError):
        self.world.spill(tag)
      return
    got = self.world.spill(tag)
    assert got == target
    self.spilled.add(got)
    self.slot_of.pop(got, None)  # its slot is free (and keeps what it held)
    self.flushed = False

  @stateful.rule()
  def flush(self):
    self.store.files.flush()
    self.flushed = True

  @stateful.precondition(lambda self: self._slotted() and self.slot_data)
  @stateful.rule(data=st.data())
  def pin(self, data):
    """Names a slot `tag`: a slot whose content the model knows (a slot not
    written since the store was built holds what the model does not)."""
    holders = dict((s, t) for t, s in self.slot_of.items())
    slot = data.draw(st.sampled_from(sorted(self.slot_data)), label="slot")
    held = sorted(self.slot_of.items(), key=lambda item: item[1])
    tag = data.draw(
      st.one_of(st.sampled_from([t for t, _ in held] or [0]), _NEW_TAGS),
      label="pinned tag",
    )
    holder = holders.get(slot)
    if holder is not None and holder != tag:
      message = "Slot %d holds snapshot %r" % (slot, holder)
      with _raises(ValueError, re.escape(message)):
        self.store.slots.pin(slot, tag)
      return
    if holder is None and tag in self.snaps:
      if tag in self.spilled:
        message = r"Tag %s is held in the .*, not in a device slot" % (
          re.escape(repr(tag))
        )
        with _raises(ValueError, message):
          self.store.slots.pin(slot, tag)
        return
      message = "Tag %r is held in slot %d, not slot %d" % (
        tag,
        self.slot_of[tag],
        slot,
      )
      with _raises(ValueError, re.escape(message)):
        self.store.slots.pin(slot, tag)
      return
    assert self.store.slots.pin(slot, tag) == tag
    self.pinned.add(tag)
    if holder is None:  # a new tag, the newest, naming what the slot holds
      if isinstance(tag, int):
        self.next_auto = max(self.next_auto, tag + 1)
      self.order.append(tag)
      self.snaps[tag] = self.slot_data[slot]
      self.slot_of[tag] = slot

  # -- what must hold after every step ----------------------------------------------

  @stateful.invariant()
  def store_matches_model(self):
    if not hasattr(self, "world"):
      return
    assert self.store.tags() == self.order, (self.store.tags(), self.order)
    helpers.assert_state(self.world.read(), self.values, "variables")
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
        self.world.arrays(tag), self.snaps[tag], "snapshot %r" % (tag,)
      )
    if self._slotted():
      assert self.store.slots.pinned() == [
        t for t in self.order if t in self.pinned
      ], (self.store.slots.pinned(), self.pinned)
      for tag, slot in self.slot_of.items():
        assert self.store.slots.slot_of(tag) == slot, (tag, slot)

  def teardown(self):
    if hasattr(self, "store"):
      self.store.files.flush()  # a failed write must show in this example


class _raises(object):
  """`with _raises(error, pattern):` fails unless the block raises `error`
  (with a message matching the regex `pattern`, if given)."""

  def __init__(self, error, pattern=None):
    self.error = error
    self.pattern = pattern

  def __enter__(self):
    return self

  def __exit__(self, kind, value, traceback):
    if kind is None:
      raise AssertionError("%s not raised" % self.error.__name__)
    if not issubclass(kind, self.error):
      return False
    if self.pattern is not None and not re.search(self.pattern, str(value)):
      raise AssertionError(
        "%s %r does not match %r" % (kind.__name__, str(value), self.pattern)
      )
    return True


def cases():
  """`{name: TestCase}`: a machine per configuration and variable kind."""
  out = {}
  for config in sorted(CONFIGS):
    for kind, use_resource in worlds.KINDS:
      name = "Test_%s_%s" % (config, kind)
      machine = type(
        "StoreMachine_%s_%s" % (config, kind),
        (StoreMachine,),
        {"config": config, "use_resource": use_resource},
      )
      case = machine.TestCase
      case.settings = _settings()
      out[name] = type(name, (case,), {})
  return out


def close_all():
  """Closes every configuration's store (a test module's tearDownModule)."""
  _Worlds.close_all()


class PinSpilledTest(tf.test.TestCase):
  """Pinning a tag that is in the spill file: refused, naming the file."""

  def test_pinning_a_spilled_tag_is_refused_naming_the_file(self):
    world = worlds.World(
      {"w": ([3], np.float32)},
      "device",
      2,
      spill_path=os.path.join(self.get_temp_dir(), "%s.h5" % self.id()),
    )
    self.addCleanup(world.close)
    world.write({"w": np.arange(3, dtype=np.float32)})
    world.snapshot("a")
    world.spill("a")
    world.store.files.flush()
    with self.assertRaisesRegex(ValueError, r"'a'.*spill file"):
      world.store.slots.pin(0, "a")
    self.assertEqual(world.store.tags(), ["a"])
    self.assertEqual(world.store.slots.pinned(), [])
    self.assertEqual(world.store.files.tier("a"), "file")
