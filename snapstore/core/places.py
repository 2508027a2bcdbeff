"""Where each device snapshot lives, and why some were dropped: a store's ledger.

A device snapshot lives where its shadows' values live: in the session, or
the cluster, that took it (`engines/graph/places.py` says what a place is).
The ledger binds each device snapshot to its place, refuses its use from
another one, reports the snapshots whose place is gone, and remembers, for
the messages of later calls, why a snapshot was dropped (its session closed,
its cluster or a parameter server restarted). An engine without sessions
(the eager engine) binds nothing and uses only the last part.

    places = Places(lambda sess: Place.of(sess, varset))
    places.bind(tag, places.of(sess))                 # after a device snapshot
    places.check(tag, places.of(other), "restore")    # SessionMismatchError
"""

import collections

from snapstore import errors

# How many dropped tags keep the reason they were dropped, for messages.
_REMEMBERED = 64


class Places(object):
  """The place of each device snapshot of one store, and why some were dropped.

  Args:
    place_of: The engine's function from a resolved session to its place
      (`engines/graph/places.py`'s `Place`), or None for an engine without
      sessions: then no snapshot is bound to a place, and the ledger only
      remembers why snapshots were dropped.
  """

  def __init__(self, place_of=None):
    self._place_of = place_of
    self._where = {}  # tag -> place
    self._dropped = collections.OrderedDict()  # tag -> message, newest last

  def of(self, session):
    """The place of `session` (a resolved session)."""
    return self._place_of(session)

  def bind(self, tag, place):
    """Records that device snapshot `tag` was just written at `place`."""
    self._where[tag] = place
    self._dropped.pop(tag, None)

  def unbind(self, tag):
    """Forgets `tag`'s place: it is not held, or not tied to one (a pinned slot)."""
    self._where.pop(tag, None)

  def gone(self):
    """[(tag, why)] of bound tags whose place is gone: a local session closed or collected."""
    return [
      (
        tag,
        lost_message(
          tag,
          "was a device snapshot of %s: its values went "
          "with that session's resources" % place.describe(),
        ),
      )
      for tag, place in self._where.items()
      if place.gone
    ]

  def keep_only(self, tags):
    """Forgets the places of tags not in `tags` (deleted or evicted meanwhile)."""
    for tag in [t for t in self._where if t not in tags]:
      del self._where[tag]

  def drop(self, tag, why):
    """Forgets `tag`, remembering `why` it was dropped (for `check`)."""
    self._where.pop(tag, None)
    self._dropped[tag] = why
    while len(self._dropped) > _REMEMBERED:
      self._dropped.popitem(last=False)

  def dropped_note(self, tag):
    """Why `tag` (None: any) was dropped, or "" if it was not."""
    if tag is None:
      return " ".join(self._dropped.values())
    return self._dropped.get(tag, "")

  def check(self, tag, place, what):
    """Checks that device snapshot `tag` is held at `place`.

    Returns:
      None, or a message saying the snapshot is lost for good (its cluster's
      tasks restarted): the caller drops it and raises.

    Raises:
      SessionMismatchError: `tag` was written at another place, which still
        holds it.
    """
    home = self._where.get(tag)
    if home is None or home.same(place):
      return None
    if home.restarted(place):
      return lost_message(
        tag,
        "was held on %s, whose tasks have restarted since "
        "(their devices have new incarnations): their "
        "variables, its shadows among them, were lost" % home.describe(),
      )
    raise errors.SessionMismatchError(
      "Snapshot %r is a device snapshot held by %s, not by %s()'s session "
      "(%s): device snapshots are variables of the session (or cluster) "
      "that took them, and this session's shadows do not hold it. Call "
      "%s() with the session that took it, or carry it over: "
      "store.load_arrays(store.arrays(%r, session=old), tag=%r, "
      "session=new)."
      % (tag, home.describe(), what, place.describe(), what, tag, tag)
    )


def lost_message(tag, why):
  """The message for device snapshot `tag`, dropped because it `why`."""
  return (
    "Snapshot %r %s, so the store dropped it. Take a new snapshot; to keep "
    "a device snapshot beyond its session, save_npz() or spill() it first."
    % (tag, why)
  )
