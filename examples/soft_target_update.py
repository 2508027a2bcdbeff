"""A TF 2 actor-critic whose target networks are snapstore slots.

    python examples/soft_target_update.py [--steps 1000] [--tau 0.01] [--check]

DDPG's update (keras-io's "Deep Deterministic Policy Gradient") on a small
tracking task: the state is (position, context), the action a move in
[-1, 1] that should point at a goal, 0.8 * position, and moves the position
by 0.3 * action; the reward is -(action - goal)^2. The critic learns from
r + gamma * Q_target(s', pi_target(s')).

The target networks are not second models kept in step by hand. Each one is
slot 0 of a `snapstore.SnapshotStore` over the online network:

- `snapstore.MovingAverage(store, tau, form="lerp")` keeps the slot at
  `(1 - tau) * target + tau * online` after every step (trfl's and
  tf-agents' soft update, bit for bit);
- `store.slots.past(fn, slot)` computes `fn` with the slot's values read in
  place of the online variables: no copy, nothing to put back.

With `--check` the same run is made again with hand-made target networks,
and every variable is compared bit for bit.
"""

import argparse
import os

# Before TensorFlow is imported: without its start-up notices (no GPU,
# oneDNN, CPU build options) and warnings; see snapstore/_tf_startup.py.
os.environ.setdefault("SNAPSTORE_QUIET_TF", "1")

import numpy as np  # noqa: E402

import snapstore  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras  # Keras 3 on TF 2.16+; tf-keras with TF_USE_LEGACY_KERAS=1
GAMMA = 0.9


def actor(seed):
  keras.utils.set_random_seed(seed)
  return keras.Sequential(
    [
      keras.Input((2,)),
      keras.layers.Dense(32, activation="relu"),
      keras.layers.Dense(1, activation="tanh"),
    ]
  )


def critic(seed):
  keras.utils.set_random_seed(seed)
  state, action = keras.Input((2,)), keras.Input((1,))
  hidden = keras.layers.Dense(32, activation="relu")(
    keras.layers.Concatenate()([state, action])
  )
  return keras.Model([state, action], keras.layers.Dense(1)(hidden))


def env_step(s, a):
  """The task: (next state, reward), for a batch of states and actions."""
  position, context = s[:, :1], s[:, 1:]
  reward = -np.square(a - 0.8 * position)
  position = np.clip(position + 0.3 * a, -1, 1)
  return np.concatenate([position, context], 1).astype(np.float32), reward


class Agent(object):
  """The online networks, their optimizers, and DDPG's update."""

  def __init__(self):
    self.actor, self.critic = actor(1), critic(2)
    self.actor_opt = keras.optimizers.Adam(3e-3)
    self.critic_opt = keras.optimizers.Adam(6e-3)

  def update(self, s, a, r, s2, target_actor, target_critic):
    with tf.GradientTape() as tape:
      y = r + GAMMA * target_critic(s2, target_actor(s2))
      critic_loss = tf.reduce_mean(tf.square(y - self.critic([s, a])))
    grads = tape.gradient(critic_loss, self.critic.trainable_variables)
    self.critic_opt.apply_gradients(zip(grads, self.critic.trainable_variables))
    with tf.GradientTape() as tape:
      actor_loss = -tf.reduce_mean(self.critic([s, self.actor(s)]))
    grads = tape.gradient(actor_loss, self.actor.trainable_variables)
    self.actor_opt.apply_gradients(zip(grads, self.actor.trainable_variables))
    return critic_loss

  def variables(self):
    return (
      self.actor.variables
      + self.critic.variables
      + self.actor_opt.variables
      + self.critic_opt.variables
    )


def with_snapstore(agent, tau):
  """The train step, its targets kept in store slots (see module doc)."""
  actor_store = snapstore.SnapshotStore(var_list=agent.actor, name="actor")
  critic_store = snapstore.SnapshotStore(var_list=agent.critic, name="critic")
  soft_actor = snapstore.MovingAverage(actor_store, tau=tau, form="lerp")
  soft_critic = snapstore.MovingAverage(critic_store, tau=tau, form="lerp")
  target_actor = actor_store.slots.past(agent.actor, soft_actor.slot)
  target_critic = critic_store.slots.past(
    lambda s, a: agent.critic([s, a]), soft_critic.slot
  )

  @tf.function
  def train_step(s, a, r, s2):
    loss = agent.update(s, a, r, s2, target_actor, target_critic)
    soft_actor.update()  # (1 - tau) * target + tau * online
    soft_critic.update()
    return loss

  def targets():
    return [
      store.arrays(soft.tag)[key]
      for store, soft in (
        (actor_store, soft_actor),
        (critic_store, soft_critic),
      )
      for key in store.keys
    ]

  return train_step, targets


def by_hand(agent, tau):
  """The same train step with separate target networks, for --check."""
  target_actor, target_critic = actor(1), critic(2)
  target_actor.set_weights(agent.actor.get_weights())
  target_critic.set_weights(agent.critic.get_weights())

  @tf.function
  def train_step(s, a, r, s2):
    loss = agent.update(
      s, a, r, s2, target_actor, lambda s, a: target_critic([s, a])
    )
    for target, online in (
      (target_actor, agent.actor),
      (target_critic, agent.critic),
    ):
      for t, o in zip(target.weights, online.weights):
        t.assign((1 - tau) * t + tau * o)
    return loss

  def targets():
    return [w.numpy() for w in target_actor.weights + target_critic.weights]

  return train_step, targets


def episode_return(agent, steps=20):
  """The policy's return from three fixed starts (no exploration)."""
  s = np.array([[0.9, 0.0], [-0.5, 0.5], [0.3, -1.0]], np.float32)
  total = 0.0
  for _ in range(steps):
    s, r = env_step(s, agent.actor(s).numpy())
    total += float(r.mean())
  return total


def train(make_step, steps, tau, seed=0):
  agent = Agent()
  train_step, targets = make_step(agent, tau)
  rng = np.random.RandomState(seed)
  before = episode_return(agent)
  s = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
  for _ in range(steps):
    noise = rng.normal(0, 0.3, (64, 1))
    a = np.clip(agent.actor(s).numpy() + noise, -1, 1).astype(np.float32)
    s2, r = env_step(s, a)
    train_step(s, a, r.astype(np.float32), s2)
    s = s2
  return agent, targets(), before, episode_return(agent)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--tau", type=float, default=0.01)
  parser.add_argument("--check", action="store_true")
  args = parser.parse_args()
  agent, targets, before, after = train(with_snapstore, args.steps, args.tau)
  print(
    "return over 20 steps: %.3f before training, %.3f after %d steps"
    % (before, after, args.steps)
  )
  if args.check:
    reference, expected, _, _ = train(by_hand, args.steps, args.tau)
    same = all(
      np.array_equal(a.numpy(), b.numpy())
      for a, b in zip(agent.variables(), reference.variables())
    ) and all(np.array_equal(a, b) for a, b in zip(targets, expected))
    print(
      "every variable and target bit for bit as with separate target "
      "networks: %s" % same
    )
    if not same:
      raise SystemExit(1)


if __name__ == "__main__":
  main()
