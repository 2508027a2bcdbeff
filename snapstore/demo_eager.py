"""The demo's eager run (TensorFlow 2.x): the same story with a Keras model.

    python -m snapstore.demo --engine eager [--steps 300] [--modes device host disk]

For each copy mode, trains a Keras classifier with Adam in a `tf.function`
train step (GradientTape) on the demo's data. Every 20 steps it takes a
snapshot of the model and Adam's state (moments and iteration count). At two
steps the learning rate spikes, the loss explodes, and the run rolls back to
the newest snapshot, bit for bit, and carries on. At the end it evaluates
every held snapshot next to the current parameters on held-out data with
`evaluate_with` (a Python function called with the snapshot's values in
place) and prints timings per mode. `python -m snapstore.demo` runs this
after the graph-mode run on TensorFlow 2.x, in a process of its own (a
program is either eager or TF1-style).
"""

import importlib.util
import os
import tempfile
import time

import numpy as np

import snapstore
from snapstore._tf import tf2 as tf
from snapstore._keras import uses_keras_3
from snapstore import demo


def keras_module():
  """The Keras `tf.keras` is: Keras 3, or tf-keras / Keras 2."""
  return tf.keras


def keras_name():
  if uses_keras_3():
    return "Keras 3"
  return "tf-keras" if importlib.util.find_spec("tf_keras") else "Keras 2"


def _model(features, classes, hidden=64):
  keras = keras_module()
  keras.utils.set_random_seed(0)
  model = keras.Sequential(
    [
      keras.Input((features,)),
      keras.layers.Dense(hidden, activation="relu", name="dense"),
      keras.layers.Dense(hidden, activation="relu", name="dense_1"),
      keras.layers.Dense(classes, name="logits"),
    ],
    name="classifier",
  )
  return model, keras.optimizers.Adam(demo.LEARNING_RATE)


def run_mode(mode, steps, data, spikes, out):
  """Trains with an eager store in `mode`; returns the Timer and a summary."""
  (train_x, train_y), (test_x, test_y) = data
  rng = np.random.RandomState(1)
  model, opt = _model(train_x.shape[1], int(train_y.max()) + 1)
  loss_fn = keras_module().losses.SparseCategoricalCrossentropy(
    from_logits=True
  )

  @tf.function
  def train_step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss

  @tf.function
  def evaluate(x, y):
    logits = model(x)
    accuracy = tf.reduce_mean(
      tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32)
    )
    return accuracy, loss_fn(y, logits)

  with tempfile.TemporaryDirectory(prefix="snapstore-demo-") as tmp:
    options = {}
    if mode == "disk":  # one snapshot in memory, the older ones in the file
      opt.build(model.trainable_variables)
      rate = opt.learning_rate  # kept out of snapshots
      nbytes = sum(
        v.numpy().nbytes
        for v in list(model.variables) + list(opt.variables)
        if v is not rate
      )
      options = {
        "spill_path": os.path.join(tmp, "spill.h5"),
        "memory_budget": nbytes,
      }
    store = snapstore.SnapshotStore(
      var_list=model, optimizer=opt, mode=mode, max_to_keep=3, **options
    )
    try:
      return _train(
        mode,
        store,
        model,
        opt,
        train_step,
        evaluate,
        steps,
        data,
        spikes,
        rng,
        out,
      )
    finally:
      store.close()


def _train(
  mode, store, model, opt, train_step, evaluate, steps, data, spikes, rng, out
):
  (train_x, train_y), (test_x, test_y) = data
  timer = demo.Timer()
  out(
    "[eager %s] store covers %d variables (%d KiB per snapshot): model, Adam "
    "moments and iterations"
    % (mode, len(store.keys), store.param_nbytes // 1024)
  )
  spikes, rollbacks, step_of, recent = set(spikes), 0, {}, []
  for _ in range(steps):
    step = int(opt.iterations.numpy())
    if step % demo.SNAPSHOT_EVERY == 0:
      step_of[timer.time("snapshot", store.snapshot)] = step
    batch = rng.randint(0, len(train_x), 64)
    x, y = train_x[batch], train_y[batch]
    if step in spikes:  # once: a replayed step after a rollback is normal
      spikes.discard(step)
      opt.learning_rate.assign(demo.SPIKE_LEARNING_RATE)
    loss = float(train_step(x, y))
    opt.learning_rate.assign(demo.LEARNING_RATE)
    check = float(evaluate(x, y)[1])  # the same batch, after the step
    median = float(np.median(recent)) if recent else None
    if demo.diverged(check, median):
      tag = store.tags()[-1]
      timer.time("restore", store.restore, tag)
      rollbacks += 1
      out(
        demo.rollback_line(
          "eager " + mode, step, check, median, tag, int(opt.iterations.numpy())
        )
      )
      continue
    recent = (recent + [loss])[-20:]
  current = [float(v) for v in evaluate(test_x, test_y)]
  for tag in store.tags():  # every held snapshot next to the current values
    past = timer.time(
      "evaluate_with",
      store.evaluate_with,
      lambda: [float(v) for v in evaluate(test_x, test_y)],
      tag=tag,
    )
    out(
      "[eager %s] held-out data: snapshot %r (step %d, %s) accuracy %.3f "
      "loss %.3f" % (mode, tag, step_of[tag], store.files.tier(tag), *past)
    )
  out(
    "[eager %s] held-out data: current (step %d)    accuracy %.3f loss %.3f"
    % (mode, int(opt.iterations.numpy()), *current)
  )
  # evaluate_with left the current parameters as they were, bit for bit.
  assert [float(v) for v in evaluate(test_x, test_y)] == current
  for _ in range(20):  # more timed calls, for steadier figures
    timer.time("evaluate_with", store.evaluate_with, lambda: None)
    timer.time("restore", store.restore)
  return timer, {"rollbacks": rollbacks, "accuracy": current[0]}


def main(steps, modes):
  """Runs the eager demo in every mode; 0 if every spike was rolled back."""
  data = demo.make_data()
  spikes = demo.spike_steps(steps)
  print(
    "\nsnapstore %s eager demo (%s, tf.function train step): %d steps per "
    "mode, learning-rate spikes at steps %s"
    % (snapstore.__version__, keras_name(), steps, sorted(spikes))
  )
  results = {}
  for mode in modes:
    start = time.perf_counter()
    results[mode] = run_mode(mode, steps, data, spikes, print) + (
      time.perf_counter() - start,
    )
  return demo.report(results, spikes, "eager")
