"""The spill file's layout: names, format markers, and the checks before any read.

Layout (h5py paths; every name is ASCII and safe, see `encode_tag`):

    /                          format="snapstore.spill", version=1,
                               checksum="xxh3_64",
                               variables=JSON [[key, shape, dtype], ...]
    /snapshots/<encoded tag>   one group per snapshot: tag, tag_type ("int" or
                               "str"), time, step (-1 if unknown), nbytes,
                               complete (0 until every dataset is written)
        <encoded key>          one dataset per variable: xxh3_64 (checksum of
                               its bytes, C order, native byte order)

Files are written in HDF5's latest format with every attribute stored inline,
so that all HDF5 metadata carries HDF5's own checksums: a damaged file gives an
error, not a crash inside the HDF5 library. Before reading data, the layout is
checked: links must be plain (no soft or external links), names must decode,
datasets must be numeric, contiguous or chunked with known filters, never in
external files, and hold the bytes their shapes declare, so a bad file cannot
make the reader allocate more than the file holds. The HDF5 library itself is
not hardened against files crafted to attack it: open only spill files your
own jobs wrote, and exchange snapshots with others as `.npz`.

Every function here reads or writes HDF5 metadata only; `snapstore.spill.file`
moves the data, in transactions.

    declared, snapshots = check_format(h5, path)     # or SnapshotFileError
    group = child(snapshots, encode_tag(7), h5py.Group, "snapshot 7", path)
"""

import functools
import json
import os

import h5py
import numpy as np
import xxhash

from snapstore import errors

FORMAT = "snapstore.spill"
VERSION = 1
COMPRESSIONS = ("gzip", "lzf")
CHECKSUM = "xxh3_64"  # faster than CRC-32: a spill is bound by memory bandwidth
# HDF5 1.10's file format (checksummed object headers and B-trees) on every
# stack, so that a file written on one reads on the other: h5py 2.10 (TF 1.15's
# stack) bundles HDF5 1.10, which cannot read the newer object versions that
# HDF5 1.12+ (h5py 3, the TF 2.x stack) writes under libver="latest" (a bool
# dataset's datatype, for one). On HDF5 1.10, "latest" is exactly this.
LIBVER = ("v110", "v110")
# Compression filters a spill file may use; gzip and lzf expand at most about
# 1032-fold (deflate's bound; lzf's is lower).
FILTERS = (
  h5py.h5z.FILTER_DEFLATE,
  h5py.h5z.FILTER_SHUFFLE,
  h5py.h5z.FILTER_FLETCHER32,
  32000,
)  # 32000: lzf
MAX_RATIO = 1032
# What h5py raises for a damaged or foreign file: KeyError when an object
# cannot be opened, OSError when it cannot be read, RuntimeError when links
# cannot be listed, ValueError and TypeError for types it cannot map.
H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError, TypeError)


# The first bytes of every HDF5 file snapstore writes (no user block).
SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path):
  """Whether the file `path` starts with the HDF5 signature (False if unreadable)."""
  try:
    with open(path, "rb") as f:
      return f.read(len(SIGNATURE)) == SIGNATURE
  except OSError:
    return False


def is_empty(path):
  """Whether `path` is an empty regular file: a new spill file, not a foreign one.

  `tempfile.mkstemp(suffix=".h5")` gives one; it holds nothing to keep.
  """
  return os.path.isfile(path) and os.path.getsize(path) == 0


def encode_tag(tag):
  """The group name of `tag`: "i<int>" or "s<percent-encoded str>".

  The name never contains "/" and never is "." or "..", so no tag can name a
  group outside `/snapshots`.
  """
  if isinstance(tag, bool) or not isinstance(tag, (int, str)):
    raise TypeError("A tag must be an int or a string, got %r." % (tag,))
  if isinstance(tag, int):
    return "i%d" % tag
  return "s" + _quote(tag)


def decode_tag(name):
  """The tag named by group `name` (inverse of `encode_tag`)."""
  if name[:1] == "i":
    return int(name[1:])
  if name[:1] == "s":
    return _unquote(name[1:])
  raise ValueError("%r is not an encoded tag" % name)


def encode_key(key):
  return "v" + _quote(key)


def decode_key(name):
  """The variable key of dataset `name` (inverse of `encode_key`)."""
  if name[:1] != "v":
    raise ValueError("%r is not an encoded key" % name)
  return _unquote(name[1:])


def _quote(text):
  # Percent-encode all but [A-Za-z0-9_-]: "/" and "." can never form a path.
  out = []
  for byte in text.encode("utf-8"):
    c = chr(byte)
    out.append(
      c if (c.isalnum() and byte < 128) or c in "_-" else "%%%02X" % byte
    )
  return "".join(out)


def _unquote(text):
  out, i = bytearray(), 0
  while i < len(text):
    if text[i] == "%":
      out.append(int(text[i + 1 : i + 3], 16))
      i += 3
    else:
      out.append(ord(text[i]))
      i += 1
  return out.decode("utf-8")


def initialize(f, specs):
  """Writes the markers and the variable list of a new spill file into `f`."""
  # Fixed-length byte strings: HDF5 keeps variable-length strings in its
  # global heap, the one metadata structure without a checksum.
  with h5py.File(f, "w", libver=LIBVER) as h5:
    h5.attrs["format"] = as_bytes(FORMAT)
    h5.attrs["version"] = VERSION
    h5.attrs["checksum"] = as_bytes(CHECKSUM)
    h5.attrs["variables"] = as_bytes(
      json.dumps([[s.key, list(s.shape), np.dtype(s.dtype).str] for s in specs])
    )
    h5.create_group("snapshots")
    h5.flush()


def set_attrs(obj, pairs):
  """Creates attributes from (name, numpy scalar) pairs.

  HDF5's own calls, several times faster than `obj.attrs[name] = value`:
  that matters for small snapshots of many variables.
  """
  scalar = h5py.h5s.create(h5py.h5s.SCALAR)
  for name, value in pairs:
    value = np.asarray(value)
    attr = h5py.h5a.create(
      obj.id, name.encode("ascii"), h5py.h5t.py_create(value.dtype), scalar
    )
    attr.write(value)


def as_bytes(text):
  return np.array(text.encode("utf-8"))


def checksum(flat):
  """The XXH3-64 checksum of the bytes of `flat` (a uint8 array)."""
  return xxhash.xxh3_64_intdigest(flat)


def is_complete(group):
  """Whether snapshot `group` was written in full."""
  try:  # a damaged flag reads as incomplete: never read
    return int(group.attrs.get("complete", 0)) == 1
  except H5_ERRORS:
    return False


def dtype_of(ds, path):
  """The numpy dtype of dataset `ds`, which must be numeric.

  Raises:
    SnapshotFileError: A type numpy cannot hold, or not a number.
  """
  try:
    dtype = ds.dtype
  except H5_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: dataset %s has a type numpy cannot hold (%s)." % (path, ds.name, e)
    )
  if dtype.kind not in "biufc" or dtype.fields is not None:
    raise errors.SnapshotFileError(
      "%s: dataset %s holds %s, not numbers; the file was not written by "
      "snapstore." % (path, ds.name, dtype)
    )
  return dtype


def parse_variables(text):
  """[(key, shape, dtype)] from the JSON of the file's `variables` attribute."""
  out = []
  for key, shape, dtype in json.loads(text):
    if not isinstance(key, str) or not key:
      raise ValueError("the key %r is not a name" % (key,))
    if not isinstance(shape, list) or not all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
      raise ValueError("%s has the shape %r" % (key, shape))
    dtype = np.dtype(str(dtype))
    if dtype.kind not in "biufc" or dtype.fields is not None:
      raise ValueError("%s has the dtype %s, not a number" % (key, dtype))
    out.append((key, tuple(shape), dtype))
  return out


def as_text(value):
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def open_problem(path, error):
  """The message for a file h5py could not open: truncated, not HDF5, other."""
  message = str(error)
  if "truncated" in message:
    return (
      "%s is truncated (%s); it was cut short, e.g. by a full disk or an "
      "interrupted copy." % (path, message)
    )
  if "signature" in message:
    return "%s is not an HDF5 file, so not a snapstore spill file." % path
  return "Cannot open %s as an HDF5 spill file: %s." % (path, message)


def check_format(h5, path):
  """Checks the markers of a spill file; returns (declared variables, /snapshots).

  Returns:
    `([(key, shape, dtype)], the snapshots group)`.

  Raises:
    SnapshotFileError: Not a snapstore spill file, another format version or
      checksum, a corrupt variable list, or damaged metadata.
  """
  try:
    attrs = dict(
      (name, h5.attrs[name])
      for name in ("format", "version", "checksum", "variables")
      if name in h5.attrs
    )
    has_snapshots = "snapshots" in h5
  except H5_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: cannot read the file's attributes (%s); it is damaged or not a "
      "snapstore spill file." % (path, e)
    )
  fmt = attrs.get("format")
  if fmt is None or as_text(fmt) != FORMAT or not has_snapshots:
    raise errors.SnapshotFileError(
      "%s is an HDF5 file, but not a snapstore spill file (it has no "
      "format=%r marker); it was written by another program." % (path, FORMAT)
    )
  try:
    version = int(attrs.get("version", -1))
  except (TypeError, ValueError):
    version = -1
  if version != VERSION:
    raise errors.SnapshotFileError(
      "%s is a snapstore spill file of format version %d; this snapstore "
      "reads version %d. Use the snapstore version that wrote it."
      % (path, version, VERSION)
    )
  if as_text(attrs.get("checksum", "")) != CHECKSUM:
    raise errors.SnapshotFileError(
      "%s: unknown checksum algorithm %r; this snapstore uses %r."
      % (path, as_text(attrs.get("checksum", "")), CHECKSUM)
    )
  try:
    declared = parse_variables(as_text(attrs["variables"]))
  except (KeyError, ValueError, TypeError) as e:
    raise errors.SnapshotFileError(
      "%s: the spill file's variable list is corrupt (%s)." % (path, e)
    )
  return declared, child(h5, "snapshots", h5py.Group, "the snapshot list", path)


def names(group, what, path):
  """The names in `group` (or SnapshotFileError naming `what`)."""
  try:
    return list(group)
  except H5_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: cannot list %s (%s); the file is damaged." % (path, what, e)
    )


def child(group, name, kind, what, path):
  """`group[name]`, which must be a hard link to a `kind` (Group or Dataset).

  A soft or external link could name an object outside the snapshot, or
  another file on this machine (HDF5 would open it): never followed.
  """
  try:
    link = group.get(name, getlink=True)
    if not isinstance(link, h5py.HardLink):
      raise errors.SnapshotFileError(
        "%s: %s is a link (%s), not data stored in the file; snapstore "
        "never follows links." % (path, what, type(link).__name__)
      )
    obj = group[name]
  except H5_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: cannot open %s (%s); the file is damaged." % (path, what, e)
    )
  if not isinstance(obj, kind):
    raise errors.SnapshotFileError(
      "%s: %s is a %s where a %s belongs; the file is damaged or was "
      "changed by another program."
      % (path, what, type(obj).__name__, kind.__name__)
    )
  return obj


def check_storage(ds, what, path, file_size):
  """Checks a dataset's layout and size; returns its contiguous data's offset.

  Nothing is allocated for a dataset that does not hold the bytes its shape
  declares, keeps its data outside the file, or needs an unknown filter.

  Args:
    ds: The dataset.
    what: How messages name it, e.g. "variable 'w' of snapshot 3".
    path: The file, for messages.
    file_size: The file's size in bytes.

  Returns:
    The offset of its data in the file, or None when it is chunked.

  Raises:
    SnapshotFileError: What is wrong with it.
  """
  try:
    dtype = dtype_of(ds, path)
    nbytes = functools.reduce(lambda a, b: a * b, ds.shape, 1) * dtype.itemsize
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    external = dcpl.get_external_count()
    filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
    offset = ds.id.get_offset()
    stored = ds.id.get_storage_size()
  except H5_ERRORS as e:
    raise errors.SnapshotFileError(
      "%s: cannot read the layout of %s (%s); the file is damaged."
      % (path, what, e)
    )
  problem = None
  if external:
    problem = (
      "keeps its data in %d external file(s), which snapstore never "
      "reads" % external
    )
  elif layout == h5py.h5d.CONTIGUOUS:
    if nbytes and (
      offset is None or stored != nbytes or offset + nbytes > file_size
    ):
      problem = (
        "declares %d bytes (shape %s, %s) but the file holds %d for "
        "it" % (nbytes, ds.shape, dtype, stored)
      )
  elif layout == h5py.h5d.CHUNKED:
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
      problem = "needs HDF5 filter(s) %s, which spill files never use" % unknown
    elif nbytes and not 0 < stored <= file_size:
      problem = "declares %d bytes but the file holds %d for it" % (
        nbytes,
        stored,
      )
    elif nbytes > MAX_RATIO * stored + (1 << 20):
      problem = (
        "declares %d bytes from %d compressed, more than compression "
        "can produce" % (nbytes, stored)
      )
    offset = None
  else:
    problem = "has HDF5 layout %d, which spill files never use" % layout
  if problem:
    raise errors.SnapshotFileError(
      "%s: %s %s; the file is damaged or was not written by snapstore."
      % (path, what, problem)
    )
  return offset
