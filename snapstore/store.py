"""`SnapshotStore`: snapshot, roll back and evaluate past parameters.

One store class for two engines, picked where the store is built: graph mode
(a TF1-style graph; calls run in a `tf.Session`) or eager execution (TF 2.x;
calls take no session, `evaluate_with` calls a Python function; the class
docstring's Example is an eager program). In graph mode, build the store
with the model, before the graph is finalized; afterwards no call adds ops to
the graph.

    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=3)
    with tf.Session() as sess:                           # after initializers
      good = store.snapshot(session=sess)                # -> 0
      sess.run(train_op, feed)
      store.restore(good, session=sess)                  # bit-exact rollback
      past_loss = store.evaluate_with(loss, feed, session=sess)

Tags are integers counting up from 0 unless given (an int or a non-empty
string). The store keeps `max_to_keep` snapshots; when a snapshot under a new tag
would exceed that, the oldest one (by the time it was taken) is evicted first.
Snapshotting under a tag the store holds replaces that snapshot and makes it the
newest.

The facade holds the snapshot lifecycle. Two parts hold the rest:
`store.files` (`.npz` archives, checkpoints, spill files; `file_io.py`) and,
in device mode, `store.slots` (ops and variables of the device slots for the
user's own graph; `slots.py`). All three act through the store's `Holdings`
(`holdings.py`): its variables, mode, tags, owners and lock. Guards and trials
are `snapstore.Guard(store, ...)` and `snapstore.Trial(store, ...)`.

Thread safety: every method takes the store's lock, so calls from several
threads are serialized. Do not run training ops that write the covered
variables concurrently with `restore` or `evaluate_with`.
"""

import collections
import collections.abc

from snapstore._tf import not_converted_methods
from snapstore.core import failures
from snapstore.engines import choice
from snapstore import file_io
from snapstore import holdings
from snapstore.modes import table as mode_table
from snapstore import slots as slots_part


@not_converted_methods
class SnapshotStore(object):
  """In-memory snapshots of a set of variables, in one of several copy modes.

  Args:
    var_list: Variables to cover: a list (keyed by name; names that collide
      by "<name>/<position>" in it), or a `{key: variable}` dict.
    scope: A scope name or `tf.VariableScope`. Keys are variable names relative
      to it. Alone, it selects every global variable under the scope.
    collection: A graph collection to cover (filtered by `scope` if given).
      Without `var_list`, `scope` or `collection`: the trainable variables.
    mode: Where snapshots live: "device" (shadow variables next to the
      originals; snapshot and restore are in-graph copies), "host" (numpy
      arrays in this process) or "disk" (host arrays under a memory budget,
      the oldest spilled to an HDF5 file; see `snapstore/modes/disk.py`).
    max_to_keep: How many snapshots to keep before the oldest is evicted. In
      device mode this many slots of shadow variables are allocated (default
      1). Host mode defaults to 5; 0 keeps every snapshot. Disk mode bounds
      all tiers together and defaults to no bound. With a spill file, device
      and host modes bound only snapshots not spilled.
    optimizer: A `tf.train.Optimizer` (or Keras optimizer, or list) whose state
      for the covered variables is covered too: slots and non-slot variables
      such as Adam's `beta1_power`. Build its train op first. Eagerly: a Keras
      optimizer (Keras 3 or tf-keras): its iterations and slots, not its
      learning rate; built for the model if `var_list` is one.
    include_global_step: Graph mode: cover the graph's global step.
    name: Name scope of the store's ops; shadows are named after it.
    chief_only: Graph mode, between-graph replication: True (default)
      refuses `snapshot`, `restore`, `evaluate_with`'s swap and storing
      arrays (`load_arrays`, `files.load_*`) in a session on a task that is
      not the chief when the variables live on other (ps) tasks: every
      worker's store shares the shadows there, and the variables
      (`snapstore/engines/graph/between_graph.py`). False lets this task write.
    **mode_options: Options of the mode. Device: `saveable=False` (True puts
      shadows in GLOBAL_VARIABLES, so a default Saver saves them) and
      `pack=False` (True packs variables of up to 1 MiB into one buffer per
      device and dtype: for thousands of variables, far fewer ops and a
      faster build and first run, but no `slots.shadows()` or
      `slots.past()`). Disk:
      `spill_path` and `memory_budget` (bytes), required. Every mode:
      `spill_path=` adds an HDF5 spill file for `files.spill(tag)`, with
      `compression=None` ("lzf", "gzip"), `compression_opts`, `max_pending=2`
      (writes queued before `files.spill`/`snapshot` block) and `durable=False`
      (fsync each commit). See `modes/tiers.py`.

  Raises:
    ValueError: An unknown mode (the message lists the valid ones), a bad
      `max_to_keep` or device slots that cannot fit in memory (with the bytes
      they need), or a variable set `VariableSet` rejects (empty, unknown
      shapes, unsupported dtypes, duplicate keys, a variable listed twice).
      Eagerly: graph-only arguments, or options (`pack`, `saveable`).
    ModeError: An eager store built inside a `tf.function`.
    TypeError: An option the mode does not take, non-variables, a single
      variable as `var_list`, or a `chief_only` that is not a bool.
    SnapshotFileError: A spill file that cannot be created or written, is not
      a snapstore spill file, or is in use by another store.
    IncompatibleSnapshotError: A spill file of other variables.

  Example:
    ```python
    store = snapstore.SnapshotStore(var_list=model, optimizer=opt)  # eagerly
    good = store.snapshot()
    ...  # train; the loss explodes
    store.restore(good)  # the model and Adam's state, bit for bit
    target = store.slots.past(model, slot=0)  # the model, reading slot 0
    ```
  """

  def __init__(
    self,
    var_list=None,
    scope=None,
    collection=None,
    mode="device",
    max_to_keep=None,
    optimizer=None,
    include_global_step=False,
    name="snapstore",
    chief_only=True,
    **mode_options,
  ):
    engine = choice.new_engine()  # graph mode or eager execution
    engine.check_chief_only(chief_only)
    engine.check_building()
    mode_cls = engine.mode_class(mode)
    mode_table.check_options(mode_cls, mode_options)
    max_to_keep = mode_table.check_max_to_keep(max_to_keep, mode_cls)
    varset = engine.variable_set(
      var_list, scope, collection, optimizer, include_global_step
    )
    mode_table.check_fits(mode_cls, max_to_keep, varset)
    built, name = engine.build(
      mode_cls, varset, max_to_keep, name, mode_options
    )
    engine.bind(varset, name, chief_only)
    self._h = holdings.Holdings(engine, built)
    self._files = file_io.Files(self._h)
    self._slots = (
      slots_part.Slots(self._h) if built.slot_set is not None else None
    )
    # Calls traced into the user's tf.function (eagerly), or None.
    self._traced = engine.traced_calls(self._h)

  @property
  def engine(self):
    """The engine the store runs on: graph mode or eager execution.

    What differs between them, for code built on the store (snapstore's
    guards, callbacks and averages): `engine.name` ("graph" or "eager"),
    `engine.session(session, what)`, parameter-server training's
    `engine.functions_in_flight()` and `engine.join()`; see
    `snapstore/engines/base.py`.
    """
    return self._h.engine

  # -- what the store covers -----------------------------------------------------

  @property
  def name(self):
    return self._h.name

  @property
  def graph(self):
    """The graph of a graph-mode store; None for an eager store."""
    return self._h.varset.graph

  @property
  def mode(self):
    """The copy mode's name."""
    return self._h.mode.name

  @property
  def max_to_keep(self):
    """The most snapshots kept at once, or None for no bound."""
    return self._h.mode.capacity

  @property
  def keys(self):
    """The keys of the covered variables, in the store's order: the order
    they were given in (a list's, a dict's; a model's `model.weights`, as
    `get_weights()` orders them, then its other state, then the
    optimizer's; a graph-mode scope's or collection's, creation order).
    `arrays()`, `variables` and `slots.shadows()` come in this order."""
    return self._h.varset.keys

  @property
  def variables(self):
    """An OrderedDict from key to covered variable (a `tf.Variable`: the one
    a Keras 3 `keras.Variable` holds; `variable_of(key)` gives the latter)."""
    return collections.OrderedDict((s.key, s.variable) for s in self._h.varset)

  def key_of(self, variable):
    """The key the store keeps `variable` under.

        store = snapstore.SnapshotStore(var_list=model)
        store.key_of(model.weights[0])   # e.g. "dense/kernel"

    Args:
      variable: A covered variable: any object in `model.weights` or
        `model.variables` (a Keras 3 `keras.Variable` or the `tf.Variable`
        it holds), an element of a `var_list` list, or a component of a
        `tf.distribute` variable.

    Returns:
      The key, a string.

    Raises:
      ValueError: The store does not cover `variable`.
    """
    return self._h.varset.key_of(variable, self._h.name)

  def variable_of(self, key):
    """The object the store covers under `key`, as the model holds it: for
    an eager store over a Keras 3 model the `keras.Variable` in
    `model.weights`, otherwise the `tf.Variable` (`variables[key]`), so
    that `store.variable_of(store.key_of(w)) is w`.

    Raises:
      KeyError: No variable has that key (the message names close ones).
    """
    return self._h.varset.origin(key, self._h.name)

  @property
  def param_nbytes(self):
    """Bytes of one copy of the covered variables."""
    return self._h.varset.nbytes

  @property
  def nbytes(self):
    """Bytes the snapshots take in the mode's memory.

    Device mode: `num_slots * param_nbytes` on the variables' devices (plus one
    more copy once `evaluate_with` has used the scratch shadows), whether or
    not the slots hold snapshots. Host mode: the bytes of the held arrays
    (and of replicas kept: `core/distributed.py`, "Replicas that differ")."""
    return self._h.mode.nbytes

  # -- snapshots -----------------------------------------------------------------

  def tags(self):
    """Tags of the held snapshots, oldest first.

    Device snapshots of a local session that has been closed are not held
    any more (see "Sessions" in `restore`).
    """
    self._h.check_not_traced("tags")
    with self._h.lock:
      self._h.drop_gone()
      return self._h.catalog.tags()

  def info(self, tag=None):
    """The `SnapshotInfo` of snapshot `tag` (default: the newest)."""
    self._h.check_not_traced("info")
    with self._h.lock:
      return self._h.catalog.info(self._h.existing(tag, None, "info"))

  def evicts(self, tag=None):
    """The held tag that `snapshot(tag)` would evict now, or None.

    None when the store has room, or when `tag` is held (a snapshot under it
    replaces it). `snapstore.Guard` uses this to refuse a nested guard that
    would evict an enclosing one's snapshot.

    Raises:
      TypeError: A tag that is not an int or a non-empty string.
      PinnedTagError: The store is full and every snapshot is pinned.
    """
    self._h.check_not_traced("evicts")
    with self._h.lock:
      self._h.drop_gone()
      return self._h.victim(self._h.catalog.new_tag(tag))

  def __len__(self):
    self._h.check_not_traced("__len__")
    with self._h.lock:
      self._h.drop_gone()
      return len(self._h.catalog)

  def __contains__(self, tag):
    self._h.check_not_traced("__contains__")
    with self._h.lock:
      self._h.drop_gone()
      return tag in self._h.catalog

  def snapshot(self, tag=None, session=None):
    """Copies the variables' current values into the store.

    Args:
      tag: An int or non-empty string; default: the next integer. A held tag is
        replaced.
      session: The session to run in; default: the default session.

    Returns:
      The tag the snapshot is stored under.

    Raises:
      TypeError: A tag that is not an int or a non-empty string.
      NoSessionError: No session given and no default session.
      GraphMismatchError: A session of another graph.
      NotChiefError: A session on a task of a between-graph cluster that is
        not the chief (see `chief_only`); nothing was run.
      SnapshotError: TensorFlow failed to copy; the variables are unchanged and
        the message names any snapshot that was overwritten.
      TracedCallError: Called while a `tf.function` is traced (eagerly, a
        copy inside your step is `store.slots.snapshot_in_step()`).
    """
    self._h.check_not_traced("snapshot", self._snapshot_fix())
    sess = self._h.session(session, "snapshot", writes=True)
    with self._h.lock:
      self._h.prepare(sess)
      tag = self._h.catalog.new_tag(tag)
      victim = self._h.victim(tag)
      place = self._h.place(sess)
      with failures.translated("snapshot", tag, note=self._h.lost_note):
        self._h.mode.take(tag, sess, victim)
      return self._h.record(tag, victim, place)

  def restore(self, tag=None, session=None):
    """Writes snapshot `tag` (default: the newest) into the variables.

    The values are bit-for-bit those of the snapshot. The snapshot stays in the
    store.

    Returns:
      The restored tag.

    Sessions: a device snapshot lives in the session that took it (a local
    `tf.Session`), or on the cluster's tasks (a `grpc://` target), and is used
    only there; see `snapstore.engines.graph.places`. From another local session, or a
    cluster whose tasks restarted, it is refused, never restored with what
    that session's shadows happen to hold. Once its local session is closed,
    it is dropped from the store. Host and disk snapshots, spilled ones and
    pinned slots are not tied to a session.

    Raises:
      UnknownTagError: The store holds no snapshot `tag` (the message lists
        the tags it holds).
      SessionMismatchError: A device snapshot held by another session, or
        dropped because its session was closed or its cluster restarted
        (eagerly: a parameter server of its variables restarted, which the
        store learns when a call fails there, see
        `snapstore/engines/eager/restarts.py`).
      NoSessionError, GraphMismatchError, NotChiefError: As for `snapshot`;
        also a closed session.
      RestoreError: TensorFlow failed part-way; the snapshot is intact and
        calling `restore` again finishes the job. Or the snapshot's device
        slot is not initialized in this session: nothing was written, and the
        message names the initializer to run. Or, eagerly, a parameter server
        of the variables restarted: the message says so, and how to carry
        the (host or file) snapshot over.
    """
    if self._tracing():
      return self._traced.restore(tag)
    sess = self._h.session(session, "restore", writes=True)
    with self._h.lock:
      self._h.prepare(sess)
      tag = self._h.existing(tag, sess, "restore")
      with failures.translated(
        "restore",
        tag,
        self._h.mode.uninitialized,
        lost=self._h.lost(tag, "restore", wrote=True),
      ):
        self._h.mode.restore(tag, sess)
      return tag

  def delete(self, tag):
    """Drops snapshot `tag`.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
    """
    self._h.check_not_traced("delete")
    with self._h.lock:
      self._h.check_open()
      tag = self._h.catalog.existing(tag, allow_default=False)
      self._h.catalog.check_unpinned(
        tag,
        "it cannot be deleted while the store exists",
        lambda t: self._h.mode.slot_set.slot_of(t),
      )
      self._h.mode.delete(tag)
      self._h.catalog.drop(tag)
      self._h.places.unbind(tag)

  def evaluate_with(
    self, fetches, feed_dict=None, past=True, tag=None, session=None
  ):
    """Runs `fetches` with the parameters of a snapshot, then puts back the current ones.

    The current values are set aside, the snapshot is loaded, `fetches` run
    once, and the set-aside values are written back, also when running the
    fetches raises. Afterwards the variables hold bit-for-bit what they held
    before. Fetched training ops change only the loaded snapshot's copy, never
    the store's snapshot or the current values.

    In device mode, when every fetch has a rewired version for the tag's slot
    (built beforehand by `past(fetches, slot)`), the rewired tensors run
    instead, reading the slot directly: no copy, nothing set aside, no ops
    built. Otherwise, or in host mode, the swap above is used.

    Args:
      fetches: As for `Session.run`.
      feed_dict: As for `Session.run`.
      past: If False, just run `fetches` with the current parameters.
      tag: The snapshot to evaluate; default: the newest.
      session: The session to run in; default: the default session.

    Returns:
      What `Session.run(fetches, feed_dict)` returns.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      NotChiefError: With `past`, as for `snapshot`.
      RestoreError: Writing the current values back failed; the store keeps
        them and writes them back at the start of its next call (or
        `recover()`).
      SnapshotError: Setting the current values aside, or loading the
        snapshot, failed in TensorFlow (e.g. its device slot is not
        initialized in this session: the message names the initializer to
        run); the current values are back in place.
      tf.errors.OpError: Whatever `Session.run` raises for `fetches`, after
        the current values are back in place.
    """
    if self._tracing():
      self._h.check_run(fetches, feed_dict, "evaluate_with")
      if not past:
        return fetches()
      return self._traced.evaluate_with(fetches, tag)
    sess = self._h.session(session, "evaluate_with", writes=past)
    self._h.check_run(fetches, feed_dict, "evaluate_with")
    with self._h.lock:
      self._h.prepare(sess)
      if not past:
        return self._h.run(fetches, feed_dict, sess, "evaluate_with")
      tag = self._h.existing(tag, sess, "evaluate_with")
      rewired = self._rewired(fetches, feed_dict, tag)
      if rewired is not None:
        return sess.run(rewired[0], feed_dict=rewired[1])
      return self._h.swapped(fetches, feed_dict, tag, sess)

  def evaluate_each(
    self, fetches, feed_dict=None, tags=None, together=True, session=None
  ):
    """Runs `fetches` with each of several snapshots, as `evaluate_with` would.

    Snapshots held in device slots, for which every fetch has a rewired version
    (built beforehand by `past(fetches, slot)`), run together in one
    `session.run`; the others run one after another through the swap. The
    store's lock is held throughout, so no other thread's call moves a snapshot
    out of its slot meanwhile. The current parameters are left bit for bit as
    they were. This is how `snapstore.Ensemble` evaluates its members.

    Args:
      fetches: As for `Session.run`.
      feed_dict: As for `Session.run`; fed for every snapshot.
      tags: The snapshots, in order; default: every snapshot held, oldest first.
      together: If False, each snapshot runs alone, as `evaluate_with` runs
        it (rewired or swapped): one run each, and the activations of one
        forward pass at a time.
      session: The session to run in; default: the default session.

    Returns:
      An OrderedDict from tag to what `Session.run(fetches, feed_dict)` returns.

    Raises:
      UnknownTagError: A tag the store does not hold, or no snapshots at all.
      TypeError: `tags` is not a list (or other iterable) of tags.
      Error: As for `evaluate_with`, otherwise.
    """
    if self._tracing():
      self._h.check_run(fetches, feed_dict, "evaluate_each")
      return self._traced.evaluate_each(fetches, tags)
    sess = self._h.session(session, "evaluate_each")
    self._h.check_run(fetches, feed_dict, "evaluate_each")
    with self._h.lock:
      self._h.prepare(sess)
      tags = self._h.tags_to_evaluate(tags)
      for tag in tags:
        self._h.existing(tag, sess, "evaluate_each", allow_default=False)
      values = {}
      if together and self._slots is not None:
        values = self._slots.run_together(fetches, feed_dict, tags, sess)
      for tag in tags:
        if tag not in values:
          values[tag] = self.evaluate_with(
            fetches, feed_dict, tag=tag, session=sess
          )
      return collections.OrderedDict((tag, values[tag]) for tag in tags)

  def recover(self, session=None):
    """Writes back current parameters a failed `evaluate_with` could not.

    Every other call does this first, so calling it is only needed to recover
    at a chosen moment. Does nothing when nothing is pending.

    Raises:
      RestoreError: Writing back failed again; the values stay pending.
    """
    sess = self._h.session(session, "recover")
    with self._h.lock:
      self._h.prepare(sess)

  def arrays(self, tag=None, session=None):
    """Snapshot `tag` (default: the newest) as numpy arrays.

    Returns:
      An OrderedDict from variable key to a read-only numpy array, a copy of the
      snapshot that stays valid whatever happens to the store or the variables.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      NoSessionError: Device mode needs a session to read its shadows.
      SnapshotError: Reading a device slot failed (e.g. its shadows were
        never initialized in this session: the message names the fix).
    """
    sess = self._h.data_session(session, "arrays")
    with self._h.lock:
      self._h.check_open()
      tag = self._h.existing(tag, sess, "arrays")
      values = self._h.read(tag, sess, "arrays")
    for a in values:
      a.setflags(write=False)
    return collections.OrderedDict(zip(self._h.varset.keys, values))

  def load_arrays(self, arrays, tag=None, session=None):
    """Stores arrays, or the values of a second model, as a snapshot.

        store.load_arrays(store.arrays(good), tag="copy")   # {key: array}
        store.load_arrays(target_net, tag="target")   # another model's values

    Everything is checked before anything is stored: the keys (or the
    variables paired) must be exactly the store's, with their shapes and
    dtypes.

    Args:
      arrays: A mapping `{key: numpy array}` (what `arrays()` returns), or a
        second model of the store's structure, whose values are stored:
        eagerly, a Keras model, layer or `tf.Module` built by the same code
        (variables paired by the path a `tf.train.Checkpoint` saves each
        under, so automatic layer names do not matter); or a list of
        variables in the order of `keys`.
      tag: The tag to store it under; default: the next integer.
      session: Graph mode: the session (default: the default session).

    Returns:
      The tag the snapshot is stored under.

    Raises:
      IncompatibleSnapshotError: Missing or extra keys, variables that do not
        pair up, or wrong shapes or dtypes, all named in the message.
      TypeError: Neither a mapping nor a model or list of variables, or a
        mapping holding tensors, variables or other non-numeric objects.
    """
    self._h.check_not_traced("load_arrays")
    if not isinstance(arrays, collections.abc.Mapping):
      holdings.check_not_values(arrays, "load_arrays()")
      arrays = self._h.engine.arrays_from(arrays, session, "load_arrays")
    return self._h.put_mapping(arrays, tag, session, "load_arrays")

  # -- the parts: files, and device slots ------------------------------------------

  @property
  def files(self):
    """`.npz` archives, checkpoints and spill files: a `snapstore.file_io.Files`."""
    return self._files

  @property
  def slots(self):
    """The device slots' ops and variables: a `snapstore.slots.Slots`.

    Raises:
      ModeError: The store has no device slots (host or disk mode); the
        message names the mode that has them.
    """
    if self._slots is None:
      raise slots_part.no_slots(self._h.mode.name)
    return self._slots

  # -- lifetime ----------------------------------------------------------------------

  def close(self):
    """Releases what the mode holds outside the graph. Safe to call twice.

    With a spill file, queued writes are finished first and the file closed.
    A disk-mode store first writes the snapshots it holds in memory, so a
    store built over the same file later lists every snapshot.

    Raises:
      SpillError: Snapshots could not be written to the spill file (a full
        disk): they are named, the store stays open with them, and calling
        `close()` again writes them. Or a delete from the file failed: the
        store is closed and the file still holds that snapshot.
    """
    self._h.check_not_traced("close")
    with self._h.lock:
      if not self._h.closed:
        try:
          self._h.mode.close()
        finally:
          self._h.closed = self._h.mode.closed

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def __repr__(self):
    return "<SnapshotStore %r mode=%s variables=%d (%d bytes) tags=%r>" % (
      self._h.name,
      self._h.mode.name,
      len(self._h.varset),
      self.param_nbytes,
      self.tags(),
    )

  # -- internals -----------------------------------------------------------------------

  def _tracing(self):
    """True for an eager store's call traced into a `tf.function`."""
    return self._traced is not None and self._traced.active()

  def _snapshot_fix(self):
    """What to call instead of `snapshot()` inside a traced step."""
    if self._traced is None:
      return None
    return self._traced.snapshot_fix(self._slots is not None)

  def _rewired(self, fetches, feed_dict, tag):
    """(fetches, feed_dict) reading the tag's slot, or None to use the swap."""
    if self._slots is None:
      return None
    return self._slots.rewired(fetches, feed_dict, tag)
