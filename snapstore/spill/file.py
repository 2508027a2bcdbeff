"""The spill file: snapshots in an HDF5 file, one group per snapshot.

The layout and its checks are in `snapstore.spill.layout`.

A snapshot is written in two commits: first its group and datasets with
`complete=0`, then its data, checksums and `complete=1`. Each commit is atomic
(see `snapstore.spill.journal`), so after a process is killed at any moment
the file holds every snapshot completed before, and at most one incomplete
snapshot, which is listed as such and never read.

Uncompressed data is written and read straight at the dataset's place in the
file (HDF5's contiguous layout), in slabs that release the GIL. The checksum is
XXH3-64, faster than CRC-32: a spill is bound by memory bandwidth, so a slower
checksum would cost as much as the write (bench/README.md has the figures).

    with snapstore.open_spill("run.h5") as spill:
      for entry in spill.entries():
        print(entry.tag, entry.time, entry.nbytes)
      arrays = spill.read(spill.entries()[-1].tag)   # checksums verified
"""

import collections
import functools
import os
import threading

import h5py
import numpy as np

from snapstore.core import buffers
from snapstore.core import checks
from snapstore import errors
from snapstore.spill import journal
from snapstore.spill import layout

_SLAB = 16 << 20  # bytes per write or read call, and per GIL release


class SpillEntry(
  collections.namedtuple(
    "SpillEntry", ["tag", "time", "step", "nbytes", "keys"]
  )
):
  """A complete snapshot in a spill file.

  Attributes:
    tag: Its tag, an int or a str.
    time: When it was taken (`time.time()`).
    step: The global step, or None when the store did not cover it.
    nbytes: The bytes of its variables' data.
    keys: The keys of its variables.

  Example:
    ```python
    with snapstore.open_spill("run7.h5") as spill:
      newest = spill.entries()[-1]  # a SpillEntry
      print(newest.tag, newest.step, newest.nbytes, len(newest.keys))
    ```
  """

  __slots__ = ()


DamagedSnapshot = collections.namedtuple(
  "DamagedSnapshot", ["tag", "name", "problem"]
)
DamagedSnapshot.__doc__ = """A snapshot of a spill file that cannot be listed.

Fields: tag (None when its group's name encodes no tag), name (the group's
name under /snapshots), problem (the error message). The file's other
snapshots are unaffected.
"""


def _locked(method):
  @functools.wraps(method)
  def wrapper(self, *args, **kwargs):
    with self._lock:  # pylint: disable=protected-access
      self._usable()  # pylint: disable=protected-access
      return method(self, *args, **kwargs)

  return wrapper


class SpillFile(object):
  """An open spill file (see module doc).

  Create or open one for writing with `SpillFile.open_for_writing`, or read one
  with `open_spill(path)`.

  Args:
    path: The file.
    writable: Open for writing (the caller must hold it exclusively).
    durable: `fsync` at each commit (survives power loss; slower).

  Raises:
    SnapshotFileError: No such file; not an HDF5 file; truncated; an HDF5 file
      written by another program or a newer snapstore; the file is open for
      writing by another process.
  """

  _h5 = None
  _file = None
  _broken = None  # why the file could not be reopened after a failed change

  def __init__(self, path, writable=False, durable=False):
    # One operation at a time: a read from the training thread waits for a
    # write on the writer thread to finish (and its possible reopen).
    self._lock = getattr(self, "_lock", None) or threading.RLock()
    self.path = checks.readable_file(path, "A spill file path")
    self._durable = durable
    try:
      self._file = journal.JournaledFile(self.path, writable, durable)
    except journal.LockedError:
      raise _in_use(self.path)
    except journal.ForeignJournalError as e:
      raise errors.SnapshotFileError(
        "Cannot open %s: %s. Nothing was changed; if the file is yours, move "
        "the journal away and open it again." % (self.path, e)
      )
    except OSError as e:
      raise errors.SnapshotFileError("Cannot open %s: %s." % (self.path, e))
    self.rolled_back = self._file.rolled_back
    try:
      self._h5 = h5py.File(
        self._file, "r+" if writable else "r", libver=layout.LIBVER
      )
    except layout.H5_ERRORS as e:
      self._file.close()
      raise errors.SnapshotFileError(layout.open_problem(self.path, e))
    try:
      self._declared, self._snapshots = layout.check_format(self._h5, self.path)
    except BaseException:
      self.close()
      raise

  @classmethod
  def open_for_writing(cls, path, varset, durable=False):
    """Opens `path` for writing, creating it for `varset` if it does not exist.

    Args:
      path: The file; its directory must exist and be writable.
      varset: The store's `VariableSet`, recorded in a new file and checked
        against an existing one.
      durable: As for the constructor.

    Returns:
      A writable `SpillFile`.

    Raises:
      TypeError: `path` is not a path.
      ValueError: `path` is empty or a directory.
      SnapshotFileError: A missing or unwritable directory, an unwritable file,
        a file another process is creating or writing (of two stores built
        over one path at once, exactly one gets the file; see
        `journal.create`), or a file the constructor rejects.
      IncompatibleSnapshotError: An existing file recorded other variables
        (names, shapes and dtypes all listed).
    """
    path = checks.file_path(path, "spill_path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
      raise errors.SnapshotFileError(
        "Cannot create spill file %s: directory %s does not exist. Create it "
        "first or choose another path." % (path, directory)
      )
    # An empty file (what tempfile.mkstemp gives) is a new spill file.
    if not os.path.exists(path) or layout.is_empty(path):
      if not os.access(directory, os.W_OK | os.X_OK):
        raise errors.SnapshotFileError(
          "Cannot create spill file %s: no write permission in %s."
          % (path, directory)
        )
      try:
        journal.create(
          path, lambda f: layout.initialize(f, varset.specs), durable
        )
      except journal.LockedError:
        raise _in_use(path)  # another process is creating it
      except FileExistsError:
        pass  # another process created it first: opened below, as any file
      except OSError as e:
        raise errors.SnapshotFileError(
          "Cannot create spill file %s: %s." % (path, e)
        )
    elif not os.access(path, os.R_OK | os.W_OK):
      raise errors.SnapshotFileError(
        "Cannot write spill file %s: no read and write permission on it." % path
      )
    spill = cls(path, writable=True, durable=durable)
    try:
      spill.check_variables(varset)
    except BaseException:
      spill.close()
      raise
    return spill

  # -- reading ---------------------------------------------------------------------

  @_locked
  def entries(self):
    """`SpillEntry` of every complete, intact snapshot, oldest first."""
    return self._scan()[0]

  @_locked
  def incomplete(self):
    """Tags of snapshots whose writing was interrupted (never readable)."""
    return self._scan()[1]

  @_locked
  def damaged(self):
    """`DamagedSnapshot` of every snapshot that cannot be listed.

    One damaged snapshot (a broken link, damaged attributes, a dataset
    snapstore never writes) leaves the others listed and readable; reading a
    damaged one raises `SnapshotFileError` naming the problem.
    """
    return self._scan()[2]

  @_locked
  def __contains__(self, tag):
    group = self._find(tag)
    return group is not None and layout.is_complete(group)

  @_locked
  def read(self, tag, varset=None):
    """The arrays of snapshot `tag`, checksums verified.

    Args:
      tag: A complete snapshot's tag.
      varset: A `VariableSet` to check the snapshot against and order the
        result by; default: every dataset, as stored.

    Returns:
      An OrderedDict key -> numpy array.

    Raises:
      UnknownTagError: No complete snapshot `tag` (incomplete ones are named).
      IncompatibleSnapshotError: The snapshot does not match `varset`.
      SnapshotFileError: A checksum mismatch (naming the variable), unreadable
        data, or a damaged or foreign layout (see the module doc).
    """
    group = self._group(tag)
    datasets = self._datasets(group, tag)
    declared = dict(
      (k, (d.shape, layout.dtype_of(d, self.path))) for k, d in datasets.items()
    )
    if varset is not None:
      varset.check_declared(declared, "Snapshot %r in %s" % (tag, self.path))
      datasets = collections.OrderedDict((k, datasets[k]) for k in varset.keys)
    elif declared != dict((k, (s, d)) for k, s, d in self._declared):
      raise errors.SnapshotFileError(
        "%s: snapshot %r does not hold the variables the file declares; the "
        "file is damaged or was changed by another program." % (self.path, tag)
      )
    out = collections.OrderedDict()
    for key, ds in datasets.items():
      out[key] = self._read_dataset(tag, key, ds)
    return out

  @_locked
  def declared(self, tag):
    """`{key: (shape, dtype)}` of snapshot `tag`, from the file's metadata only."""
    return dict(
      (k, (d.shape, layout.dtype_of(d, self.path)))
      for k, d in self._datasets(self._group(tag), tag).items()
    )

  @_locked
  def read_variable(self, tag, key):
    """The array of variable `key` in snapshot `tag`, its checksum verified."""
    group = self._group(tag)
    name = layout.encode_key(key)
    try:
      present = name in group
    except layout.H5_ERRORS:
      present = True  # layout.child reports the damage
    if not present:
      raise errors.SnapshotFileError(
        "%s: snapshot %r holds no variable %r." % (self.path, tag, key)
      )
    ds = layout.child(
      group,
      name,
      h5py.Dataset,
      "variable %r of snapshot %r" % (key, tag),
      self.path,
    )
    return self._read_dataset(tag, key, ds)

  # -- writing (writable files only) -------------------------------------------------

  def check_variables(self, varset):
    """Raises IncompatibleSnapshotError unless the file is for `varset`."""
    varset.check_declared(
      dict((k, (s, d)) for k, s, d in self._declared),
      "Spill file %s" % self.path,
    )

  @_locked
  def write(
    self, tag, time, step, keys, arrays, compression=None, compression_opts=None
  ):
    """Writes a snapshot: complete when this returns, invisible if interrupted.

    A snapshot the file holds under `tag` is replaced.

    Raises:
      OSError, RuntimeError: The write failed (e.g. ENOSPC). The file holds
        what it held before, or the new snapshot marked incomplete.
    """
    try:
      self._write(tag, time, step, keys, arrays, compression, compression_opts)
    except BaseException as e:
      self._roll_back(e)

  def _write(
    self, tag, time, step, keys, arrays, compression, compression_opts
  ):
    name = layout.encode_tag(tag)
    if name in self._snapshots:
      self._delete(name)
    group = self._snapshots.create_group(name)
    layout.set_attrs(
      group,
      [
        ("complete", np.int8(0)),
        ("tag", layout.as_bytes(str(tag))),
        ("tag_type", layout.as_bytes("int" if isinstance(tag, int) else "str")),
        ("time", np.float64(time)),
        ("step", np.int64(-1 if step is None else step)),
        ("nbytes", np.int64(sum(a.nbytes for a in arrays))),
      ],
    )
    datasets = [
      self._create_dataset(group, key, array, compression, compression_opts)
      for key, array in zip(keys, arrays)
    ]
    self._commit()  # The snapshot now exists, marked incomplete.
    for ds, array in zip(datasets, arrays):
      checksum = np.uint64(self._write_dataset(ds, array))
      layout.set_attrs(ds, [(layout.CHECKSUM, checksum)])
    h5py.h5a.open(group.id, b"complete").write(np.array(1, np.int8))
    self._commit()

  @_locked
  def delete(self, tag):
    """Removes snapshot `tag` (complete or not) and reuses its space."""
    name = layout.encode_tag(tag)
    if name not in self._snapshots:
      return
    try:
      self._delete(name)
    except BaseException as e:
      self._roll_back(e)

  def _delete(self, name):
    extents = []
    try:
      group = layout.child(self._snapshots, name, h5py.Group, name, self.path)
    except errors.SnapshotFileError:
      group = None  # a link or damaged: only its name is removed, nothing freed
    for ds in group.values() if group is not None else ():
      if not isinstance(ds, h5py.Dataset):
        continue
      offset = ds.id.get_offset()
      if offset is not None:
        extents.append((offset, ds.id.get_storage_size()))
    del self._snapshots[name]
    self._commit()
    for offset, size in extents:  # unused by the committed file from now on
      self._file.mark_free(offset, size)

  @_locked
  def delete_incomplete(self):
    """Removes every incomplete snapshot; returns their tags.

    Raises:
      SnapshotFileError: The file is damaged and cannot be changed.
    """
    tags = self.incomplete()
    for tag in tags:
      try:
        self.delete(tag)
      except layout.H5_ERRORS as e:
        raise errors.SnapshotFileError(
          "%s: cannot remove the incomplete snapshot %r (%s); the file is "
          "damaged." % (self.path, tag, e)
        )
    return tags

  # -- lifetime ----------------------------------------------------------------------

  def close(self):
    """Closes the file; an uncommitted change is rolled back. Safe to call twice."""
    with self._lock:
      self._close()

  def _close(self):
    self._broken = None
    if self._h5 is not None:
      h5, self._h5 = self._h5, None
      if self._file.in_transaction:
        # A failed write left HDF5 mid-change: drop what it would write now,
        # so that the next open rolls the file back to the last commit.
        self._file.abandon()
      try:
        h5.close()
        if self._file.writable() and not self._file.abandoned:
          self._file.commit()  # what HDF5 writes when it closes
      except (OSError, RuntimeError, ValueError):
        pass
    if self._file is not None:
      self._file.close()
      self._file = None

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def __repr__(self):
    return "<SpillFile %s>" % self.path

  # -- internals -----------------------------------------------------------------------

  def _scan(self):
    """(entries oldest first, incomplete tags, damaged) of every snapshot.

    Each snapshot's name, link, attributes and dataset names are checked on
    their own: a damaged one is reported, the others are listed.
    """
    entries, incomplete, damaged = [], [], []
    for name in layout.names(self._snapshots, "the snapshot list", self.path):
      try:
        tag = layout.decode_tag(name)
      except ValueError:
        damaged.append(
          DamagedSnapshot(
            None,
            name,
            (
              "%s: /snapshots/%s is not a snapstore snapshot (its name encodes no "
              "tag); the file is damaged or was changed by another program."
              % (self.path, errors.names([name]))
            ),
          )
        )
        continue
      try:
        group = layout.child(
          self._snapshots, name, h5py.Group, "snapshot %r" % (tag,), self.path
        )
        if layout.is_complete(group):
          entries.append(self._entry(name, group))
        else:
          incomplete.append(tag)
      except errors.SnapshotFileError as e:
        damaged.append(DamagedSnapshot(tag, name, str(e)))
    return sorted(entries, key=lambda e: e.time), incomplete, damaged

  def _entry(self, name, group):
    tag = layout.decode_tag(name)
    try:
      step = int(group.attrs.get("step", -1))
      when = float(group.attrs["time"])
      nbytes = int(group.attrs["nbytes"])
    except layout.H5_ERRORS as e:
      raise errors.SnapshotFileError(
        "%s: snapshot %r has damaged attributes (%s)." % (self.path, tag, e)
      )
    keys = tuple(sorted(self._datasets(group, tag, open_them=False)))
    return SpillEntry(tag, when, None if step < 0 else step, nbytes, keys)

  def _find(self, tag):
    """The group of snapshot `tag`, or None; never follows a soft or external link."""
    name = layout.encode_tag(tag)
    if name not in layout.names(
      self._snapshots, "the snapshot list", self.path
    ):
      return None
    return layout.child(
      self._snapshots, name, h5py.Group, "snapshot %r" % (tag,), self.path
    )

  def _group(self, tag):
    group = self._find(tag)
    if group is None or not layout.is_complete(group):
      held = ", ".join(repr(e.tag) for e in self.entries()) or "none"
      note = (
        " Its writing was interrupted, so it is incomplete and never read."
        if group is not None
        else ""
      )
      raise errors.UnknownTagError(
        "%s holds no complete snapshot %r.%s Complete snapshots: %s."
        % (self.path, tag, note, held)
      )
    return group

  def _datasets(self, group, tag, open_them=True):
    """OrderedDict key -> dataset of a snapshot (or -> name if not `open_them`)."""
    out = collections.OrderedDict()
    for name in sorted(layout.names(group, "snapshot %r" % (tag,), self.path)):
      try:
        key = layout.decode_key(name)
      except ValueError:
        raise errors.SnapshotFileError(
          "%s: snapshot %r holds %s, which is not a snapstore variable (its "
          "name encodes no key); the file is damaged or was changed by "
          "another program." % (self.path, tag, errors.names([name]))
        )
      out[key] = (
        layout.child(
          group,
          name,
          h5py.Dataset,
          "variable %r of snapshot %r" % (key, tag),
          self.path,
        )
        if open_them
        else name
      )
    return out

  def _create_dataset(self, group, key, array, compression, compression_opts):
    if compression is None:
      dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
      # Allocated now, never filled: the data is written once, in place.
      dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
      dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
      space = (
        h5py.h5s.create_simple(array.shape)
        if array.shape
        else h5py.h5s.create(h5py.h5s.SCALAR)
      )
      dsid = h5py.h5d.create(
        group.id,
        layout.encode_key(key).encode("ascii"),
        h5py.h5t.py_create(array.dtype, logical=True),
        space,
        dcpl=dcpl,
      )
      ds = h5py.Dataset(dsid)
    else:
      chunked = array.ndim > 0 and array.size > 0
      ds = group.create_dataset(
        layout.encode_key(key),
        shape=array.shape,
        dtype=array.dtype,
        chunks=True if chunked else None,
        compression=compression if chunked else None,
        compression_opts=compression_opts if chunked else None,
      )
    return ds

  def _write_dataset(self, ds, array):
    array = np.ascontiguousarray(array)
    flat = (
      array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
    )
    offset = ds.id.get_offset()
    if offset is None and ds.chunks is None:  # nothing to store
      return layout.checksum(flat)
    if offset is not None:
      for start in range(0, flat.size, _SLAB):
        self._file.write_at(offset + start, flat[start : start + _SLAB])
      return layout.checksum(flat)
    rows = max(1, _SLAB // max(1, array[0].nbytes))
    for start in range(0, array.shape[0], rows):
      ds[start : start + rows] = array[start : start + rows]
    return layout.checksum(flat)

  def _read_dataset(self, tag, key, ds):
    offset = layout.check_storage(
      ds, "variable %r of snapshot %r" % (key, tag), self.path, self._file.size
    )
    # Aligned, so that a restore feeds it without a copy.
    out = buffers.aligned_empty(ds.shape, layout.dtype_of(ds, self.path))
    flat = out.reshape(-1).view(np.uint8) if out.size else np.empty(0, np.uint8)
    try:
      stored = ds.attrs.get(layout.CHECKSUM)
      if offset is not None:
        for start in range(0, flat.size, _SLAB):
          slab = flat[start : start + _SLAB]
          if self._file.read_into(offset + start, slab) != slab.size:
            raise OSError("the file ends inside the data")
      elif out.size:
        ds.read_direct(out)
      stored = None if stored is None else int(stored)
    except layout.H5_ERRORS as e:
      raise errors.SnapshotFileError(
        "%s: cannot read variable %r of snapshot %r (%s); the file is "
        "truncated or corrupt." % (self.path, key, tag, e)
      )
    if stored is None or layout.checksum(flat) != stored:
      raise errors.SnapshotFileError(
        "%s: checksum mismatch in variable %r of snapshot %r: the stored data "
        "is corrupt and was not used." % (self.path, key, tag)
      )
    return out

  def _commit(self):
    self._h5.flush()
    self._file.commit()

  def _roll_back(self, error):
    """After change that raised `error`: back to the last commit, then
    raises `error`, or the failed write's own OSError where HDF5's error
    hides it (`JournaledFile.hidden_failure`)."""
    failed = (
      self._file.hidden_failure(error) if self._file is not None else None
    )
    self._reopen()
    if failed is not None:
      raise failed from error
    raise error

  def _reopen(self, cleanup=True):
    """After a failed change: back to the last commit, with HDF5 reopened.

    HDF5's state after an I/O error is unknown, so it is dropped unwritten and
    the file reopened, which rolls back the failed transaction. A snapshot left
    incomplete by a committed first step is removed if the disk allows it;
    if that fails too (a disk that stays full), the file is reopened once more
    without it: the snapshot stays listed as incomplete, is never read, and is
    removed by the next write of its tag or the next store over the file.
    Never raises and never recurses: a file that cannot be reopened now is
    reopened by the next operation (`_usable`).
    """
    self._close()
    try:
      self.__init__(self.path, writable=True, durable=self._durable)
    except (errors.Error, OSError) as e:
      self._broken = e
      return
    if not cleanup:
      return
    for tag in self._scan()[1]:
      try:
        self._delete(layout.encode_tag(tag))
      except BaseException as e:  # pylint: disable=broad-except
        self._reopen(cleanup=False)
        if not isinstance(e, Exception):
          raise  # an interrupt is the user's, after the file is usable again
        return

  def _usable(self):
    """Reopens a file a failed change left closed, or says why it cannot."""
    if self._broken is None:
      return
    self._reopen(cleanup=False)
    if self._broken is not None:
      raise errors.SnapshotFileError(
        "%s could not be reopened after a failed write (%s); its committed "
        "snapshots are intact on disk. Free space or fix the disk; the next "
        "operation tries again." % (self.path, self._broken)
      )


def _in_use(path):
  return errors.SnapshotFileError(
    "%s is open for writing by another process (a running store); close "
    "that store first, or read its snapshots through it." % path
  )


def open_spill(path):
  """Opens the spill file `path` for reading.

  A file a killed process left is read as of its last commit (that process's
  unfinished transaction is rolled back in memory; the file is not changed).

  Args:
    path: The spill file (a path; `~` is not expanded).

  Returns:
    A read-only `SpillFile`: `entries()`, `incomplete()`, `read(tag)` (which
    verifies the checksums); close it or use it as a context manager.

  Raises:
    SnapshotFileError: As for `SpillFile`.

  Example:
    ```python
    with snapstore.open_spill("run7.h5") as spill:
      for entry in spill.entries():  # SpillEntry, oldest first
        print(entry.tag, entry.step, entry.nbytes)
      arrays = spill.read(spill.entries()[-1].tag)  # checksums verified
    ```
  """
  return SpillFile(path, writable=False)
