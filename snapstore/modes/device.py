"""Device mode: snapshots in shadow variables next to the originals.

The store keeps `max_to_keep` slots, each a full set of shadow variables made
like optimizer slots (see `shadows.make_slots`): shadow `k` of variable
`dense/kernel` in a store named `snapstore` is `dense/kernel/snapstore/slot_k`,
on `dense/kernel`'s device. A snapshot or restore is one grouped assign op;
nothing crosses devices or reaches the host.

Shadows go into `tf.GraphKeys.LOCAL_VARIABLES`, which `MonitoredSession`,
Estimators and `tf.local_variables_initializer()` initialize and a default
`tf.train.Saver()` does not save (adding a store to a training script does not
change its checkpoints). With `saveable=True` they go into GLOBAL_VARIABLES
instead. Either way a snapshot writes a slot whole, so a slot that was never
initialized is still usable by `snapshot()`. A shadow is initialized once:
running an initializer again (resetting `tf.metrics` with the local
initializer, a non-chief worker's `local_init_op`) leaves it as it is.

`evaluate_with` sets the current values aside in a scratch set of shadows
(`.../snapstore/scratch`), which is in no standard collection and takes device
memory only from its first use. Setting aside, loading the snapshot and writing
back are plain copies, so each can be retried after a failure; an in-place swap
could not.
"""
from snapstore._tf import tf
from snapstore.core import copies
from snapstore.core import shadows
from snapstore.core import variables
from snapstore.modes import base


class DeviceMode(base.CopyMode):
  """Snapshots held in device-resident shadow variables (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: Number of slots (>= 1).
    name: The store's name.
    saveable: Put the shadows in GLOBAL_VARIABLES, so that a default
      `tf.train.Saver()` saves them and `global_variables_initializer()`
      initializes them. Default False: LOCAL_VARIABLES.
  """

  name = "device"
  default_max_to_keep = 1

  def __init__(self, varset, max_to_keep, name, saveable=False):
    super(DeviceMode, self).__init__(varset, max_to_keep, name)
    shadow_name = name.split("/")[-1]
    main = (tf.GraphKeys.GLOBAL_VARIABLES if saveable
            else tf.GraphKeys.LOCAL_VARIABLES)
    collections = [main, variables.SHADOW_VARIABLES]
    primaries = varset.variables
    reads = self._reads = copies.SharedReads()
    self._slots = shadows.make_slots(
        primaries, [("%s/slot_%d" % (shadow_name, k), collections)
                    for k in range(max_to_keep)])
    self._scratch = shadows.make_scratch(
        primaries, shadow_name + "/scratch", [variables.SHADOW_VARIABLES], reads)
    self._snapshot_ops = [copies.copy(primaries, slot, "snapshot_%d" % k, reads)
                          for k, slot in enumerate(self._slots)]
    self._restore_ops = [copies.copy(slot, primaries, "restore_%d" % k, reads)
                         for k, slot in enumerate(self._slots)]
    # The scratch shadows' initializers copy the primaries into them.
    self._stash_op = tf.group(*[s.initializer for s in self._scratch],
                              name="stash")
    self._unstash_op = copies.copy(self._scratch, primaries, "unstash", reads)
    self._slot_reads = [[reads(s) for s in slot] for slot in self._slots]
    # Writing arrays into a slot is its snapshot op with the primaries' reads
    # fed: no op per slot and variable.
    self._feeder = copies.Feeder(varset.specs, "feed",
                                 targets=[reads(p) for p in primaries])
    self._initializer = tf.group(
        *[s.initializer for slot in self._slots for s in slot],
        name="initializer")
    self._slot_of = {}
    self._free = list(range(max_to_keep))
    self._pinned_slots = set()
    self._scratch_used = False

  # -- ops and variables for the user's own graph ------------------------------

  @property
  def num_slots(self):
    return len(self._slots)

  @property
  def initializer(self):
    return self._initializer

  def snapshot_op(self, slot):
    return self._snapshot_ops[slot]

  def restore_op(self, slot):
    return self._restore_ops[slot]

  def build_snapshot_op(self, slot, name):
    """A new grouped copy into `slot`, built under the caller's control inputs.

    For a copy that must wait for (or be skipped with) an op of the user's
    step; `snapshot_op(slot)` is built with none and cannot gain any.
    """
    return copies.copy(self._varset.variables, self._slots[slot], name,
                       self._reads)

  def shadows(self, slot):
    return list(self._slots[slot])

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

  # -- CopyMode ------------------------------------------------------------------

  def tags(self):
    return list(self._slot_of)

  @property
  def nbytes(self):
    copies = len(self._slots) + (1 if self._scratch_used else 0)
    return copies * self._varset.nbytes

  def take(self, tag, session, victim=None):
    slot = self._slot_for(tag, victim)
    self._write_slot(slot, lambda: self._run(session, self._snapshot_ops[slot]))
    self._bind(tag, slot, victim)

  def put(self, tag, arrays, session, victim=None):
    slot = self._slot_for(tag, victim)
    self._write_slot(slot, lambda: self._feed(
        session, self._snapshot_ops[slot], self._feeder, arrays))
    self._bind(tag, slot, victim)

  def restore(self, tag, session):
    self._run(session, self._restore_ops[self._slot_of[tag]])

  def arrays(self, tag, session):
    return list(self._run(session, self._slot_reads[self._slot_of[tag]]))

  def delete(self, tag):
    self._free.append(self._slot_of.pop(tag))

  def stash(self, session):
    self._scratch_used = True
    self._run(session, self._stash_op)
    return None

  def unstash(self, token, session):
    del token  # The values are in the scratch shadows.
    self._run(session, self._unstash_op)

  # -- slot bookkeeping ----------------------------------------------------------

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
