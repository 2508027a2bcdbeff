"""The tags of guards and trials inside one another, on one store.

A guard or trial asks for a tag (default "guard" or "trial"). Entered inside
another guard or trial of the same store that uses that tag, it snapshots
under `<tag>/1` instead (`<tag>/2` one level deeper, ...), so its snapshot
never replaces the one the enclosing block rolls back to. An entry whose
snapshot would evict an enclosing one's is refused before it takes it.

    own = own_tag(store, "guard")          # "guard", or "guard/1" inside one
    enter(store, own, session, "Guard")    # snapshot, then registered
    ...
    leave(store, own)                      # always, in a `finally`
"""

import threading
import weakref

from snapstore.core import checks
from snapstore.training import ps_joins

# On each store, the tags of the guards and trials entered and not yet left,
# outermost first. Keyed weakly: a list of tags does not keep a store alive.
_ACTIVE = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def requested_tag(tag):
  """`tag` checked as the tag a guard or trial asks for.

  Raises:
    TypeError: None (a guard needs a fixed tag to nest by), or not a tag.
  """
  if tag is None:
    raise TypeError(
      "A guard or trial needs a fixed tag (an int or a non-empty "
      "string), got None."
    )
  return checks.tag(tag)


def own_tag(store, tag):
  """The tag a guard or trial entering with `tag` snapshots under.

  Inside another guard or trial of `store` with the same tag, the snapshot
  goes under `<tag>/<n>` instead, so that it does not replace the enclosing
  one's.

  Raises:
    ValueError: The snapshot would evict an enclosing guard's or trial's.
  """
  active = _ACTIVE.get(store) or []
  own, depth = tag, 0
  while own in active:
    depth += 1
    own = "%s/%d" % (tag, depth)
  victim = store.evicts(own)
  if victim in active:
    raise ValueError(
      "A guard or trial nested in another one needs a snapshot of its own, "
      "but the store keeps max_to_keep=%s snapshots and taking %r would evict "
      "%r, which an enclosing guard or trial rolls back to. Build the store "
      "with a larger max_to_keep (one more per nesting level)."
      % (store.max_to_keep, own, victim)
    )
  return own


def enter(store, own, session, what, snapshot=True):
  """Registers a guard or trial entering under tag `own`; snapshots unless told not.

  Args:
    store: The guarded store.
    own: The tag from `own_tag`.
    session: The session for the snapshot (graph mode), or None.
    what: "Guard" or "Trial", for messages.
    snapshot: Whether to take the snapshot now (a guard of an in-step tag
      takes it in its first step instead).

  Returns:
    `own`.

  Raises:
    ValueError: Functions scheduled on a `ClusterCoordinator` may be
      writing the store's variables (`ps_joins.check_nothing_in_flight`).
  """
  ps_joins.check_nothing_in_flight(store, what)
  if snapshot:
    store.snapshot(own, session=session)
  with _LOCK:
    _ACTIVE.setdefault(store, []).append(own)
  return own


def leave(store, tag):
  """Unregisters the guard or trial that entered under `tag`."""
  with _LOCK:
    active = _ACTIVE.get(store)
    if active and tag in active:
      active.remove(tag)
