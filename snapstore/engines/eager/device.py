"""Device mode on the eager engine: shadow `tf.Variable`s next to the originals.

The eager counterpart of `device.py`. Each slot is a full set of shadow
variables, made when the store is built under `init_scope` (never inside a
traced function) on each variable's device, not trainable, and held only by
the store: Keras, `tf.Module.variables` and checkpoints do not see them. A
shadow starts as a copy of its variable (sharing its buffer until either is
written), so a slot is always initialized.

Per slot, a snapshot and a restore are one traced function each, traced when
the store is built (`snapstore/engines/eager/copies.py`; the copies into shadows are
also run once then, see `__init__`); `evaluate_with` sets the
current values aside in a scratch set with two more. Reading a slot into numpy
(`arrays`) and writing arrays into it (`load_arrays`, `load_npz`) trace their
function on first use.

`store.slots.snapshot_in_step()` writes a slot from inside the caller's own
`tf.function` (`snapstore/engines/eager/in_step.py`).
"""

import numpy as np

from snapstore._tf import tf
from snapstore._tf import tf2
from snapstore.core import buffers
from snapstore.core.distributed import kept_components
from snapstore.core.distributed import replica_layout
from snapstore.engines.eager import copies
from snapstore.engines.eager import distributed
from snapstore.engines.eager import multi_worker
from snapstore.engines.eager import traced
from snapstore import errors
from snapstore.modes import base
from snapstore.modes import slot_book


class EagerDeviceMode(slot_book.SlotBook):
  """Snapshots held in eager shadow variables (see module doc).

  Args:
    varset: The store's `VariableSet` (eager variables).
    max_to_keep: Number of slots (>= 1).
    name: The store's name; shadows are named `<key>/<name>/slot_<k>`.
    saveable: Refused when True: eager shadows are not tracked; hand
      `store.slots.trackable(k)` to a `tf.train.Checkpoint` to save a slot.
    pack: Refused when True (see `_check_options`).
  """

  name = "device"
  default_max_to_keep = 1

  def __init__(self, varset, max_to_keep, name, saveable=False, pack=False):
    super(EagerDeviceMode, self).__init__(varset, max_to_keep, name)
    _check_options(saveable, pack)
    # Under MultiWorkerMirroredStrategy making the shadows is a collective:
    # refused, not a hang, unless every worker builds this store now.
    multi_worker.check_build(varset, name)
    self._primaries = list(varset.variables)
    self._slots = [
      _shadows(varset, "%s/slot_%d" % (name, k)) for k in range(max_to_keep)
    ]
    p = self._primaries
    self._takes = [
      copies.copier(p, s, "snapshot_%d" % k) for k, s in enumerate(self._slots)
    ]
    self._restores = [
      copies.copier(s, p, "restore_%d" % k) for k, s in enumerate(self._slots)
    ]
    # evaluate_with's swap sets the current values aside in a scratch set;
    # a call nested in the evaluated function in the next one (made on
    # first use), so that each puts back what it found.
    self._scratches = []
    self._depth = 0  # swaps in progress, one inside the other
    self._add_scratch()
    # Which tag each slot holds, for calls traced into the user's
    # tf.function, which look it up when they run (engines/eager/traced.py):
    # written once such a call is built (`start_marking`), not before.
    self._markers = [
      distributed.make_marker(p[0], traced.NO_TAG, "%s/slot_%d/tag" % (name, k))
      for k in range(max_to_keep)
    ]
    self._tag_ids = traced.TagIds()
    self._marking = False
    self._reads = [
      copies.Lazy(lambda s=s, k=k: copies.reader(s, "read_%d" % k))
      for k, s in enumerate(self._slots)
    ]
    # The other replicas of a slot's mirrored variables whose replicas may
    # differ, when they do, and every component of its sync-on-read ones:
    # for a spill file, which keeps one array per variable (`replicas`).
    self._layout = replica_layout(varset.variables)
    self._replica_reads = [
      copies.Lazy(
        lambda s=s, k=k: copies.reader(
          [], "read_replicas_%d" % k, [s[i] for i, _ in self._layout]
        )
      )
      for k, s in enumerate(self._slots)
    ]
    self._puts = [
      copies.Lazy(
        lambda s=s, k=k: copies.assigner(s, varset.specs, "put_%d" % k)
      )
      for k, s in enumerate(self._slots)
    ]
    self._initializer = None
    self._start_book(max_to_keep)
    self._scratch_used = 0  # scratch sets evaluate_with has used
    # TensorFlow optimizes a function at its first run (tens of ms for a
    # small model), not when it is traced. Run the copies into the store's
    # own shadows now, while no slot holds a snapshot, so that the first
    # snapshot() in a training loop costs what the others do. (Restores
    # write the variables: they pay it at their first call.)
    for take in self._takes:
      take()
    self._scratches[0][1]()

  # -- slots (store.slots) -------------------------------------------------------

  @property
  def slot_set(self):
    return self

  @property
  def per_variable(self):
    return True

  @property
  def num_slots(self):
    return len(self._slots)

  def shadows(self, slot, what="shadows"):
    del what
    return list(self._slots[slot])

  def restore_slot(self, slot):
    """Copies slot `slot` into the variables (traced into the caller's
    function when called while one is traced)."""
    self._restores[slot]()

  # -- slot markers, for traced calls (engines/eager/traced.py) ---------------------------

  @property
  def markers(self):
    """Per slot, the int64 variable holding the id of its tag (`tag_id`)."""
    return list(self._markers)

  def tag_id(self, tag):
    """The id a marker holds for `tag`."""
    return self._tag_ids(tag)

  def start_marking(self):
    """Keeps the markers up to date from now on (writes them now)."""
    if not self._marking:
      self._marking = True
      for slot in range(len(self._slots)):
        self._slot_changed(slot)

  def _slot_changed(self, slot):
    if not self._marking:
      return
    tag = self.tag_in(slot)
    value = traced.NO_TAG if tag is None else self._tag_ids(tag)
    # Eagerly, also when called while a step is traced (in replica context
    # too: component by component, no cross-replica write).
    with tf2.init_scope():
      for part in distributed.components(self._markers[slot]):
        with tf.device(part.device):
          part.assign(value, read_value=False)

  def component_shadows(self, slot, what="component_shadows"):
    """Per variable, its shadow's components (see `DeviceMode`'s)."""
    del what
    return [distributed.components(s) for s in self._slots[slot]]

  # -- CopyMode ------------------------------------------------------------------

  @property
  def nbytes(self):
    held = len(self._slots) + self._scratch_used
    return held * self._varset.nbytes

  def take(self, tag, session, victim=None):
    del session
    slot = self._slot_for(tag, victim)
    self._write_slot(slot, self._takes[slot])
    self._bind(tag, slot, victim)

  def put(self, tag, arrays, session, victim=None):
    del session
    slot = self._slot_for(tag, victim)
    self._write_slot(slot, lambda: self._puts[slot](*arrays))
    self._bind(tag, slot, victim)

  def restore(self, tag, session):
    del session
    self._restores[self._slot_of[tag]]()

  def arrays(self, tag, session):
    del session
    return [t.numpy() for t in self._reads[self._slot_of[tag]]()]

  def replicas(self, tag, session):
    del session
    if not self._layout:
      return None
    values = self._replica_reads[self._slot_of[tag]]()
    k = len(self._layout)
    return base.kept_replicas(
      self._layout,
      [bool(flag) for flag in values[:k]],
      values[k:],
      lambda value: buffers.aligned_copy(np.asarray(memoryview(value))),
    )

  def stash(self, session):
    """Copies the variables into the scratch set of this nesting depth; the
    token is that depth."""
    del session
    depth = self._depth
    if depth == len(self._scratches):
      self._add_scratch()
    self._scratches[depth][1]()
    self._depth = depth + 1
    self._scratch_used = max(self._scratch_used, depth + 1)
    return depth

  def unstash(self, token, session):
    del session
    self._scratches[token][2]()
    self._depth = token

  def _add_scratch(self):
    """One more scratch set: (shadows, copy into them, copy back)."""
    k = len(self._scratches)
    suffix = "scratch" if k == 0 else "scratch_%d" % k
    scratch = _shadows(self._varset, "%s/%s" % (self._name, suffix))
    self._scratches.append(
      (
        scratch,
        copies.copier(
          self._primaries, scratch, suffix.replace("scratch", "stash")
        ),
        copies.copier(
          scratch, self._primaries, suffix.replace("scratch", "unstash")
        ),
      )
    )

  def array_writer(self, name):
    return _writer(self._primaries, self._varset.specs, name)


def _writer(variables, specs, name):
  """`CopyMode.array_writer`'s function for eager variables."""
  write = copies.assigner(variables, specs, name)
  layout = replica_layout(variables)
  parts = [part for i, _ in layout for part in kept_components(variables[i])]
  # The variables, then the kept replicas each into its own component
  # (built on first use: most snapshots have none).
  write_replicas = copies.Lazy(
    lambda: copies.assigner(variables, specs, name + "_replicas", parts)
  )

  def run(arrays, session, replicas=None):
    del session
    if not replicas:
      write(*arrays)
      return
    write_replicas(*arrays, *base.replica_values(layout, arrays, replicas))

  return run


def _check_options(saveable, pack):
  if not isinstance(pack, bool):
    raise TypeError("pack must be True or False, got %r." % (pack,))
  if pack:
    raise ValueError(
      "pack=True is for graph mode, where it saves ops per variable; an "
      "eager store copies every variable in one traced function already, "
      "and packing would give up the copy-on-write sharing that makes an "
      "eager snapshot cost no memory copy until the next update. Leave "
      "pack=False."
    )
  if saveable:
    raise ValueError(
      "saveable=True puts graph-mode shadows into GLOBAL_VARIABLES; eager "
      "execution has no collections. To save a slot, hand it to your "
      "checkpoint: tf.train.Checkpoint(model=model, "
      "target=store.slots.trackable(0)), which names each shadow as the "
      "model names its variable."
    )


def _shadows(varset, suffix):
  """One shadow per variable, made eagerly on its device(s) (see module doc)."""
  return [
    distributed.make_shadow(spec.variable, "%s/%s" % (spec.key, suffix))
    for spec in varset
  ]


def check_not_traced(what):
  """Refuses building eager state while a `tf.function` is traced.

  Under `init_scope` in a trace, execution is eager and the state made is
  too (what `SnapshotCallback(in_step=...)` does at its step's first trace);
  `tf.inside_function()` alone stays True there.
  """
  if tf2.inside_function() and not tf2.executing_eagerly():
    raise errors.ModeError(
      "%s cannot be built inside a tf.function: its shadow variables and "
      "traced copies are made once, eagerly. Build the store before the "
      "function (e.g. next to the model and optimizer)." % what
    )
