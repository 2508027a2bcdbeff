"""A Q-learner with a target network kept in a snapstore device slot.

    python examples/target_network.py [--steps 1500] [--tau 0.05]

The task is a chain of states 0..N-1: "right" moves one state right, "left" one
state left (or stays at 0); reaching the last state pays 1 and ends the
episode. The optimal values are known exactly (value iteration in numpy), so
the learner can be checked.

The Q-network is trained on every transition with the TD target

    r + gamma * max_a Q_target(s', a)

where Q_target is the same network with its parameters from a snapshot: a
`SnapshotStore(mode="device")` slot pinned under the tag "target". By default
the target is refreshed with a hard copy every `--sync` steps
(`store.snapshot("target")`); with `--tau` it is a Polyak average updated in
the train step (`snapstore.MovingAverage(store, tau, form="lerp")`: the
`(1 - tau) * target + tau * online` of trfl and tf-agents, bit for bit). The
targets are computed with `store.evaluate_with(..., tag="target")`, which
leaves the online parameters exactly as they were.
"""

import argparse
import importlib.util
import os
import sys

import numpy as np

# Before TensorFlow is imported: without its start-up notices (no GPU,
# oneDNN, CPU build options) and warnings; see snapstore/_tf_startup.py.
os.environ.setdefault("SNAPSTORE_QUIET_TF", "1")
# TF 2.16+ takes tf.compat.v1.layers and tf.keras from tf-keras (TF1-style
# Keras) only with this set before TensorFlow is imported; where tf-keras
# is not installed (TF 1.15, 2.15), tf.keras is TensorFlow's own.
if importlib.util.find_spec("tf_keras") is not None:
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import snapstore  # pylint: disable=g-import-not-at-top
import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x (1.15's default)

GAMMA = 0.9
LEFT, RIGHT = 0, 1


def transitions(num_states):
  """Every (state, action, reward, next state, done) of the chain."""
  out = []
  for s in range(num_states - 1):  # the last state is terminal
    for a in (LEFT, RIGHT):
      s2 = max(s - 1, 0) if a == LEFT else s + 1
      done = s2 == num_states - 1
      out.append((s, a, 1.0 if done else 0.0, s2, done))
  return out


def optimal_q(num_states):
  """Q* by value iteration."""
  q = np.zeros((num_states, 2))
  for _ in range(200):
    v = q.max(axis=1)
    v[-1] = 0.0
    new = np.zeros_like(q)
    for s, a, r, s2, done in transitions(num_states):
      new[s, a] = r + (0.0 if done else GAMMA * v[s2])
    q = new
  return q


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--states", type=int, default=6)
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument(
    "--sync",
    type=int,
    default=50,
    help="hard target update every this many steps",
  )
  parser.add_argument(
    "--tau",
    type=float,
    default=None,
    help="instead: Polyak target update with this rate each step",
  )
  args = parser.parse_args(argv)
  tf.logging.set_verbosity(tf.logging.ERROR)

  n = args.states
  data = transitions(n)
  states = np.eye(n, dtype=np.float32)[[t[0] for t in data]]
  next_states = np.eye(n, dtype=np.float32)[[t[3] for t in data]]
  actions = np.array([t[1] for t in data])
  rewards = np.array([t[2] for t in data], np.float32)
  not_done = np.array([0.0 if t[4] else 1.0 for t in data], np.float32)

  graph = tf.Graph()
  with graph.as_default():
    tf.set_random_seed(0)
    s = tf.placeholder(tf.float32, [None, n], name="state")
    a = tf.placeholder(tf.int32, [None], name="action")
    target = tf.placeholder(tf.float32, [None], name="td_target")
    with tf.variable_scope("q"):
      hidden = tf.layers.dense(s, 32, tf.nn.relu)
      q = tf.layers.dense(hidden, 2)
    q_taken = tf.reduce_sum(q * tf.one_hot(a, 2), axis=1)
    loss = tf.reduce_mean(tf.square(q_taken - target))
    train_op = tf.train.AdamOptimizer(0.01).minimize(loss)
    store = snapstore.SnapshotStore(scope="q", mode="device")
    if args.tau is None:
      store.slots.pin(0, "target")
      update = train_op
    else:  # the average is updated after every step, in the same run
      with tf.control_dependencies([train_op]):
        average = snapstore.MovingAverage(
          store, tau=args.tau, form="lerp", tag="target"
        )
      update = average.update_op
    init = [tf.global_variables_initializer(), tf.local_variables_initializer()]
  graph.finalize()  # no op is added from here on

  with tf.Session(graph=graph) as sess:
    sess.run(init)  # the target starts as a copy of the initial network
    for step in range(args.steps):
      next_q = store.evaluate_with(
        q, {s: next_states}, tag="target", session=sess
      )
      td = rewards + GAMMA * not_done * next_q.max(axis=1)
      _, value = sess.run([update, loss], {s: states, a: actions, target: td})
      if args.tau is None and (step + 1) % args.sync == 0:
        store.snapshot("target", session=sess)
      if step % (args.steps // 5) == 0:
        print("step %5d  TD loss %.5f" % (step, value))
    learned = sess.run(q, {s: np.eye(n, dtype=np.float32)})

  best = optimal_q(n)
  error = np.abs(learned[:-1] - best[:-1]).max()
  greedy = learned[:-1].argmax(axis=1)
  print("Q*(s, right):      %s" % np.round(best[:-1, RIGHT], 3))
  print("learned Q(s, right): %s" % np.round(learned[:-1, RIGHT], 3))
  print(
    "largest error %.4f; greedy policy %s"
    % (error, "".join("R" if g == RIGHT else "L" for g in greedy))
  )
  if error > 0.05 or not np.all(greedy == RIGHT):
    print("FAILED: the learner did not find the optimal values")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
