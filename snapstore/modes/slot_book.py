"""Which tag each device slot holds: the bookkeeping both engines' device modes share.

A device mode has a fixed number of slots, each a full set of shadows. A new
snapshot goes into the slot of its tag if held, else the lowest free slot,
else the slot of the victim the store chose. A slot whose write failed part-way
holds no snapshot any more, unless it is pinned (its in-graph or in-step ops
write it again anyway, and it must never go to another snapshot).
"""

from snapstore._tf import tf
from snapstore.modes import base


class SlotBook(base.CopyMode):
  """A copy mode whose snapshots live in numbered slots (see module doc)."""

  def _start_book(self, num_slots):
    self._slot_of = {}
    self._free = list(range(num_slots))
    self._pinned_slots = set()

  def slot_of(self, tag):
    return self._slot_of[tag]

  def tag_in(self, slot):
    """The tag held in `slot`, or None."""
    for tag, s in self._slot_of.items():
      if s == slot:
        return tag
    return None

  def pin(self, tag, slot):
    """Binds `tag` to `slot` without copying; in-graph ops own the slot.

    A pinned slot keeps its tag when writing it fails part-way: its ops write
    it again anyway, and the slot must never go to another snapshot.
    """
    self._bind(tag, slot, None)
    self._pinned_slots.add(slot)

  def tags(self):
    return list(self._slot_of)

  def delete(self, tag):
    slot = self._slot_of.pop(tag)
    self._free.append(slot)
    self._slot_changed(slot)

  def _slot_for(self, tag, victim):
    if tag in self._slot_of:
      return self._slot_of[tag]
    if self._free:
      return min(self._free)
    return self._slot_of[victim]

  def _write_slot(self, slot, write):
    try:
      write()
    except tf.errors.OpError:
      # A partly written slot holds no snapshot any more.
      if slot not in self._pinned_slots:
        for tag in [t for t, s in self._slot_of.items() if s == slot]:
          self.delete(tag)
      raise

  def _bind(self, tag, slot, victim):
    if victim is not None and victim != tag and victim in self._slot_of:
      self.delete(victim)
    if slot in self._free:
      self._free.remove(slot)
    self._slot_of[tag] = slot
    self._slot_changed(slot)

  def _slot_changed(self, slot):
    """Called after `slot` changed hands (took a tag, or lost its own)."""
