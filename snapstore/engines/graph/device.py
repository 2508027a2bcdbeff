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

With `pack=True`, variables of at most `packing.PACK_LIMIT_BYTES` share one
buffer per slot for each device and dtype (`<store>/packed_<n>/slot_k`, see
`snapstore.engines.graph.packing`): a snapshot is a concatenation and an assign per
group, a restore a split per group and an assign per variable. A store of
thousands of small variables is then built and first run in a fraction of the
time, with a fraction of the ops. Such variables have no shadow of their own,
so `shadows()` and `past()` are refused; everything else works the same.
A packed store also runs one op per kind of copy whatever the slot, with the
slot fed (see `DeviceMode._gate`): TensorFlow's first-run cost of a new run
signature is paid in the first slot used, not again in every slot.

A `tf.distribute` variable (`MirroredStrategy`) is shadowed component by
component (see `snapstore.core.distributed`): a shadow per replica component,
`dense/kernel/replica_1/snapstore/slot_k` on that replica's device, and
copies per (component, shadow) pair on its device, so every replica's bits
are kept and restored and nothing crosses devices. `arrays()` gives one array
per variable, as a host snapshot reads it; arrays written into a slot
(`load_arrays`) reach the components as a host restore writes them. Its
shadows are not one distributed variable, so `shadows()` is refused;
`component_shadows()` gives them per component (what `MovingAverage` and
`Lookahead` update, each component from its own). `past()` rewires each
component to its own shadow (`snapstore.engines.graph.rewire`): TF reads a
distributed variable through its components (a replica its own, a
cross-replica read the primary, a sync-on-read aggregate all of them), so
every copied read reads the shadow of the component its original read.
"""

import functools
import re

import numpy as np

from snapstore._tf import control_flow_ops
from snapstore._tf import ops
from snapstore._tf import tf
from snapstore.engines.graph import copies
from snapstore.core import distributed
from snapstore.engines.graph import packing
from snapstore.engines.graph import sessions
from snapstore.engines.graph import shadows
from snapstore.engines.graph import variables
from snapstore import errors
from snapstore.modes import base
from snapstore.engines.graph import mode
from snapstore.modes import slot_book

# The message of the check that a slot is initialized before a restore.
UNINITIALIZED = "snapstore: device slot %d is not initialized"


class DeviceMode(mode.GraphMode, slot_book.SlotBook):
  """Snapshots held in device-resident shadow variables (see module doc).

  Args:
    varset: The store's `VariableSet`.
    max_to_keep: Number of slots (>= 1).
    name: The store's name.
    saveable: Put the shadows in GLOBAL_VARIABLES, so that a default
      `tf.train.Saver()` saves them and `global_variables_initializer()`
      initializes them. Default False: LOCAL_VARIABLES.
    pack: Pack small variables into one buffer per device and dtype (see
      module doc). Default False: a shadow per variable.
  """

  name = "device"
  default_max_to_keep = 1

  def __init__(self, varset, max_to_keep, name, saveable=False, pack=False):
    super(DeviceMode, self).__init__(varset, max_to_keep, name)
    shadow_name = name.split("/")[-1]
    main = (
      tf.GraphKeys.GLOBAL_VARIABLES
      if saveable
      else tf.GraphKeys.LOCAL_VARIABLES
    )
    collections = [main, variables.SHADOW_VARIABLES]
    if not isinstance(pack, bool):
      raise TypeError("pack must be True or False, got %r." % (pack,))
    # The variables shadowed: every variable, a distributed one as its
    # components (see `snapstore.core.distributed`), and the position in
    # `varset` of the variable each belongs to.
    self._distributed = [
      spec.key
      for spec in varset.specs
      if distributed.is_distributed(spec.variable)
    ]
    self._primaries = []
    self._owners = []
    for i, v in enumerate(varset.variables):
      for part in distributed.components(v):
        self._primaries.append(part)
        self._owners.append(i)
    # Mirrored variables whose replicas may differ, and sync-on-read ones: a
    # spill reads their components' shadows too (`replicas`).
    self._layout = distributed.replica_layout(varset.variables)
    primaries = self._primaries
    # What each shadow in a slot stands for: a variable, or a packed group.
    self._units = packing.plan(primaries, name, pack)
    self._reads = copies.SharedReads()
    self._slots = shadows.make_slots(
      self._units,
      [
        ("%s/slot_%d" % (shadow_name, k), collections)
        for k in range(max_to_keep)
      ],
    )
    self._scratch = shadows.make_scratch(
      self._units,
      shadow_name + "/scratch",
      [variables.SHADOW_VARIABLES],
      self._reads,
    )
    # A packed store runs one op per kind of copy, whatever the slot (see
    # `_gate`); a store of per-variable shadows runs an op per slot.
    self._one_signature = any(u.packed for u in self._units)
    self._gates = {}
    self._selects = ()
    scope = tf.get_default_graph().get_name_scope()
    self._select_scope = (scope + "/" if scope else "") + "select/"
    if self._one_signature:
      with ops.colocate_with(self._units[0].anchor), tf.name_scope(
        self._select_scope
      ):
        # One per slot, then one for the scratch shadows.
        self._selects = tuple(
          tf.placeholder_with_default(True, [], name="slot_%d" % k)
          for k in range(max_to_keep)
        ) + (tf.placeholder_with_default(True, [], name="scratch"),)
      self._picks = [
        [np.array(j == k) for j in range(len(self._selects))]
        for k in range(len(self._selects))
      ]
      for k, shadow_set in enumerate(self._slots + [self._scratch]):
        for unit, shadow in zip(self._units, shadow_set):
          # A set not selected is not read (its shadows may be uninitialized)
          # and what is built on its reads does not run.
          self._reads(shadow).op._add_control_input(self._gate(k, unit.anchor))
    self._snapshot_ops = [
      self._copy_in(slot, "snapshot_%d" % k, k if self._one_signature else None)
      for k, slot in enumerate(self._slots)
    ]
    restores = []
    for k, slot in enumerate(self._slots):
      gate = self._initialized(slot, k)
      op, values = self._copy_out([slot], "restore_%d" % k, gate)
      restores.append((op, values, gate))
    self._restore_ops = [op for op, _, _ in restores]
    # The scratch shadows' initializers copy the primaries into them.
    self._stash_op = tf.group(
      *[s.initializer for s in self._scratch], name="stash"
    )
    if self._one_signature:
      self._snapshot_any = tf.group(*self._snapshot_ops, name="snapshot")
      # A restore from any slot, and the write-back of the scratch shadows,
      # is one op: each unit's buffer is the merge of its gated reads.
      self._restore_any, values = self._copy_out(
        self._slots + [self._scratch],
        "restore",
        self._checked([gate for _, _, gate in restores]),
      )
      self._any_reads = self._host_values(values)
      self._any_replicas = self._replica_reads(values)
      self._unstash_op = self._restore_any
    else:
      self._slot_reads = [self._host_values(v) for _, v, _ in restores]
      self._slot_replicas = [self._replica_reads(v) for _, v, _ in restores]
      self._unstash_op = self._copy_out([self._scratch], "unstash")[0]
    if not self._distributed:
      # Writing arrays into a slot is its snapshot op with the primaries'
      # reads fed: no op per slot and variable.
      self._feeder = copies.Feeder(
        varset.specs, "feed", targets=[self._reads(p) for p in primaries]
      )
      self._put_ops = self._snapshot_ops
      if self._one_signature:
        self._put_any = self._snapshot_any
    else:
      # A distributed variable's array is written into its components'
      # shadows as a host write would write the components (`spread`).
      self._feeder = copies.Feeder(varset.specs, "feed")
      parts = []
      for var, value in zip(varset.variables, self._feeder.placeholders):
        parts.extend(distributed.spread(var, value))
      packed = [u.pack([parts[i] for i in u.indices]) for u in self._units]
      self._put_ops = [
        copies.copy(
          packed,
          slot,
          "put_%d" % k,
          after=self._gated(k) if self._one_signature else None,
        )
        for k, slot in enumerate(self._slots)
      ]
      if self._one_signature:
        self._put_any = tf.group(*self._put_ops, name="put")
    self._initializer = tf.group(
      *[s.initializer for slot in self._slots for s in slot], name="initializer"
    )
    self._start_book(max_to_keep)
    self._scratch_used = False

  # -- ops and variables for the user's own graph ------------------------------

  @property
  def slot_set(self):
    """The mode's slots (see `CopyMode.slot_set`): the mode itself."""
    return self

  @property
  def per_variable(self):
    """Whether every variable has a shadow of its own (not with `pack=True`)."""
    return not self._distributed and not any(u.packed for u in self._units)

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
    return self._copy_in(self._slots[slot], name)

  def shadows(self, slot, what="shadows"):
    """The shadow variable of each variable in `slot`.

    Raises:
      ModeError: The store packs variables: they have no shadow of their own;
        or covers `tf.distribute` variables: each component has a shadow.
    """
    if self._distributed:
      raise errors.ModeError(
        "%s() needs a shadow variable per variable; %s %s a tf.distribute "
        "variable, whose shadows in a graph-mode store are one per replica "
        "component, not a distributed variable. Get them with "
        "store.slots.component_shadows(slot) (a list per key, as "
        "snapstore.MovingAverage and Lookahead use them), compute outputs "
        "from a slot with store.slots.past(outputs, slot), evaluate at a "
        "snapshot with store.evaluate_with(fetches, tag=...), snapshot and "
        "restore with store.snapshot() and store.restore(); or use the "
        "eager engine, whose shadows of a distributed variable are "
        "distributed."
        % (
          what,
          errors.names(self._distributed),
          "is" if len(self._distributed) == 1 else "are",
        )
      )
    self._check_unpacked(what)
    return list(self._slots[slot])

  def component_shadows(self, slot, what="component_shadows"):
    """The shadow variables of each variable in `slot`, one per component.

    A list per variable of the store: the shadow of each of its components
    (`distributed.components`, in the strategy's device order), so a single
    one for an ordinary variable.

    Raises:
      ModeError: The store packs variables: they have no shadow of their own.
    """
    self._check_unpacked(what)
    # Units (one per shadow) are in `packing.plan`'s order; each names the
    # primary it stands for.
    shadow_of = {}
    for unit, shadow in zip(self._units, self._slots[slot]):
      shadow_of[unit.indices[0]] = shadow
    per_owner = [[] for _ in self._varset.variables]
    for i, owner in enumerate(self._owners):
      per_owner[owner].append(shadow_of[i])
    return per_owner

  def _check_unpacked(self, what):
    groups = [u for u in self._units if u.packed]
    if groups:
      raise errors.ModeError(
        "%s() needs a shadow variable per variable; this store packs %d of "
        "its %d variables into %d buffers per slot (pack=True). Build the "
        "store with pack=False (the default) for per-variable shadows."
        % (
          what,
          sum(len(g.members) for g in groups),
          len(self._varset),
          len(groups),
        )
      )

  # -- CopyMode ------------------------------------------------------------------

  @property
  def nbytes(self):
    copies = len(self._slots) + (1 if self._scratch_used else 0)
    return copies * self._varset.nbytes

  def take(self, tag, session, victim=None):
    slot = self._slot_for(tag, victim)
    if self._one_signature:
      write = functools.partial(self._select, session, self._snapshot_any, slot)
    else:
      write = functools.partial(self._run, session, self._snapshot_ops[slot])
    self._write_slot(slot, write)
    self._bind(tag, slot, victim)

  def put(self, tag, arrays, session, victim=None):
    slot = self._slot_for(tag, victim)
    if self._one_signature:
      write = functools.partial(
        self._select, session, self._put_any, slot, self._feeder, arrays
      )
    else:
      write = functools.partial(
        self._feed, session, self._put_ops[slot], self._feeder, arrays
      )
    self._write_slot(slot, write)
    self._bind(tag, slot, victim)

  def restore(self, tag, session):
    slot = self._slot_of[tag]
    if self._one_signature:
      self._select(session, self._restore_any, slot)
    else:
      self._run(session, self._restore_ops[slot])

  def arrays(self, tag, session):
    slot = self._slot_of[tag]
    if self._one_signature:
      return list(self._select(session, self._any_reads, slot))
    return list(self._run(session, self._slot_reads[slot]))

  def replicas(self, tag, session):
    """The slot's replicas that differ (`base.kept_replicas`): for a spill
    file, which keeps one array per variable."""
    if not self._layout:
      return None
    slot = self._slot_of[tag]
    if self._one_signature:
      values = self._select(session, self._any_replicas, slot)
    else:
      values = self._run(session, self._slot_replicas[slot])
    k = len(self._layout)
    # The arrays a run fetches are new: kept as they are.
    return base.kept_replicas(
      self._layout, values[:k], values[k:], lambda array: array
    )

  def stash(self, session):
    self._scratch_used = True
    self._run(session, self._stash_op)
    return None

  def unstash(self, token, session):
    del token  # The values are in the scratch shadows.
    if self._one_signature:
      self._select(session, self._unstash_op, len(self._slots))
    else:
      self._run(session, self._unstash_op)

  def _select(self, session, fetches, which, feeder=None, arrays=()):
    """Runs `fetches` (an op built on every slot) on slot `which` alone.

    `which` is a slot, or `num_slots` for the scratch shadows; `feeder`'s
    placeholders are fed with `arrays` as well (see `_gate`).
    """
    feeds, values = self._selects, self._picks[which]
    if feeder is not None:
      feeds = tuple(feeder.placeholders) + feeds
      values = feeder.values(arrays) + values
    return sessions.run_cached(session, fetches, feeds, values)

  # -- copies between the variables and a set of shadows ----------------------

  def _copy_in(self, shadow_set, name, slot=None):
    """One op copying the variables into `shadow_set` (a slot or the scratch);
    for a `slot`, every write is gated by its selection (see `_gate`)."""
    return copies.copy(
      [u.pack(self._reads) for u in self._units],
      shadow_set,
      name,
      after=None if slot is None else self._gated(slot),
    )

  def _gate(self, slot, anchor):
    """An op that is dead unless `slot` is selected, on `anchor`'s device.

    TensorFlow's first run of a new set of fetches and feeds (a run
    signature) optimizes the graph, which takes seconds for a store of a
    thousand variables (bench/README.md, "Building a store and its first
    calls"); a store that ran an op per slot paid it again in each slot. A packed store runs one op per kind of copy instead, and
    feeds `_selects` (True for the slot it copies, False for the others; the
    last one stands for the scratch shadows):

      snapshot, load_arrays  the group of every slot's copy
                             (`_snapshot_any`, `_put_any`)
      restore, write-back    one assign per variable of the merge of its
                             shadows' reads in every slot and the scratch
                             (`_restore_any`), and `arrays` fetches those
                             merges (`_any_reads`)

    Every write into slot `k`, every read of its shadows and its initialized
    check has a control input on this gate (a NoOp after the Identity of the
    Switch output taken when slot `k` is selected), so the copies of the
    slots not selected are dead and do not run, as an untaken `tf.cond`
    branch, and a slot never initialized is never read. Not fed, every slot
    is selected: a user's own `snapshot_op(k)`, `restore_op(k)` run as
    before (they are not merged: each is its own slot's copy).

    A dead op still costs the executor time at every run, so the restore
    merges reads rather than gating an assign per slot and variable, and a
    store of per-variable shadows keeps an op per slot: gating its K copies
    of every variable made each snapshot run all K slots' dead copies, more
    than twice as slow as its own slot's op (bench/README.md, "Building a
    store and its first calls").

    Args:
      slot: The slot, or `num_slots` for the scratch shadows.
      anchor: A variable whose device the gate is placed on (one gate per
        device and slot: only a control edge crosses devices for it).
    """
    key = (slot, anchor.device)
    gate = self._gates.get(key)
    if gate is None:
      select = self._selects[slot]
      with tf.name_scope("%sgate_%d/" % (self._select_scope, slot)):
        if slot not in self._gates:  # the Switch, next to the selects
          with ops.colocate_with(select.op):
            self._gates[slot] = tf.identity(
              control_flow_ops.switch(select, select)[1], name="selected"
            ).op
        # Only a control edge reaches another device.
        with ops.colocate_with(anchor), tf.control_dependencies(
          [self._gates[slot]]
        ):
          gate = tf.no_op(name="gate")
      self._gates[key] = gate
    return gate

  def _gated(self, slot):
    """`after` for `copies.copy`: a write into `slot` waits for its gate."""
    return lambda target: self._gate(slot, target)

  def _host_values(self, values):
    """The value of each variable of the store from `values`, one per
    shadowed variable (`_primaries`): a distributed variable's as a host read
    gives it (`distributed.aggregate`)."""
    per_owner = [[] for _ in self._varset.variables]
    for owner, value in zip(self._owners, values):
      per_owner[owner].append(value)
    return [
      distributed.aggregate(v, parts)
      for v, parts in zip(self._varset.variables, per_owner)
    ]

  def _replica_reads(self, values):
    """`distributed.replica_reads` of each variable whose replicas may
    differ, from `values`, one per shadowed variable (`_primaries`): the
    flags, then the reads, flattened."""
    flags, reads = [], []
    for index, _ in self._layout:
      parts = [x for x, o in zip(values, self._owners) if o == index]
      flag, more = distributed.replica_reads(
        self._varset.variables[index], parts
      )
      flags.append(flag)
      reads.extend(more)
    return flags + reads

  def _copy_out(self, shadow_sets, name, gate=None):
    """One op copying a set of shadows into the variables (a distributed
    one's components), and the value of each shadowed variable
    (`_primaries`).

    Args:
      shadow_sets: The set to copy (a slot or the scratch) in a 1-list; or
        several, whose reads are gated (see `_gate`): each unit's value is
        the merge of its shadows' reads, the one of the set selected.
      name: The op's name.
      gate: None, or a dict from a variable's device to an op: every write
        waits for it, and nothing is written if it fails.
    """
    values = [None] * len(self._primaries)
    for n, unit in enumerate(self._units):
      reads = [self._reads(shadow_set[n]) for shadow_set in shadow_sets]
      if len(reads) == 1:
        value = reads[0]
      else:
        with ops.colocate_with(unit.anchor), tf.name_scope(name):
          value = control_flow_ops.merge(reads, name="selected")[0]
      for i, part in zip(unit.indices, unit.unpack(value)):
        values[i] = part
    wait = None if gate is None else lambda target: gate[target.device]
    return copies.copy(values, self._primaries, name, after=wait), values

  def _initialized(self, shadow_set, slot):
    """Ops that fail unless slot `slot` is initialized on every device.

    A slot's shadows are initialized together per device (see
    `shadows.make_slots`; a snapshot writes them all), so the first shadow on
    each device tells. A restore waits for every device's check before
    writing any variable: restoring a slot that a session never initialized
    (the local initializer did not run; a parameter server restarted) writes
    nothing, rather than the variables of the devices that still have it.
    Each check runs on its own device and only control edges cross devices,
    as for the copies themselves.

    Returns:
      A dict from a variable's device string to the op its restore waits for.
    """
    first = {}
    anchors = {}
    for unit, shadow in zip(self._units, shadow_set):
      first.setdefault(unit.anchor.device, shadow)
      anchors.setdefault(unit.anchor.device, unit.anchor)
    with tf.name_scope("slot_%d_initialized" % slot):
      checks = []
      for device, shadow in first.items():
        # Gated as the slot's reads: a slot not selected is not checked.
        gated = [self._gate(slot, anchors[device])] if self._selects else []
        with ops.colocate_with(shadow), tf.control_dependencies(gated):
          checks.append(
            tf.Assert(
              tf.is_variable_initialized(shadow),
              [UNINITIALIZED % slot],
              name="check",
            )
          )
      if len(checks) == 1:  # one device: the restore waits for its check
        return dict.fromkeys(first, checks[0])
      gates = {}
      for device, shadow in first.items():
        with ops.colocate_with(shadow), tf.control_dependencies(checks):
          gates[device] = tf.no_op(name="checked")
    return gates

  def _checked(self, initialized):
    """Per device, an op alive once the selected set's check passed.

    Args:
      initialized: Per slot, `_initialized`'s dict (gated: the checks of a
        slot not selected are dead).

    Returns:
      A dict from a variable's device string to the op a restore from any
      slot or the scratch waits for: the merge of each slot's signal that
      its check passed and of the scratch's gate (which has no check).
    """
    anchors = {}
    for unit in self._units:
      anchors.setdefault(unit.anchor.device, unit.anchor)
    checked = {}
    with tf.name_scope("checked"):
      for device, anchor in anchors.items():
        signals = []
        for k, gates in enumerate(initialized):
          with ops.colocate_with(anchor), tf.control_dependencies(
            [gates[device]]
          ):
            signals.append(tf.constant(k, name="passed"))
        with ops.colocate_with(anchor), tf.control_dependencies(
          [self._gate(len(initialized), anchor)]
        ):
          signals.append(tf.constant(len(initialized), name="scratch"))
        with ops.colocate_with(anchor):
          checked[device] = control_flow_ops.merge(signals)[0].op
    return checked

  def uninitialized(self, error):
    """The slot whose uninitialized shadows `error` (a tf.errors.OpError) is about, or None."""
    message = str(getattr(error, "message", error))
    for slot, shadow_set in enumerate(self._slots):
      if UNINITIALIZED % slot in message:
        return slot
      # A TF name is followed by a space or a "/" in TF's messages.
      if "uninitialized" in message and any(
        re.search(re.escape(s.op.name) + r"(?![\w.-])", message)
        for s in shadow_set
      ):
        return slot
    return None
