#!/usr/bin/env python
"""Benchmark: the eager engine (TensorFlow 2.x) against what eager users write.

On a Keras model of `--layers` Dense(`--width`) layers (default 32 x
1448x1448 float32: 64 variables, 256 MiB, the issue's size), in one process, every method
interleaved round by round after warm-up; medians (and min) over rounds:

  device snapshot / restore     SnapshotStore(var_list=model, mode="device")
  hand snapshot / restore       a hand-written tf.function assigning each
                                variable into its own shadow (and back),
                                traced and run once before timing
  snapshot + update             the snapshot, then one in-place update of
                                every variable (assign_add of zeros, as a
                                step writes them): with copy on write the
                                memory copy is paid by that update, so this
                                is the pair to compare (hand-written the same)
  host snapshot / restore       SnapshotStore(mode="host")
  host restore + update         the restore, then the same update: a variable
                                of 1 MiB or more takes the snapshot's
                                (aligned) array without a copy, and copies it
                                at its next write (copy on write), so this is
                                the pair to compare, against a warm memcpy
                                followed by the update
  memcpy (warm)                 np.copyto of every value into preallocated
                                arrays: the floor for a host snapshot
  get_weights / set_weights     model.get_weights() / model.set_weights()
  round trip                    device snapshot + restore
  Checkpoint write + read       tf.train.Checkpoint(model=...).write/read on
                                tmpfs (/dev/shm) when it exists

a mirrored store (MirroredStrategy over two logical CPUs, the model made in
its scope) against the same model on one device, device and host mode (a
mirrored device snapshot copies both replicas' components),

and, on a training step (`--step-width`, default a 1024-1024-1 MLP with Adam,
batch 256), the in-step snapshot (`store.slots.snapshot_in_step()`, begin at
the top and commit after the update) against the bare compiled step; and `fit` per batch (the second epoch of a 2-epoch
fit, `--fit-batches` batches, timed by a callback) bare, with
`SnapshotCallback(every_n_batches=1)`, with `SnapshotCallback(in_step=True)`
(copying the state in every step), with `SnapshotCallback(in_step=True,
in_step_undo="skip")` (the update skipped when the loss is not finite, no
copy) and with a callback calling an empty traced function per batch (the floor of
any hook that runs TensorFlow work),
on the tests' small model (Dense 8 - BatchNorm - Dense 1, batch 32), on an
MLP of the size of Keras's MNIST example (784-128-10, batch 128), on
the `--step-width` MLP (batch 256; 3.2 M parameters, so that copying its
state with Adam's moments, 38 MiB, is a memory-bound part of the step) and
on a small CNN (3x3 convolutions of 32 and 48 channels on 24x24x3 images,
batch 64, 20 batches an epoch: a compute-bound step of >= 20 ms with a
small state): targets <= 1.05x on the small models, <= 1.02x on the steps
of >= 20 ms.

    .venv-tf2/bin/python bench/bench_eager.py
    .venv-tf2/bin/python bench/bench_eager.py --layers 8 --width 512 --repeats 5
    .venv-tf2/bin/python bench/bench_eager.py --json bench/results/eager.json
    .venv-tf2/bin/python bench/bench_eager.py --fit-only --repeats 7

On TensorFlow 1.15 (no eager engine) it prints that and exits 0.
"""

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import snapstore  # noqa: E402
from snapstore import _tf  # noqa: E402
from snapstore import _keras


def parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__.splitlines()[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--layers", type=int, default=32)
  p.add_argument("--width", type=int, default=1448)
  p.add_argument("--step-width", type=int, default=1024)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument(
    "--fit-batches", type=int, default=100, help="batches per fit epoch"
  )
  p.add_argument(
    "--fit-only",
    action="store_true",
    help="only the fit rows (SnapshotCallback vs bare fit)",
  )
  p.add_argument(
    "--copies-only",
    action="store_true",
    help="only the copy rows (device, host, mirrored), no fit rows",
  )
  p.add_argument("--json", default=None, help="write the figures here")
  return p.parse_args(argv)


def timed(fn):
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def rounds(methods, repeats, warmup):
  """{name: [seconds]}: every method once per round, rotating the start."""
  names = list(methods)
  out = dict((n, []) for n in names)
  for r in range(warmup + repeats):
    order = names[r % len(names) :] + names[: r % len(names)]
    for name in order:
      t = timed(methods[name])
      if r >= warmup:
        out[name].append(t)
  return out


def copies_bench(args, tf, keras):
  keras.utils.set_random_seed(0)
  layers = [keras.Input((args.width,))]
  layers += [keras.layers.Dense(args.width) for _ in range(args.layers)]
  model = keras.Sequential(layers)
  variables = [
    _keras.keras_variable_value(v) if _keras.is_keras_3_object(v) else v
    for v in model.weights
  ]
  nbytes = sum(v.numpy().nbytes for v in variables)
  device = snapstore.SnapshotStore(var_list=model, mode="device")
  host = snapstore.SnapshotStore(var_list=model, mode="host", name="host")
  with tf.init_scope():
    shadows = [
      tf.Variable(v.value(), trainable=False, name="hand") for v in variables
    ]

  @tf.function(autograph=False)
  def hand_snapshot():
    for s, v in zip(shadows, variables):
      s.assign(v, read_value=False)

  @tf.function(autograph=False)
  def hand_restore():
    for s, v in zip(shadows, variables):
      v.assign(s, read_value=False)

  zeros = [tf.zeros_like(v) for v in variables]

  @tf.function(autograph=False)
  def update():
    for v, z in zip(variables, zeros):
      v.assign_add(z, read_value=False)

  buffers = [np.empty(v.shape, v.dtype.as_numpy_dtype) for v in variables]
  values = [v.numpy() for v in variables]

  def memcpy():
    for b, a in zip(buffers, values):
      np.copyto(b, a)

  weights = model.get_weights()
  tmp = "/dev/shm" if os.path.isdir("/dev/shm") else None
  ckpt_dir = tempfile.mkdtemp(prefix="snapstore-bench-", dir=tmp)
  checkpoint = tf.train.Checkpoint(model=model)
  prefix = os.path.join(ckpt_dir, "ckpt")

  def ckpt_round_trip():
    path = checkpoint.write(prefix)
    checkpoint.read(path).assert_consumed()

  for fn in (hand_snapshot, hand_restore, update):
    fn()
  device.snapshot(0)
  host.snapshot(0)
  methods = {
    "device snapshot": lambda: device.snapshot(0),
    "hand snapshot": hand_snapshot,
    "device restore": lambda: device.restore(0),
    "hand restore": hand_restore,
    "device snapshot + update": lambda: (device.snapshot(0), update()),
    "hand snapshot + update": lambda: (hand_snapshot(), update()),
    "update": update,
    "host snapshot": lambda: host.snapshot(0),
    "memcpy (warm)": memcpy,
    "get_weights": model.get_weights,
    "host restore": lambda: host.restore(0),
    "host restore + update": lambda: (host.restore(0), update()),
    "memcpy + update": lambda: (memcpy(), update()),
    "set_weights": lambda: model.set_weights(weights),
    "round trip": lambda: (device.snapshot(0), device.restore(0)),
    "Checkpoint write + read": ckpt_round_trip,
  }
  results = rounds(methods, args.repeats, args.warmup)
  device.close()
  host.close()
  return results, nbytes, len(variables), tmp


def mirrored_bench(args, tf, keras):
  """Device and host stores of one model, mirrored on two CPUs and not."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

  def model():
    keras.utils.set_random_seed(0)
    layers = [keras.Input((args.width,))]
    layers += [keras.layers.Dense(args.width) for _ in range(args.layers // 4)]
    return keras.Sequential(layers)

  single = model()
  with strategy.scope():
    mirrored = model()
  stores = {}
  for label, m in (("single", single), ("mirrored", mirrored)):
    for mode in ("device", "host"):
      store = snapstore.SnapshotStore(var_list=m, mode=mode, name=label + mode)
      store.snapshot(0)
      stores[(label, mode)] = store
  methods = {}
  for (label, mode), store in stores.items():
    methods["%s %s snapshot" % (label, mode)] = lambda s=store: s.snapshot(0)
    methods["%s %s restore" % (label, mode)] = lambda s=store: s.restore(0)
  results = rounds(methods, args.repeats, args.warmup)
  for store in stores.values():
    store.close()
  return results


def step_bench(args, tf, keras):
  keras.utils.set_random_seed(0)
  w = args.step_width
  model = keras.Sequential(
    [
      keras.Input((w,)),
      keras.layers.Dense(w, activation="relu"),
      keras.layers.Dense(w, activation="relu"),
      keras.layers.Dense(1),
    ]
  )
  opt = keras.optimizers.Adam(1e-4)
  opt.build(model.trainable_variables)
  store = snapstore.SnapshotStore(var_list=model, optimizer=opt, max_to_keep=2)
  snap = store.slots.snapshot_in_step()
  rng = np.random.RandomState(0)
  x = tf.constant(rng.rand(256, w).astype(np.float32))
  y = tf.constant(rng.rand(256, 1).astype(np.float32))

  def make(in_step):
    @tf.function
    def step():
      start = snap.begin() if in_step else None
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
      grads = tape.gradient(loss, model.trainable_variables)
      opt.apply_gradients(zip(grads, model.trainable_variables))
      if in_step:
        start.commit(if_finite=loss)
      return loss

    return step

  bare, with_snap = make(False), make(True)
  bare()
  with_snap()
  methods = {
    "bare step": lambda: bare().numpy(),
    "step + in-step snapshot": lambda: with_snap().numpy(),
    "step, then store.snapshot()": lambda: (
      bare().numpy(),
      store.snapshot("s"),
    ),
  }
  return rounds(methods, args.repeats, args.warmup)


class EpochTimer(object):
  """Seconds per batch of each epoch after the first (callbacks made by
  `make`, so that the class is a callback of the Keras in use)."""

  @staticmethod
  def make(keras, batches):
    class Timer(keras.callbacks.Callback):
      def __init__(self):
        super(Timer, self).__init__()
        self.per_batch = []

      def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

      def on_epoch_end(self, epoch, logs=None):
        if epoch > 0:  # the first epoch traces the train function
          took = time.perf_counter() - self._start
          self.per_batch.append(took / batches)

    return Timer()


class _EmptyCall(object):
  """A callback calling an empty traced function before every batch."""

  @staticmethod
  def make(tf, keras):
    empty = tf.function(lambda: tf.constant(0), autograph=False)
    empty = empty.get_concrete_function()

    class EmptyCall(keras.callbacks.Callback):
      def on_train_batch_begin(self, batch, logs=None):
        empty()

      def on_train_batch_end(self, batch, logs=None):
        pass  # a batch-end hook, as SnapshotCallback has

    return EmptyCall()


def fit_bench(args, tf, keras, width, batch, label, batches=None):
  """`fit` per batch: bare, SnapshotCallback every batch, and in-step.

  One model per method (same weights), one 2-epoch `fit` per method and
  round, interleaved; the second epoch is timed (the first traces).
  `width` None: the tests' small model; "mnist": an MLP of the size of
  Keras's MNIST example (784-128-10, 0.1 M parameters); "cnn": a small convolutional net on
  24x24x3 images (compute-bound, 15k parameters); else an MLP that wide.
  """
  rng = np.random.RandomState(0)
  batches = batches or args.fit_batches
  n = batches * batch
  shape = {None: (3,), "cnn": (24, 24, 3), "mnist": (784,)}.get(width, (width,))
  x = rng.rand(n, *shape).astype(np.float32)
  y = rng.rand(n, 10 if width == "mnist" else 1).astype(np.float32)

  def model():
    keras.utils.set_random_seed(0)
    if width == "cnn":
      layers = [
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(48, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1),
      ]
    elif width == "mnist":  # the size of Keras's MNIST MLP example
      layers = [
        keras.Input(shape),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
      ]
    elif width is None:  # the tests' model: Dense 8 - BatchNorm - Dense 1
      layers = [
        keras.Input((3,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(1),
      ]
    else:
      layers = [
        keras.Input((width,)),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(1),
      ]
    m = keras.Sequential(layers)
    m.compile(
      optimizer=keras.optimizers.Adam(1e-4), loss="mse", metrics=["mae"]
    )
    return m

  setups = {
    "fit, bare": (model(), lambda: []),
    "fit + callback every batch": (
      model(),
      lambda: [snapstore.SnapshotCallback(every_n_batches=1)],
    ),
    "fit + in-step callback": (
      model(),
      lambda: [snapstore.SnapshotCallback(in_step=True)],
    ),
    "fit + in-step skip callback": (
      model(),
      lambda: [snapstore.SnapshotCallback(in_step=True, in_step_undo="skip")],
    ),
    # The floor of any batch hook that runs TensorFlow work: one call of an
    # empty traced function per batch (what a hook-taken snapshot cannot
    # cost less than).
    "fit + empty function per batch": (
      model(),
      lambda: [_EmptyCall.make(tf, keras)],
    ),
  }
  timers = dict((name, []) for name in setups)
  names = list(setups)
  for r in range(args.warmup + args.repeats):
    order = names[r % len(names) :] + names[: r % len(names)]
    for name in order:
      m, callbacks = setups[name]
      timer = EpochTimer.make(keras, batches)
      m.fit(
        x,
        y,
        batch_size=batch,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks() + [timer],
      )
      if r >= args.warmup:
        timers[name].extend(timer.per_batch)
  return dict(("%s (%s)" % (k, label), v) for k, v in timers.items())


def main(argv=None):
  args = parse_args(argv)
  if _tf.VERSION[0] < 2:
    print(
      "bench_eager: the eager engine needs TensorFlow 2.x; on %s, skipped."
      % _tf.stack()
    )
    return 0
  tf = _tf.tf2
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(  # for the mirrored rows
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
  )
  keras = tf.keras
  print(
    "on %s, Keras %s"
    % (
      _tf.stack(),
      "3" if _keras.uses_keras_3() else "2 (tf-keras)",
    )
  )
  print("load average: %.2f %.2f %.2f" % os.getloadavg())
  results, nbytes, count, tmp = {}, 0, 0, None
  if not args.fit_only:
    results, nbytes, count, tmp = copies_bench(args, tf, keras)
    results.update(mirrored_bench(args, tf, keras))
    results.update(step_bench(args, tf, keras))
  if not args.copies_only:
    results.update(fit_bench(args, tf, keras, None, 32, "small"))
    results.update(fit_bench(args, tf, keras, "mnist", 128, "MNIST MLP"))
    results.update(fit_bench(args, tf, keras, args.step_width, 256, "MLP"))
    results.update(fit_bench(args, tf, keras, "cnn", 64, "CNN", batches=20))
  med = dict((k, float(np.median(v)) * 1e3) for k, v in results.items())
  low = dict((k, float(np.min(v)) * 1e3) for k, v in results.items())
  print(
    "\n%d variables, %.0f MiB; %d rounds after %d warm-up"
    % (count, nbytes / 2**20, args.repeats, args.warmup)
  )
  print("%-46s %10s %10s" % ("method", "median ms", "min ms"))
  for k in results:
    print("%-46s %10.3f %10.3f" % (k, med[k], low[k]))
  ratios = (
    []
    if args.fit_only
    else [
      ("device snapshot / hand", "device snapshot", "hand snapshot", 1.05),
      ("device restore / hand", "device restore", "hand restore", 1.05),
      (
        "snapshot + update / hand",
        "device snapshot + update",
        "hand snapshot + update",
        1.05,
      ),
      ("host snapshot / memcpy", "host snapshot", "memcpy (warm)", 1.3),
      ("host restore / memcpy", "host restore", "memcpy (warm)", None),
      (
        "host restore + update / memcpy + update",
        "host restore + update",
        "memcpy + update",
        1.3,
      ),
      ("host snapshot / get_weights", "host snapshot", "get_weights", None),
      ("host restore / set_weights", "host restore", "set_weights", None),
      (
        "round trip / Checkpoint (%s)" % (tmp or "tmp dir"),
        "round trip",
        "Checkpoint write + read",
        None,
      ),
      (
        "mirrored device snapshot / single",
        "mirrored device snapshot",
        "single device snapshot",
        None,
      ),
      (
        "mirrored device restore / single",
        "mirrored device restore",
        "single device restore",
        None,
      ),
      (
        "mirrored host snapshot / single",
        "mirrored host snapshot",
        "single host snapshot",
        None,
      ),
      (
        "mirrored host restore / single",
        "mirrored host restore",
        "single host restore",
        None,
      ),
      (
        "in-step step / bare step",
        "step + in-step snapshot",
        "bare step",
        None,
      ),
      (
        "step + snapshot() / bare",
        "step, then store.snapshot()",
        "bare step",
        None,
      ),
    ]
  )
  for label, target in (
    ("small", 1.05),
    ("MNIST MLP", 1.05),
    ("MLP", 1.02),
    ("CNN", 1.02),
  ):
    ratios += [
      (
        "fit + callback / bare (%s)" % label,
        "fit + callback every batch (%s)" % label,
        "fit, bare (%s)" % label,
        target,
      ),
      (
        "fit + in-step / bare (%s)" % label,
        "fit + in-step callback (%s)" % label,
        "fit, bare (%s)" % label,
        target,
      ),
      (
        "fit + in-step skip / bare (%s)" % label,
        "fit + in-step skip callback (%s)" % label,
        "fit, bare (%s)" % label,
        target,
      ),
      (
        "fit + empty call / bare (%s)" % label,
        "fit + empty function per batch (%s)" % label,
        "fit, bare (%s)" % label,
        None,
      ),
    ]
  # "paired": the median over rounds of each round's ratio (both methods
  # timed in the same round, one after the other), which a drift of the
  # machine's speed across rounds moves less than a ratio of medians.
  print(
    "\n%-38s %8s %8s %8s %8s" % ("ratio", "median", "min", "paired", "target")
  )
  out = {"stack": _tf.stack(), "median_ms": med, "min_ms": low, "ratios": {}}
  for label, a, b, target in ratios:
    if a not in med:  # a row this run left out (--copies-only, --fit-only)
      continue
    r, m = med[a] / med[b], low[a] / low[b]
    paired = float(np.median(np.array(results[a]) / np.array(results[b])))
    out["ratios"][label] = {
      "median": r,
      "min": m,
      "paired": paired,
      "target": target,
    }
    print(
      "%-38s %8.3f %8.3f %8.3f %8s"
      % (label, r, m, paired, "<= %.2f" % target if target else "-")
    )
  print("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
