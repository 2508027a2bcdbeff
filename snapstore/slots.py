"""`store.slots`: the calls of a store's device slots, for the user's own graph.

A device store (`mode="device"`, with or without a spill file) keeps its
snapshots in slots of shadow variables. Besides the lifecycle calls every
store has, its slots offer ops and variables to build into a graph:

    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=2)
    slots = store.slots
    sess.run(slots.snapshot_op(1))            # the grouped copy into slot 1
    q_past = slots.past(q, 1)                 # q computed from slot 1
    slots.pin(1, "target")                    # "target" names what slot 1 holds
    train_op = slots.snapshot_before(update)  # a snapshot in the step's run

On the eager engine a device store's slots are eager shadow variables:
`shadows`, `pin`, `pinned`, `slot_of` work as in graph mode; `past(fn, slot)`
takes a function and returns it reading the slot
(`snapstore/engines/eager/past.py`); `trackable(slot)` puts a slot in a
`tf.train.Checkpoint`; and `snapshot_in_step()` is the in-step snapshot for
the user's `tf.function` (`snapstore/engines/eager/in_step.py`). The
graph-only calls (`initializer`, `snapshot_op`, `restore_op`,
`snapshot_before`) raise `ModeError` naming the eager way, and
`snapshot_in_step` and `trackable` do in graph mode.

Host and disk stores have no slots: `store.slots` raises `ModeError` once,
naming the mode that has them. A store with `pack=True` has slots but no
shadow per variable: `shadows()` and `past()` raise `ModeError`
(`per_variable` tells). A graph-mode store over `tf.distribute` variables
has a shadow per replica component: `component_shadows()` gives them,
`past()` rewires each component to its own, and `shadows()` (one variable
per key) raises `ModeError`.
"""

import collections

from snapstore._tf import not_converted_methods
from snapstore.core import checks
from snapstore import errors


@not_converted_methods
class Slots(object):
  """The device slots of a store (see module doc). Made by `store.slots`.

  Args:
    holdings: The store's `Holdings`; its mode has a `slot_set`.
  """

  def __init__(self, holdings):
    self._h = holdings
    self._set = holdings.mode.slot_set
    self._in_step = {}  # train op from snapshot_before() -> its in_step.InStep
    self._trackables = {}  # slot -> its trackable() object

  def __len__(self):
    """The number of slots (the store's `max_to_keep` in device mode)."""
    return self._set.num_slots

  @property
  def per_variable(self):
    """Whether every variable has a shadow of its own (False with `pack=True`)."""
    return self._set.per_variable

  @property
  def initializer(self):
    """An op initializing the slots' shadow variables.

    `tf.local_variables_initializer()` and `MonitoredSession` run it too. It
    initializes each shadow once; run again, it leaves the shadows as they are.
    """
    self._graph_only("initializer")
    return self._set.initializer

  def snapshot_op(self, slot=0):
    """The grouped op copying the variables into slot `slot`.

    For the user's own `session.run` or `control_dependencies`, e.g. refreshing
    a target network after each train step. Running it does not change the
    store's tags: `restore(tag)` restores whatever the tag's slot holds.
    """
    self._graph_only("snapshot_op")
    return self._set.snapshot_op(self._check_slot(slot))

  def restore_op(self, slot=0):
    """The grouped op copying slot `slot` into the variables."""
    self._graph_only("restore_op")
    return self._set.restore_op(self._check_slot(slot))

  def shadows(self, slot=0):
    """An OrderedDict from key to the shadow variable of slot `slot`.

    Raises:
      ModeError: The store packs variables (`pack=True`), or is a graph-mode
        store over `tf.distribute` variables (see `component_shadows`).
    """
    values = self._set.shadows(self._check_slot(slot))
    return collections.OrderedDict(zip(self._h.varset.keys, values))

  def trackable(self, slot=0):
    """Eager stores: slot `slot`'s shadows as a trackable object, for checkpoints.

    The shadows are not tracked by the model (nor by anything else), so a
    `tf.train.Checkpoint` of the model does not save a target network or
    an average kept in a slot. Give it this object, and it does:

        ckpt = tf.train.Checkpoint(model=model, target=store.slots.trackable(1))
        ckpt.write(path)
        # later, or in another process, with a model built by the same code:
        ckpt = tf.train.Checkpoint(model=model, target=store.slots.trackable(1))
        ckpt.restore(path)   # the slot's shadows hold the target again

    Each shadow sits where its variable sits in what the store was built
    over (the path a checkpoint of the model saves the variable under:
    `layer_with_weights-0/kernel`), so a checkpoint restores into a store
    over a network built with other automatic layer names; over a list or
    dict of variables, each shadow is named by its key. Restoring writes
    the slot's shadows, not the store's tags: pin the slot under its tag
    (`pin`, or the `MovingAverage` that keeps it) before or after, as when
    the checkpoint was written. The same object is returned for a slot
    every time.

    Args:
      slot: The slot, 0 to `len(store.slots) - 1`.

    Returns:
      A trackable object (`tf.train.Checkpoint(name=...)` takes it).

    Raises:
      ModeError: A graph-mode store (build it with `saveable=True` for
        `tf.train.Saver`, or add the slot's `shadows()` to your Saver).
      ValueError: No such slot.
    """
    slot = self._check_slot(slot)
    with self._h.lock:
      if slot not in self._trackables:
        self._trackables[slot] = self._h.engine.trackable(
          self._set.shadows(slot)
        )
      return self._trackables[slot]

  def component_shadows(self, slot=0):
    """An OrderedDict from key to the shadows of its variable's components.

    For each variable, a list with the shadow of each component in slot
    `slot`: one per replica for a `tf.distribute` variable (in the order of
    `variable.values`, each on its component's device), a single one for
    an ordinary variable. Unlike `shadows()`, it works for a graph-mode
    store over distributed variables, whose shadows are per component.

    Raises:
      ModeError: The store packs variables (`pack=True`).
    """
    values = self._set.component_shadows(self._check_slot(slot))
    return collections.OrderedDict(zip(self._h.varset.keys, values))

  def past(self, outputs, slot=0):
    """`outputs` computed from slot `slot` instead of the variables.

    Eagerly, `outputs` is a function (a model, `lambda x: model(x)`, a
    `tf.function`), and `past` returns one that computes it with the
    slot's shadows read in place of the store's variables: no copy,
    nothing put back, what the slot holds read at every call. Call it
    eagerly, inside your `tf.function` or inside a `GradientTape`: its
    values are bit for bit those of the same function on a separate model
    holding the slot's values, called the same way; no gradient flows to
    the current variables, gradients flow to its inputs. See
    `snapstore/engines/eager/past.py`.

    In graph mode, `outputs` are tensors of the model, and `past` returns
    tensors computing them from the slot, to fetch next to `outputs`: past
    and current parameters in one `session.run`, no copy. Built at
    graph-construction time and cached: asking again returns the same
    tensors. See `snapstore.engines.graph.rewire` for what is copied, what
    is refused and why; gradients never flow into the shadows. Over
    `tf.distribute` variables (`MirroredStrategy`), each component is
    rewired to its own shadow (`component_shadows`): an output computed in
    `strategy.run` reads its replica's, one computed in cross-replica
    context the primary's. A `PerReplica` of outputs gives a `PerReplica`
    of their past tensors; fetch them with
    `strategy.experimental_local_results(...)`.

    Refresh the slot with `store.snapshot()` (or, in graph mode,
    `snapshot_op(slot)`), a `MovingAverage`, or `store.load_arrays`.

    Args:
      outputs: Eagerly, a callable. In graph mode, a tensor, a
        `PerReplica` of tensors, or a list, tuple or dict of them.
      slot: The slot to read.

    Returns:
      Eagerly, a callable taking `outputs`' arguments (its `function` is
      the `tf.function` it runs). In graph mode, the rewired tensors, in the
      structure of `outputs` (a tensor that does not depend on the covered
      variables is returned as it is).

    Raises:
      TypeError: Eagerly, `outputs` is not callable; in graph mode, it is a
        function, or not tensors.
      ValueError: No such slot. Eagerly, when the function is traced (at its
        first call with new arguments): it writes a variable of the store
        (batch norm in training mode), or creates variables. In graph mode,
        no tensors, or a variable's reference/handle.
      ModeError: The store packs variables (`pack=True`).
      GraphMismatchError: Tensors of another graph.
      RewireError: An op on the way cannot be rewired faithfully (the message
        names it); nothing is built.

    Example:
      ```python
      target_q = store.slots.past(q_net, slot=0)  # eagerly
      y = r + gamma * tf.reduce_max(target_q(next_obs), axis=1)
      q_past = store.slots.past(q, slot=0)  # graph mode: tensors
      ```
    """
    slot = self._check_slot(slot)
    with self._h.lock:
      return self._h.engine.past(outputs, slot, self._set)

  def rewired(self, fetches, feed_dict, tag):
    """(fetches, feed_dict) reading the slot of `tag`, or None to swap it in.

    None when nothing was rewired with `past`, or the snapshot is not in a
    slot (a spilled one is swapped in from its tier).
    """
    if self._h.mode.tier(tag) != "device":
      return None
    return self._h.engine.rewired(fetches, feed_dict, self._set.slot_of(tag))

  def run_together(self, fetches, feed_dict, tags, session):
    """`{tag: values}` of the `tags` whose fetches all have rewired versions
    for their slot, run in one `session.run` (the others are left out)."""
    in_one_run, fetch_list, feeds = [], [], dict(feed_dict or {})
    for tag in tags:
      rewired = self.rewired(fetches, feed_dict, tag)
      if rewired is not None:
        in_one_run.append(tag)
        fetch_list.append(rewired[0])
        feeds.update(rewired[1] or {})  # each slot's copies of fed tensors
    if not in_one_run:
      return {}
    return dict(zip(in_one_run, session.run(fetch_list, feed_dict=feeds)))

  def slot_of(self, tag):
    """The slot holding snapshot `tag`.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      ModeError: The snapshot is in the spill file, not in a slot.
    """
    with self._h.lock:
      tag = self._h.catalog.existing(tag, allow_default=False)
      if self._h.mode.tier(tag) != "device":
        raise errors.ModeError(
          "Snapshot %r is in the spill file (%s tier), not in a device slot."
          % (tag, self._h.mode.tier(tag))
        )
      return self._set.slot_of(tag)

  def pin(self, slot, tag):
    """Names slot `slot` `tag`, for ops that write the slot in the graph.

    Nothing is copied: from now on `tag` names whatever the slot holds, as
    written by your own ops (`snapshot_op(slot)` in the train step for a target
    network, a `MovingAverage`, Lookahead's slow weights), so that
    `store.evaluate_with(tag=tag)`, `restore(tag)`, `arrays(tag)` and
    `files.save_npz` use it. A pinned tag is never evicted and cannot be
    deleted; `snapshot(tag)` and `load_arrays(..., tag)` overwrite the slot.
    Pinning makes the tag the newest, as taking a snapshot would; pinning the
    tag the slot already holds pins it in place. No graph ops are added.

    Args:
      slot: A slot, 0 to `len(store.slots) - 1`.
      tag: An int or non-empty string.

    Returns:
      The tag.

    Raises:
      ValueError: No such slot; the slot holds another snapshot; or `tag` is
        held in another slot.
      TypeError: A tag that is not an int or a non-empty string.
    """
    self._h.check_not_traced("slots.pin")
    with self._h.lock:
      return self._pin(*self._check_pin("pin", slot, tag))

  def pinned(self):
    """The pinned tags (see `pin`), oldest first."""
    with self._h.lock:
      return self._h.catalog.pinned()

  def snapshot_before(
    self,
    update,
    slot=0,
    tag="before_step",
    if_finite=None,
    name="snapshot_before",
  ):
    """A train op that snapshots into slot `slot`, then runs the update.

    One `session.run` of the returned op copies the variables into the slot
    and then applies the update `update()` builds: every op it creates waits
    for the copy, and the train op is checked to write no variable of the
    store before the copy (see `snapstore.engines.graph.in_step`). The slot is pinned
    under `tag` (see `pin`), so after a step `store.restore(tag)`,
    `store.evaluate_with(..., tag=tag)` or a `snapstore.Guard(store,
    tag=tag)` use the values the step started from. Before the first step the
    slot holds what its initializer gave it (the variables' initial values).

        grads = opt.compute_gradients(loss)   # outside: runs next to the copy
        train_op = store.slots.snapshot_before(
            lambda: opt.apply_gradients(grads, global_step=step))
        sess.run(train_op, feed)
        store.restore("before_step")          # undoes the step, bit for bit

    With `if_finite=loss`, the copy runs only when every element of `loss` is
    finite, and the update runs either way (after the copy when it runs). The
    slot then holds the parameters of the newest step whose loss was finite:
    after a step whose loss is NaN or infinite, `restore(tag)` goes back to
    them (`SnapshotHook(store, loss=loss, in_step=tag)` does this for you).
    The update waits for `loss`, so `loss` is computed from the values the
    step started from, as is a `loss` fetched in the same run.

    Args:
      update: A function of no arguments that builds the update and returns
        the op(s) to run (what `apply_gradients` or `minimize` returns).
        Built ops are refused: they cannot be made to wait for the copy.
      slot: The slot to write, 0 to `len(store.slots) - 1`.
      tag: The tag naming the slot (an int or a non-empty string).
      if_finite: None, or a float tensor of the model computed from the
        variables (typically the loss the step minimizes): copy only when it
        is all finite. Not a tensor computed inside a `tf.cond` or
        `tf.while_loop`.
      name: The name of the returned op.

    Returns:
      The train op. It replaces the update's op in the TRAIN_OP collection.

    Raises:
      ValueError: No such slot; the slot or tag is taken (as for `pin`);
        `update()` returned nothing; the train op writes a variable of the
        store without waiting for the copy (the message names the op, and
        for a function call or v2 control flow the function and op inside
        it; an op taking a variable's handle counts as a writer unless it is
        proven to only read it); or `if_finite` is computed inside a
        `tf.cond` or `tf.while_loop`.
      TypeError: `update` is not a function (an already built op), a bad
        tag, or an `if_finite` that is not a float tensor.
      GraphMismatchError: `if_finite` is of another graph.
    """
    self._graph_only("snapshot_before")
    with self._h.lock:
      pin = self._check_pin("snapshot_before", slot, tag)
      entry = self._h.engine.snapshot_before(
        update, self._set, pin[0], name, if_finite
      )
      self._in_step[entry.train_op] = entry
      self._pin(*pin)
      return entry.train_op

  def snapshot_in_step(self, slot=0, tag="before_step"):
    """Eager engine: the in-step snapshot for your own `tf.function`.

    Returns an `InStepSnapshot` writing slot `slot`, pinned under `tag` (see
    `pin`). In the step, call `start = snap.begin()` first, before anything
    writes the variables, and `start.commit(if_finite=loss)` anywhere after;
    or `snap()` for an unconditional copy at that point. After a step,
    `store.restore(tag)` goes back to the values it started from (with
    `if_finite`, of the newest step whose loss was finite). See
    `snapstore/engines/eager/in_step.py` for why the order is exact. Before the first
    step the slot holds the values the variables had when the store was
    built.

    Raises:
      ModeError: A graph-mode store (use `snapshot_before`).
      ValueError, TypeError: As for `pin`.
    """
    with self._h.lock:
      pin = self._check_pin("snapshot_in_step", slot, tag)
      snap = self._h.engine.in_step_snapshot(
        self._h.varset.variables, self._set.shadows(pin[0]), pin[1]
      )
      self._pin(*pin)
      return snap

  def in_steps(self, tag):
    """The `in_step.InStep` of each train op snapshotting under `tag` in its run.

    An empty list if `tag` is not the tag of such a slot.
    """
    with self._h.lock:
      if tag not in self._h.catalog.pinned():
        return []
      slot = self._set.slot_of(tag)
      return [entry for entry in self._in_step.values() if entry.slot == slot]

  def in_step_ops(self, tag):
    """The train ops (from `snapshot_before`) that snapshot under `tag` in their run."""
    return [entry.train_op for entry in self.in_steps(tag)]

  def in_step_condition(self, train_op):
    """The `if_finite` tensor of a train op from `snapshot_before`, or None.

    None means the train op writes its slot on every run; a tensor, that it
    writes it only when that tensor is all finite.

    Raises:
      ValueError: `train_op` was not built by this store's `snapshot_before`.
    """
    with self._h.lock:
      entry = self._in_step.get(train_op)
      if entry is None:
        raise ValueError(
          "%r is not a train op built by this store's "
          "snapshot_before() (those are %s)."
          % (
            getattr(train_op, "name", train_op),
            errors.names(sorted(op.name for op in self._in_step)) or "none",
          )
        )
      return entry.condition

  # -- internals ---------------------------------------------------------------

  def _graph_only(self, what):
    self._h.engine.check_graph_call(what)

  def _check_slot(self, slot):
    n = self._set.num_slots
    return checks.integer(
      slot,
      "slot",
      0,
      n - 1,
      hint="this store has %d slot(s); set max_to_keep for more" % n,
    )

  def _check_pin(self, what, slot, tag):
    """(slot, tag, tag held in the slot) for pinning `tag` to `slot`."""
    slot = self._check_slot(slot)
    if tag is None:
      raise TypeError("%s() needs a tag (an int or a non-empty string)." % what)
    tag = self._h.catalog.new_tag(tag)
    with self._h.lock:
      self._h.check_open()
      holder = self._set.tag_in(slot)
      if holder is not None and holder != tag:
        raise ValueError(
          "Slot %d holds snapshot %r; delete it first or pin another slot."
          % (slot, holder)
        )
      if holder is None and tag in self._h.catalog:
        tier = self._h.mode.tier(tag)
        if tier != "device":
          raise ValueError(
            "Tag %r is held in the %s, not in a device slot, so it cannot "
            "name slot %d. Pin another tag, or delete %r first "
            "(store.delete(%r))."
            % (
              tag,
              "spill file"
              if tier == "file"
              else "host memory, on its way to the spill file",
              slot,
              tag,
              tag,
            )
          )
        raise ValueError(
          "Tag %r is held in slot %d, not slot %d."
          % (tag, self._set.slot_of(tag), slot)
        )
      return slot, tag, holder

  def _pin(self, slot, tag, holder):
    self._set.pin(tag, slot)
    self._h.catalog.pin(tag)
    self._h.places.unbind(tag)  # in-graph ops write the slot in any session
    if holder is None:
      self._h.record(tag, None, None)
    return tag


def no_slots(mode):
  """The ModeError for `store.slots` on a store of `mode` (no device slots)."""
  return errors.ModeError(
    "store.slots: this store uses mode %r, whose snapshots are not graph "
    "variables, so it has no device slots (snapshot_op, restore_op, "
    "shadows, past, pin, snapshot_before). mode='device' has them; with "
    "this store, use snapshot() and restore()." % mode
  )
