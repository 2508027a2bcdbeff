"""An Estimator's chief under `ParameterServerStrategy` v1, with a SnapshotHook.

Run as `python -m tests.ps_estimator SPEC MODE OUT_DIR [TASK [HOOKS [MEET]]]`
(SPEC: the cluster as JSON, with one "chief" task and "ps" tasks served
elsewhere, e.g. by `tests/cluster.py`; TASK "chief" (default) or "worker",
task 0): it trains with `tf.estimator.train_and_evaluate`, as a task does
under a `TF_CONFIG` (the distribute coordinator starts the task's server
and configures the strategy), with a `SnapshotHook` of a `MODE` store and a
hook after it that records every variable after each step. HOOKS says where
they go: "train_spec" (default: every task runs them) or "chief_only"
(`EstimatorSpec(training_chief_hooks=...)` from model_fn). A worker's data
has no bad batch. With a directory MEET as 6th argument, the chief and a
worker meet there before they train (`meeting_hook`). It writes `OUT_DIR/steps.npz` (`<step>/<variable name>`: the values
after that step, rollback included; `start/<name>`: before the first) and
`OUT_DIR/report.json` (the hook's rollbacks, the store's keys, where each
variable and shadow sits). Used by tests/test_ps_estimator.py.
"""

import json
import os
import sys
import time

import numpy as np

BATCH = 8
BATCHES = 16
BAD_BATCH = 5  # its squared error overflows: an infinite loss
LEARNING_RATE = 0.01
MOMENTUM = 0.9
TRUE_W = [1.0, -2.0, 0.5, 0.25, -1.0, 3.0]


def data(bad=True):
  """The training set: (x, y), batch i being rows [8 i, 8 i + 8)."""
  rng = np.random.RandomState(1)
  x = rng.randn(BATCH * BATCHES, 6).astype(np.float32)
  if bad:
    x[BAD_BATCH * BATCH] = 1e30
  y = x.dot(np.asarray(TRUE_W, np.float32)).astype(np.float32)
  return x, y


def main(
  spec, store_mode, out_dir, task="chief", hooks="train_spec", meet=None
):
  os.environ["TF_CONFIG"] = json.dumps(
    {"cluster": spec, "task": {"type": task, "index": 0}}
  )
  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  tf.disable_v2_behavior()

  def model_fn(features, labels, mode):
    with tf.variable_scope("net"):
      w = tf.get_variable(
        "w",
        [6],
        initializer=tf.zeros_initializer(),
        partitioner=tf.fixed_size_partitioner(2),
      )
      b = tf.get_variable("b", [], initializer=tf.zeros_initializer())
    w = tf.concat(list(w), 0)
    loss = tf.reduce_mean(
      tf.square(tf.tensordot(features["x"], w, 1) + b - labels)
    )
    train_op = tf.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM).minimize(
      loss, global_step=tf.train.get_global_step()
    )
    chief_hooks = None
    if hooks == "chief_only":  # as README "Distributed training" shows
      made["snap"] = snapstore.SnapshotHook(
        lambda: snapstore.SnapshotStore(
          collection=tf.GraphKeys.GLOBAL_VARIABLES,
          mode=store_mode,
          max_to_keep=2,
        ),
        every_n_steps=2,
        loss=loss,
      )
      chief_hooks = [made["snap"], recorder]
    return tf.estimator.EstimatorSpec(
      mode, loss=loss, train_op=train_op, training_chief_hooks=chief_hooks
    )

  def input_fn():
    x, y = data(bad=task == "chief")
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).batch(BATCH)

  # In the TrainSpec (every task runs it): the store and the loss are found
  # in the graph model_fn builds.
  made = {
    "snap": snapstore.SnapshotHook(
      lambda: snapstore.SnapshotStore(
        collection=tf.GraphKeys.GLOBAL_VARIABLES,
        mode=store_mode,
        max_to_keep=2,
      ),
      every_n_steps=2,
      loss=lambda: tf.get_collection(tf.GraphKeys.LOSSES)[-1],
    )
  }
  recorder = recorder_hook(tf, snapstore)
  strategy = tf.distribute.experimental.ParameterServerStrategy()
  config = tf.estimator.RunConfig(
    train_distribute=strategy,
    log_step_count_steps=None,
    save_summary_steps=None,
    session_config=tf.ConfigProto(operation_timeout_in_ms=60000),
  )
  estimator = tf.estimator.Estimator(
    model_fn, model_dir=os.path.join(out_dir, "model"), config=config
  )
  tf.estimator.train_and_evaluate(
    estimator,
    tf.estimator.TrainSpec(
      input_fn,
      max_steps=None,  # until the data ends, however far others took it
      hooks=([made["snap"], recorder] if hooks == "train_spec" else [])
      + ([meeting_hook(tf, task, meet)] if meet else []),
    ),
    tf.estimator.EvalSpec(input_fn, steps=1),
  )
  snap = made["snap"]
  if snap.store is None:  # the hooks did not run on this task
    return
  np.savez(os.path.join(out_dir, "steps.npz"), **recorder.values)
  report = dict(
    recorder.report,
    rollbacks=snap.rollbacks,
    keys=list(snap.store.keys),
    strategy=type(strategy).__name__,
    replicas=strategy.num_replicas_in_sync,
  )
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f)


def meeting_hook(tf, task, where):
  """A hook that makes the chief and the worker train at the same time.

  Once its session is ready, the chief writes `where/chief` and waits (at
  most 60 s) for `where/worker`, which the worker writes once its session is
  ready: a test starts the worker after `where/chief` appears, so that the
  worker finds the variables initialized at its first check (otherwise it
  sleeps 30 s before the next).
  """

  class Meeting(tf.train.SessionRunHook):
    def after_create_session(self, session, coord):
      del session, coord
      with open(os.path.join(where, task), "w"):
        pass
      if task == "chief":
        deadline = time.time() + 60
        while time.time() < deadline:
          if os.path.exists(os.path.join(where, "worker")):
            return
          time.sleep(0.05)

  return Meeting()


def recorder_hook(tf, snapstore):
  """A hook that records every model variable after each step (a function:
  tf is imported only after TF_CONFIG is set)."""

  class Recorder(tf.train.SessionRunHook):
    def __init__(self):
      self.values = {}
      self.report = {}
      self._step = 0

    def begin(self):
      shadows = set(tf.get_collection(snapstore.SHADOW_VARIABLES))
      self._vars = [v for v in tf.global_variables() if v not in shadows]
      self.report["devices"] = {v.op.name: v.device for v in self._vars}
      self.report["shadows"] = {v.op.name: v.device for v in shadows}
      self.report["kinds"] = {v.op.name: type(v).__name__ for v in self._vars}

    def after_create_session(self, session, coord):
      del coord
      self._record("start", session)

    def after_run(self, run_context, run_values):
      del run_values
      self._record(str(self._step), run_context.session)
      self._step += 1

    def _record(self, step, session):
      for v, value in zip(self._vars, session.run(self._vars)):
        self.values["%s/%s" % (step, v.op.name)] = value

  return Recorder()


if __name__ == "__main__":
  main(json.loads(sys.argv[1]), *sys.argv[2:])
  sys.stdout.flush()
  os._exit(0)  # the chief's tf.train.Server cannot be stopped in TF 1.15
