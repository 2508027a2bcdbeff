"""A file whose changes take effect all at once: a rollback journal under HDF5.

HDF5 updates its metadata (B-trees, heaps, object headers, the superblock) in
place and in no crash-safe order: a process killed while `H5Fflush` writes them
can leave a file whose root group no longer lists anything, losing snapshots
written long before. `JournaledFile` is a file-like object for h5py's `fileobj`
driver that makes every `commit()` atomic against a process kill:

- Before a byte that was in the file at the last commit is overwritten, the page
  holding it is copied to `<path>-journal` (SQLite's rollback journal). Bytes
  appended past the committed size need no copy.
- `commit()` deletes the journal; that unlink is the commit point.
- Opening a file with a journal left over rolls it back: the saved pages are
  written back and the file is cut to its committed size. A read-only open
  applies the same rollback in memory, leaving the files as they are.

A kill -9 loses no write the kernel accepted, so this needs no `fsync`;
`durable=True` adds the `fsync` calls that also survive a power cut.

Bulk data can bypass HDF5 (`write_at`/`read_into`) but never the journal. Space
that the committed file no longer uses (`mark_free`, e.g. the data of a deleted
dataset once its deletion is committed) is overwritten without a copy.

    f = JournaledFile(path, writable=True)
    with h5py.File(f, "r+") as h5:
      h5["x"] = 1
      h5.flush()
      f.commit()
"""

import bisect
import errno
import fcntl
import io
import os
import struct
import threading
import zlib

PAGE = 4096
_MAGIC = b"SNAPJRN1"
_HEADER = struct.Struct("<8sQI")  # magic, committed size, crc of the first two
_RECORD = struct.Struct("<QII")  # offset, length, crc of the data


class LockedError(OSError):
  """Raised when another open `JournaledFile` holds a conflicting lock."""


class ForeignJournalError(OSError):
  """Raised when a journal next to the file cannot have been written for it.

  Its committed size exceeds the file, a saved page lies past it, or it is
  longer than a journal of the file can be: rolling it back would write
  garbage, so it is left alone.
  """


def journal_path(path):
  return path + "-journal"


class JournaledFile(io.RawIOBase):
  """A file on disk whose writes become permanent only at `commit()`.

  Args:
    path: The file. It must exist (create files with `create`).
    writable: Open for writing. A writer takes an exclusive lock on the file
      for its lifetime, rolls back a journal left by a killed writer, and is
      the only object that may change the file; readers take a shared lock.
    durable: `fsync` journal and file, so that commits also survive a power cut.

  Raises:
    LockedError: Another process (or another `JournaledFile`) has the file open
      for writing, or, for a writer, open at all.
    OSError: The file cannot be opened.
  """

  _fd = None
  _journal_fd = None

  def __init__(self, path, writable, durable=False):
    super(JournaledFile, self).__init__()
    self._path = path
    self._writable = writable
    self._durable = durable
    self._lock = threading.Lock()
    self._fd = _open_locked(
      path,
      os.O_RDWR if writable else os.O_RDONLY,
      fcntl.LOCK_EX if writable else fcntl.LOCK_SH,
    )
    self._overlay = {}  # page -> bytes, for a read-only rollback
    self.rolled_back = False
    try:
      self._open_journal()
    except BaseException:
      self.close()
      raise
    self._size = (
      self._overlay_size
      if self._overlay_size is not None
      else os.fstat(self._fd).st_size
    )
    self._committed = self._size
    self._pos = 0
    self._saved = set()  # pages copied to the journal in this transaction
    self._free = []  # sorted disjoint [start, end) ranges safe to overwrite
    self._written = []  # ranges written in this transaction
    self.abandoned = False
    self._failure = None  # a failed write in this transaction

  # -- io.RawIOBase, as h5py's fileobj driver uses it -----------------------------

  def readable(self):
    return True

  def writable(self):
    return self._writable

  @property
  def durable(self):
    return self._durable

  def hidden_failure(self, error):
    """The OSError of this transaction's failed write, if `error` (what HDF5
    raised) does not say it: HDF5 may meet a failed write (EFBIG, ENOSPC) in
    a flush and report only that the flush failed ("Unable to synchronously
    flush file"). None if `error` names an OS error already, or none failed.
    """
    failed = self._failure
    if getattr(underlying(error), "errno", None) is not None:
      return None
    return failed if getattr(failed, "errno", None) is not None else None

  @property
  def size(self):
    """The file's size as HDF5 sees it (this transaction's writes included)."""
    return self._size

  def seekable(self):
    return True

  def seek(self, offset, whence=io.SEEK_SET):
    if whence == io.SEEK_SET:
      self._pos = offset
    elif whence == io.SEEK_CUR:
      self._pos += offset
    else:
      self._pos = self._size + offset
    return self._pos

  def tell(self):
    return self._pos

  def readinto(self, buffer):
    n = self.read_into(self._pos, buffer)
    self._pos += n
    return n

  def write(self, data):
    n = self.write_at(self._pos, data)
    self._pos += n
    return n

  def truncate(self, size=None):
    # HDF5 cuts the file to its end of allocation when it flushes. Cutting
    # committed bytes now would lose them if the process died before commit,
    # so the cut happens at commit; until then the file only looks shorter.
    if not self._writable:
      raise io.UnsupportedOperation("truncate on a read-only JournaledFile")
    if self.abandoned:
      return self._size
    self._size = self._pos if size is None else size
    return self._size

  def flush(self):
    pass  # Every write is a syscall already; commit() syncs when durable.

  def fileno(self):
    return self._fd

  def close(self):
    if self._fd is not None:
      fd, self._fd = self._fd, None
      if self._journal_fd is not None:
        os.close(self._journal_fd)  # An open transaction stays rollback-able.
        self._journal_fd = None
      os.close(fd)  # releases the lock
    super(JournaledFile, self).close()

  # -- positional I/O ------------------------------------------------------------

  def read_into(self, offset, buffer):
    """Reads into `buffer` from `offset`; returns the bytes read."""
    view = memoryview(buffer).cast("B")
    end = min(offset + len(view), self._size)
    done = 0
    while offset + done < end:
      n = (
        os.preadv(self._fd, [view[done : end - offset]], offset + done)
        if hasattr(os, "preadv")
        else self._pread_copy(view, done, end, offset)
      )
      if n <= 0:
        break
      done += n
    if self._overlay and done:
      first, last = offset // PAGE, (offset + done - 1) // PAGE
      for page in range(first, last + 1):
        data = self._overlay.get(page)
        if data is None:
          continue
        lo, hi = (
          max(offset, page * PAGE),
          min(offset + done, page * PAGE + len(data)),
        )
        if lo < hi:
          view[lo - offset : hi - offset] = data[
            lo - page * PAGE : hi - page * PAGE
          ]
    return done

  def _pread_copy(self, view, done, end, offset):
    data = os.pread(self._fd, end - offset - done, offset + done)
    view[done : done + len(data)] = data
    return len(data)

  def write_at(self, offset, data):
    """Writes `data` at `offset`, saving the committed bytes it overwrites."""
    view = memoryview(data).cast("B")
    n = len(view)
    if self.abandoned:
      return n
    with self._lock:
      self._written.append((offset, offset + n))
      try:
        self._protect(offset, offset + n)
        done = 0
        while done < n:
          done += os.pwrite(self._fd, view[done:], offset + done)
      except BaseException as e:
        # HDF5 does not report every failed write to its caller; remember it,
        # so that this transaction can never be committed.
        self._failure = e
        raise
      self._size = max(self._size, offset + n)
    return n

  def mark_free(self, offset, length):
    """Declares that the committed file does not use `[offset, offset+length)`.

    Call it only for space a committed change released, e.g. the data of a
    dataset whose deletion was committed: overwriting it then needs no copy.
    """
    if length <= 0:
      return
    with self._lock:
      self._add_free(offset, offset + length)

  def _add_free(self, lo, hi):
    """Adds [lo, hi) to the free ranges, keeping them sorted and disjoint."""
    keep = []
    for a, b in self._free:
      if b < lo or a > hi:
        keep.append((a, b))
      else:
        lo, hi = min(lo, a), max(hi, b)
    bisect.insort(keep, (lo, hi))
    self._free = keep

  def abandon(self):
    """Ignores every later write: the open transaction is left to roll back."""
    self.abandoned = True

  # -- transactions ----------------------------------------------------------------

  def commit(self):
    """Makes every write since the last commit permanent, atomically."""
    if self.abandoned:
      raise ValueError("commit() after abandon()")
    if self._failure is not None:
      raise IOError(
        getattr(self._failure, "errno", None) or errno.EIO,
        "a write of this transaction failed (%s); it cannot be "
        "committed" % (self._failure,),
      )
    with self._lock:
      physical = os.fstat(self._fd).st_size
      # HDF5 may allocate space it has not written yet (a dataset written
      # later): the committed file must reach that far, or it reads as
      # truncated. Growing before the commit point is rolled back like a write.
      if self._size > physical:
        os.ftruncate(self._fd, self._size)
      if self._durable:
        os.fsync(self._fd)
      if self._journal_fd is not None:
        os.close(self._journal_fd)
        self._journal_fd = None
        os.unlink(journal_path(self._path))  # the commit point
        if self._durable:
          _fsync_dir(self._path)
      if self._size < physical:
        os.ftruncate(self._fd, self._size)
      if self._written:
        # Space written in this transaction may be in use from now on.
        self._free = [
          r for r in self._free if not _overlaps_any(r, self._written)
        ]
      # Space HDF5 allocated in this transaction but did not write (a dataset
      # to be written later) holds nothing the committed file depends on.
      for lo, hi in _gaps(self._committed, self._size, self._written):
        self._add_free(lo, hi)
      self._written = []
      self._committed = self._size
      self._saved.clear()

  @property
  def in_transaction(self):
    return (
      self._journal_fd is not None
      or bool(self._written)
      or self._failure is not None
    )

  def _protect(self, start, end):
    """Copies committed pages in [start, end) to the journal, once per commit."""
    end = min(end, self._committed)
    if start >= end:
      return
    pages = [
      p
      for lo, hi in self._not_free(start // PAGE, (end - 1) // PAGE + 1)
      for p in range(lo, hi)
      if p not in self._saved
    ]
    if not pages:
      return
    if self._journal_fd is None:
      self._begin()
    runs = []
    for page in pages:
      if runs and runs[-1][1] == page:
        runs[-1][1] = page + 1
      else:
        runs.append([page, page + 1])
    for first, stop in runs:
      lo, hi = first * PAGE, min(stop * PAGE, self._committed)
      old = os.pread(self._fd, hi - lo, lo)
      _write_all(
        self._journal_fd, _RECORD.pack(lo, len(old), zlib.crc32(old)) + old
      )
    if self._durable:
      os.fsync(self._journal_fd)
    self._saved.update(pages)

  def _not_free(self, first, stop):
    """Page ranges in [first, stop) not wholly inside a free range."""
    covered = []
    i = max(
      0, bisect.bisect_right(self._free, (first * PAGE, float("inf"))) - 1
    )
    for lo, hi in self._free[i:]:
      if lo >= stop * PAGE:
        break
      covered.append((-(-lo // PAGE), hi // PAGE))  # pages wholly inside
    return _gaps(first, stop, covered)

  def _begin(self):
    path = journal_path(self._path)
    self._journal_fd = os.open(
      path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
    )
    head = struct.pack("<8sQ", _MAGIC, self._committed)
    _write_all(self._journal_fd, head + struct.pack("<I", zlib.crc32(head)))
    if self._durable:
      os.fsync(self._journal_fd)
      _fsync_dir(self._path)

  # -- recovery --------------------------------------------------------------------

  _overlay_size = None

  def _open_journal(self):
    """Rolls back a journal a killed writer left (in memory when read-only)."""
    path = journal_path(self._path)
    try:
      f = open(path, "rb")
    except (IOError, OSError) as e:
      if e.errno == errno.ENOENT:
        return
      raise
    with f:
      # A transaction only grows the file and saves each committed page once:
      # the committed size and the journal's length are bounded by the file.
      size, _ = _parse_journal(f.read(_HEADER.size))
      if (
        size is None
      ):  # Killed while starting the journal: nothing was changed.
        if self._writable:
          os.unlink(path)
        return
      longest = _HEADER.size + -(-size // PAGE) * (_RECORD.size + PAGE)
      if (
        size > os.fstat(self._fd).st_size
        or os.fstat(f.fileno()).st_size > longest
      ):
        raise ForeignJournalError(
          "the journal %s does not belong to it (it records a file of %d "
          "bytes)" % (path, size)
        )
      f.seek(0)
      size, records = _parse_journal(f.read())
    if any(offset + len(data) > size for offset, data in records):
      raise ForeignJournalError(
        "the journal %s does not belong to it (it saves bytes past the "
        "file's committed end)" % path
      )
    self.rolled_back = True
    if not self._writable:
      for offset, data in records:
        for k in range(0, len(data), PAGE):
          self._overlay[(offset + k) // PAGE] = data[k : k + PAGE]
      self._overlay_size = size
      return
    for offset, data in records:
      _pwrite_all(self._fd, data, offset)
    os.ftruncate(self._fd, size)
    if self._durable:
      os.fsync(self._fd)
    os.unlink(path)


def create(path, build, durable=False):
  """Creates the file `path`, missing or empty, atomically: `build(file_object)`
  writes it in full.

  `build` writes a temporary file next to `path`, which is renamed into place,
  so `path` never exists half-written. Two processes creating one path at
  once (two workers given one spill path) must not both succeed: a rename
  replaces whatever is at `path`, so each would go on to lock a file of its
  own, one of them no longer at `path`. So the creator first claims `path`:
  it creates it empty (`O_EXCL`), or takes the empty file there, and holds an
  exclusive lock on that empty file until its rename replaces it. Another
  creator finds the lock taken (`LockedError`), or, coming later, finds the
  new file (`FileExistsError`), whose lock its writer contends for as any
  opener does.

  Raises:
    LockedError: Another process holds `path`: it is creating or writing it.
    FileExistsError: `path` is a file that is not empty (another process
      created it meanwhile): open it instead. `path` is unchanged.
    OSError: The file cannot be written; `path` is unchanged.
  """
  claim = _claim_empty(path)
  tmp = "%s.%d.tmp" % (path, os.getpid())
  try:
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.close(fd)
    jf = JournaledFile(tmp, writable=True, durable=durable)
    try:
      build(jf)
      jf.commit()
    finally:
      jf.close()
    os.rename(tmp, path)
    if durable:
      _fsync_dir(path)
  except BaseException:
    for p in (tmp, journal_path(tmp)):
      try:
        os.remove(p)
      except OSError:
        pass
    raise
  finally:
    os.close(claim)  # the empty file, replaced: its lock guards nothing now


# Opens of a path that keeps being replaced while it is locked, before giving
# up: each replacement is another process's creation, which holds the new file.
_ATTEMPTS = 5


def _claim_empty(path):
  """A descriptor holding an exclusive lock on the empty file at `path`,
  created if missing (see `create`).

  Raises:
    LockedError: Another process holds the file at `path`.
    FileExistsError: The file at `path` is not empty.
  """
  for _ in range(_ATTEMPTS):
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
      try:
        fd = os.open(path, os.O_RDWR)
      except FileNotFoundError:
        continue  # removed meanwhile
    try:
      _lock(fd, fcntl.LOCK_EX, path)
      if os.fstat(fd).st_size:
        raise FileExistsError(
          errno.EEXIST, "created by another process meanwhile", path
        )
      if _is_at(fd, path):
        return fd
    except BaseException:
      os.close(fd)
      raise
    os.close(fd)  # replaced since it was opened: look again
  raise LockedError(
    errno.EWOULDBLOCK, "being replaced by other processes", path
  )


def _open_locked(path, flags, lock):
  """A descriptor of the file at `path`, opened with `flags`, holding `lock`
  (`LOCK_EX` or `LOCK_SH`).

  The lock is taken on the file the descriptor opened; checking afterwards
  that `path` still names that file makes sure it is the file at `path`
  that is locked, not one a creation has just replaced (`create`).

  Raises:
    LockedError: Another process holds a conflicting lock.
    OSError: The file cannot be opened.
  """
  for _ in range(_ATTEMPTS):
    fd = os.open(path, flags)
    try:
      _lock(fd, lock, path)
      if _is_at(fd, path):
        return fd
    except BaseException:
      os.close(fd)
      raise
    os.close(fd)
  raise LockedError(
    errno.EWOULDBLOCK, "being replaced by other processes", path
  )


def _lock(fd, lock, path):
  try:
    fcntl.flock(fd, lock | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
      raise LockedError(e.errno, "in use by a process writing to it", path)
    raise


def _is_at(fd, path):
  """Whether `path` names the file open as `fd` (False if it names none)."""
  try:
    named = os.stat(path)
  except FileNotFoundError:
    return False
  held = os.fstat(fd)
  return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _parse_journal(raw):
  """(committed size, [(offset, data)]) of a journal; (None, []) if unusable."""
  if len(raw) < _HEADER.size:
    return None, []
  magic, size, crc = _HEADER.unpack_from(raw)
  if magic != _MAGIC or zlib.crc32(raw[:16]) != crc:
    return None, []
  records, pos = [], _HEADER.size
  while pos + _RECORD.size <= len(raw):
    offset, length, crc = _RECORD.unpack_from(raw, pos)
    data = raw[pos + _RECORD.size : pos + _RECORD.size + length]
    if len(data) != length or zlib.crc32(data) != crc:
      break  # killed while writing it: its page was not overwritten yet
    records.append((offset, data))
    pos += _RECORD.size + length
  return size, records


def _gaps(start, end, ranges):
  """The parts of [start, end) that no range in `ranges` covers."""
  gaps, pos = [], start
  for lo, hi in sorted(ranges):
    if hi <= pos or lo >= end:
      continue
    if lo > pos:
      gaps.append((pos, lo))
    pos = max(pos, hi)
  if pos < end:
    gaps.append((pos, end))
  return gaps


def _overlaps_any(r, ranges):
  return any(r[0] < hi and lo < r[1] for lo, hi in ranges)


def _write_all(fd, data):
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view) :]


def _pwrite_all(fd, data, offset):
  view = memoryview(data)
  while view:
    n = os.pwrite(fd, view, offset)
    view, offset = view[n:], offset + n


def _fsync_dir(path):
  fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def underlying(error):
  """The error a file write really failed with.

  When the spill file's `write` raises (ENOSPC, EFBIG, EIO), h5py calls its
  `flush` with that OSError still set, and Python 3.13 raises SystemError
  ("... returned a result with an exception set") from it.
  """
  while isinstance(error, SystemError) and error.__cause__ is not None:
    error = error.__cause__
  return error
