"""An actor-critic whose target networks are store slots read by `past`.

Trained twice for 200 steps: once with hand-made target networks updated by
`(1 - tau) * target + tau * online` (keras-io's DDPG keeps them so), once
with a store per network, `MovingAverage(form="lerp")` for the soft update
and `store.slots.past` for the targets' forward passes. Every variable (the
networks, both optimizers, the targets) is bit-identical at the end,
eagerly and inside a `tf.function`; the targets then survive a
`tf.train.Checkpoint` round trip into freshly built networks whose layers
have other automatic names, and training goes on identically.
"""

import numpy as np
import pytest
import tensorflow as tf

import snapstore
from tests.eager.common import assert_bits_equal
from tests.eager import common
from tests.eager.common import keras
from tests.eager.common import values

GAMMA = 0.99
TAU = 0.005
STEPS = 200
MORE = 10  # steps after the checkpoint round trip


def _actor(seed):
  return common.actor(seed, width=16)


def _critic(seed):
  return common.critic(seed, width=16)


def _batches(n, seed=4):
  return common.transitions(n, batch=32, seed=seed)


class _Agent(object):
  """The online networks and their optimizers."""

  def __init__(self):
    self.actor, self.critic = _actor(1), _critic(2)
    self.actor_opt = keras.optimizers.Adam(1e-3)
    self.critic_opt = keras.optimizers.Adam(2e-3)

  def update(self, batch, target_actor, target_critic):
    """keras-io DDPG's update, its targets given as functions."""
    s, a, r, s2 = batch
    with tf.GradientTape() as tape:
      y = r + GAMMA * target_critic(s2, target_actor(s2))
      critic_loss = tf.reduce_mean(tf.square(y - self.critic([s, a])))
    grads = tape.gradient(critic_loss, self.critic.trainable_variables)
    self.critic_opt.apply_gradients(zip(grads, self.critic.trainable_variables))
    with tf.GradientTape() as tape:
      actor_loss = -tf.reduce_mean(self.critic([s, self.actor(s)]))
    grads = tape.gradient(actor_loss, self.actor.trainable_variables)
    self.actor_opt.apply_gradients(zip(grads, self.actor.trainable_variables))

  def state(self):
    return values(
      self.actor.variables
      + self.critic.variables
      + self.actor_opt.variables
      + self.critic_opt.variables
    )


def _soft(target, online):
  for t, o in zip(target.variables, online.variables):
    t.assign((1 - TAU) * t + TAU * o)


class _HandMade(object):
  """Separate target networks, updated by hand."""

  def __init__(self, agent):
    self.agent = agent
    self.actor, self.critic = _actor(1), _critic(2)
    self.actor.set_weights(agent.actor.get_weights())
    self.critic.set_weights(agent.critic.get_weights())

  def step(self, batch):
    self.agent.update(
      batch, lambda s: self.actor(s), lambda s, a: self.critic([s, a])
    )
    _soft(self.actor, self.agent.actor)
    _soft(self.critic, self.agent.critic)

  def targets(self):
    return values(self.actor.weights + self.critic.weights)


class _WithStores(object):
  """The targets as store slots, read by `past`, updated by MovingAverage."""

  def __init__(self, agent, name=""):
    self.agent = agent
    self.stores, self.softs = [], []
    for net, what in ((agent.actor, "actor"), (agent.critic, "critic")):
      store = snapstore.SnapshotStore(var_list=net, name=what + name)
      self.stores.append(store)
      self.softs.append(
        snapstore.MovingAverage(store, tau=TAU, form="lerp", tag="target")
      )
    actor_store, critic_store = self.stores
    self.target_actor = actor_store.slots.past(
      lambda s: agent.actor(s), self.softs[0].slot
    )
    self.target_critic = critic_store.slots.past(
      lambda s, a: agent.critic([s, a]), self.softs[1].slot
    )

  def step(self, batch):
    self.agent.update(batch, self.target_actor, self.target_critic)
    for soft in self.softs:
      soft.update()

  def targets(self):
    return [
      a
      for store in self.stores
      for a in (store.arrays("target")[k] for k in store.keys)
    ]

  def checkpoint(self):
    return tf.train.Checkpoint(
      actor=self.agent.actor,
      critic=self.agent.critic,
      actor_opt=self.agent.actor_opt,
      critic_opt=self.agent.critic_opt,
      target_actor=self.stores[0].slots.trackable(self.softs[0].slot),
      target_critic=self.stores[1].slots.trackable(self.softs[1].slot),
    )


def _train(run, batches, in_function):
  step = tf.function(run.step) if in_function else run.step
  for batch in batches:
    step(batch)


@pytest.mark.parametrize(
  "in_function", [False, True], ids=["eager", "function"]
)
def test_past_and_lerp_train_as_hand_made_target_networks(
  in_function, tmp_path
):
  batches = _batches(STEPS + MORE)
  reference = _HandMade(_Agent())
  _train(reference, batches[:STEPS], in_function)
  run = _WithStores(_Agent())
  _train(run, batches[:STEPS], in_function)
  assert_bits_equal(reference.agent.state(), run.agent.state())
  assert_bits_equal(reference.targets(), run.targets())
  assert not np.array_equal(reference.targets()[0], run.agent.state()[0])

  # Checkpointed with the targets, into networks with other layer names.
  path = run.checkpoint().save(str(tmp_path / "ckpt"))
  for _ in range(2):
    _actor(9), _critic(9)
  agent = _Agent()
  agent.actor_opt.build(agent.actor.trainable_variables)
  agent.critic_opt.build(agent.critic.trainable_variables)
  fresh = _WithStores(agent, name="_fresh")
  fresh.checkpoint().restore(path).assert_existing_objects_matched()
  assert_bits_equal(reference.targets(), fresh.targets())
  assert_bits_equal(reference.agent.state(), fresh.agent.state())
  _train(reference, batches[STEPS:], in_function)
  _train(fresh, batches[STEPS:], in_function)
  assert_bits_equal(reference.agent.state(), fresh.agent.state())
  assert_bits_equal(reference.targets(), fresh.targets())
