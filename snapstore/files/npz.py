"""Snapshots as `.npz` archives: one array per variable, named by its store key.

An archive is what `numpy.savez` writes and `numpy.load` reads: member
`dense/kernel.npy` holds variable key `dense/kernel`. Keys are relative to the
store's scope, so an archive saved from one model loads into the same model
built under another scope or in another process.

Writing goes to a temporary file next to the target, which is flushed and then
renamed over it: a crash leaves the old archive or the new one, never half of
one. Only a regular file is replaced, and never an HDF5 file (a spill file,
perhaps in use by a live store): a symbolic link, a device node or an HDF5
file at the path is refused.

Reading never unpickles (`allow_pickle=False`) and checks every member's header
(name, shape, dtype) against the store before it reads any data, so a wrong or
hostile file is reported in full and cannot make the loader allocate more than
the store's own size. Without a store (`read`, used by the CLI) nothing is
allocated beyond what the archive holds: a member's declared shape must account
for its stored bytes exactly, its compressed bytes must lie inside the file,
and it must be stored or deflated (what `numpy.savez` and `savez_compressed`
write), with no more than deflate's 1032:1 expansion. Headers longer than
numpy writes are refused before they are parsed. A member whose header and
data are consistent is read to its end, so its CRC-32 is always checked.

NaN and infinite values are data: a snapshot of a diverging run holds them, and
they load bit for bit (`snapstore verify --finite FILE` checks for them).

    store.files.save_npz("/tmp/best.npz")
    other_store.files.load_npz("/tmp/best.npz", tag="best")
"""

import collections
import functools
import io
import operator
import os
import struct
import tokenize
import uuid
import zipfile
import zlib

import numpy as np

from snapstore.core import checks
from snapstore import errors
from snapstore.spill import layout

_SUFFIX = ".npy"
# numpy writes .npy headers of about a hundred bytes; newer numpy refuses to
# parse more than this many, since parsing is a Python literal_eval.
_MAX_HEADER = 10000
# RFC 1951: deflate expands its input at most 1032-fold (258 bytes per 2 bits).
_MAX_DEFLATE_RATIO = 1032
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
# What can go wrong reading a corrupt or hostile member: zipfile raises
# NotImplementedError for unknown methods or flags and RuntimeError for
# encryption, zlib its own error, numpy's header parser MemoryError (parser
# stack overflow), SyntaxError or, where it tokenizes the header (numpy 2 on
# Python 3.12+), tokenize.TokenError ("too many nested parentheses").
_STREAM_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError)
_MEMBER_ERRORS = _STREAM_ERRORS + (
  ValueError,
  NotImplementedError,
  RuntimeError,
  SyntaxError,
  MemoryError,
  RecursionError,
  struct.error,
  tokenize.TokenError,
)


def save(path, keys, arrays, compress=False):
  """Writes `arrays` under `keys` to the `.npz` archive `path`, atomically.

  Args:
    path: Target file. Its directory must exist; no suffix is appended.
    keys: Variable keys, one per array.
    arrays: numpy arrays.
    compress: Deflate the members (smaller, slower).

  Raises:
    TypeError: `path` is not a path (None, bytes, ...).
    ValueError: `path` is empty or a directory.
    SnapshotFileError: The directory does not exist or cannot be written;
      `path` is a symbolic link, not a regular file, or an HDF5 file.
  """
  path = checks.replaceable_file(path, "The .npz path")
  if layout.is_hdf5(path):
    raise errors.SnapshotFileError(
      "Refusing to write an .npz archive over %s: it is an HDF5 file (a "
      "snapstore spill file, perhaps in use by a live store, or another "
      "program's data). Choose another path." % path
    )
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise errors.SnapshotFileError(
      "Cannot write %s: directory %s does not exist." % (path, directory)
    )
  tmp = "%s.%s.tmp" % (path, uuid.uuid4().hex[:12])
  method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
  try:
    with open(tmp, "xb") as f:
      with zipfile.ZipFile(f, "w", method, allowZip64=True) as zf:
        for key, array in zip(keys, arrays):
          _write_member(zf, key + _SUFFIX, np.asarray(array))
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    _remove_quietly(tmp)
    raise errors.SnapshotFileError("Cannot write %s: %s" % (path, e))
  except BaseException:
    _remove_quietly(tmp)
    raise


def read(path):
  """Reads every array of the archive `path`, with no store to check against.

  Returns:
    An OrderedDict key -> numpy array, sorted by key.

  Raises:
    SnapshotFileError: As for `Archive`.
  """
  with Archive(path) as archive:
    return collections.OrderedDict(
      (key, archive.read(key)) for key in sorted(archive.declared())
    )


class Archive(object):
  """An `.npz` archive opened for reading, as a snapshot source (`snapstore.files.sources`).

  Every member's zip entry and header are read and checked when it is opened
  (see the module docstring); data is read member by member by `read`.

  Args:
    path: An `.npz` archive.

  Raises:
    SnapshotFileError: No such file; not an `.npz` archive; a member that is not
      a numeric array, is stored twice, holds pickled objects, has no valid
      header, or declares more or fewer bytes than it holds.
  """

  _archive = None  # close() is safe if __init__ raised

  def __init__(self, path):
    path = checks.readable_file(path, "The .npz path")
    try:
      archive = zipfile.ZipFile(path)
    except (
      zipfile.BadZipFile,
      OSError,
      ValueError,
      NotImplementedError,
      struct.error,
    ) as e:
      raise errors.SnapshotFileError(
        "%s is not an .npz archive (%s). Write archives with "
        "SnapshotStore.save_npz or numpy.savez." % (path, e)
      )
    self._path = path
    self._archive = archive
    try:
      self._members = _members(archive, path, os.path.getsize(path))
      self._declared = {
        key: _header(archive, info, path, key)
        for key, info in self._members.items()
      }
      _check_numeric(self._declared, path)
    except BaseException:
      self.close()
      raise

  @property
  def where(self):
    return self._path

  def declared(self):
    """`{member name: (shape, dtype)}` from the headers."""
    return dict(self._declared)

  def read(self, name):
    """The array `name`, in native byte order."""
    return _read(self._archive, self._members[name], self._path, name)

  def close(self):
    """Closes the archive. Safe to call twice."""
    if self._archive is not None:
      self._archive.close()
      self._archive = None

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()


def _check_numeric(declared, path):
  pickled = sorted(k for k, (_, dtype) in declared.items() if dtype.hasobject)
  if pickled:
    raise errors.SnapshotFileError(
      "%s holds pickled Python objects in %s; snapstore loads .npz files "
      "with allow_pickle=False. Save snapshots with SnapshotStore.save_npz "
      "or numpy.savez of numeric arrays." % (path, errors.names(pickled))
    )
  other = sorted(
    k for k, (_, dtype) in declared.items() if dtype.kind not in "biufc"
  )
  if other:
    raise errors.SnapshotFileError(
      "%s holds arrays that are not numeric (%s); a snapshot holds "
      "numbers."
      % (path, errors.names(["%r: %s" % (k, declared[k][1]) for k in other]))
    )


def _write_member(archive, name, array):
  with archive.open(name, "w", force_zip64=True) as member:
    np.lib.format.write_array(member, array, allow_pickle=False)


def _members(archive, path, size):
  members = {}
  for info in archive.infolist():
    name = info.filename
    if not name.endswith(_SUFFIX):
      raise errors.SnapshotFileError(
        "%s holds %r, which is not a .npy array; it is not a snapshot archive."
        % (path, name)
      )
    key = name[: -len(_SUFFIX)]
    if key in members:
      raise errors.SnapshotFileError("%s holds array %r twice." % (path, key))
    _check_member(info, path, key, size)
    members[key] = info
  return members


def _check_member(info, path, key, size):
  """Refuses a member whose sizes or storage no savez archive has."""
  if info.flag_bits & 0x1:
    raise errors.SnapshotFileError(
      "%s: array %r is encrypted; snapstore reads unencrypted archives."
      % (path, key)
    )
  if info.compress_type not in _METHODS:
    raise errors.SnapshotFileError(
      "%s: array %r is compressed with zip method %d; snapstore reads stored "
      "or deflated members (numpy.savez, numpy.savez_compressed)."
      % (path, key, info.compress_type)
    )
  if info.header_offset + info.compress_size > size:
    raise errors.SnapshotFileError(
      "%s: array %r ends past the end of the file (%d bytes); the archive is "
      "truncated or corrupt." % (path, key, size)
    )
  if info.compress_type == zipfile.ZIP_STORED:
    expandable = info.compress_size
  else:
    expandable = _MAX_DEFLATE_RATIO * info.compress_size + 1024
  if info.file_size > expandable:
    raise errors.SnapshotFileError(
      "%s: array %r declares %d bytes from %d %s bytes, more than they can "
      "hold; the archive is corrupt (or a zip bomb)."
      % (
        path,
        key,
        info.file_size,
        info.compress_size,
        _METHODS[info.compress_type],
      )
    )


def _header(archive, info, path, key):
  """(shape, dtype) from a member's .npy header, reading no data.

  The header must declare exactly the bytes the member holds.
  """
  try:
    with archive.open(info) as f:
      start = f.read(12)  # magic, version and the header's length
      version = np.lib.format.read_magic(io.BytesIO(start))
      if version not in ((1, 0), (2, 0)):
        raise ValueError("unsupported .npy format version %d.%d" % version)
      width = 2 if version == (1, 0) else 4
      if len(start) < 8 + width:
        raise ValueError("the member ends inside the header")
      (length,) = struct.unpack(
        "<H" if width == 2 else "<I", start[8 : 8 + width]
      )
      if length > _MAX_HEADER:
        raise ValueError(
          "a header of %d bytes; numpy writes at most %d"
          % (length, _MAX_HEADER)
        )
      header = io.BytesIO(
        start + f.read(max(0, 8 + width + length - len(start)))
      )
      header.seek(8)
      if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(header)
      else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(header)
  except _STREAM_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: array %r is truncated or corrupt (%s)." % (path, key, _describe(e))
    )
  except _MEMBER_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: array %r has no valid .npy header (%s)." % (path, key, _describe(e))
    )
  if any(d < 0 for d in shape):
    raise errors.SnapshotFileError(
      "%s: array %r declares the negative shape %s." % (path, key, shape)
    )
  data = 8 + width + length
  if not dtype.hasobject:
    nbytes = functools.reduce(operator.mul, shape, 1) * dtype.itemsize
    if data + nbytes != info.file_size:
      raise errors.SnapshotFileError(
        "%s: array %r declares shape %s of %s (%d bytes of data), but its "
        "member holds %d; the archive is corrupt."
        % (path, key, shape, dtype, nbytes, info.file_size - data)
      )
  return shape, dtype


def _read(archive, info, path, key):
  try:
    with archive.open(info) as f:
      array = np.lib.format.read_array(f, allow_pickle=False)
      if f.read(1):
        raise ValueError("data after the array")
  except _MEMBER_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: array %r is truncated or corrupt (%s)." % (path, key, _describe(e))
    )
  if not array.dtype.isnative:
    array = array.astype(array.dtype.newbyteorder("="))
  return array


def _describe(error):
  return str(error).strip() or type(error).__name__


def _remove_quietly(path):
  try:
    os.remove(path)
  except OSError:
    pass
