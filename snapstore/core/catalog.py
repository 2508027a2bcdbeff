"""The tags of a store's snapshots: order, automatic tags, eviction and pins.

A `Catalog` is a store's bookkeeping of its snapshots, with no TensorFlow in
it: which tags it holds, oldest first, with the time each was taken; the next
automatic tag; which held tag a new snapshot evicts when the store is full;
which tags are pinned to device slots that in-graph ops write; and the
messages for tags that are unknown or pinned. The store asks it before any
copy, and records in it only once the copy succeeded.

    catalog = Catalog(capacity=3)
    tag = catalog.new_tag(None)                     # 0, then 1, 2, ...
    victim = catalog.victim(tag)                    # None, or the oldest held
    ...copy the variables, reusing the victim's storage...
    catalog.record(tag, victim, time.time())
    catalog.existing(None)                          # the newest tag

Tags are ints or non-empty strings. Automatic tags count up from 0 and skip
every int tag ever held, so they never name an older snapshot. Snapshotting
under a held tag replaces it and makes it the newest.
"""

import collections

from snapstore.core import checks
from snapstore import errors


class SnapshotInfo(collections.namedtuple("SnapshotInfo", ["tag", "time"])):
  """A held snapshot: its tag and wall time of taking it.

  Attributes:
    tag: Its tag, an int or a str.
    time: When it was taken (`time.time()`).

  Example:
    ```python
    tag = store.snapshot()
    info = store.info(tag)  # SnapshotInfo(tag=0, time=1764630000.0)
    age = time.time() - info.time
    ```
  """

  __slots__ = ()


class Catalog(object):
  """The tags a store holds, oldest first (see module doc).

  Args:
    capacity: How many snapshots count toward the store's bound, or None for
      no bound; named in messages.
  """

  def __init__(self, capacity):
    self._capacity = capacity
    self._order = collections.OrderedDict()  # tag -> SnapshotInfo, oldest first
    self._next = 0
    self._pinned = set()

  # -- what is held ----------------------------------------------------------------

  def tags(self):
    """The held tags, oldest first."""
    return list(self._order)

  def infos(self):
    """The `SnapshotInfo` of every held snapshot, oldest first."""
    return list(self._order.values())

  def info(self, tag):
    """The `SnapshotInfo` of held snapshot `tag`."""
    return self._order[tag]

  def __len__(self):
    return len(self._order)

  def __contains__(self, tag):
    return tag in self._order

  def existing(self, tag, allow_default=True):
    """`tag` if held; with `allow_default`, None means the newest.

    Raises:
      UnknownTagError: Nothing held (for None), or `tag` is not held; the
        message lists the held tags.
    """
    if tag is None and allow_default:
      if not self._order:
        raise errors.UnknownTagError(
          "The store holds no snapshots yet; take one with snapshot() first."
        )
      return next(reversed(self._order))
    if tag not in self._order:
      held = ", ".join(repr(t) for t in self._order) or "none"
      raise errors.UnknownTagError(
        "No snapshot tagged %r. The store holds: %s (oldest first; it keeps "
        "max_to_keep=%s)." % (tag, held, self._capacity)
      )
    return tag

  # -- new snapshots -----------------------------------------------------------------

  def new_tag(self, tag):
    """The tag a new snapshot is stored under: `tag`, or the next automatic one.

    Raises:
      TypeError: A tag that is not an int or a non-empty string.
    """
    return self._next if tag is None else checks.tag(tag)

  def victim(self, tag, counts=None):
    """The held tag a snapshot under `tag` evicts, or None.

    Args:
      tag: The new snapshot's tag. Replacing a held tag evicts nothing.
      counts: A function telling whether a held tag counts toward the
        capacity (with a spill file, spilled snapshots do not); default: all.

    Raises:
      PinnedTagError: The store is full and every counted tag is pinned.
    """
    if self._capacity is None:
      return None
    counted = [t for t in self._order if counts is None or counts(t)]
    if tag in counted or len(counted) < self._capacity:
      return None
    for held in counted:  # oldest first; a pinned slot is never reused
      if held not in self._pinned:
        return held
    raise errors.PinnedTagError(
      "Cannot store snapshot %r: every slot of the store is pinned (%s). "
      "Create the store with a larger max_to_keep, or snapshot under a "
      "pinned tag to overwrite its slot."
      % (tag, ", ".join(repr(t) for t in counted))
    )

  def record(self, tag, victim, when):
    """Records a snapshot stored under `tag` at `when`, and its victim's eviction.

    Returns:
      `tag`.
    """
    if victim is not None:
      self._order.pop(victim, None)
    self.adopt(tag, when)
    return tag

  def adopt(self, tag, when):
    """Records a snapshot `tag` taken at `when` as the newest."""
    self._order.pop(tag, None)
    self._order[tag] = SnapshotInfo(tag, when)
    if isinstance(tag, int) and tag >= self._next:
      self._next = tag + 1

  def drop(self, tag):
    """Forgets snapshot `tag`."""
    del self._order[tag]
    self._pinned.discard(tag)

  def keep_only(self, held):
    """Forgets every tag not in `held`; returns the forgotten ones, oldest first."""
    lost = [t for t in self._order if t not in held]
    for t in lost:
      self.drop(t)
    return lost

  # -- pins ----------------------------------------------------------------------------

  def pin(self, tag):
    """Marks `tag` as pinned: never evicted, never deleted or spilled."""
    self._pinned.add(tag)

  def pinned(self):
    """The pinned tags, oldest first."""
    return [t for t in self._order if t in self._pinned]

  def check_unpinned(self, tag, refusal, slot_of):
    """Raises PinnedTagError if `tag` is pinned.

    Args:
      tag: A held tag.
      refusal: What cannot be done and the way out, e.g. "it cannot be
        deleted while the store exists".
      slot_of: A function giving the device slot of a pinned tag, for the
        message.
    """
    if tag in self._pinned:
      raise errors.PinnedTagError(
        "Snapshot %r is pinned to device slot %d, which in-graph ops write "
        "(store.slots.pin); %s." % (tag, slot_of(tag), refusal)
      )


def lost_note(lost):
  """A sentence naming snapshots a failed copy overwrote, or ""."""
  if not lost:
    return ""
  return " Snapshot(s) %s were being overwritten and are dropped." % ", ".join(
    repr(t) for t in lost
  )
