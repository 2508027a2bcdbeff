"""`store.files`: snapshots to and from files, and the store's spill file.

Every store reads and writes the same files, whatever its mode:

    store.files.save_npz("best.npz", tag)                 # keys as members
    store.files.load_npz("best.npz", tag="best")           # checked in full first
    store.files.load_checkpoint(path, tag="run_2", allow_extra=True)
    store.files.load_spill("other_run.h5", 17, tag="theirs")

A store with a spill file (`mode="disk"`, or `spill_path=` on a device or host
store) also moves snapshots there and tells where each one is:

    store.files.spill(tag)     # to the file, written in the background
    store.files.flush()        # wait for the writes
    store.files.tier(tag)      # "device", "host" or "file"

Loading never touches the variables: it stores a snapshot, which `restore`
writes into them. Every source is read and checked in full (names, shapes,
dtypes, checksums) before anything is stored; see `snapstore.files.sources`.
"""

from snapstore._tf import not_converted_methods
from snapstore.files import checkpoints
from snapstore.files import npz
from snapstore.files import object_graph
from snapstore.files import sources
from snapstore.core import failures
from snapstore import errors
from snapstore.spill import source as spill_source


@not_converted_methods
class Files(object):
  """Snapshot files of a store (see module doc). Made by `store.files`.

  Args:
    holdings: The store's `Holdings`.
  """

  def __init__(self, holdings):
    self._h = holdings

  def save_npz(self, path, tag=None, session=None, compress=False):
    """Writes snapshot `tag` (default: the newest) to an `.npz` archive.

    Members are named by variable key (see `snapstore.files.npz`); the file is
    written atomically and `path` is used as given.

    Returns:
      The tag written.

    Raises:
      UnknownTagError: The store holds no snapshot `tag`.
      SnapshotFileError: The file cannot be written.
      SnapshotError: Reading a device slot failed (see `arrays`).
    """
    sess = self._h.data_session(session, "save_npz")
    with self._h.lock:
      self._h.check_open()
      tag = self._h.existing(tag, sess, "save_npz")
      tiers = self._h.mode.tiers
      streamed = tiers.arrays_one_by_one(tag) if tiers is not None else None
      if streamed is not None:
        # From the spill file a variable at a time, under the lock.
        npz.save(path, self._h.varset.keys, streamed, compress=compress)
        return tag
      values = self._h.read(tag, sess, "save_npz")
    npz.save(path, self._h.varset.keys, values, compress=compress)
    return tag

  def load_npz(
    self,
    path,
    tag=None,
    strip_prefix=None,
    add_prefix=None,
    mapping=None,
    allow_extra=False,
    session=None,
  ):
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
    return self._load(
      "load_npz",
      lambda: npz.Archive(path),
      tag,
      session,
      strip_prefix,
      add_prefix,
      mapping,
      allow_extra,
    )

  def load_checkpoint(
    self,
    path,
    tag=None,
    strip_prefix=None,
    add_prefix=None,
    mapping=None,
    allow_extra=False,
    session=None,
    root=None,
  ):
    """Reads a TensorFlow checkpoint into the store as a snapshot.

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

        store.files.load_checkpoint(path, tag="b", strip_prefix="model_2")  # model_2/w -> w

    A TF2 object-based checkpoint (`tf.train.Checkpoint.write`,
    `model.save_weights` in the TF format) is matched to the store's variables
    through its object graph when `root` is given: the object it was written
    from, or a dict of its children (`root={"model": model, "optimizer":
    opt}` for `tf.train.Checkpoint(model=model, optimizer=opt)`); see
    `snapstore.files.object_graph`. Names holding variables the store does not
    cover (a learning rate, another model) are skipped.

        store.files.load_checkpoint(path, root={"model": model, "optimizer": opt})

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
      root: For a TF2 object-based checkpoint: what it was written from (see
        above). Not with `mapping` or the prefixes.

    Returns:
      The tag the snapshot is stored under.

    Raises:
      CheckpointError: No checkpoint at `path`, not a checkpoint, or the reader
        failed (the message says how to fix it); `root` with a checkpoint that
        has no object graph.
      IncompatibleSnapshotError: Variables the checkpoint lacks, names that map
        to no variable (unless `allow_extra`), other shapes or dtypes: all
        named in one message.
      ValueError: A mapping value that is not a key of the store, or two names
        mapped to one variable.
      TypeError: A bad `path`, prefix or mapping type.
    """
    if root is not None:
      if mapping is not None or strip_prefix or add_prefix:
        raise TypeError(
          "load_checkpoint(root=...) maps names through the checkpoint's "
          "object graph; pass no mapping, strip_prefix or add_prefix with it."
        )
      mapping = self._by_object_graph(path, root)
      strip_prefix = ""
    if strip_prefix is None and not callable(mapping):
      strip_prefix = self._h.varset.scope
    return self._load(
      "load_checkpoint",
      lambda: checkpoints.Checkpoint(path),
      tag,
      session,
      strip_prefix,
      add_prefix,
      mapping,
      allow_extra,
    )

  def load_spill(
    self,
    path,
    snapshot,
    tag=None,
    strip_prefix=None,
    add_prefix=None,
    mapping=None,
    allow_extra=False,
    session=None,
  ):
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
      strip_prefix: As for `load_checkpoint`.
      add_prefix: As for `load_checkpoint`.
      mapping: As for `load_checkpoint`.
      allow_extra: As for `load_checkpoint`.
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
    return self._load(
      "load_spill",
      lambda: spill_source.open_snapshot(path, snapshot),
      tag,
      session,
      strip_prefix,
      add_prefix,
      mapping,
      allow_extra,
    )

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
      PinnedTagError: The snapshot is pinned to a device slot (`store.slots.pin`).
      SnapshotError: Reading a device snapshot failed; it stays in its slot.
      SpillError: An earlier background write failed (see `flush`).
    """
    sess = self._h.data_session(session, "spill")
    with self._h.lock:
      self._h.prepare(sess)
      tiered = self._tiers("spill")
      tag = self._h.existing(tag, sess, "spill")
      self._h.catalog.check_unpinned(
        tag,
        "it cannot leave the slot. Snapshot it under another tag and "
        "spill that",
        lambda t: self._h.mode.slot_set.slot_of(t),
      )
      with failures.translated("spill", tag, self._h.mode.uninitialized):
        tiered.spill(tag, self._h.catalog.info(tag), sess)
      return tag

  def flush(self):
    """Waits until every snapshot on its way to the spill file is written.

    Snapshots whose write failed earlier are written again first. Does nothing
    for a store without a spill file.

    Raises:
      SpillError: A write failed; the message names each snapshot, which stays
        in host memory.
    """
    with self._h.lock:
      self._h.check_open()
      self._h.mode.flush()

  def tier(self, tag=None):
    """Where snapshot `tag` (default: the newest) is: "device", "host" or "file".

    "host" includes a snapshot on its way to the spill file.
    """
    with self._h.lock:
      return self._h.mode.tier(self._h.catalog.existing(tag))

  # -- internals ---------------------------------------------------------------

  def _load(
    self,
    what,
    open_source,
    tag,
    session,
    strip_prefix,
    add_prefix,
    mapping,
    allow_extra,
  ):
    """Stores the snapshot a file holds: `load_npz`, `load_checkpoint`, `load_spill`.

    The session is resolved and the names' mapping checked first, so that
    either is reported before any file is read; `open_source()` gives a
    source (see `snapstore.files.sources`) usable as a context manager, read
    in full and closed before storing.
    """
    self._h.data_session(session, what)
    names = sources.NameMap(self._h.varset, strip_prefix, add_prefix, mapping)
    with open_source() as source:
      arrays = sources.read(
        source, self._h.varset, names, allow_extra=allow_extra
      )
    return self._h.put(arrays, tag, session, what)

  def _by_object_graph(self, path, root):
    """`{checkpoint name: key or None}` of an object-based checkpoint."""
    root = object_graph.root_object(root)
    with checkpoints.Checkpoint(path) as source:
      found = object_graph.live_variables(source.object_graph(), root)
      names = source.declared()
    keys = dict((id(s.variable), s.key) for s in self._h.varset)
    return dict((name, keys.get(id(found.get(name)))) for name in names)

  def _tiers(self, what):
    tiers = self._h.mode.tiers
    if tiers is None:
      raise errors.ModeError(
        "files.%s() needs a spill file; this %s-mode store has none. Pass "
        "spill_path='file.h5' when building it, or use mode='disk'."
        % (what, self._h.mode.name)
      )
    return tiers
