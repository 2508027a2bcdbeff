"""`SnapshotStore`: snapshot, roll back and evaluate past parameters (graph mode).

Build the store with the model, before the graph is finalized; afterwards no call
adds ops to the graph.

    loss, train_op = build_model()                       # variables under "net"
    store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=3)
    with tf.Session() as sess:
      sess.run([tf.global_variables_initializer(),
                tf.local_variables_initializer()])
      good = store.snapshot(session=sess)                # -> 0
      _, value = sess.run([train_op, loss], feed)
      if not np.isfinite(value):
        store.restore(good, session=sess)                # bit-exact rollback
      past_loss = store.evaluate_with(loss, feed, session=sess)

Tags are integers counting up from 0 unless given (an int or a non-empty
string). The store keeps `max_to_keep` snapshots; when a snapshot under a new tag
would exceed that, the oldest one (by the time it was taken) is evicted first.
Snapshotting under a tag the store holds replaces that snapshot and makes it the
newest.

Thread safety: every method takes the store's lock, so calls from several
threads are serialized. Do not run training ops that write the covered
variables concurrently with `restore` or `evaluate_with`.
"""
import collections
import collections.abc
import threading
import time

import numpy as np

from snapstore._tf import tf
from snapstore._tf import tf_variables
from snapstore.core import catalog
from snapstore.core import checks
from snapstore.core import places
from snapstore.core import sessions
from snapstore.core.variables import VariableSet
from snapstore import errors
from snapstore.files import checkpoints
from snapstore.files import npz
from snapstore.files import sources
from snapstore.graph import rewire
from snapstore.modes import table as mode_table
from snapstore.spill import file as spill_file
from snapstore.training import guards
from snapstore.training import steps

_NOTHING = object()


class SnapshotStore(object):
  """In-memory snapshots of a set of variables, in one of several copy modes.

  Args:
    var_list: Variables to cover: a list, or a `{key: variable}` dict.
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
      such as Adam's `beta1_power`. Build its train op first.
    include_global_step: Cover the graph's global step.
    name: Name scope of the store's ops; shadows are named after it.
    **mode_options: Options of the mode. Device: `saveable=False` (True puts
      shadows in GLOBAL_VARIABLES, so a default Saver saves them) and
      `pack=False` (True packs variables of up to 1 MiB into one buffer per
      device and dtype: for thousands of variables, far fewer ops and a
      faster build and first run, but no `shadows()` or `past()`). Disk:
      `spill_path` and `memory_budget` (bytes), required. Every mode:
      `spill_path=` adds an HDF5 spill file for `spill(tag)`, with
      `compression=None` ("lzf", "gzip"), `compression_opts`, `max_pending=2`
      (writes queued before `spill`/`snapshot` block) and `durable=False`
      (fsync each commit). See `modes/tiers.py`.

  Raises:
    ValueError: An unknown mode (the message lists the valid ones), a bad
      `max_to_keep` or device slots that cannot fit in memory (with the bytes
      they need), or a variable set `VariableSet` rejects (empty, unknown
      shapes, unsupported dtypes, duplicate keys, a variable listed twice).
    TypeError: An option the mode does not take, non-variables, or a single
      variable as `var_list`.
    SnapshotFileError: A spill file that cannot be created or written, is not
      a snapstore spill file, or is in use by another store.
    IncompatibleSnapshotError: A spill file of other variables.
  """

  def __init__(self, var_list=None, scope=None, collection=None, mode="device",
               max_to_keep=None, optimizer=None, include_global_step=False,
               name="snapstore", **mode_options):
    mode_cls = mode_table.get(mode)
    mode_table.check_options(mode_cls, mode_options)
    max_to_keep = mode_table.check_max_to_keep(max_to_keep, mode_cls)
    self._varset = VariableSet(var_list=var_list, scope=scope,
                               collection=collection, optimizer=optimizer,
                               include_global_step=include_global_step)
    mode_table.check_fits(mode_cls, max_to_keep, self._varset)
    # The store's ops run on their own: they must not inherit the control
    # dependencies (a train op) of the block the store is built in.
    with self._varset.graph.as_default(), tf.control_dependencies(None), \
        tf.name_scope(name) as scope_name:
      self._name = scope_name.rstrip("/")
      self._mode = mode_table.build(mode_cls, self._varset, max_to_keep, self._name,
                               mode_options)
    self._lock = threading.RLock()
    self._catalog = catalog.Catalog(self._mode.capacity)
    for tag, when in self._mode.adopted():  # snapshots in an existing spill file
      self._catalog.adopt(tag, when)
    self._pending = _NOTHING  # token of current values a failed put-back left
    self._places = places.Places(self._varset)  # where device snapshots live
    self._closed = False
    self._rewirer = None  # made by the first past() call
    # train op from snapshot_before() -> (the slot it writes, its if_finite)
    self._in_step = {}

  # -- what the store covers -----------------------------------------------------

  @property
  def name(self):
    return self._name

  @property
  def graph(self):
    return self._varset.graph

  @property
  def mode(self):
    """The copy mode's name."""
    return self._mode.name

  @property
  def max_to_keep(self):
    """The most snapshots kept at once, or None for no bound."""
    return self._mode.capacity

  @property
  def keys(self):
    """Variable keys (names relative to the scope), sorted."""
    return self._varset.keys

  @property
  def variables(self):
    """An OrderedDict from key to covered variable."""
    return collections.OrderedDict((s.key, s.variable) for s in self._varset)

  @property
  def param_nbytes(self):
    """Bytes of one copy of the covered variables."""
    return self._varset.nbytes

  @property
  def nbytes(self):
    """Bytes the snapshots take in the mode's memory.

    Device mode: `num_slots * param_nbytes` on the variables' devices (plus one
    more copy once `evaluate_with` has used the scratch shadows), whether or
    not the slots hold snapshots. Host mode: the bytes of the held arrays.
    """
    return self._mode.nbytes

  # -- snapshots -----------------------------------------------------------------

  def tags(self):
    """Tags of the held snapshots, oldest first.

    Device snapshots of a local session that has been closed are not held
    any more (see "Sessions" in `restore`).
    """
    with self._lock:
      self._drop_gone()
      return self._catalog.tags()

  def info(self, tag=None):
    """The `SnapshotInfo` of snapshot `tag` (default: the newest)."""
    with self._lock:
      return self._catalog.info(self._existing(tag, None, "info"))

  def evicts(self, tag=None):
    """The held tag that `snapshot(tag)` would evict now, or None.

    None when the store has room, or when `tag` is held (a snapshot under it
    replaces it). `store.guard` uses this to refuse a nested guard that would
    evict an enclosing one's snapshot.

    Raises:
      TypeError: A tag that is not an int or a non-empty string.
      PinnedTagError: The store is full and every snapshot is pinned.
    """
    with self._lock:
      self._drop_gone()
      return self._victim(self._catalog.new_tag(tag))

  def __len__(self):
    with self._lock:
      self._drop_gone()
      return len(self._catalog)

  def __contains__(self, tag):
    with self._lock:
      self._drop_gone()
      return tag in self._catalog

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
      SnapshotError: TensorFlow failed to copy; the variables are unchanged and
        the message names any snapshot that was overwritten.
    """
    sess = self._session(session, "snapshot")
    with self._lock:
      self._prepare(sess)
      tag = self._catalog.new_tag(tag)
      victim = self._victim(tag)
      place = self._place(sess)
      try:
        self._mode.take(tag, sess, victim)
      except tf.errors.OpError as e:
        lost = self._catalog.keep_only(set(self._mode.tags()))
        raise errors.SnapshotError(
            "Taking snapshot %r failed: %s. The variables are unchanged.%s"
            % (tag, errors.first_line(e), catalog.lost_note(lost))) from e
      return self._record(tag, victim, place)

  def restore(self, tag=None, session=None):
    """Writes snapshot `tag` (default: the newest) into the variables.

    The values are bit-for-bit those of the snapshot. The snapshot stays in the
    store.

    Returns:
      The restored tag.

    Sessions: a device snapshot lives in the session that took it (a local
    `tf.Session`), or on the cluster's tasks (a `grpc://` target), and is used
    only there; see `snapstore.core.places`. From another local session, or a
    cluster whose tasks restarted, it is refused, never restored with what
    that session's shadows happen to hold. Once its local session is closed,
    it is dropped from the store. Host and disk snapshots, spilled ones and
    pinned slots are not tied to a session.

    Raises:
      UnknownTagError: The store holds no snapshot `tag` (the message lists
        the tags it holds).
      SessionMismatchError: A device snapshot held by another session, or
        dropped because its session was closed or its cluster restarted.
      NoSessionError, GraphMismatchError: As for `snapshot`; also a closed
        session.
      RestoreError: TensorFlow failed part-way; the snapshot is intact and
        calling `restore` again finishes the job.
    """
    sess = self._session(session, "restore")
    with self._lock:
      self._prepare(sess)
      tag = self._existing(tag, sess, "restore")
      try:
        self._mode.restore(tag, sess)
      except tf.errors.OpError as e:
        raise errors.RestoreError(
            "Restoring snapshot %r failed: %s. The variables may hold a mix of "
            "old and restored values; the snapshot is intact, call restore(%r) "
            "again." % (tag, errors.first_line(e), tag)) from e
      return tag

  def delete(self, tag):
    """Drops snapshot `tag`.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
    """
    with self._lock:
      self._check_open()
      tag = self._catalog.existing(tag, allow_default=False)
      self._catalog.check_unpinned(
          tag, "it cannot be deleted while the store exists",
          lambda t: self._mode.slot_of(t))
      self._mode.delete(tag)
      self._catalog.drop(tag)
      self._places.unbind(tag)

  def evaluate_with(self, fetches, feed_dict=None, past=True, tag=None,
                    session=None):
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
      RestoreError: Writing the current values back failed; the store keeps
        them and writes them back at the start of its next call (or
        `recover()`).
      Whatever `Session.run` raises for `fetches`, after the current values are
        back in place.
    """
    sess = self._session(session, "evaluate_with")
    with self._lock:
      self._prepare(sess)
      if not past:
        return sess.run(fetches, feed_dict=feed_dict)
      tag = self._existing(tag, sess, "evaluate_with")
      rewired = self._rewired(fetches, feed_dict, tag)
      if rewired is not None:
        return sess.run(rewired[0], feed_dict=rewired[1])
      try:
        token = self._mode.stash(sess)
      except tf.errors.OpError as e:
        raise errors.SnapshotError(
            "evaluate_with could not set the current parameters aside: %s. "
            "Nothing was changed." % errors.first_line(e)) from e
      try:
        self._mode.restore(tag, sess)
        return sess.run(fetches, feed_dict=feed_dict)
      finally:
        self._put_back(token, sess)

  def evaluate_each(self, fetches, feed_dict=None, tags=None, together=True,
                    session=None):
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
      As `evaluate_with` otherwise.
    """
    sess = self._session(session, "evaluate_each")
    with self._lock:
      self._prepare(sess)
      if tags is None:
        tags = self._catalog.tags()
        if not tags:
          self._catalog.existing(None)  # the "no snapshots yet" error
      elif isinstance(tags, (str, bytes)) or not isinstance(
          tags, collections.abc.Iterable):
        raise TypeError(
            "evaluate_each() takes a list of tags, got tags=%r. For one "
            "snapshot pass tags=[%r], or call evaluate_with(..., tag=%r)."
            % (tags, tags, tags))
      for tag in tags:
        self._existing(tag, sess, "evaluate_each", allow_default=False)
      in_one_run, fetch_list, feeds = [], [], dict(feed_dict or {})
      for tag in tags if together else ():
        rewired = self._rewired(fetches, feed_dict, tag)
        if rewired is not None:
          in_one_run.append(tag)
          fetch_list.append(rewired[0])
          feeds.update(rewired[1] or {})  # each slot's copies of fed tensors
      values = {}
      if in_one_run:
        values.update(zip(in_one_run, sess.run(fetch_list, feed_dict=feeds)))
      for tag in tags:
        if tag not in values:
          values[tag] = self.evaluate_with(fetches, feed_dict, tag=tag, session=sess)
      return collections.OrderedDict((tag, values[tag]) for tag in tags)

  def recover(self, session=None):
    """Writes back current parameters a failed `evaluate_with` could not.

    Every other call does this first, so calling it is only needed to recover
    at a chosen moment. Does nothing when nothing is pending.

    Raises:
      RestoreError: Writing back failed again; the values stay pending.
    """
    sess = self._session(session, "recover")
    with self._lock:
      self._prepare(sess)

  # -- training-loop blocks (snapstore.training.guards) ---------------------------------------

  def guard(self, watch=None, retries=0, reraise=True, catch=(Exception,),
            tag="guard", session=None):
    """A block that rolls the variables back when it raises or a loss is not finite.

    Takes a snapshot (under `tag`) on entry; when the block raises, or a
    watched tensor that `guard.run` fetches is NaN or infinite, restores it
    and retries (`retries`), re-raises or carries on. See `snapstore.training.guards`.

        with store.guard(watch=loss, reraise=False, session=sess) as guard:
          guard.run(train_op, feed)
          guard.run(loss, feed)  # the loss after the step

    Returns:
      A `snapstore.Guard`.
    """
    return guards.Guard(self, watch=watch, retries=retries, reraise=reraise,
                        catch=catch, tag=tag, session=session)

  def trial(self, metric=None, feed_dict=None, accept=None, tag="trial",
            session=None):
    """A block whose update is kept or rolled back by a criterion.

    Snapshots on entry (under `tag`); on exit keeps the block's update if the
    block called `trial.keep()`, or if `accept(before, after)` holds for
    `metric` evaluated before and after the block (default: `after` is finite
    and no larger); otherwise restores the snapshot. See `snapstore.training.guards`.

        with store.trial(metric=loss, feed_dict=held_out, session=sess) as trial:
          sess.run(train_op, feed)

    Returns:
      A `snapstore.Trial`.
    """
    return guards.Trial(self, metric=metric, feed_dict=feed_dict, accept=accept,
                        tag=tag, session=session)

  # -- arrays and files ------------------------------------------------------------

  def arrays(self, tag=None, session=None):
    """Snapshot `tag` (default: the newest) as numpy arrays.

    Returns:
      An OrderedDict from variable key to a read-only numpy array, a copy of the
      snapshot that stays valid whatever happens to the store or the variables.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      NoSessionError: Device mode needs a session to read its shadows.
    """
    sess = self._session(session, "arrays", required=self._mode.data_needs_session)
    with self._lock:
      self._check_open()
      tag = self._existing(tag, sess, "arrays")
      values = self._mode.arrays(tag, sess)
    for a in values:
      a.setflags(write=False)
    return collections.OrderedDict(zip(self._varset.keys, values))

  def load_arrays(self, arrays, tag=None, session=None):
    """Stores a mapping `{key: numpy array}` as a snapshot.

    Everything is checked before anything is stored: the keys must be exactly
    the store's keys, with the variables' shapes and dtypes.

    Returns:
      The tag the snapshot is stored under.

    Raises:
      IncompatibleSnapshotError: Missing or extra keys, or wrong shapes or
        dtypes, all named in the message.
      TypeError: `arrays` is not a mapping, or holds tensors, variables or
        other objects that are not numeric arrays.
    """
    if not isinstance(arrays, collections.abc.Mapping):
      raise TypeError(
          "load_arrays() takes a dict {key: numpy array}, got %s. For values in "
          "the order of store.keys, pass dict(zip(store.keys, values))."
          % type(arrays).__name__)
    declared = {}
    for key, value in arrays.items():
      kind = ("a variable" if isinstance(value, tf_variables.Variable) else
              "a tensor" if isinstance(value, tf.Tensor) else
              "an op" if isinstance(value, tf.Operation) else None)
      if kind:
        raise TypeError(
            "load_arrays() takes numpy arrays; %r is %s (%s). Evaluate it first "
            "(session.run), or take a snapshot of the variables with snapshot()."
            % (key, kind, value.name))
      value = np.asarray(value)
      if value.dtype.hasobject:
        raise TypeError("load_arrays() takes numeric arrays; %r holds Python "
                        "objects (%s)." % (key, type(arrays[key]).__name__))
      declared[key] = (value.shape, value.dtype)
    self._varset.check_declared(declared, "The dict of arrays")
    return self._put([np.asarray(arrays[k]) for k in self._varset.keys], tag,
                     session, "load_arrays")

  def save_npz(self, path, tag=None, session=None, compress=False):
    """Writes snapshot `tag` (default: the newest) to an `.npz` archive.

    Members are named by variable key (see `snapstore.files.npz`); the file is
    written atomically and `path` is used as given.

    Returns:
      The tag written.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      SnapshotFileError: The file cannot be written.
    """
    sess = self._session(session, "save_npz", required=self._mode.data_needs_session)
    with self._lock:
      self._check_open()
      tag = self._existing(tag, sess, "save_npz")
      values = self._mode.arrays(tag, sess)
    npz.save(path, self._varset.keys, values, compress=compress)
    return tag

  def load_npz(self, path, tag=None, strip_prefix=None, add_prefix=None,
               mapping=None, allow_extra=False, session=None):
    """Reads an `.npz` archive (see `snapstore.files.npz`) into the store as a snapshot.

    The archive is checked in full before anything is stored, and loaded with
    `allow_pickle=False`. The variables are not changed; `restore` the tag to
    use it. Member names are the store's keys unless mapped as for
    `load_checkpoint` (by default nothing is stripped: `save_npz` writes keys).

    Returns:
      The tag the snapshot is stored under.

    Raises:
      SnapshotFileError: No such file, not an `.npz` archive, pickled objects,
        or corrupt data.
      IncompatibleSnapshotError: Missing, extra, wrong-shape or wrong-dtype
        arrays, each named.
      ValueError, TypeError: A bad mapping, or two members mapped to one variable.
    """
    return self._load("load_npz", lambda: npz.Archive(path),
                      sources.NameMap(self._varset, strip_prefix, add_prefix, mapping),
                      allow_extra, tag, session)

  def load_checkpoint(self, path, tag=None, strip_prefix=None, add_prefix=None,
                      mapping=None, allow_extra=False, session=None):
    """Reads a `tf.train.Saver` checkpoint into the store as a snapshot.

    The checkpoint (V1 or V2, written by any process) is read with TF's
    checkpoint reader; its graph is not built and no op is added. Names,
    shapes and dtypes are checked in full before any tensor is read, and
    nothing is stored unless every covered variable is read. The variables
    are not changed; `restore(tag)`, `evaluate_with(..., tag=tag)` or a
    `snapstore.Ensemble` use the snapshot. See `snapstore.files.checkpoints`.

    A checkpoint name becomes a store key as `snapstore.files.sources.NameMap`
    says: a `mapping` dict entry wins (None skips the name); otherwise a name
    under `strip_prefix` loses it and gains `add_prefix`; other names are
    keys as they are.

        store.load_checkpoint(path, tag="b", strip_prefix="model_2")  # model_2/w -> w

    Args:
      path: What `Saver.save` returned (a V2 prefix or V1 file), or a
        directory with a `checkpoint` file (its latest checkpoint).
      tag: The tag to store under; default: the next integer.
      strip_prefix: The scope of the model in the checkpoint. Default: the
        store's scope, so a checkpoint of the same model under the same scope
        needs no mapping; "" strips nothing.
      add_prefix: A scope put in front of the stripped names, for a store
        whose keys carry one (a store built without `scope`).
      mapping: A dict `{checkpoint name: key or None}`, or a function
        `name -> key or None` that replaces the prefix rules.
      allow_extra: Skip checkpoint names that map to no variable (optimizer
        slots, a global step, other models) instead of reporting them.
      session: The session to run in (device mode); default: the default
        session.

    Returns:
      The tag the snapshot is stored under.

    Raises:
      CheckpointError: No checkpoint at `path`, not a checkpoint, or the reader
        failed (the message says how to fix it).
      IncompatibleSnapshotError: Variables the checkpoint lacks, names that map
        to no variable (unless `allow_extra`), other shapes or dtypes: all
        named in one message.
      ValueError: A mapping value that is not a key of the store, or two names
        mapped to one variable.
      TypeError: A bad `path`, prefix or mapping type.
    """
    if strip_prefix is None and not callable(mapping):
      strip_prefix = self._varset.scope
    return self._load("load_checkpoint", lambda: checkpoints.Checkpoint(path),
                      sources.NameMap(self._varset, strip_prefix, add_prefix, mapping),
                      allow_extra, tag, session)

  def load_spill(self, path, snapshot, tag=None, strip_prefix=None,
                 add_prefix=None, mapping=None, allow_extra=False, session=None):
    """Reads snapshot `snapshot` of the spill file `path` into the store.

    For a file another run or store wrote (this store's own spilled snapshots
    are restored by their tags). Names, shapes and dtypes are checked in full
    before any data is read, and each array's checksum as it is read; nothing
    is stored unless every covered variable is read. The variables are not
    changed. Names map to keys as for `load_checkpoint`, except that nothing is
    stripped by default: a spill file's names are already keys.

    Args:
      path: A snapstore spill file, not open for writing by a live store.
      snapshot: The tag of a complete snapshot in the file.
      tag: The tag to store under; default: the next integer.
      strip_prefix, add_prefix, mapping, allow_extra: As for `load_checkpoint`.
      session: The session to run in (device mode); default: the default
        session.

    Returns:
      The tag the snapshot is stored under.

    Raises:
      SnapshotFileError: No such file, not a spill file, the file is open for
        writing, or a checksum mismatch (naming the variable).
      UnknownTagError: The file holds no complete snapshot `snapshot`.
      IncompatibleSnapshotError: Missing, unexpected, wrong-shape or wrong-dtype
        variables, all named.
      ValueError: Two names mapped to one variable.
    """
    return self._load("load_spill", lambda: spill_file.open_snapshot(path, snapshot),
                      sources.NameMap(self._varset, strip_prefix, add_prefix, mapping),
                      allow_extra, tag, session)

  # -- tiers: a spill file under the store ------------------------------------------

  def spill(self, tag=None, session=None):
    """Moves snapshot `tag` (default: the newest) to the store's spill file.

    The snapshot is read into host memory (device mode needs the session for
    that) and leaves its tier at once; it is written to the file in the
    background and leaves host memory once the write is committed. It stays
    restorable throughout. Spilling a spilled snapshot does nothing. Blocks
    while `max_pending` snapshots wait for the writer (back-pressure).

    Returns:
      The tag.

    Raises:
      ModeError: The store has no spill file (give it `spill_path=`, or use
        mode="disk").
      UnknownTagError: The store holds no snapshot `tag`.
      PinnedTagError: The snapshot is pinned to a device slot (`pin_slot`).
      SnapshotError: Reading a device snapshot failed; it stays in its slot.
      SpillError: An earlier background write failed (see `flush`).
    """
    sess = self._session(session, "spill", required=self._mode.data_needs_session)
    with self._lock:
      if sess is not None:
        self._prepare(sess)
      self._check_open()
      tiered = self._tiered("spill")
      tag = self._existing(tag, sess, "spill")
      self._catalog.check_unpinned(
          tag, "it cannot leave the slot. Snapshot it under another tag and "
          "spill that", lambda t: self._mode.slot_of(t))
      try:
        tiered.spill(tag, self._catalog.info(tag), sess)
      except tf.errors.OpError as e:
        raise errors.SnapshotError(
            "Spilling snapshot %r failed: reading it failed: %s. It stays where "
            "it was." % (tag, errors.first_line(e))) from e
      return tag

  def flush(self):
    """Waits until every snapshot on its way to the spill file is written.

    Snapshots whose write failed earlier are written again first. Does nothing
    for a store without a spill file.

    Raises:
      SpillError: A write failed; the message names each snapshot, which stays
        in host memory.
    """
    with self._lock:
      self._check_open()
      self._mode.flush()

  def tier(self, tag=None):
    """Where snapshot `tag` (default: the newest) is: "device", "host" or "file".

    "host" includes a snapshot on its way to the spill file.
    """
    with self._lock:
      return self._mode.tier(self._catalog.existing(tag))

  # -- device-mode ops for the user's own graph ------------------------------------

  @property
  def initializer(self):
    """An op initializing the store's shadow variables (a no-op in host mode).

    `tf.local_variables_initializer()` and `MonitoredSession` run it too. It
    initializes each shadow once; run again, it leaves the shadows as they are.
    """
    return self._mode.initializer

  @property
  def num_slots(self):
    """Number of device slots. Device mode only."""
    return self._device("num_slots").num_slots

  def snapshot_op(self, slot=0):
    """The grouped op copying the variables into device slot `slot`.

    For the user's own `session.run` or `control_dependencies`, e.g. refreshing
    a target network after each train step. Running it does not change the
    store's tags: `restore(tag)` restores whatever the tag's slot holds.
    """
    return self._device("snapshot_op").snapshot_op(self._check_slot(slot))

  def restore_op(self, slot=0):
    """The grouped op copying device slot `slot` into the variables."""
    return self._device("restore_op").restore_op(self._check_slot(slot))

  def shadows(self, slot=0):
    """An OrderedDict from key to the shadow variable of device slot `slot`."""
    values = self._device("shadows").shadows(self._check_slot(slot))
    return collections.OrderedDict(zip(self._varset.keys, values))

  def past(self, outputs, slot=0):
    """Tensors computing `outputs` from device slot `slot` instead of the variables.

    Fetch them next to `outputs` to evaluate past and current parameters in
    one `session.run` with no copy; refresh the slot with `snapshot_op(slot)`
    (or `snapshot()`). Built at graph-construction time and cached: asking
    again returns the same tensors. See `snapstore.graph.rewire` for what is copied,
    what is refused and why; gradients never flow into the shadows.

    Args:
      outputs: A tensor, or a list, tuple or dict of tensors, of the model.
      slot: The device slot to read.

    Returns:
      The rewired tensors, in the structure of `outputs`. A tensor that does
      not depend on the covered variables is returned as it is.

    Raises:
      ModeError: The store is not in device mode.
      ValueError: No such slot, no tensors, or a variable's reference/handle.
      TypeError: Something other than tensors.
      GraphMismatchError: Tensors of another graph.
      RewireError: An op on the way cannot be rewired faithfully (the message
        names it); nothing is built.
    """
    device = self._device("past")
    slot = self._check_slot(slot)
    with self._lock:
      if self._rewirer is None:
        self._rewirer = rewire.Rewirer(
            self._name, self._varset.variables,
            [device.shadows(k, "past") for k in range(device.num_slots)])
      return self._rewirer.past(outputs, slot)

  def slot_of(self, tag):
    """The device slot holding snapshot `tag`."""
    device = self._device("slot_of")
    with self._lock:
      return device.slot_of(self._catalog.existing(tag, allow_default=False))

  def pin_slot(self, slot, tag):
    """Names device slot `slot` `tag`, for ops that write the slot in the graph.

    Nothing is copied: from now on `tag` names whatever the slot holds, as
    written by your own ops (`snapshot_op(slot)` in the train step for a target
    network, a `MovingAverage`, Lookahead's slow weights), so that
    `evaluate_with(tag=tag)`, `restore(tag)`, `arrays(tag)` and `save_npz` use
    it. A pinned tag is never evicted and cannot be deleted; `snapshot(tag)`
    and `load_arrays(..., tag)` overwrite the slot. Pinning makes the tag the
    newest, as taking a snapshot would; pinning the tag the slot already holds
    pins it in place. No graph ops are added.

    Args:
      slot: A device slot, 0 to `num_slots - 1`.
      tag: An int or non-empty string.

    Returns:
      The tag.

    Raises:
      ModeError: The store is not in device mode.
      ValueError: No such slot; the slot holds another snapshot; or `tag` is
        held in another slot.
      TypeError: A tag that is not an int or a non-empty string.
    """
    with self._lock:
      return self._pin(*self._check_pin("pin_slot", slot, tag))

  def snapshot_before(self, update, slot=0, tag="before_step", if_finite=None,
                      name="snapshot_before"):
    """A train op that snapshots into device slot `slot`, then runs the update.

    One `session.run` of the returned op copies the variables into the slot
    and then applies the update `update()` builds: every op it creates waits
    for the copy, and the train op is checked to write no variable of the
    store before the copy (see `snapstore.training.steps`). The slot is pinned
    under `tag` (see `pin_slot`), so after a step `restore(tag)`,
    `evaluate_with(..., tag=tag)` or a `guard(tag=tag)` use the values the step
    started from. Before the first step the slot holds what its initializer
    gave it (the variables' initial values).

        grads = opt.compute_gradients(loss)   # outside: runs next to the copy
        train_op = store.snapshot_before(
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
      slot: The device slot to write, 0 to `num_slots - 1`.
      tag: The tag naming the slot (an int or a non-empty string).
      if_finite: None, or a float tensor of the model computed from the
        variables (typically the loss the step minimizes): copy only when it
        is all finite. Not a tensor computed inside a `tf.cond` or
        `tf.while_loop`.
      name: The name of the returned op.

    Returns:
      The train op. It replaces the update's op in the TRAIN_OP collection.

    Raises:
      ModeError: The store is not in device mode (host and disk snapshots are
        not graph variables: use `snapshot()` before the step).
      ValueError: No such slot; the slot or tag is taken (as for `pin_slot`);
        `update()` returned nothing; the train op writes a variable of the
        store without waiting for the copy (the message names the op, and
        for a function call or v2 control flow the function and op inside
        it; an op taking a variable's handle counts as a writer unless it is
        proven to only read it); or
        `if_finite` is computed inside a `tf.cond` or `tf.while_loop`.
      TypeError: `update` is not a function (an already built op), a bad
        tag, or an `if_finite` that is not a float tensor.
      GraphMismatchError: `if_finite` is of another graph.
    """
    with self._lock:
      pin = self._check_pin("snapshot_before", slot, tag)
      train_op = steps.build(update, self._mode, pin[1], self._varset.variables,
                             name, if_finite)
      self._in_step[train_op] = (pin[1], if_finite)
      self._pin(*pin)
      return train_op

  def in_step_ops(self, tag):
    """The train ops (from `snapshot_before`) that snapshot under `tag` in their run.

    An empty list if `tag` is not the tag of such a slot.
    """
    with self._lock:
      if tag not in self._catalog.pinned():
        return []
      slot = self._mode.slot_of(tag)
      return [op for op, (s, _) in self._in_step.items() if s == slot]

  def in_step_condition(self, train_op):
    """The `if_finite` tensor of a train op from `snapshot_before`, or None.

    None means the train op writes its slot on every run; a tensor, that it
    writes it only when that tensor is all finite.

    Raises:
      ValueError: `train_op` was not built by this store's `snapshot_before`.
    """
    with self._lock:
      entry = self._in_step.get(train_op)
      if entry is None:
        raise ValueError("%r is not a train op built by this store's "
                         "snapshot_before() (those are %s)." % (
                             getattr(train_op, "name", train_op),
                             errors.names(sorted(op.name for op in self._in_step))
                             or "none"))
      return entry[1]

  def pinned(self):
    """The pinned tags (see `pin_slot`), oldest first."""
    with self._lock:
      return self._catalog.pinned()

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
    with self._lock:
      if not self._closed:
        try:
          self._mode.close()
        finally:
          self._closed = self._mode.closed

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def __repr__(self):
    return "<SnapshotStore %r mode=%s variables=%d (%d bytes) tags=%r>" % (
        self._name, self._mode.name, len(self._varset), self.param_nbytes,
        self.tags())

  # -- internals -----------------------------------------------------------------------

  def _session(self, session, what, required=True):
    if not required and session is None and tf.get_default_session() is None:
      return None
    return sessions.resolve(session, self.graph, what)

  def _check_open(self):
    if self._closed:
      raise errors.StoreClosedError("The store %r is closed." % self._name)
    self._mode.check()  # a failed background write (spill file), once
    self._drop_gone()

  def _prepare(self, sess):
    """Checks the store is open and writes back pending current values."""
    self._check_open()
    if self._pending is _NOTHING:
      return
    try:
      self._mode.unstash(self._pending, sess)
    except tf.errors.OpError as e:
      raise errors.RestoreError(
          "The current parameters that evaluate_with set aside are still not "
          "written back: %s. The store keeps them; call recover() with a "
          "working session." % errors.first_line(e)) from e
    self._pending = _NOTHING

  def _rewired(self, fetches, feed_dict, tag):
    """(fetches, feed_dict) reading the tag's slot, or None to use the swap."""
    if self._rewirer is None or self._mode.tier(tag) != "device":
      return None  # not in a slot: a spilled snapshot is swapped in from its tier
    return self._rewirer.lookup(fetches, feed_dict, self._mode.slot_of(tag))

  def _put_back(self, token, sess):
    try:
      self._mode.unstash(token, sess)
    except tf.errors.OpError as e:
      self._pending = token
      raise errors.RestoreError(
          "evaluate_with could not write the current parameters back: %s. The "
          "store keeps them and writes them back at the start of its next call, "
          "or call recover()." % errors.first_line(e)) from e

  def _load(self, what, open_source, names, allow_extra, tag, session):
    """Stores the snapshot a file holds: `load_npz`, `load_checkpoint`, `load_spill`.

    The session is resolved first, so that a missing one is reported before
    any file is read; `open_source()` gives a source (see `snapstore.files.sources`)
    usable as a context manager, read in full and closed before storing.
    """
    self._session(session, what, required=self._mode.data_needs_session)
    with open_source() as source:
      arrays = sources.read(source, self._varset, names, allow_extra=allow_extra)
    return self._put(arrays, tag, session, what)

  def _put(self, values, tag, session, what):
    sess = self._session(session, what, required=self._mode.data_needs_session)
    with self._lock:
      if sess is not None:
        self._prepare(sess)
      self._check_open()
      tag = self._catalog.new_tag(tag)
      victim = self._victim(tag)
      place = self._place(sess)
      try:
        self._mode.put(tag, values, sess, victim)
      except tf.errors.OpError as e:
        lost = self._catalog.keep_only(set(self._mode.tags()))
        raise errors.SnapshotError("Storing snapshot %r failed: %s.%s" % (
            tag, errors.first_line(e), catalog.lost_note(lost))) from e
      return self._record(tag, victim, place)

  def _victim(self, tag):
    # With a spill file, spilled snapshots may not count (see modes/tiers.py).
    return self._catalog.victim(tag, self._mode.counts_toward_capacity)

  def _record(self, tag, victim, place):
    """Records snapshot `tag`, just written at `place` (None: no session)."""
    self._catalog.record(tag, victim, time.time())
    self._mode.settle(self._catalog.infos())
    self._places.keep_only(set(self._catalog.tags()))
    if (place is not None and self._mode.tier(tag) == "device"
        and tag not in self._catalog.pinned()):
      self._places.bind(tag, place)
    else:
      self._places.unbind(tag)
    return tag

  # -- where device snapshots live (snapstore/core/places.py) -------------------------

  def _place(self, sess):
    """Where `sess` keeps variables, if this store can hold device snapshots."""
    if sess is None or self._mode.name != "device":
      return None
    return self._places.of(sess)

  def _existing(self, tag, sess, what, allow_default=True):
    """`tag` (None: the newest) if held, and usable from `sess` (None: no data use).

    Raises:
      UnknownTagError: As `Catalog.existing`.
      SessionMismatchError: A device snapshot held elsewhere, or dropped
        because its session or cluster lost it.
    """
    self._drop_gone()
    if tag not in self._catalog and (tag is not None or not len(self._catalog)):
      note = self._places.dropped_note(tag)
      if note:
        raise errors.SessionMismatchError(
            note if tag is not None else "The store holds no snapshots. " + note)
    tag = self._catalog.existing(tag, allow_default)
    place = self._place(sess)
    if place is not None and self._mode.tier(tag) == "device":
      lost = self._places.check(tag, place, what)
      if lost:
        self._forget(tag, lost)
        raise errors.SessionMismatchError(lost)
    return tag

  def _drop_gone(self):
    """Drops the device snapshots of local sessions that are closed or gone."""
    for tag, why in self._places.gone():
      self._forget(tag, why)

  def _forget(self, tag, why):
    if tag in self._catalog and self._mode.tier(tag) == "device":
      self._mode.delete(tag)
      self._catalog.drop(tag)
      self._places.drop(tag, why)
    else:
      self._places.unbind(tag)

  def _device(self, what):
    if self._mode.name != "device":
      raise errors.ModeError(
          "%s() is for device mode; this store uses mode %r, whose snapshots "
          "are not graph variables. Use snapshot()/restore(), or a store with "
          "mode='device'." % (what, self._mode.name))
    return self._mode

  def _tiered(self, what):
    if not hasattr(self._mode, "spill"):
      raise errors.ModeError(
          "%s() needs a spill file; this %s-mode store has none. Pass "
          "spill_path='file.h5' when building it, or use mode='disk'."
          % (what, self._mode.name))
    return self._mode

  def _check_pin(self, what, slot, tag):
    """(device, slot, tag, tag held in the slot) for pinning `tag` to `slot`."""
    device = self._device(what)
    slot = self._check_slot(slot)
    if tag is None:
      raise TypeError("%s() needs a tag (an int or a non-empty string)." % what)
    tag = self._catalog.new_tag(tag)
    with self._lock:
      self._check_open()
      holder = device.tag_in(slot)
      if holder is not None and holder != tag:
        raise ValueError(
            "Slot %d holds snapshot %r; delete it first or pin another slot."
            % (slot, holder))
      if holder is None and tag in self._catalog:
        raise ValueError("Tag %r is held in slot %d, not slot %d."
                         % (tag, device.slot_of(tag), slot))
      return device, slot, tag, holder

  def _pin(self, device, slot, tag, holder):
    device.pin(tag, slot)
    self._catalog.pin(tag)
    self._places.unbind(tag)  # in-graph ops write the slot in any session
    if holder is None:
      self._record(tag, None, None)
    return tag

  def _check_slot(self, slot):
    n = self._mode.num_slots
    return checks.integer(slot, "slot", 0, n - 1, hint="this store has %d "
                          "slot(s); set max_to_keep for more" % n)
