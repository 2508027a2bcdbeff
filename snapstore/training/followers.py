"""Callbacks that follow the rollbacks of a `SnapshotCallback` (Lookahead's).

A callback that changes state of its own at a batch's end (Lookahead's slow
weights and step counter) would count a rolled-back batch, or synchronize
from the NaN weights before the rollback. Registered with
`follow_rollbacks`, it is led by the `SnapshotCallback` of the same eager
`fit` (Keras hands all callbacks of one `fit` one `params` dict, which pairs
them): that callback's store covers the follower's state
(`rollback_variables()`), and it calls the follower's `batch_stands()` after
each batch it does not roll back. The follower's own batch end does nothing
while it is led (`is_led`). So in either callback order the `fit` ends as
the same `fit` without the rolled-back batches.

    class LookaheadCallback(keras.callbacks.Callback):
      def __init__(self):
        followers.follow_rollbacks(self)
      def on_train_batch_end(self, batch, logs=None):
        if not followers.is_led(self):
          self.batch_stands()
"""

import collections
import weakref

from snapstore.engines.eager import variables as eager_variables

# Callbacks following rollbacks, oldest first (weakly: a callback lives as
# long as its owner keeps it), and who leads each: (keeper, that fit's
# params); the keeper weakly, or it would keep its followers alive here.
_FOLLOWERS = []
_LEADERS = weakref.WeakKeyDictionary()


def follow_rollbacks(callback):
  """Makes a Keras callback follow the rollbacks of `SnapshotCallback`.

  For a callback that changes state of its own at a batch's end (Lookahead's
  slow weights and step counter). In an eager `fit` with a
  `SnapshotCallback`, that callback leads it: its store covers the state
  `callback.rollback_variables()` returns (`{key: variable}`), and it calls
  `callback.batch_stands()` after each batch it does not roll back, from
  its own batch end, once it has decided. The callback's own batch end then
  does nothing (`is_led`): a rolled-back batch never happened for it either,
  whichever of the two `fit` calls first.
  """
  _FOLLOWERS[:] = [ref for ref in _FOLLOWERS if ref() is not None]
  _FOLLOWERS.append(weakref.ref(callback))


def is_led(callback):
  """Whether a `SnapshotCallback` of the callback's current `fit` leads it
  (calls its `batch_stands()`)."""
  led = _LEADERS.get(callback)
  params = getattr(callback, "params", None)
  return led is not None and params is not None and led[1] is params


class Leader(object):
  """What an eager keeper does for the followers of its `fit`."""

  _followers = ()  # the callbacks of this fit following its rollbacks

  def lead(self, model, params):
    """Takes the followers in the `fit` of `params`, over `model`.

    Returns:
      `{key: variable}` of their state (`followed_state`).

    Raises:
      ValueError: One of them is led by another `SnapshotCallback` of this
        fit.
    """
    self._followers = _lead(self, model, params)
    return followed_state(self._followers)

  def followed(self):
    """`{key: variable}` of the state of the followers led now."""
    return followed_state(self._followers)

  def stand(self):
    """After a batch that is not rolled back: the followers' updates."""
    for follower in self._followers:
      follower.batch_stands()

  def check_covers(self, store, followed):
    """Refuses a store of your own without the followers' state.

    Raises:
      ValueError: The store leaves some of it out; names it, and the fix.
    """
    covered = set(id(v) for v in store.variables.values())
    missing = [k for k, v in followed.items() if id(v) not in covered]
    if missing:
      raise ValueError(
        "SnapshotCallback's store %r does not cover the state that %s keeps "
        "in this fit (%s), so a rollback would leave it as the rolled-back "
        "batches made it. Pass store=None (the default store covers it), or "
        "add that state to your store's var_list (Lookahead's: "
        "lookahead.variables())."
        % (
          store.name,
          " and ".join(sorted(set(type(f).__name__ for f in self._followers))),
          ", ".join(missing[:5] + (["..."] if len(missing) > 5 else [])),
        )
      )


def covers(store, followed):
  """Whether `store` covers every variable of `followed`."""
  covered = set(id(v) for v in store.variables.values())
  return all(id(v) in covered for v in followed.values())


def followed_state(followers):
  """`{key: variable}` of the followers' state (`rollback_variables()`)."""
  out = collections.OrderedDict()
  for follower in followers:
    for key, variable in follower.rollback_variables().items():
      out[eager_variables.unique_key(key, out)] = variable
  return out


def _lead(keeper, model, params):
  """The followers in the `fit` of `params`, over `model`: led by `keeper`.

  A `fit` gives all its callbacks one `params` dict, so a follower of an
  earlier `fit` is never taken.

  Raises:
    ValueError: One of them is led by another `SnapshotCallback` of this fit.
  """
  if params is None:
    return []
  found = []
  for ref in _FOLLOWERS:
    callback = ref()
    if (
      callback is None
      or getattr(callback, "params", None) is not params
      or getattr(callback, "model", None) is not model
    ):
      continue
    led = _LEADERS.get(callback)
    if led is not None and led[1] is params and led[0]() is not keeper:
      raise ValueError(
        "%s follows the rollbacks of one SnapshotCallback, but this fit has "
        "two: each would roll back and update it. Pass fit one "
        "SnapshotCallback." % type(callback).__name__
      )
    _LEADERS[callback] = (weakref.ref(keeper), params)
    found.append(callback)
  return found
