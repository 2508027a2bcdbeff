"""SnapshotCallback in eager `fit`: Keras 3, tf-keras and TF 2.15's Keras 2.

The done-when test of issue 23: `fit` with a batch that makes the loss NaN,
rolled back by the callback, ends bit for bit where `fit` on the same data
without that batch ends (weights, batch-norm statistics, optimizer slots,
iterations, seed states, metrics), with a negative control showing that the
comparison can fail. `shuffle=False` so that both runs see the same batches
in the same order; no XLA (jit_compile is "auto", False on a CPU).
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from snapstore import _keras
from snapstore.engines.eager import copies
from tests.eager import common
from tests.eager.common import keras

B, NB = 16, 8  # batch size, batches per epoch


def _data(bad=None):
  """Inputs and targets for NB batches; batch `bad` has one bad example."""
  rng = np.random.RandomState(0)
  x = rng.randn(B * NB, 3).astype(np.float32)
  y = np.tanh(x @ rng.randn(3, 1)).astype(np.float32)
  if bad is not None:
    common.spoil(x, y, bad * B)
  return x, y


def _without(x, y, batch):
  keep = np.r_[0 : batch * B, (batch + 1) * B : B * NB]
  return x[keep], y[keep]


def _model(dropout=False, learning_rate=0.01):
  model = common.small_model(seed=3, dropout=dropout)
  model.compile(
    optimizer=keras.optimizers.Adam(learning_rate),
    loss="mse",
    metrics=["mae"],
  )
  return model


def _fit(model, x, y, callbacks=(), epochs=2):
  return model.fit(
    x,
    y,
    batch_size=B,
    epochs=epochs,
    shuffle=False,
    verbose=0,
    callbacks=list(callbacks),
  )


def _state(model):
  """Model variables (seed states too), optimizer variables, metrics."""
  metrics = [v for m in model.metrics for v in m.variables]
  return common.values(common.state_variables(model, model.optimizer) + metrics)


def _differing(expected, actual):
  assert len(expected) == len(actual)
  return sum(a.tobytes() != b.tobytes() for a, b in zip(expected, actual))


@pytest.mark.parametrize("bad", [3, 0])
def test_rolled_back_fit_ends_bit_identical_to_fit_without_the_batch(bad):
  x, y = _data(bad)
  clean = _model()
  clean_history = _fit(clean, *_without(x, y, bad))
  model = _model()
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2  # the bad batch, in each epoch
  assert callback.snapshots == 2 * NB
  expected = _state(clean)
  assert len(expected) > 20  # weights, Adam's slots and iterations, metrics
  common.assert_bits_equal(expected, _state(model))
  assert history.history["loss"] == clean_history.history["loss"]
  keys = callback.store.keys
  assert "bn/moving_mean" in keys
  assert any(k.startswith("metrics/") for k in keys)  # rebuilt after epoch 0
  assert not any("learning_rate" in k for k in keys)


@common.needs_keras_3
def test_dropout_seed_state_is_rolled_back_with_the_model():
  x, y = _data(3)
  clean = _model(dropout=True)
  _fit(clean, *_without(x, y, 3))
  model = _model(dropout=True)
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  assert any("seed_generator" in k for k in callback.store.keys)
  common.assert_bits_equal(_state(clean), _state(model))


def _store_without_iterations(model):
  full = snapstore.SnapshotStore(var_list=model, optimizer=model.optimizer)
  var_list = {k: v for k, v in full.variables.items() if "iteration" not in k}
  assert len(var_list) == len(full.keys) - 1
  full.close()
  return snapstore.SnapshotStore(var_list=var_list, max_to_keep=2)


def test_negative_control_without_iterations_the_result_differs():
  # A store of our own that leaves out the optimizer's iteration counter:
  # Adam's bias correction then counts the rolled-back steps, and the
  # weights end elsewhere. The comparison of the test above can fail.
  x, y = _data(3)
  clean = _model()
  _fit(clean, *_without(x, y, 3))
  model = _model()
  callback = snapstore.SnapshotCallback(
    _store_without_iterations, every_n_batches=1
  )
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  weights = len(model.trainable_variables)
  assert (
    _differing(
      common.values(clean.trainable_variables),
      common.values(model.trainable_variables),
    )
    == weights
  )
  assert (
    int(model.optimizer.iterations.numpy())
    == int(clean.optimizer.iterations.numpy()) + 2
  )
  # The metrics are reset at each rollback with a store of your own: the
  # logs stay finite and no good batch is rolled back.
  assert np.all(np.isfinite(history.history["loss"]))


class _Recorder(keras.callbacks.Callback):
  """The model's and optimizer's values at the start of every batch."""

  def __init__(self):
    super(_Recorder, self).__init__()
    self.before = []
    self.losses = []

  def on_train_batch_begin(self, batch, logs=None):
    self.before.append(
      common.values(common.state_variables(self.model, self.model.optimizer))
    )

  def on_train_batch_end(self, batch, logs=None):
    self.losses.append(logs["loss"])


def test_every_n_batches_rolls_back_to_the_newest_snapshot():
  # Snapshots before batches 0, 3, 6; batch 4 is bad: back to the start of
  # batch 3 (batches 3 and 4 undone), and batch 5 starts from there.
  x, y = _data(4)
  model = _model()
  recorder = _Recorder()
  callback = snapstore.SnapshotCallback(every_n_batches=3)
  _fit(model, x, y, [callback, recorder], epochs=1)
  # ... and one at the epoch's end, by the store rebuilt to cover the
  # metrics Keras made in the first step.
  assert callback.snapshots == 3 + 1
  assert callback.rollbacks == 1
  common.assert_bits_equal(recorder.before[3], recorder.before[5])
  assert np.all(np.isfinite(recorder.losses[5:]))
  assert not np.isfinite(recorder.losses[4])


def test_the_callbacks_bookkeeping_stays_within_the_stores_snapshots():
  # Every batch for 3 epochs: 24 snapshots, of which the store keeps 2. The
  # callback's list of its tags (looked through at every snapshot) kept all
  # 24, so each batch cost more than the one before.
  x, y = _data()
  model = _model()
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  _fit(model, x, y, [callback], epochs=3)
  assert callback.snapshots >= 3 * NB
  keeper = callback._keeper
  assert len(keeper._tags) <= callback.store.max_to_keep
  assert set(t for t, _ in keeper._tags) == set(callback.store.tags())
  assert len(keeper._metric_copies) <= callback.store.max_to_keep


class _MetricsAtEnd(keras.callbacks.Callback):
  """The metric variables' values at the end of every batch (after the
  callbacks listed before this one)."""

  def __init__(self):
    super(_MetricsAtEnd, self).__init__()
    self.values = []

  def on_train_batch_end(self, batch, logs=None):
    self.values.append(
      common.values([v for m in self.model.metrics for v in m.variables])
    )


def test_a_snapshot_from_an_earlier_epoch_resets_the_metrics():
  # Snapshots every 5 batches: before steps 0 and 5 (epoch 0), 10 (epoch 1,
  # batch 2). Batch 1 is bad in both epochs. In epoch 1 (step 9) the newest
  # snapshot is from epoch 0's step 5, whose metrics hold epoch 0's batches:
  # the weights go back there, and the metrics restart from zero (fit reset
  # them at the epoch start and no batch of epoch 1 is in effect any more).
  # A first fit on good data makes the metrics, and the store (rebuilt at
  # its epoch's end) covers them: no rebuild drops snapshots in the second.
  x, y = _data(1)
  model = _model()
  callback = snapstore.SnapshotCallback(every_n_batches=5)
  _fit(model, *_data(), callbacks=[callback], epochs=1)
  store = callback.store
  recorder = _Recorder()
  metrics = _MetricsAtEnd()
  history = _fit(model, x, y, [recorder, callback, metrics])
  assert callback.store is store  # the same model: the store is reused
  assert callback.rollbacks == 2
  assert not np.isfinite(recorder.losses[NB + 1])
  common.assert_bits_equal(recorder.before[5], recorder.before[NB + 2])
  after = metrics.values[NB + 1]
  assert after and all(float(np.asarray(v)) == 0.0 for v in after)
  # In epoch 0 (step 1) the snapshot before step 0 is of the same epoch:
  # its metric values (zero, or none yet) are put back, and the running
  # mean goes on finite.
  assert all(np.isfinite(recorder.losses[2:NB]))
  assert np.all(np.isfinite(history.history["loss"]))


def test_backoff_multiplies_the_learning_rate_at_each_rollback():
  x, y = _data(3)
  model = _model(learning_rate=0.01)
  calls = []
  callback = snapstore.SnapshotCallback(
    every_n_batches=1, backoff=0.5, on_rollback=lambda: calls.append(1)
  )
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2 and len(calls) == 2
  want = np.float32(0.01) * np.float32(0.5) * np.float32(0.5)
  rate = np.asarray(model.optimizer.learning_rate.numpy())
  assert rate.dtype == np.float32
  assert rate.tobytes() == np.float32(want).tobytes()


def test_snapshots_only_without_a_monitor():
  x, y = _data()
  model = _model()
  callback = snapstore.SnapshotCallback(every_n_batches=2, monitor=None)
  _fit(model, x, y, [callback], epochs=1)
  assert callback.snapshots == NB // 2 + 1  # + the rebuilt store's
  assert callback.rollbacks == 0
  assert callback.trusted in callback.store


def test_weights_made_non_finite_by_an_update_roll_back_one_further():
  # A snapshot whose weights are not finite is never restored: its own
  # batch had a finite loss, but the update after it overflowed. Here the
  # weights are poisoned by hand right after the snapshot before batch 3.
  x, y = _data()
  model = _model()
  recorder = _Recorder()

  class Poison(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      if batch == 3:
        # The output layer's (d1's can give a finite loss: common.spoil)
        kernel = self.model.get_layer("out").kernel
        kernel.assign(tf.fill(kernel.shape, np.float32(np.nan)))

  callback = snapstore.SnapshotCallback(every_n_batches=1)
  # Order: recorder, snapshot (before 3: finite), poison (batch 3 runs on
  # NaN weights), so batch 3's loss is NaN and its snapshot is finite.
  _fit(model, x, y, [recorder, callback, Poison()], epochs=1)
  assert callback.rollbacks == 1
  common.assert_bits_equal(recorder.before[3], recorder.before[4])

  # Now poison before the snapshot: the snapshot before batch 3 holds NaN
  # weights; the rollback drops it and restores the one before batch 2.
  model = _model()
  recorder = _Recorder()
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  _fit(model, x, y, [recorder, Poison(), callback], epochs=1)
  assert callback.rollbacks == 1
  common.assert_bits_equal(recorder.before[2], recorder.before[4])


def test_copies_are_traced_at_train_begin_not_in_batch_hooks(monkeypatch):
  traced_in_hooks = []
  in_hook = []
  real = copies.traced

  def traced(body, name, signature=None):
    if in_hook:
      traced_in_hooks.append(name)
    return real(body, name, signature)

  monkeypatch.setattr(copies, "traced", traced)

  class Watched(snapstore.SnapshotCallback):
    def on_train_batch_begin(self, batch, logs=None):
      in_hook.append(1)
      try:
        super(Watched, self).on_train_batch_begin(batch, logs)
      finally:
        in_hook.pop()

    def on_train_batch_end(self, batch, logs=None):
      in_hook.append(1)
      try:
        super(Watched, self).on_train_batch_end(batch, logs)
      finally:
        in_hook.pop()

  x, y = _data(2)
  callback = Watched(every_n_batches=1)
  _fit(_model(), x, y, [callback])
  assert callback.rollbacks == 2
  assert traced_in_hooks == []


def test_the_callback_is_a_callback_of_the_keras_in_use():
  assert isinstance(
    snapstore.SnapshotCallback(every_n_batches=1), keras.callbacks.Callback
  )


# -- errors: one test per path, each matching its message --------------------


def test_too_many_consecutive_rollbacks_raise_with_the_weights_restored():
  x, y = _data()
  common.spoil(x, y, slice(3 * B, None))  # batches 3.. are all bad
  model = _model()
  recorder = _Recorder()
  callback = snapstore.SnapshotCallback(
    every_n_batches=1, max_consecutive_rollbacks=1
  )
  with pytest.raises(
    snapstore.NonFiniteError,
    match=r"at batch 4: 2 rollbacks in a row, more than "
    r"max_consecutive_rollbacks=1",
  ):
    _fit(model, x, y, [recorder, callback], epochs=1)
  common.assert_bits_equal(
    recorder.before[3],
    common.values(common.state_variables(model, model.optimizer)),
  )


def test_no_snapshot_with_finite_weights_raises():
  x, y = _data()
  model = _model()
  # The output layer's: a NaN kernel of d1 can give a finite loss (common.spoil)
  model.get_layer("out").kernel.assign(tf.fill([8, 1], np.float32(np.nan)))
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  with pytest.raises(
    snapstore.NonFiniteError,
    match="no snapshot with finite weights to roll back to",
  ):
    _fit(model, x, y, [callback], epochs=1)


def test_missing_monitor_key_is_refused():
  x, y = _data()
  callback = snapstore.SnapshotCallback(every_n_batches=1, monitor="acc")
  with pytest.raises(ValueError, match="The batch logs have no 'acc'"):
    _fit(_model(), x, y, [callback], epochs=1)


def test_backoff_with_a_schedule_is_refused_before_anything_is_built():
  x, y = _data()
  model = common.small_model(seed=3)
  schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9)
  model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
  callback = snapstore.SnapshotCallback(every_n_batches=1, backoff=0.5)
  with pytest.raises(
    ValueError, match="backoff= multiplies the optimizer's learning rate"
  ):
    _fit(model, x, y, [callback], epochs=1)
  assert callback.store is None


@pytest.mark.parametrize(
  "backoff, error, message",
  [
    (0.0, ValueError, "backoff must be > 0, got 0.0"),
    (-1, ValueError, "backoff must be > 0, got -1"),
    ("half", TypeError, "backoff must be a number"),
  ],
)
def test_bad_backoff_is_refused(backoff, error, message):
  with pytest.raises(error, match=message):
    snapstore.SnapshotCallback(every_n_batches=1, backoff=backoff)


def test_a_graph_mode_store_is_refused_in_eager_fit():
  with tf.Graph().as_default():
    v = tf.compat.v1.Variable(1.0, use_resource=True, name="v")
    store = snapstore.SnapshotStore(var_list=[v], max_to_keep=2)
  x, y = _data()
  callback = snapstore.SnapshotCallback(store, every_n_batches=1)
  with pytest.raises(ValueError, match="was built in graph mode, but fit"):
    _fit(_model(), x, y, [callback], epochs=1)


def test_a_store_function_must_return_a_store():
  x, y = _data()
  callback = snapstore.SnapshotCallback(lambda m: 3, every_n_batches=1)
  with pytest.raises(
    TypeError, match="The store function returned 3, not a SnapshotStore"
  ):
    _fit(_model(), x, y, [callback], epochs=1)


@common.needs_keras_3
def test_keras_3_callback_made_in_graph_mode_is_refused():
  with tf.Graph().as_default():
    with pytest.raises(
      RuntimeError,
      match="tf.keras is Keras 3 here, and the callback is being made in "
      "graph mode",
    ):
      snapstore.SnapshotCallback(every_n_batches=1)


# -- in-step mode: the copy and the rollback inside the compiled step ---------


def _compiled(spe=1, jit_compile=False, dropout=False, learning_rate=0.01):
  model = common.small_model(seed=3, dropout=dropout)
  model.compile(
    optimizer=keras.optimizers.Adam(learning_rate),
    loss="mse",
    metrics=["mae"],
    steps_per_execution=spe,
    jit_compile=jit_compile,
  )
  return model


# How in_step undoes a step: copying the state, or skipping the update.
UNDO = ["copy", "skip"]


@pytest.mark.parametrize("undo", UNDO)
@pytest.mark.parametrize("spe", [1, 4])
@pytest.mark.parametrize("bad", [3, 0])
def test_in_step_fit_ends_bit_identical_to_fit_without_the_batch(
  undo, spe, bad
):
  # steps_per_execution=4: the batch hooks see one boundary per 4 steps, but
  # the bad step is undone inside the compiled loop, alone. Without XLA.
  x, y = _data(bad)
  clean = _compiled(spe)
  clean_history = _fit(clean, *_without(x, y, bad))
  model = _compiled(spe)
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2  # the bad step, in each epoch
  assert callback.snapshots == 0  # no batch hook copies
  expected = _state(clean)
  assert len(expected) > 20
  common.assert_bits_equal(expected, _state(model))
  assert history.history["loss"] == clean_history.history["loss"]
  if undo == "copy":
    keys = callback.store.keys
    assert "bn/moving_mean" in keys
    assert any(k.startswith("metrics/") for k in keys)  # built before trace
    assert callback.trusted == "before_step"
  else:  # nothing kept
    assert callback.store is None and callback.trusted is None
  assert "train_step" not in vars(model)  # put back at on_train_end


@pytest.mark.parametrize("undo", UNDO)
def test_in_step_with_a_loss_scale_optimizer_and_averages(undo):
  # A LossScaleOptimizer (its own tf.cond on finite gradients, and its scale)
  # around Adam; with Keras 3, Adam's own moving average of the weights
  # (use_ema) too: all inside the one update that skipping gates.
  def compiled():
    model = common.small_model(seed=3)
    # (Keras 3: Adam's own moving average too; tf-keras's Adam has none.)
    ema = dict(use_ema=True) if common.KERAS_3 else {}
    scaled = common.loss_scale_optimizer(keras.optimizers.Adam(0.01, **ema))
    model.compile(optimizer=scaled, loss="mse", metrics=["mae"])
    return model

  x, y = _data(3)
  clean = compiled()
  _fit(clean, *_without(x, y, 3))
  model = compiled()
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  common.assert_bits_equal(_state(clean), _state(model))


def _callback_args(how):
  if how == "every_batch":
    return dict(every_n_batches=1)
  return dict(in_step=True, in_step_undo=how)


def _callback(how):
  return snapstore.SnapshotCallback(**_callback_args(how))


@pytest.mark.parametrize("how", ["every_batch"] + UNDO)
@pytest.mark.parametrize("kind", ["nadam", "loss_scale"])
def test_optimizer_state_outside_its_variables_is_rolled_back(kind, how):
  # tf-keras keeps Nadam's momentum product and a LossScaleOptimizer's loss
  # scale and good-step count outside `optimizer.variables`; a rollback that
  # left them out ended with 17 of Nadam's 25 variables different, and with
  # the loss scale halved by the bad batch.
  def compiled():
    model = common.small_model(seed=3)
    if kind == "nadam":
      optimizer = keras.optimizers.Nadam(0.01)
    else:
      optimizer = common.loss_scale_optimizer(keras.optimizers.Adam(0.01))
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model

  x, y = _data(3)
  clean = compiled()
  if kind == "nadam" and how != "every_batch" and not common.KERAS_3:
    # tf-keras's Nadam advances a Python counter at each trace of its update
    # and compares it with `iterations`, so what it computes depends on how
    # often the step was traced; the in-step modes trace it once more. The
    # reference is then the same callback's fit without the batch.
    _fit(clean, *_without(x, y, 3), [_callback(how)])
  else:
    _fit(clean, *_without(x, y, 3))
  model = compiled()
  callback = _callback(how)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  common.assert_bits_equal(_state(clean), _state(model))


class _Noise(keras.layers.Layer):
  """Adds noise from a `tf.random.Generator` (its state: no Keras weight)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.generator = tf.random.Generator.from_seed(5)

  def call(self, x):
    return x + 0.1 * self.generator.normal(tf.shape(x))


class _Count(keras.layers.Layer):
  """Counts its calls in a `tf.Variable` attribute (Keras 3: no weight)."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.count = tf.Variable(0.0, trainable=False)

  def call(self, x):
    self.count.assign_add(1.0)
    return x + 0.01 * self.count


def _model_with_state(kind):
  """A model whose step writes state outside `model.variables`, and it."""
  keras.utils.set_random_seed(3)
  if kind == "rnn":  # the states of a stateful LSTM
    layers = [
      keras.Input((5, 2), batch_size=B),
      keras.layers.LSTM(3, stateful=True, name="lstm"),
    ]
  else:
    extra = _Noise(name="noise") if kind == "generator" else _Count(name="n")
    layers = [
      keras.Input((3,)),
      keras.layers.Dense(4, activation="tanh"),
      extra,
    ]
  model = keras.Sequential(layers + [keras.layers.Dense(1)])
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  if kind == "rnn":
    state = list(model.layers[0].states)
  elif kind == "generator":
    state = [model.layers[1].generator.state]
  else:
    state = [model.layers[1].count]
  return model, [
    (_keras.keras_variable_value(v) if _keras.is_keras_3_object(v) else v)
    for v in state
  ]


@pytest.mark.parametrize("how", ["every_batch"] + UNDO)
@pytest.mark.parametrize("kind", ["rnn", "generator", "counter"])
def test_state_outside_the_models_variables_is_rolled_back(kind, how):
  # A rollback left it as the bad batch made it: a stateful RNN's states
  # stayed NaN (every later batch rolled back, then NonFiniteError), the
  # generator's and the counter's differed (15 of 19 variables after the
  # fit); skip refused the step ("no variables of the model").
  rng = np.random.RandomState(0)
  x = rng.randn(B * NB, *((5, 2) if kind == "rnn" else (3,)))
  x = x.astype(np.float32)
  y = rng.randn(B * NB, 1).astype(np.float32)
  clean, clean_state = _model_with_state(kind)
  _fit(clean, *_without(x, y, 3), epochs=1)
  common.spoil(x.reshape(B * NB, -1), y, 3 * B)
  model, state = _model_with_state(kind)
  callback = _callback(how)
  _fit(model, x, y, [callback], epochs=1)
  assert callback.rollbacks == 1
  expected = _state(clean) + common.values(clean_state)
  common.assert_bits_equal(expected, _state(model) + common.values(state))
  assert np.all(np.isfinite(common.values(state)[0]))


class _Gan(keras.Model):
  """Keras's GAN example, small: its own compile, train step and trackers."""

  def __init__(self):
    super().__init__()
    self.discriminator = keras.Sequential(
      [keras.Input((2,)), keras.layers.Dense(8, activation="tanh")]
      + [keras.layers.Dense(1)]
    )
    self.generator = keras.Sequential(
      [keras.Input((3,)), keras.layers.Dense(8, activation="tanh")]
      + [keras.layers.Dense(2)]
    )
    self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
    self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

  def compile(self, d_optimizer, g_optimizer):
    super().compile()
    self.d_optimizer = d_optimizer
    self.g_optimizer = g_optimizer

  @property
  def metrics(self):
    return [self.d_loss_tracker, self.g_loss_tracker]

  def train_step(self, data):
    real, z = data[:, :2], data[:, 2:]
    n = tf.shape(real)[0]
    both = tf.concat([self.generator(z), real], 0)
    labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
    with tf.GradientTape() as tape:
      d_loss = common.mse(labels, self.discriminator(both))
    weights = self.discriminator.trainable_weights
    grads = tape.gradient(d_loss, weights)
    self.d_optimizer.apply_gradients(zip(grads, weights))
    with tf.GradientTape() as tape:
      g_loss = common.mse(
        tf.zeros((n, 1)), self.discriminator(self.generator(z))
      )
    weights = self.generator.trainable_weights
    grads = tape.gradient(g_loss, weights)
    self.g_optimizer.apply_gradients(zip(grads, weights))
    self.d_loss_tracker.update_state(d_loss)
    self.g_loss_tracker.update_state(g_loss)
    return {"d_loss": self.d_loss_tracker.result(), "g_loss": 0.0}


def _gan(built=False):
  keras.utils.set_random_seed(4)
  gan = _Gan()
  gan.compile(keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01))
  if built:  # as their first apply_gradients would
    gan.d_optimizer.build(gan.discriminator.trainable_weights)
    gan.g_optimizer.build(gan.generator.trainable_weights)
  return gan


def _gan_state(gan):
  variables = list(gan.variables)
  for opt in (gan.d_optimizer, gan.g_optimizer):
    variables += list(opt.variables) + common.optimizer_extras(opt)
  return common.values(
    [_keras.keras_variable_value(v) if common.KERAS_3 else v for v in variables]
  )


@pytest.mark.parametrize("how", ["every_batch", "copy"])
def test_a_gans_own_optimizers_are_rolled_back(how):
  # The store covered model.optimizer (compile's unused default) only: the
  # rollback left both Adams' moments as the bad batch made them (26 of 30
  # variables ended different, NaN). every_n_batches needs them built before
  # fit (test below); in_step=True makes them in its first trace.
  rng = np.random.RandomState(0)
  data = rng.randn(8 * 6, 5).astype(np.float32)
  keep = np.r_[0:16, 24:48]
  clean = _gan(built=how == "every_batch")
  clean.fit(data[keep], batch_size=8, shuffle=False, verbose=0)
  data[16, 0] = np.nan  # batch 2: real and generated mixed, d_loss NaN
  gan = _gan(built=how == "every_batch")
  callback = snapstore.SnapshotCallback(monitor="d_loss", **_callback_args(how))
  gan.fit(data, batch_size=8, shuffle=False, verbose=0, callbacks=[callback])
  assert callback.rollbacks == 1
  common.assert_bits_equal(_gan_state(clean), _gan_state(gan))


def test_a_gans_optimizers_without_state_are_refused_every_n_batches():
  rng = np.random.RandomState(0)
  gan = _gan()
  callback = snapstore.SnapshotCallback(every_n_batches=1, monitor="d_loss")
  with pytest.raises(
    ValueError,
    match=r"covers every optimizer _Gan holds, but these have no state yet: "
    r"d_optimizer \(Adam\), g_optimizer \(Adam\).*optimizer\.build.*"
    r"in_step=True",
  ):
    gan.fit(
      rng.randn(16, 5).astype(np.float32),
      batch_size=8,
      verbose=0,
      callbacks=[callback],
    )


def test_a_plain_store_over_a_gan_and_both_its_optimizers():
  # A list of optimizers: each under its own name ("iteration" was one key
  # for both, refused).
  gan = _gan(built=True)
  store = snapstore.SnapshotStore(
    var_list=gan, optimizer=[gan.d_optimizer, gan.g_optimizer]
  )
  names = set(k.split("/")[1] for k in store.keys if k.startswith("optimizer/"))
  assert len(names) == 2
  data = np.random.RandomState(1).randn(16, 5).astype(np.float32)
  gan.fit(data, batch_size=8, shuffle=False, verbose=0)
  tag = store.snapshot()
  saved = _gan_state(gan)
  gan.fit(data, batch_size=8, shuffle=False, verbose=0)
  after = _gan_state(gan)
  assert _differing(saved, after) > 10
  store.restore(tag)
  common.assert_bits_equal(saved, _gan_state(gan))
  gan.fit(data, batch_size=8, shuffle=False, verbose=0)
  common.assert_bits_equal(after, _gan_state(gan))


def test_skip_is_exact_against_the_same_program():
  # With Keras 3's SGD with momentum, one of 20 variables rounds otherwise
  # than in a fit without the callback (TF 2.21): under the gate's tf.cond
  # the update is a block of its own for grappler, whose arithmetic rewrites
  # do not reach across it. The undo is exact against the same program.
  def compiled():
    model = common.small_model(seed=3)
    model.compile(
      optimizer=keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True),
      loss="mse",
      metrics=["mae"],
    )
    return model

  x, y = _data(3)
  clean = compiled()
  _fit(clean, *_without(x, y, 3), [_callback("skip")])
  model = compiled()
  callback = _callback("skip")
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  common.assert_bits_equal(_state(clean), _state(model))


def test_skip_puts_back_what_the_step_writes_outside_the_update():
  # Batch-norm statistics and the metrics (written by the forward pass and
  # the logs' running means); not the weights or Adam's state, which only
  # the skipped update writes. (The exactness is the test above's.)
  x, y = _data(3)
  model = _compiled()
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")
  _fit(model, x, y, [callback], epochs=1)
  restored = set(_tf_names(callback._keeper._undo._restored))  # pylint: disable=protected-access
  metrics = set(_tf_names(v for m in model.metrics for v in m.variables))
  assert metrics and metrics <= restored
  bn = model.get_layer("bn")
  assert set(_tf_names([bn.moving_mean, bn.moving_variance])) <= restored
  written_only_by_the_update = set(
    _tf_names(model.trainable_variables + model.optimizer.variables)
  )
  assert not restored & written_only_by_the_update


def _tf_names(variables):
  """The names of the `tf.Variable`s behind `variables` (Keras 3's too)."""
  out = []
  for v in variables:
    inner = _keras.keras_variable_value(v) if common.KERAS_3 else v
    out.append((inner if inner is not None else v).name)
  return out


def test_negative_control_the_callback_mode_with_steps_per_execution_differs():
  # Snapshots from batch hooks with steps_per_execution=4: a rollback also
  # undoes the 3 good steps of that execution, so the comparison above can
  # fail, and does for the mode without in_step.
  x, y = _data(3)
  clean = _compiled(4)
  _fit(clean, *_without(x, y, 3))
  model = _compiled(4)
  callback = snapstore.SnapshotCallback(every_n_batches=1)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  weights = len(model.trainable_variables)
  assert (
    _differing(
      common.values(clean.trainable_variables),
      common.values(model.trainable_variables),
    )
    == weights
  )


@pytest.mark.parametrize("undo", UNDO)
@pytest.mark.parametrize("bad", [3, 0])
def test_in_step_with_xla_is_exact_against_the_same_program(undo, bad):
  # XLA fuses the step with the in-step ops otherwise than the bare step
  # (FINDINGS section 6: batch-norm statistics then differ in the last bit
  # from a run without the callback). The reference is the same compiled
  # program, trained with the callback on the data without the bad batch.
  x, y = _data(bad)
  clean = _compiled(4, jit_compile=True)
  reference = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  _fit(clean, *_without(x, y, bad), callbacks=[reference])
  assert reference.rollbacks == 0
  model = _compiled(4, jit_compile=True)
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  common.assert_bits_equal(_state(clean), _state(model))


@common.needs_keras_3
@pytest.mark.parametrize("undo", UNDO)
def test_in_step_rolls_the_dropout_seed_state_back(undo):
  x, y = _data(3)
  clean = _compiled(4, dropout=True)
  _fit(clean, *_without(x, y, 3))
  model = _compiled(4, dropout=True)
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  if undo == "copy":
    assert any("seed_generator" in k for k in callback.store.keys)
  common.assert_bits_equal(_state(clean), _state(model))


def _store_without_metrics(model):
  return snapstore.SnapshotStore(
    var_list=model, optimizer=model.optimizer, max_to_keep=1
  )


def test_in_step_with_a_store_of_your_own_restores_the_metrics_too():
  # The store covers the model and the optimizer; the metric variables
  # (the logs' running means) are restored from the step's start as well,
  # or every later step's logs would stay NaN.
  x, y = _data(3)
  clean = _compiled(4)
  _fit(clean, *_without(x, y, 3))
  model = _compiled(4)
  callback = snapstore.SnapshotCallback(
    _store_without_metrics, in_step=True, in_step_tag="ok"
  )
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  assert not any(k.startswith("metrics/") for k in callback.store.keys)
  assert callback.store.slots.pinned() == ["ok"]
  common.assert_bits_equal(_state(clean), _state(model))
  assert np.all(np.isfinite(history.history["loss"]))


def test_a_tag_as_in_step_is_deprecated_and_means_in_step_tag():
  # in_step is True or False; the slot's tag is in_step_tag. The old
  # spelling, a tag as in_step, warns and fits as the new one does.
  x, y = _data(3)
  new = _compiled(4)
  _fit(
    new,
    x,
    y,
    [
      snapstore.SnapshotCallback(
        _store_without_metrics, in_step=True, in_step_tag="ok"
      )
    ],
  )
  model = _compiled(4)
  with pytest.warns(
    DeprecationWarning,
    match=r"SnapshotCallback\(in_step='ok'\) is deprecated: in_step is True "
    r"or False; pass in_step=True, in_step_tag='ok'",
  ):
    callback = snapstore.SnapshotCallback(_store_without_metrics, in_step="ok")
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  assert callback.store.slots.pinned() == ["ok"]
  common.assert_bits_equal(_state(new), _state(model))


@pytest.mark.parametrize("undo", UNDO)
def test_in_step_backoff_and_on_rollback_count_each_step(undo):
  x, y = _data(3)
  model = _compiled(4, learning_rate=0.01)
  calls = []
  callback = snapstore.SnapshotCallback(
    in_step=True,
    in_step_undo=undo,
    backoff=0.5,
    on_rollback=lambda: calls.append(1),
  )
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2 and len(calls) == 2
  want = np.float32(np.float32(0.01) * np.float32(0.5)) * np.float32(0.5)
  rate = np.asarray(model.optimizer.learning_rate.numpy())
  assert rate.tobytes() == np.float32(want).tobytes()


@pytest.mark.parametrize("how", ["every_batch"] + UNDO)
def test_backoff_cuts_the_rate_a_loss_scale_optimizer_applies(how):
  # Keras 3's LossScaleOptimizer has a learning rate of its own that nothing
  # reads; the cut went there, and the step kept 0.01.
  x, y = _data(3)
  model = common.small_model(seed=3)
  scaled = common.loss_scale_optimizer(keras.optimizers.Adam(0.01))
  model.compile(optimizer=scaled, loss="mse")
  callback = snapstore.SnapshotCallback(backoff=0.5, **_callback_args(how))
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  want = np.float32(np.float32(0.01) * np.float32(0.5)) * np.float32(0.5)
  rate = np.asarray(scaled.inner_optimizer.learning_rate.numpy())
  assert rate.tobytes() == np.float32(want).tobytes()


def test_in_step_weights_made_non_finite_by_an_update_roll_back_one_further():
  # The weights are poisoned right before step 3: its start is not finite,
  # so the slot (the start of step 2, whose loss was finite) is restored.
  x, y = _data()
  model = _compiled()
  recorder = _Recorder()

  class Poison(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      if batch == 3:
        # The output layer's (d1's can give a finite loss: common.spoil)
        kernel = self.model.get_layer("out").kernel
        kernel.assign(tf.fill(kernel.shape, np.float32(np.nan)))

  callback = snapstore.SnapshotCallback(in_step=True)
  _fit(model, x, y, [recorder, Poison(), callback], epochs=1)
  assert callback.rollbacks == 1
  common.assert_bits_equal(recorder.before[2], recorder.before[4])


def test_skip_weights_made_non_finite_by_an_update_raise():
  # As above: skipping keeps no older state to go back to, so the rollback
  # of step 3 (whose start is not finite) raises, naming the way out.
  x, y = _data()
  model = _compiled()

  class Poison(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      if batch == 3:
        model.get_layer("out").kernel.assign(
          tf.fill([8, 1], np.float32(np.nan))
        )

  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")
  with pytest.raises(
    snapstore.NonFiniteError,
    match=r"at batch 3, and the weights were already not finite when that "
    r"step started.*Use in_step_undo='copy'",
  ):
    _fit(model, x, y, [Poison(), callback], epochs=1)
  assert callback.rollbacks == 1
  assert "train_step" not in vars(model)


def _lowering_of_step_conds(model, x, y, callback):
  """{If op name: its _lower_using_switch_merge} in the wrapped step's trace."""
  seen = {}

  class Trace(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      if seen:
        return
      spec = (
        tf.TensorSpec([None] + list(x.shape[1:]), tf.float32),
        tf.TensorSpec([None] + list(y.shape[1:]), tf.float32),
      )
      step = self.model.train_step  # the callback's wrapper, during fit
      graph = tf.function(step).get_concrete_function(spec).graph
      for op in graph.get_operations():
        if op.type in ("If", "StatelessIf"):
          seen[op.name] = op.get_attr("_lower_using_switch_merge")

  _fit(model, x, y, [callback, Trace()], epochs=1)
  return seen


@pytest.mark.parametrize("undo", UNDO)
def test_in_step_rollback_branch_runs_as_a_call_not_as_dead_nodes(undo):
  # Lowered to switch/merge, the rollback branch's nodes pass through the
  # executor as dead ones at every step (1-2% of a small model's step,
  # bench/probe_in_step_cond.py): the decision's If stays a call,
  # and the rollbacks stay exact (the tests above). Skipping has two: the
  # put-back's (a call) and the update's, lowered: its ops then run in the
  # step's executor, and go through as dead ones only when skipped.
  x, y = _data(3)
  model = _compiled(1)
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  conds = _lowering_of_step_conds(model, x, y, callback)
  want = [False, True] if undo == "skip" else [False]
  assert sorted(conds.values()) == want, conds
  assert callback.rollbacks == 1


def test_a_fit_after_the_in_step_fit_runs_the_plain_step():
  # on_train_end put train_step back and re-made the train function: a fit
  # without the callback rolls nothing back (its loss goes NaN).
  x, y = _data(3)
  model = _compiled(4)
  callback = snapstore.SnapshotCallback(in_step=True)
  _fit(model, x, y, [callback], epochs=1)
  store = callback.store
  history = _fit(model, x, y, epochs=1)
  assert np.isnan(history.history["loss"][0])
  # The same callback on another model: rollbacks counted on.
  model2 = _compiled(4)
  _fit(model2, x, y, [callback], epochs=1)
  assert callback.store is not store  # another model: another store
  assert callback.rollbacks == 2


@pytest.mark.parametrize("undo", UNDO)
def test_in_step_too_many_consecutive_rollbacks_raise(undo):
  x, y = _data()
  common.spoil(x, y, slice(3 * B, None))  # batches 3.. are all bad
  model = _compiled()
  recorder = _Recorder()
  callback = snapstore.SnapshotCallback(
    in_step=True, in_step_undo=undo, max_consecutive_rollbacks=1
  )
  with pytest.raises(
    snapstore.NonFiniteError,
    match=r"^The loss is nan at batch 4: 2 rollbacks in a row, more than "
    r"max_consecutive_rollbacks=1",
  ):
    _fit(model, x, y, [recorder, callback], epochs=1)
  common.assert_bits_equal(
    recorder.before[3],
    common.values(common.state_variables(model, model.optimizer)),
  )
  assert "train_step" not in vars(model)  # put back before raising


@pytest.mark.parametrize(
  "undo, message",
  [
    ("copy", "no snapshot with finite weights to roll back to: neither"),
    ("skip", "the weights were already not finite when that step started"),
  ],
)
def test_in_step_without_finite_weights_raises(undo, message):
  x, y = _data()
  model = _compiled()
  # The output layer's: a NaN kernel of d1 can give a finite loss (common.spoil)
  model.get_layer("out").kernel.assign(tf.fill([8, 1], np.float32(np.nan)))
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  with pytest.raises(snapstore.NonFiniteError, match=message):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)


@pytest.mark.skipif(
  common.KERAS_3, reason="Keras 3 hands every callback Python numbers"
)
@pytest.mark.parametrize("undo", UNDO)
def test_in_step_takes_tf_keras_logs_as_tensors(undo):
  # tf-keras converts every batch's logs to numpy (a sync of each value)
  # unless every callback with batch hooks takes them as tensors; the
  # in-step callback reads one value, so it takes them as they come.
  class Recorder(keras.callbacks.Callback):
    def __init__(self):
      super(Recorder, self).__init__()
      self._supports_tf_logs = True
      self.kinds = set()

    def on_train_batch_end(self, batch, logs=None):
      self.kinds.update(tf.is_tensor(v) for v in logs.values())

  x, y = _data(bad=3)
  recorder = Recorder()
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo=undo)
  _fit(_compiled(), x, y, [callback, recorder], epochs=1)
  assert recorder.kinds == {True}
  assert callback.rollbacks == 1  # the bad batch seen through a tensor


def test_in_step_missing_monitor_key_is_refused_and_the_step_put_back():
  x, y = _data()
  model = _compiled()
  callback = snapstore.SnapshotCallback(in_step=True, monitor="acc")
  with pytest.raises(ValueError, match="The batch logs have no 'acc'"):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)
  _fit(model, x, y, epochs=1)  # the plain step again


def test_in_step_needs_a_store_with_device_slots():
  x, y = _data()
  model = _compiled()
  store = snapstore.SnapshotStore(var_list=model, mode="host")
  callback = snapstore.SnapshotCallback(store, in_step=True)
  with pytest.raises(ValueError, match="copies into a device slot in the"):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)


def test_in_step_store_function_must_return_a_store():
  x, y = _data()
  model = _compiled()
  callback = snapstore.SnapshotCallback(lambda m: 3, in_step=True)
  with pytest.raises(
    TypeError, match="The store function returned 3, not a SnapshotStore"
  ):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)


@pytest.mark.parametrize(
  "kwargs, error, message",
  [
    (dict(every_n_batches=1), ValueError, "every_n_batches/every_n_secs do"),
    (dict(every_n_secs=1.0), ValueError, "every_n_batches/every_n_secs do"),
    (dict(monitor=None), ValueError, r"pass monitor= \(e.g. 'loss'\)"),
    (dict(in_step_tag=""), TypeError, "A tag must be an int or a non-empty"),
    (
      dict(in_step_undo="fast"),
      ValueError,
      "Invalid in_step_undo 'fast'; must be one of copy, skip",
    ),
    (
      dict(in_step_undo="skip", in_step_tag="mine"),
      ValueError,
      r"copies nothing, so it needs in_step=True, with no store and no tag "
      r"of your own \(got in_step=True and in_step_tag='mine'\)",
    ),
    (
      dict(in_step=False, in_step_tag="mine"),
      ValueError,
      r"in_step_tag='mine'\) names the slot of in-step snapshots: pass "
      r"in_step=True too",
    ),
    (
      dict(in_step="mine", in_step_tag="other"),
      TypeError,
      r"a tag as in_step is the old spelling of in_step=True, "
      r"in_step_tag=<tag>",
    ),
    (
      dict(in_step_undo="skip", in_step=False),
      ValueError,
      r"needs in_step=True, .*\(got in_step=False\)",
    ),
    (
      dict(in_step_undo="skip", store=lambda model: None),
      ValueError,
      r"\(got in_step=True and a store\)",
    ),
  ],
)
def test_bad_in_step_options_are_refused(kwargs, error, message):
  kwargs.setdefault("in_step", True)
  with pytest.raises(error, match=message):
    snapstore.SnapshotCallback(**kwargs)


class OwnStep(keras.Sequential):
  """A model with a train step of its own (the default one, re-spelled)."""

  def train_step(self, data):
    return super(OwnStep, self).train_step(data)


def _refused_skip(model, message, monitor="loss"):
  """Fits `model` with a skip callback: refused at the first trace."""
  x, y = _data()
  callback = snapstore.SnapshotCallback(
    in_step=True, in_step_undo="skip", monitor=monitor
  )
  before = common.values(model.variables)
  with pytest.raises(ValueError, match=message):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)  # put back
  common.assert_bits_equal(before, common.values(model.variables))


def test_skip_refuses_a_train_step_of_your_own():
  model = OwnStep(common.small_model(seed=3).layers)
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  _fit(model, *_data(), epochs=1)  # built
  _refused_skip(
    model,
    r"cannot undo this train step by skipping its update: OwnStep has its "
    r"own train_step, so the logged 'loss' is not known where the "
    r"optimizer's update is called. Use in_step_undo='copy'",
  )


@common.needs_keras_3
def test_skip_refuses_a_retrace_without_the_update():
  # Keras 3's train step calls no update once no weight is trainable: a
  # retrace then (here forced after freezing the model mid-fit) has nothing
  # to gate, and says so instead of running unguarded.
  x, y = _data()

  class Freeze(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
      if batch == 2:
        self.model.trainable = False
        self.model.make_train_function(force=True)

  model = _compiled()
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")
  with pytest.raises(
    ValueError,
    match=r"the train step did not call the optimizer's apply_gradients "
    r"this time, though its first trace did; pass in_step_undo='copy'",
  ):
    _fit(model, x, y, [Freeze(), callback], epochs=1)
  assert "train_step" not in vars(model)


def test_skip_refuses_a_monitor_updated_after_the_update():
  # The compiled metrics are updated after the optimizer's update.
  _refused_skip(
    _compiled(),
    r"the train step updates 'mae' after the optimizer's update \(Keras "
    r"updates the compiled metrics after it, the loss before it\); monitor "
    r"'loss'. Use in_step_undo='copy'",
    monitor="mae",
  )


def test_skip_refuses_a_monitor_that_is_no_metric():
  _refused_skip(
    _compiled(), r"the logged 'acc' is no metric of the model", monitor="acc"
  )


def test_skip_refuses_a_step_writing_a_variable_outside_the_model():
  # A layer counting its calls in a variable the model does not track: a
  # skipped step could not put it back.
  calls = tf.Variable(0.0, trainable=False, name="outside_calls")

  class Counting(keras.layers.Layer):
    def call(self, x):
      calls.assign_add(1.0)
      return x

  keras.utils.set_random_seed(3)
  model = keras.Sequential(
    [keras.Input((3,)), Counting(), keras.layers.Dense(1, name="out")]
  )
  model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  _refused_skip(
    model,
    r"ops of the train step outside the optimizer's update may write "
    r"resources that are no variables of the model, its optimizer or its "
    r"metrics, which a skipped step would not put back \(.*AssignAdd",
  )


needs_two_cpus = pytest.mark.skipif(
  len(tf.config.list_logical_devices("CPU")) < 2,
  reason="needs two logical CPUs (tests/eager/conftest.py)",
)


def _components(model):
  """Every component of every state variable (metrics too), in order."""
  metrics = [
    _keras.keras_variable_value(v) if common.KERAS_3 else v
    for m in model.metrics
    for v in m.variables
  ]
  out = []
  for v in common.state_variables(model, model.optimizer) + metrics:
    out.extend(
      np.array(c.numpy(), copy=True) for c in getattr(v, "values", [v])
    )
  return out


@needs_two_cpus
@pytest.mark.parametrize("replica", [0, 1])
@pytest.mark.parametrize("in_step", [False, True])
def test_under_mirrored_strategy_every_replica_rolls_back_exactly(
  in_step, replica
):
  # Batch 3's bad sample is in one replica's half of the batch: the other
  # replica's own loss is finite, but the gradients are summed across
  # replicas, so both must undo the step. Every component (each replica's
  # metric totals too) ends as in the fit without that batch.
  strategy = common.mirrored()
  x, y = _data()
  common.spoil(x, y, 3 * B + replica * (B // 2) + 1)
  with strategy.scope():
    clean = _compiled()
  clean_history = _fit(clean, *_without(x, y, 3))
  with strategy.scope():
    model = _compiled()
  if in_step:
    callback = snapstore.SnapshotCallback(in_step=True)
  else:
    callback = snapstore.SnapshotCallback(every_n_batches=1)
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  expected, got = _components(clean), _components(model)
  assert len(got) > 40
  assert [a.tobytes() for a in got] == [a.tobytes() for a in expected]
  assert history.history["loss"] == clean_history.history["loss"]
  assert "train_step" not in vars(model)


def _weight_components(model):
  """Every component of the model's variables, as numpy arrays."""
  return [
    c.numpy()
    for v in common.state_variables(model, model.optimizer)[
      : len(model.variables)
    ]
    for c in getattr(v, "values", [v])
  ]


@needs_two_cpus
@pytest.mark.parametrize(
  "devices, replicas",
  [(["/cpu:0", "/cpu:1"], "2 replicas"), (["/cpu:0"], "1 replica")],
)
def test_skip_under_mirrored_strategy_is_refused_before_the_step_changes(
  devices, replicas
):
  # With one replica too: its update still merges in replica context, which
  # TensorFlow refuses inside the tf.cond (a RuntimeError from the trace).
  strategy = common.mirrored(devices)
  with strategy.scope():
    model = _compiled()
  before = _weight_components(model)
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")
  with pytest.raises(
    ValueError,
    match=r"in_step_undo='skip'\) cannot run under MirroredStrategy \(%s\): "
    r".* Use in_step_undo='copy'" % replicas,
  ):
    _fit(model, *_data(3), [callback], epochs=1)
  assert "train_step" not in vars(model)
  common.assert_bits_equal(before, _weight_components(model))


def test_skip_under_one_device_strategy_ends_as_without_the_batch():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  x, y = _data(3)
  with strategy.scope():
    clean = _compiled()
  _fit(clean, *_without(x, y, 3))
  with strategy.scope():
    model = _compiled()
  callback = snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")
  _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  common.assert_bits_equal(_state(clean), _state(model))


def _host_store(mode, tmp_path):
  """A store function: a host or disk store of the model and optimizer."""

  def make(model):
    options = {}
    if mode == "disk":
      options = dict(spill_path=str(tmp_path / "spill.h5"), memory_budget=0)
    return snapstore.SnapshotStore(
      var_list=model,
      optimizer=model.optimizer,
      mode=mode,
      max_to_keep=2,
      **options,
    )

  return make


@needs_two_cpus
@pytest.mark.parametrize("mode", ["host", "disk"])
def test_under_mirrored_strategy_host_mode_rolls_each_replica_back(
  mode, tmp_path
):
  # As above, with a host (disk) store. The batch-norm statistics are
  # written by each replica from its half of the batch: their replicas
  # differ, and each must come back as it was. Keras 3 makes them mirrored
  # (aggregation NONE), tf-keras and Keras 2 sync-on-read (MEAN), whose
  # host value is the mean of the replicas': host mode keeps every
  # component beside it.
  strategy = common.mirrored()
  x, y = _data()
  common.spoil(x, y, 3 * B + 1)
  with strategy.scope():
    clean = _compiled()
  clean_history = _fit(clean, *_without(x, y, 3))
  with strategy.scope():
    model = _compiled()
  callback = snapstore.SnapshotCallback(
    _host_store(mode, tmp_path), every_n_batches=1
  )
  history = _fit(model, x, y, [callback])
  assert callback.rollbacks == 2
  state = common.state_variables(model, model.optimizer)
  expected = _parts(common.state_variables(clean, clean.optimizer))
  got = _parts(state)
  assert len(got) > 30
  assert [a.tobytes() for a in got] == [a.tobytes() for a in expected]
  assert history.history["loss"] == clean_history.history["loss"]
  stats = [v for v in state if "moving_mean" in v.name]
  assert stats
  first, second = (c.numpy() for c in stats[0].values)
  assert first.tobytes() != second.tobytes()
  callback.store.close()


def _parts(variables):
  return [
    np.array(c.numpy(), copy=True)
    for v in variables
    for c in getattr(v, "values", [v])
  ]


@needs_two_cpus
@common.needs_keras_2
def test_in_step_under_replicas_refuses_state_made_in_the_first_step():
  # A subclassed tf-keras model has no symbolic outputs: its compiled
  # metrics are made in the first step, after the store. Refused at that
  # step's trace, before it runs: nothing changed, the step put back.
  class Net(keras.Model):
    def __init__(self):
      super(Net, self).__init__()
      self.dense = keras.layers.Dense(1)

    def call(self, x):
      return self.dense(x)

  strategy = common.mirrored()
  with strategy.scope():
    model = Net()
    model(np.zeros((1, 3), np.float32))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
  before = _components(model)
  x, y = _data()
  callback = snapstore.SnapshotCallback(in_step=True)
  with pytest.raises(
    ValueError,
    match=r"under MirroredStrategy with 2 replicas makes its store at "
    r"on_train_begin, but the first train step made more variables, .*"
    r"loss/total",
  ):
    _fit(model, x, y, [callback], epochs=1)
  assert "train_step" not in vars(model)
  got = _components(model)[: len(before)]
  assert [a.tobytes() for a in got] == [a.tobytes() for a in before]
