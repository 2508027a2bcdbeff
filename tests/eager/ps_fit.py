"""`SnapshotCallback` in tf-keras `fit` under ParameterServerStrategy (v2).

Run by tests/eager/test_parameter_server.py as a script of its own (the
strategy connects the process's eager context to the cluster): one worker
and two parameter servers on loopback ports, in-process servers, a model
whose first kernel is sharded across both servers. One worker: which worker
runs a scheduled step is the coordinator's choice, and each worker reads its
own copy of the dataset, so with two the order of the batches (and the
reference run below) would not be reproducible. Prints one line per check,
then "ALL OK"; a failed check raises.

    python tests/eager/ps_fit.py

Checks:
- `every_n_batches=1`: a batch whose loss is NaN is rolled back (the
  callback joins the coordinator first), and fit ends with the weights,
  Adam's slots and `iterations` bit-equal to a fit of the same model
  without that batch.
- `monitor=None`, `every_n_batches=2`: each snapshot waits for the steps
  scheduled before it.
- `in_step=True` is refused at `on_train_begin`, with the message, and the
  model is left as it was.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import snapstore  # noqa: E402
from tests.eager import common  # noqa: E402
from tests.eager import ps_cluster  # noqa: E402

keras = common.keras


def _cluster():
  # Shards of at most 64 bytes: the 3x8 float32 kernel in two shards.
  return ps_cluster.in_process_cluster(workers=1, max_shard_bytes=64)


def _model(strategy, weights=None):
  with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
      [
        keras.Input((3,)),
        keras.layers.Dense(8, activation="relu", name="d1"),
        keras.layers.Dense(1, name="out"),
      ]
    )
    # Adam: its slots and `iterations` must be rolled back too.
    model.compile(keras.optimizers.Adam(0.01), "mse")
  if weights is not None:
    model.set_weights(weights)
  return model


def _fit(model, x, y, callbacks):
  data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
  model.fit(
    data,
    epochs=1,
    steps_per_epoch=len(x) // 8,
    callbacks=callbacks,
    verbose=0,
  )


def _state(model):
  out = []
  for v in common.state_variables(model, model.optimizer):
    for part in getattr(v, "variables", [v]):  # a sharded one's shards
      out.append(np.array(part.numpy(), copy=True))
  return out


def _same(expected, actual, what):
  if len(expected) != len(actual) or any(
    a.dtype != b.dtype or a.tobytes() != b.tobytes()
    for a, b in zip(expected, actual)
  ):
    raise AssertionError("%s: %s != %s" % (what, expected, actual))


def check_rollback(strategy):
  model = _model(strategy)
  kernel = model.get_layer("d1").kernel
  if len(getattr(kernel, "variables", ())) != 2:
    raise AssertionError("d1's kernel is not in two shards: %r" % kernel)
  start = model.get_weights()
  x = np.concatenate([b[0] for b in common.batches(3)])[:40]
  y = np.concatenate([b[1] for b in common.batches(3)])[:40]
  good = x.copy()
  common.spoil(x, y, 16)  # batch 2 of 5
  losses, rollbacks = [], []

  class Losses(keras.callbacks.Callback):
    def __init__(self):
      super(Losses, self).__init__()
      self._supports_tf_logs = True  # batch hooks under PSS

    def on_train_batch_end(self, batch, logs=None):
      losses.append(float(logs.fetch()["loss"]))

  callback = snapstore.SnapshotCallback(
    every_n_batches=1, on_rollback=lambda: rollbacks.append(len(losses))
  )
  _fit(model, x, y, [Losses(), callback])
  # The logged loss is the epoch's running mean: finite again after the
  # rollback, which put the metrics back too.
  if (
    rollbacks != [3]
    or not np.isnan(losses[2])
    or not np.isfinite(losses[:2] + losses[3:]).all()
  ):
    raise AssertionError("rollbacks %s, losses %s" % (rollbacks, losses))
  state = _state(model)
  reference = _model(strategy, start)
  _fit(
    reference,
    np.delete(good, range(16, 24), axis=0),
    np.delete(y, range(16, 24), axis=0),
    [],
  )
  _same(_state(reference), state, "after the rollback vs without the batch")
  print("every_n_batches rollback: OK")


def check_unmonitored(strategy):
  """monitor=None: the steps between snapshots run unchecked (concurrently,
  with several workers); each snapshot waits for them (a store refuses to
  copy while scheduled steps run)."""
  model = _model(strategy)
  x = np.concatenate([b[0] for b in common.batches(3)])
  callback = snapstore.SnapshotCallback(every_n_batches=2, monitor=None)
  # 6 steps: snapshots at 0, 2 and 4, and one at the epoch's end (the
  # default store is rebuilt there to cover the metrics fit made).
  _fit(model, x, x[:, :1], [callback])
  if callback.snapshots != 4 or callback.rollbacks:
    raise AssertionError(
      "snapshots %d, rollbacks %d" % (callback.snapshots, callback.rollbacks)
    )
  print("monitor=None snapshots: OK")


def check_in_step_refused(strategy):
  model = _model(strategy)
  start = _state(model)
  x = np.concatenate([b[0] for b in common.batches(1)])
  callback = snapstore.SnapshotCallback(in_step=True)
  try:
    _fit(model, x, x[:, :1], [callback])
  except ValueError as e:
    message = str(e)
  else:
    raise AssertionError("in_step under ParameterServerStrategy: no error")
  for fragment in (
    "SnapshotCallback(in_step=True) cannot run under ParameterServerStrategy",
    "every_n_batches=",
  ):
    if fragment not in message:
      raise AssertionError("%r not in %r" % (fragment, message))
  if "train_step" in vars(model):
    raise AssertionError("the refused callback left train_step wrapped")
  _same(start, _state(model), "the refused fit changed the model")
  print("in_step refused: OK")


def main():
  servers, strategy = _cluster()
  check_rollback(strategy)
  check_unmonitored(strategy)
  check_in_step_refused(strategy)
  print("ALL OK")
  del servers


if __name__ == "__main__":
  main()
