"""SnapshotHook under MonitoredTrainingSession and an Estimator; SnapshotCallback in fit."""

import unittest
from unittest import mock

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from tests import helpers
from tests import training_helpers as th


def _bad(feed, model):
  """The batch `feed` with a NaN input: the loss on it is NaN."""
  feed = dict(feed)
  x = feed[model.x].copy()
  x[0, 0] = np.nan
  feed[model.x] = x
  return feed


class _StateRecorder(tf.train.SessionRunHook):
  """Records the store's variables before every run (listed before the hook)."""

  def __init__(self, store):
    self.store = store
    self.before = []

  def before_run(self, run_context):
    self.before.append(th.state(self.store, run_context.session))


class SnapshotHookTest(tf.test.TestCase, parameterized.TestCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_rolls_back_to_the_newest_trusted_snapshot(self, mode, use_resource):
    with tf.Graph().as_default():
      model = th.Regression(use_resource=use_resource)
      store = model.store(mode=mode, max_to_keep=2)
      hook = snapstore.SnapshotHook(store, every_n_steps=3, loss=model.loss)
      recorder = _StateRecorder(store)
      feeds = model.feeds(0, 12)
      for i in (7, 9):
        feeds[i] = _bad(feeds[i], model)
      with tf.train.MonitoredTrainingSession(hooks=[recorder, hook]) as sess:
        raw = sess._tf_sess()  # pylint: disable=protected-access
        for i, feed in enumerate(feeds):
          sess.run(model.train_op, feed)
          if i == 7:
            # Step 7's loss is inf: back to the snapshot taken before step 6,
            # the newest one whose parameters gave a finite loss.
            helpers.assert_state(
              th.state(store, raw), recorder.before[6], "step 7"
            )
            self.assertEqual(store.tags(), [1, 2])
            self.assertEqual(hook.trusted, 2)
          if i == 9:
            # The snapshot taken right before step 9 is dropped: its parameters
            # gave the inf loss. Back to the same trusted snapshot.
            helpers.assert_state(
              th.state(store, raw), recorder.before[6], "step 9"
            )
            self.assertEqual(store.tags(), [2])
          if i == 10:  # after a dropped snapshot, the next step snapshots
            self.assertEqual(store.tags(), [2, 4])
        self.assertEqual(hook.rollbacks, 2)
        self.assertEqual(hook.snapshots, 5)  # before steps 0, 3, 6, 9, 10
        self.assertEqual(hook.trusted, 4)
        for key, value in th.state(store, raw).items():
          self.assertTrue(np.all(np.isfinite(value)), key)

  def test_consecutive_rollbacks_raise_after_the_limit(self):
    with tf.Graph().as_default():
      model = th.Regression()
      store = model.store(max_to_keep=2)
      hook = snapstore.SnapshotHook(
        store, every_n_steps=1, loss=model.loss, max_consecutive_rollbacks=2
      )
      recorder = _StateRecorder(store)
      feeds = model.feeds(0, 8)
      with tf.train.MonitoredTrainingSession(hooks=[recorder, hook]) as sess:
        for feed in feeds[:3]:
          sess.run(model.train_op, feed)
        sess.run(model.train_op, _bad(feeds[3], model))
        sess.run(model.train_op, _bad(feeds[4], model))
        with helpers.assert_raises_naming(
          self,
          snapstore.NonFiniteError,
          "3 rollbacks in a row, more than max_consecutive_rollbacks=2",
          "hold snapshot 2\\b",
        ):
          sess.run(model.train_op, _bad(feeds[5], model))
        helpers.assert_state(
          th.state(store, sess._tf_sess()),  # pylint: disable=protected-access
          recorder.before[2],
        )
      self.assertEqual(hook.rollbacks, 3)

  def test_no_trusted_snapshot_yet(self):
    with tf.Graph().as_default():
      model = th.Regression()
      hook = snapstore.SnapshotHook(
        model.store(max_to_keep=2), every_n_steps=5, loss=model.loss
      )
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        with self.assertRaisesRegex(
          snapstore.NonFiniteError, "no trusted snapshot to roll back to"
        ):
          sess.run(model.train_op, _bad(model.feeds(0, 1)[0], model))

  @parameterized.named_parameters(
    ("steps", 2, None, 3), ("secs", None, 3600.0, 1)
  )
  def test_snapshots_only_without_a_loss(
    self, every_n_steps, every_n_secs, count
  ):
    with tf.Graph().as_default():
      model = th.Regression()
      store = model.store(max_to_keep=1)
      hook = snapstore.SnapshotHook(
        store, every_n_steps=every_n_steps, every_n_secs=every_n_secs
      )
      recorder = _StateRecorder(store)
      with tf.train.MonitoredTrainingSession(hooks=[recorder, hook]) as sess:
        for feed in model.feeds(0, 5):
          sess.run(model.train_op, feed)
        store.restore(session=sess)
        helpers.assert_state(
          th.state(store, sess._tf_sess()),  # pylint: disable=protected-access
          recorder.before[4 if count == 3 else 0],
        )
      self.assertEqual(hook.snapshots, count)
      self.assertEqual(hook.rollbacks, 0)

  def test_store_factory_loss_name_and_on_rollback(self):
    calls = []
    with tf.Graph().as_default() as graph:
      model = th.Regression()

      def lower_learning_rate(session):
        calls.append(session)

      hook = snapstore.SnapshotHook(
        lambda: model.store(max_to_keep=2),
        every_n_steps=1,
        loss="loss:0",
        on_rollback=lower_learning_rate,
      )
      self.assertIsNone(hook.store)
      feeds = model.feeds(0, 3)
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        sess.run(model.train_op, feeds[0])
        sess.run(model.train_op, _bad(feeds[1], model))
        raw = sess._tf_sess()  # pylint: disable=protected-access
      self.assertIs(hook.store.graph, graph)
      self.assertEqual(calls, [raw])
      # Another session on the (now finalized) graph: the store built for it is reused.
      store = hook.store
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        sess.run(model.train_op, feeds[2])
      self.assertIs(hook.store, store)


def _in_step_model(use_resource=False, if_finite=True):
  """A `th.Linear` model, its store and a train op snapshotting in its run."""
  model = th.Linear(use_resource)
  store = model.store()
  train_op = store.slots.snapshot_before(
    model.apply, if_finite=model.loss if if_finite else None
  )
  return model, store, train_op


class InStepHookTest(tf.test.TestCase, parameterized.TestCase):
  """SnapshotHook(in_step_tag=tag): the train op's run snapshots if the loss is finite."""

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_rolls_back_to_the_last_finite_step_with_no_run_of_its_own(
    self, use_resource
  ):
    with tf.Graph().as_default():
      model, store, train_op = _in_step_model(use_resource)
      hook = snapstore.SnapshotHook(
        store, loss=model.loss, in_step_tag="before_step"
      )
      counter = helpers.CountingHook()
      scales = [1.0, 1.0, 1.0, np.nan, 1.0, np.inf, np.nan, 1.0, 1.0]
      with tf.train.MonitoredTrainingSession(hooks=[counter, hook]) as sess:
        raw = sess._tf_sess()  # pylint: disable=protected-access
        expected = start = th.momentum_steps(0)[0]
        with mock.patch.object(
          store, "snapshot", wraps=store.snapshot
        ) as snap, mock.patch.object(
          store, "restore", wraps=store.restore
        ) as restore, mock.patch.object(raw, "run", wraps=raw.run) as raw_run:
          for i, scale in enumerate(scales):
            runs = raw_run.call_count
            sess.run(train_op, {model.scale: scale})
            # One run of the raw session per step: the user's, with the loss.
            self.assertEqual(raw_run.call_count, runs + 1, "step %d" % i)
            if np.isfinite(scale):  # the slot took the step's start
              start, expected = expected, th.momentum_step(expected)
            else:  # back to the start of the last finite-loss step
              expected = start
            helpers.assert_state(
              th.state(store, raw), th.linear_state(expected), "step %d" % i
            )
          # A run without the train op is not a step of the hook's.
          sess.run(model.loss, {model.scale: np.nan})
          helpers.assert_state(
            th.state(store, raw), th.linear_state(expected), "no train op"
          )
        self.assertEqual(snap.call_count, 0)
        self.assertEqual(restore.call_count, 3)
      # Three steps, three rollbacks to the start of step 2, then two steps.
      self.assertEqual(expected[2], 4)
      self.assertEqual(counter.runs, len(scales) + 1)
      self.assertEqual(hook.rollbacks, 3)
      self.assertEqual(hook.snapshots, 0)
      self.assertEqual(hook.trusted, "before_step")
      self.assertEqual(store.tags(), ["before_step"])

  @parameterized.named_parameters(*helpers.kind_cases())
  def test_consecutive_rollbacks_raise_after_the_limit(self, use_resource):
    calls = []
    with tf.Graph().as_default():
      model, store, train_op = _in_step_model(use_resource)
      hook = snapstore.SnapshotHook(
        store,
        loss=model.loss,
        in_step_tag="before_step",
        max_consecutive_rollbacks=1,
        on_rollback=calls.append,
      )
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        raw = sess._tf_sess()  # pylint: disable=protected-access
        sess.run(train_op)
        sess.run(train_op, {model.scale: np.nan})
        with helpers.assert_raises_naming(
          self,
          snapstore.NonFiniteError,
          "2 rollbacks in a row, more than max_consecutive_rollbacks=1",
          "hold snapshot 'before_step'",
        ):
          sess.run(train_op, {model.scale: np.inf})
        helpers.assert_state(
          th.state(store, raw), th.linear_state(th.momentum_steps(0)[0])
        )
      self.assertEqual(calls, [raw, raw])
      self.assertEqual(hook.rollbacks, 2)

  def test_no_finite_step_yet(self):
    with tf.Graph().as_default():
      model, store, train_op = _in_step_model()
      hook = snapstore.SnapshotHook(
        store, loss=model.loss, in_step_tag="before_step"
      )
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        with helpers.assert_raises_naming(
          self,
          snapstore.NonFiniteError,
          "no trusted snapshot to roll back to",
          "no step has had a finite loss yet",
        ):
          sess.run(train_op, {model.scale: np.nan})
      self.assertEqual(hook.rollbacks, 0)


class DeprecatedInStepTest(tf.test.TestCase):
  """`SnapshotHook(in_step=tag)`: the old spelling of `in_step_tag=`, warned."""

  def test_in_step_warns_and_rolls_back_as_in_step_tag(self):
    with tf.Graph().as_default():
      model, store, train_op = _in_step_model()
      with self.assertWarnsRegex(
        DeprecationWarning,
        r"SnapshotHook\(in_step='before_step'\) is deprecated; pass "
        r"in_step_tag='before_step'",
      ):
        hook = snapstore.SnapshotHook(
          store, loss=model.loss, in_step="before_step"
        )
      with tf.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        raw = sess._tf_sess()  # pylint: disable=protected-access
        sess.run(train_op)
        sess.run(train_op, {model.scale: np.nan})
        # Back to the start of step 0, the newest step whose loss was finite.
        helpers.assert_state(
          th.state(store, raw), th.linear_state(th.momentum_steps(0)[0])
        )
      self.assertEqual(hook.rollbacks, 1)
      self.assertEqual(hook.snapshots, 0)
      self.assertEqual(hook.trusted, "before_step")

  def test_in_step_is_checked_as_in_step_tag(self):
    with tf.Graph().as_default():
      model, store, _ = _in_step_model()
    with self.assertWarns(DeprecationWarning):
      with helpers.assert_raises_naming(
        self, ValueError, "in_step_tag='before_step'", "pass loss="
      ):
        snapstore.SnapshotHook(store, in_step="before_step")

  def test_both_spellings_are_refused(self):
    with tf.Graph().as_default():
      model, store, _ = _in_step_model()
    with helpers.assert_raises_naming(
      self, TypeError, "in_step is the old name of in_step_tag"
    ):
      snapstore.SnapshotHook(
        store, loss=model.loss, in_step_tag="a", in_step="before_step"
      )


class SnapshotHookErrorsTest(tf.test.TestCase):
  def test_bad_arguments(self):
    with tf.Graph().as_default():
      model = th.Regression()
      store = model.store(max_to_keep=2)
    with self.assertRaisesRegex(
      ValueError, "exactly one of every_n_steps and every_n_secs"
    ):
      snapstore.SnapshotHook(store)
    with self.assertRaisesRegex(
      ValueError, "exactly one of every_n_steps and every_n_secs"
    ):
      snapstore.SnapshotHook(store, every_n_steps=1, every_n_secs=1.0)
    with self.assertRaisesRegex(
      ValueError, "every_n_steps must be >= 1, got 0"
    ):
      snapstore.SnapshotHook(store, every_n_steps=0)
    with self.assertRaisesRegex(ValueError, "every_n_secs must be > 0"):
      snapstore.SnapshotHook(store, every_n_secs=-1)
    with self.assertRaisesRegex(
      TypeError, "store must be a SnapshotStore, a function returning one, got"
    ):
      snapstore.SnapshotHook("store", every_n_steps=1)
    with self.assertRaisesRegex(
      TypeError, "loss must be a tensor, a tensor name"
    ):
      snapstore.SnapshotHook(store, every_n_steps=1, loss=1.0)
    with self.assertRaisesRegex(TypeError, "on_rollback must be a function"):
      snapstore.SnapshotHook(store, every_n_steps=1, on_rollback=1)
    with self.assertRaisesRegex(
      ValueError, "max_consecutive_rollbacks must be >= 0"
    ):
      snapstore.SnapshotHook(
        store, every_n_steps=1, max_consecutive_rollbacks=-1
      )

  def _begin(self, hook, graph):
    with graph.as_default():
      hook.begin()

  def test_problems_found_in_begin(self):
    graph = tf.Graph()
    with graph.as_default():
      model = th.Regression()
      one_slot = model.store(max_to_keep=1)
      counter = tf.train.get_global_step()
    with self.assertRaisesRegex(
      ValueError, "needs a store that keeps 2 snapshots"
    ):
      self._begin(
        snapstore.SnapshotHook(one_slot, every_n_steps=1, loss=model.loss),
        graph,
      )
    with self.assertRaisesRegex(ValueError, "loss='nope:0' names no tensor"):
      self._begin(
        snapstore.SnapshotHook(one_slot, every_n_steps=1, loss="nope:0"), graph
      )
    with self.assertRaisesRegex(TypeError, "loss read:0 has dtype int64"):
      self._begin(
        snapstore.SnapshotHook(
          one_slot, every_n_steps=1, loss=lambda: counter.read_value()
        ),
        graph,
      )
    with self.assertRaisesRegex(TypeError, "returned 'x', not a SnapshotStore"):
      self._begin(snapstore.SnapshotHook(lambda: "x", every_n_steps=1), graph)
    with self.assertRaisesRegex(
      snapstore.GraphMismatchError,
      "store belongs to another graph.*pass a function that creates the store",
    ):
      self._begin(snapstore.SnapshotHook(one_slot, every_n_steps=1), tf.Graph())

  # -- in_step_tag ---------------------------------------------------------------------

  def test_in_step_needs_a_loss(self):
    with tf.Graph().as_default():
      _, store, _ = _in_step_model()
    with helpers.assert_raises_naming(
      self, ValueError, "in_step_tag='before_step'", "pass loss=", "if_finite"
    ):
      snapstore.SnapshotHook(store, in_step_tag="before_step")

  def test_in_step_takes_no_period(self):
    with tf.Graph().as_default():
      model, store, _ = _in_step_model()
    for period in ({"every_n_steps": 1}, {"every_n_secs": 60.0}):
      with helpers.assert_raises_naming(
        self, ValueError, "snapshots in its own run", "Pass neither"
      ):
        snapstore.SnapshotHook(
          store, loss=model.loss, in_step_tag="before_step", **period
        )

  def test_in_step_must_be_a_tag(self):
    with tf.Graph().as_default():
      model, store, _ = _in_step_model()
    with helpers.assert_raises_naming(
      self, TypeError, "A tag must be an int or a non-empty string, got ''"
    ):
      snapstore.SnapshotHook(store, loss=model.loss, in_step_tag="")

  def test_in_step_tag_no_train_op_snapshots_under(self):
    graph = tf.Graph()
    with graph.as_default():
      model, store, _ = _in_step_model()
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "in_step_tag='other'",
      "no train op of the store",
      "pinned tags: \\['before_step'\\]",
      "snapshot_before\\(update, tag='other', if_finite=loss\\)",
    ):
      self._begin(
        snapstore.SnapshotHook(store, loss=model.loss, in_step_tag="other"),
        graph,
      )

  def test_in_step_train_op_built_without_if_finite(self):
    graph = tf.Graph()
    with graph.as_default():
      model, store, train_op = _in_step_model(if_finite=False)
    with helpers.assert_raises_naming(
      self,
      ValueError,
      train_op.name,
      "writes the slot in every run",
      "if_finite=loss",
    ):
      self._begin(
        snapstore.SnapshotHook(
          store, loss=model.loss, in_step_tag="before_step"
        ),
        graph,
      )

  def test_in_step_loss_must_be_the_if_finite_tensor(self):
    graph = tf.Graph()
    with graph.as_default():
      model, store, train_op = _in_step_model()
      other = tf.identity(model.loss, name="other_loss")
    with helpers.assert_raises_naming(
      self,
      ValueError,
      "checks the loss other_loss:0",
      "%s snapshots when %s is finite" % (train_op.name, model.loss.name),
      "same tensor",
    ):
      self._begin(
        snapstore.SnapshotHook(store, loss=other, in_step_tag="before_step"),
        graph,
      )


@unittest.skipUnless(
  hasattr(tf, "estimator"), "tf.estimator is gone from TensorFlow 2.16 on"
)
class EstimatorTest(tf.test.TestCase):
  def test_rolls_back_inside_estimator_train(self):
    # Estimator.train builds its graph in model_fn: the hook builds the store.
    hook = snapstore.SnapshotHook(
      lambda: snapstore.SnapshotStore(
        collection=tf.GraphKeys.GLOBAL_VARIABLES, max_to_keep=2
      ),
      every_n_steps=2,
      loss=lambda: tf.get_collection(tf.GraphKeys.LOSSES)[-1],
    )
    config = tf.estimator.RunConfig(
      log_step_count_steps=None, save_summary_steps=None
    )
    estimator = tf.estimator.Estimator(
      helpers.estimator_model_fn,
      model_dir=self.get_temp_dir(),
      config=config,
    )
    estimator.train(helpers.estimator_input_fn(bad_batch=5), hooks=[hook])
    self.assertEqual(hook.rollbacks, 1)
    self.assertEqual(
      hook.store.keys, ("global_step", "net/w", "net/w/Momentum")
    )
    w = estimator.get_variable_value("net/w")
    self.assertTrue(np.all(np.isfinite(w)))
    self.assertAllClose(w, [1.0, -2.0, 0.5], atol=0.5)
    # 16 batches; the rollback took the global step back to where the trusted
    # snapshot was taken (before step 4), so two steps were undone.
    self.assertEqual(estimator.get_variable_value("global_step"), 14)
    # A second train() call builds a new graph, and the hook a new store.
    first_store = hook.store
    estimator.train(
      helpers.estimator_input_fn(bad_batch=None), hooks=[hook], steps=2
    )
    self.assertIsNot(hook.store, first_store)
    self.assertEqual(hook.rollbacks, 0)


class _WeightsRecorder(tf.keras.callbacks.Callback):
  def __init__(self):
    super(_WeightsRecorder, self).__init__()
    self.before = []

  def on_train_batch_begin(self, batch, logs=None):
    self.before.append(self.model.get_weights())


class SnapshotCallbackTest(tf.test.TestCase):
  def _data(self):
    rng = np.random.RandomState(0)
    x = rng.randn(256, 4).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.float32)
    # Batch 2 of every epoch: its squared error overflows, an infinite loss.
    # (A huge input instead gives a NaN loss on TF 1.15, but a finite one and
    # an infinite moving variance through TF 2.x's batch norm.)
    y[64 * 2 + 3] = 1e30
    return x, y

  def test_rolls_back_in_model_fit(self):
    x, y = self._data()
    with tf.Graph().as_default():
      model = tf.keras.Sequential(
        [
          tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
          tf.keras.layers.BatchNormalization(),
          tf.keras.layers.Dense(1),
        ]
      )
      model.compile(tf.keras.optimizers.Adam(0.01), "mse")
      recorder = _WeightsRecorder()
      callback = snapstore.SnapshotCallback(every_n_batches=1)
      model.fit(
        x,
        y,
        batch_size=64,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[recorder, callback],
      )
      self.assertEqual(callback.rollbacks, 2)
      # The default store: every weight (batch-norm statistics too) and Adam's
      # state, iterations included.
      keys = callback.store.keys
      self.assertIn("batch_normalization/moving_mean", keys)
      self.assertIn("training/Adam/dense/kernel/m", keys)
      self.assertIn("training/Adam/iter", keys)
      for w in model.get_weights():
        self.assertTrue(np.all(np.isfinite(w)))
      # Batch 2's loss was inf: back to the weights before batch 1 (the
      # snapshot before batch 2 is dropped); batch 3 started from there.
      for got, want in zip(recorder.before[3], recorder.before[1]):
        helpers.assert_bit_equal(got, want)
      # A second fit reuses the store built for this graph.
      store = callback.store
      model.fit(
        x[:64], y[:64], batch_size=64, epochs=1, verbose=0, callbacks=[callback]
      )
      self.assertIs(callback.store, store)

  def test_tf_train_optimizer_factory_and_missing_monitor(self):
    x, y = self._data()
    with tf.Graph().as_default():
      model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
      model.compile(tf.train.GradientDescentOptimizer(0.01), "mse")
      callback = snapstore.SnapshotCallback(every_n_batches=2)
      model.fit(
        x,
        y,
        batch_size=64,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[callback],
      )
      self.assertEqual(callback.rollbacks, 1)
      self.assertIn("TFOptimizer/iterations", callback.store.keys)
      built = []

      def factory(m):
        built.append(m)
        return snapstore.SnapshotStore(var_list=m.weights, max_to_keep=2)

      callback = snapstore.SnapshotCallback(
        factory, every_n_batches=1, monitor="acc"
      )
      with self.assertRaisesRegex(ValueError, "The batch logs have no 'acc'"):
        model.fit(
          x, y, batch_size=64, epochs=1, verbose=0, callbacks=[callback]
        )
      self.assertEqual(built, [model])

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "exactly one of every_n_batches"):
      snapstore.SnapshotCallback()
    with self.assertRaisesRegex(
      TypeError,
      "store must be a SnapshotStore, a function returning one or None",
    ):
      snapstore.SnapshotCallback(store=3, every_n_batches=1)

  def test_eager_only_options_are_refused_in_graph_mode_fit(self):
    x, y = self._data()
    for kwargs, message in [
      (dict(in_step=True), "in_step= is for eager fit; in graph mode"),
      (dict(every_n_batches=1, backoff=0.5), "backoff= is for eager fit"),
    ]:
      with tf.Graph().as_default():
        model = tf.keras.Sequential(
          [tf.keras.layers.Dense(1, input_shape=(4,))]
        )
        model.compile(tf.keras.optimizers.SGD(0.01), "mse")
        callback = snapstore.SnapshotCallback(**kwargs)
        with self.assertRaisesRegex(ValueError, message):
          model.fit(
            x, y, batch_size=64, epochs=1, verbose=0, callbacks=[callback]
          )
        self.assertIsNone(callback.store)


if __name__ == "__main__":
  tf.test.main()
