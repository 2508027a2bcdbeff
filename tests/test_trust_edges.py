"""Edges where a call used to roll back to the wrong state, crash or lose a snapshot.

Each test goes through the public API and failed on the code before its fix
(issue "Trust, round 2"): the in-step tag under guards and trials, arrays
of every byte order and rank on every path into a variable, tags that cannot
be written to a file, refused calls that changed something, uninitialized
shadows, and device-slot calls on every mode that has slots.
"""

import os

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th

KINDS = helpers.kind_cases()


def _in_step(use_resource=False, if_finite=False, **store_kwargs):
  """A `th.Linear` model, a device store of it and a train op snapshotting in its run."""
  graph = tf.Graph()
  with graph.as_default():
    model = th.Linear(use_resource)
    store = model.store(**store_kwargs)
    train_op = store.slots.snapshot_before(
      model.apply, if_finite=model.loss if if_finite else None
    )
  return graph, model, store, train_op


class InStepTagUnderGuardsTest(tf.test.TestCase, parameterized.TestCase):
  """A guard or trial on the tag a train op snapshots under in its own run."""

  def _setup(self, use_resource=False, **store_kwargs):
    graph, model, store, train_op = _in_step(use_resource, **store_kwargs)
    sess = th.session(self, graph)
    sess.run(train_op)  # the slot now holds the start of that step
    return model, store, train_op, sess

  @parameterized.named_parameters(*KINDS)
  def test_a_guard_whose_steps_ran_outside_guard_run_refuses_check(
    self, use_resource
  ):
    model, store, train_op, sess = self._setup(use_resource)
    entry = th.state(store, sess)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      r"guard\.check\(\)",
      "'before_step'",
      "ran no step through guard.run",
      r"guard\.run\(train_op",
    ):
      with snapstore.Guard(
        store, tag="before_step", reraise=False, session=sess
      ) as guard:
        sess.run(train_op, {model.scale: 1e30})
        sess.run(train_op, {model.scale: 1e30})
        guard.check(np.float32(np.inf))
    # Refused, not claimed: the variables are what the two steps made.
    helpers.assert_state_differs(th.state(store, sess), entry)
    self.assertFalse(guard.failed)

  def test_a_guard_failing_before_any_guard_run_does_not_claim_a_rollback(self):
    model, store, train_op, sess = self._setup()
    with helpers.assert_raises_naming(
      self, ValueError, "cannot roll back", "ran no step through guard.run"
    ):
      with snapstore.Guard(
        store, tag="before_step", reraise=False, session=sess
      ):
        sess.run(train_op, {model.scale: 1e30})
        raise RuntimeError("the block failed")

  @parameterized.named_parameters(*KINDS)
  def test_a_guard_sees_the_in_step_op_run_outside_guard_run(
    self, use_resource
  ):
    model, store, train_op, sess = self._setup(use_resource)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "cannot roll back",
      "'before_step'",
      "ran 2 times outside guard.run",
    ):
      with snapstore.Guard(
        store, tag="before_step", watch=model.loss, reraise=False, session=sess
      ) as guard:
        guard.run(model.loss)  # the guard snapshots into the slot first
        sess.run(train_op)
        sess.run(train_op)  # the slot now holds the second step's start
        guard.run(model.loss, {model.scale: np.nan})

  @parameterized.named_parameters(*KINDS)
  def test_a_guard_still_rolls_back_after_its_own_in_step_run(
    self, use_resource
  ):
    model, store, train_op, sess = self._setup(use_resource)
    entry = th.state(store, sess)
    with snapstore.Guard(
      store, tag="before_step", watch=model.loss, reraise=False, session=sess
    ) as guard:
      guard.run(train_op, {model.scale: 1e30})
      guard.run(model.loss, {model.scale: np.nan})
    self.assertTrue(guard.failed)
    helpers.assert_state(th.state(store, sess), entry, "rolled back")

  @parameterized.named_parameters(*KINDS)
  def test_a_trial_refuses_the_in_step_tag(self, use_resource):
    _, store, train_op, sess = self._setup(use_resource)
    entry = th.state(store, sess)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      r"trial\(tag='before_step'\)",
      "pinned",
      train_op.name,
      "another tag",
    ):
      with snapstore.Trial(store, tag="before_step", session=sess) as trial:
        sess.run(train_op)
        sess.run(train_op)
        trial.reject()
    # Refused on entry: the block never ran.
    helpers.assert_state(th.state(store, sess), entry)

  def test_guards_and_trials_refuse_a_pinned_tag_of_in_graph_ops(self):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression()
      store = model.store(mode="device", max_to_keep=2)
      ema = snapstore.MovingAverage(store, tau=0.5, slot=1)
    sess = th.session(self, graph)
    sess.run(ema.update_op)
    average = sess.run(list(store.slots.shadows(1).values()))
    for make in (
      lambda: snapstore.Guard(store, tag="ema", session=sess),
      lambda: snapstore.Trial(store, tag="ema", session=sess),
    ):
      with helpers.assert_raises_naming(
        self, ValueError, "'ema'", "pinned", "slot 1", "another tag"
      ):
        with make():
          pass
    for shadow, value in zip(
      sess.run(list(store.slots.shadows(1).values())), average
    ):
      helpers.assert_bit_equal(shadow, value, "the average")


class ArraysIntoVariablesTest(tf.test.TestCase, parameterized.TestCase):
  """Byte order and rank survive every path from numpy into a variable."""

  CASES = [
    (
      "%s_%s_%s" % (mode, kind, "packed" if pack else "plain"),
      mode,
      use_resource,
      pack,
    )
    for mode in ("device", "host", "disk")
    for kind, use_resource in KINDS
    for pack in ((False, True) if mode == "device" else (False,))
  ]

  def _store(self, mode, use_resource, pack):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net", use_resource=use_resource):
        variables = [
          tf.get_variable("scalar", initializer=np.float32(1.5)),
          tf.get_variable("other", initializer=np.float32(-2.0)),
          tf.get_variable("vector", initializer=np.arange(3, dtype=np.float64)),
          tf.get_variable("count", initializer=np.int64(7)),
        ]
      options = {"pack": True} if pack else {}
      if mode == "disk":
        options = {
          "spill_path": os.path.join(self.get_temp_dir(), "s.h5"),
          "memory_budget": 1 << 20,
        }
      store = snapstore.SnapshotStore(
        var_list=variables, scope="net", mode=mode, max_to_keep=2, **options
      )
    self.addCleanup(store.close)
    return store, th.session(self, graph)

  @parameterized.named_parameters(*CASES)
  def test_zero_d_and_big_endian_arrays_load_and_restore_exactly(
    self, mode, use_resource, pack
  ):
    store, sess = self._store(mode, use_resource, pack)
    kept = store.snapshot("keep", session=sess)
    foreign = {
      "scalar": np.array(-0.0, ">f4"),  # 0-d, big-endian
      "other": np.array(np.nan, "<f4")[()],  # a numpy scalar
      "vector": np.array([1.0, -2.5, 3e300], ">f8")[::-1],  # strided, swapped
      "count": np.array(-3, ">i8"),
    }
    store.load_arrays(foreign, tag="keep", session=sess)
    self.assertEqual(store.tags(), [kept])
    store.restore("keep", session=sess)
    values = dict(zip(store.keys, sess.run(list(store.variables.values()))))
    for key, value in foreign.items():
      expected = np.asarray(value).astype(
        np.asarray(value).dtype.newbyteorder("=")
      )
      helpers.assert_bit_equal(values[key], expected, key)
    for key, value in store.arrays("keep", session=sess).items():
      helpers.assert_bit_equal(value, values[key], "arrays " + key)


class TagsThatCannotBeWrittenTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(
    ("device", "device"), ("host", "host"), ("disk", "disk")
  )
  def test_a_tag_with_a_lone_surrogate_is_refused_before_anything_is_stored(
    self, mode
  ):
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(dtypes=(tf.float32,))
      options = {}
      if mode == "disk":
        options = {
          "spill_path": os.path.join(self.get_temp_dir(), "s.h5"),
          "memory_budget": 0,
        }
      store = snapstore.SnapshotStore(scope="net", mode=mode, **options)
    sess = th.session(self, graph)
    bad = os.fsdecode(b"run-\xff")
    for call in (
      lambda: store.snapshot(bad, session=sess),
      lambda: store.load_arrays(
        store.arrays(store.snapshot("good", session=sess), session=sess),
        tag=bad,
        session=sess,
      ),
    ):
      with helpers.assert_raises_naming(
        self,
        TypeError,
        "cannot be encoded as UTF-8",
        r"'run-\\udcff'",
        "os.fsdecode",
      ):
        call()
    self.assertEqual(store.tags(), ["good"])
    store.close()  # nothing unwritable is held: the store closes
    del model


class RefusedCallsChangeNothingTest(tf.test.TestCase):
  def test_a_moving_average_refused_on_a_packed_store_pins_nothing(self):
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(dtypes=(tf.float32, tf.float32))
      store = snapstore.SnapshotStore(
        scope="net", mode="device", pack=True, max_to_keep=2
      )
      with helpers.assert_raises_naming(
        self, snapstore.ModeError, "pack=True", "pack=False"
      ):
        snapstore.MovingAverage(store, tau=0.1, tag="ema")
    self.assertEqual(store.slots.pinned(), [])
    self.assertEqual(store.tags(), [])
    sess = th.session(self, graph)
    store.snapshot("a", session=sess)
    store.snapshot("b", session=sess)  # both slots are free for snapshots
    self.assertEqual(store.tags(), ["a", "b"])
    del model


class UninitializedShadowsTest(tf.test.TestCase, parameterized.TestCase):
  """The local initializer never ran: the fix is named, and nothing is written."""

  def _setup(self, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = helpers.Model(
        dtypes=(tf.float32, tf.int64), use_resource=use_resource
      )
      store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=2)
      store.slots.pin(1, "target")  # in-graph ops would write it; none ran
    sess = tf.Session(graph=graph)
    self.addCleanup(sess.close)
    with graph.as_default():
      sess.run(tf.global_variables_initializer())  # not the local one
    return model, store, sess

  @parameterized.named_parameters(*KINDS)
  def test_restore_says_nothing_was_written_and_names_the_initializer(
    self, use_resource
  ):
    model, store, sess = self._setup(use_resource)
    live = model.randomize(sess, seed=1)
    with helpers.assert_raises_naming(
      self,
      snapstore.RestoreError,
      "slot 1",
      "not initialized",
      "local_variables_initializer",
      "Nothing was written",
    ):
      store.restore("target", session=sess)
    helpers.assert_state(model.values(sess), live)

  @parameterized.named_parameters(*KINDS)
  def test_arrays_and_evaluate_with_name_the_initializer(self, use_resource):
    model, store, sess = self._setup(use_resource)
    live = model.randomize(sess, seed=2)
    for call in (
      lambda: store.arrays("target", session=sess),
      lambda: store.files.save_npz(
        os.path.join(self.get_temp_dir(), "t.npz"), "target", session=sess
      ),
      lambda: store.evaluate_with(
        list(model.variables.values()), tag="target", session=sess
      ),
    ):
      with helpers.assert_raises_naming(
        self,
        snapstore.SnapshotError,
        "slot 1",
        "not initialized",
        "local_variables_initializer",
      ):
        call()
      helpers.assert_state(model.values(sess), live)


def _slot_store_cases():
  return [
    (
      "%s%s_%s"
      % ("packed" if pack else "device", "_spill" if spill else "", kind),
      pack,
      spill,
      use_resource,
    )
    for pack in (False, True)
    for spill in (False, True)
    for kind, use_resource in KINDS
  ]


class DeviceSlotCallsOnEveryModeWithSlotsTest(
  tf.test.TestCase, parameterized.TestCase
):
  """Device, device + spill file, packed, packed + spill file: the same calls."""

  @parameterized.named_parameters(*_slot_store_cases())
  def test_every_slot_call_works(self, pack, spill, use_resource):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Linear(use_resource)
      options = {"pack": pack}
      if spill:
        options["spill_path"] = os.path.join(self.get_temp_dir(), "s.h5")
      store = model.store(max_to_keep=3, **options)
      self.addCleanup(store.close)
      self.assertEqual(len(store.slots), 3)
      snapshot_op, restore_op = (
        store.slots.snapshot_op(2),
        store.slots.restore_op(2),
      )
      if not pack:
        self.assertLen(store.slots.shadows(0), 3)
      store.slots.pin(1, "pinned")
      train_op = store.slots.snapshot_before(
        model.apply, slot=0, tag="before_step", if_finite=model.loss
      )
      self.assertEqual(store.slots.in_step_ops("before_step"), [train_op])
      self.assertIs(store.slots.in_step_condition(train_op), model.loss)
    sess = th.session(self, graph)
    start = th.state(store, sess)
    sess.run(snapshot_op)
    sess.run(train_op)
    self.assertEqual(store.slots.slot_of("before_step"), 0)
    after = th.state(store, sess)
    helpers.assert_state_differs(after, start)
    store.restore("before_step", session=sess)
    helpers.assert_state(th.state(store, sess), start, "in-step slot")
    sess.run(train_op)
    sess.run(restore_op)
    helpers.assert_state(th.state(store, sess), start, "restore_op")
    self.assertEqual(sorted(store.slots.pinned()), ["before_step", "pinned"])


class EnsembleOnPackedStoreTest(tf.test.TestCase):
  def _packed(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [None, 4])
      out = helpers.dense_net(x)
      store = snapstore.SnapshotStore(
        scope="net", mode="device", pack=True, max_to_keep=2
      )
    return graph, x, out, store

  def test_the_default_falls_back_to_one_member_at_a_time(self):
    graph, x, out, store = self._packed()
    with graph.as_default():
      ensemble = snapstore.Ensemble(store, out)
    self.assertFalse(ensemble.rewired)
    sess = th.session(self, graph)
    data = helpers.dense_net_data()[0]
    first = store.snapshot("a", session=sess)
    expected = sess.run(out, {x: data})
    result = ensemble.evaluate({x: data}, session=sess)
    helpers.assert_bit_equal(result.members[first], expected)

  def test_rewire_true_names_both_ways_out(self):
    graph, _, out, store = self._packed()
    with graph.as_default():
      with helpers.assert_raises_naming(
        self, snapstore.ModeError, "pack=True", "pack=False", "rewire=False"
      ):
        snapstore.Ensemble(store, out, rewire=True)


class _AbortOnce(tf.train.SessionRunHook):
  """Fails run number `at` as a preempted worker would: MTS starts a new session."""

  def __init__(self, at):
    self._at = at
    self._runs = 0

  def after_run(self, run_context, run_values):
    self._runs += 1
    if self._runs == self._at:
      raise tf.errors.AbortedError(None, None, "preempted (test)")


class InStepHookAcrossRecoveryTest(tf.test.TestCase):
  def test_a_new_sessions_slot_is_not_trusted_before_a_finite_step(self):
    graph, model, store, train_op = _in_step(if_finite=True)
    with graph.as_default():
      hook = snapstore.SnapshotHook(
        store, loss=model.loss, in_step_tag="before_step"
      )
      with tf.train.MonitoredTrainingSession(
        hooks=[_AbortOnce(at=2), hook]
      ) as sess:
        sess.run(train_op)  # finite: the slot is trusted in this session
        self.assertEqual(hook.trusted, "before_step")
        # Run 2 is aborted after it ran; MTS runs it again in a new session,
        # whose slot holds what its initializer gave, checked by no step.
        with helpers.assert_raises_naming(
          self,
          snapstore.NonFiniteError,
          "no trusted snapshot",
          "no step has had a finite loss yet",
        ):
          sess.run(train_op, {model.scale: np.nan})
      self.assertEqual(hook.rollbacks, 0)


if __name__ == "__main__":
  tf.test.main()
