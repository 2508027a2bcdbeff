"""An actor-critic (DDPG's update, as keras-io writes it) with its target
networks replaced by stores: bit for bit the run with separate target models.

The target is computed with `evaluate_with(..., tag="target")` inside the
critic's `GradientTape`, eagerly and inside the `tf.function` step. Soft
(Polyak) updates use `MovingAverage(form="lerp")` in device mode; hard
updates copy the online network every few steps (`snapshot("target")`) in
every mode.
"""

import pytest
import tensorflow as tf

import snapstore
from snapstore import _keras
from tests.eager import common
from tests.eager.common import assert_bits_equal
from tests.eager.common import keras
from tests.eager.common import mode_options
from tests.eager.common import values

GAMMA = 0.99
TAU = 0.05
STEPS = 12
HARD_EVERY = 4


def _actor(seed):
  return common.actor(seed, width=8)


def _critic(seed):
  return common.critic(seed, width=8)


def _batches():
  return common.transitions(STEPS, batch=16)


def _agent():
  actor, critic = _actor(1), _critic(2)
  return actor, critic, keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.02)


def _update(actor, critic, actor_opt, critic_opt, targets, batch):
  """keras-io DDPG's `update`, with `targets(next_state)` giving the target
  critic's value of the target actor's action."""
  s, a, r, s2 = batch
  with tf.GradientTape() as tape:
    y = r + GAMMA * targets(s2)
    critic_value = critic([s, a], training=True)
    critic_loss = tf.reduce_mean(tf.square(y - critic_value))
  grads = tape.gradient(critic_loss, critic.trainable_variables)
  critic_opt.apply_gradients(zip(grads, critic.trainable_variables))
  with tf.GradientTape() as tape:
    actions = actor(s, training=True)
    actor_loss = -tf.reduce_mean(critic([s, actions], training=True))
  grads = tape.gradient(actor_loss, actor.trainable_variables)
  actor_opt.apply_gradients(zip(grads, actor.trainable_variables))
  return critic_loss


def _soft(target, online):
  """keras-io DDPG's `update_target`."""
  for a, b in zip(target.variables, online.variables):
    a.assign(b * TAU + a * (1 - TAU))


def _reference(update, in_function):
  """Separate target models, as keras-io's DDPG keeps them."""
  actor, critic, actor_opt, critic_opt = _agent()
  target_actor, target_critic = _actor(1), _critic(2)
  target_actor.set_weights(actor.get_weights())
  target_critic.set_weights(critic.get_weights())

  def targets(s2):
    return target_critic([s2, target_actor(s2, training=True)], training=True)

  def step(batch, hard):
    loss = _update(actor, critic, actor_opt, critic_opt, targets, batch)
    if update == "soft":
      _soft(target_actor, actor)
      _soft(target_critic, critic)
    return loss

  if in_function:
    step = tf.function(step)
  losses = []
  for i, batch in enumerate(_batches()):
    losses.append(float(step(batch, False)))
    if update == "hard" and (i + 1) % HARD_EVERY == 0:
      target_actor.set_weights(actor.get_weights())
      target_critic.set_weights(critic.get_weights())
  state = values(
    actor.variables
    + critic.variables
    + actor_opt.variables
    + critic_opt.variables
  )
  return losses, state, values(target_actor.variables + target_critic.variables)


def _with_stores(update, mode, in_function, tmp_path):
  """The same agent, its targets kept by stores over the online networks."""
  actor, critic, actor_opt, critic_opt = _agent()
  stores = []
  for net, name in ((actor, "actor"), (critic, "critic")):
    (tmp_path / name).mkdir()
    stores.append(
      snapstore.SnapshotStore(
        var_list=net, mode=mode, **mode_options(mode, tmp_path / name)
      )
    )
  actor_store, critic_store = stores
  averages = []
  if update == "soft":
    averages = [
      snapstore.MovingAverage(s, tau=TAU, form="lerp", tag="target")
      for s in stores
    ]
  else:
    for s in stores:
      s.snapshot("target")

  def targets(s2):
    target_actions = actor_store.evaluate_with(
      lambda: actor(s2, training=True), tag="target"
    )
    return critic_store.evaluate_with(
      lambda: critic([s2, target_actions], training=True), tag="target"
    )

  def step(batch, hard):
    loss = _update(actor, critic, actor_opt, critic_opt, targets, batch)
    for average in averages:
      average.update()
    return loss

  if in_function:
    step = tf.function(step)
  losses = []
  for i, batch in enumerate(_batches()):
    losses.append(float(step(batch, False)))
    if update == "hard" and (i + 1) % HARD_EVERY == 0:
      for s in stores:
        s.snapshot("target")
  state = values(
    actor.variables
    + critic.variables
    + actor_opt.variables
    + critic_opt.variables
  )
  targets_now = [
    a
    for s, net in ((actor_store, actor), (critic_store, critic))
    for a in _in_model_order(s, net)
  ]
  for s in stores:
    s.close()
  return losses, state, targets_now


def _in_model_order(store, model):
  """The target's arrays in the order of `model.variables`."""
  arrays = store.arrays("target")
  by_id = dict((id(v), k) for k, v in store.variables.items())
  return [arrays[by_id[id(_unwrapped(v))]] for v in model.variables]


def _unwrapped(variable):
  """The tf.Variable a Keras 3 variable keeps its value in; others as
  they are."""
  if common.KERAS_3:
    return _keras.keras_variable_value(variable)
  return variable


CASES = [
  ("soft", "device", False),
  ("soft", "device", True),
  ("hard", "device", True),
  ("hard", "host", True),
  ("hard", "host", False),
  ("hard", "disk", True),
]


@pytest.mark.parametrize("update,mode,in_function", CASES)
def test_targets_by_evaluate_with_train_as_separate_target_models(
  update, mode, in_function, tmp_path
):
  losses, state, target = _reference(update, in_function)
  got_losses, got_state, got_target = _with_stores(
    update, mode, in_function, tmp_path
  )
  assert got_losses == losses
  assert_bits_equal(state, got_state)
  assert_bits_equal(target, got_target)
