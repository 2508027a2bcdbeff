"""`python -m snapstore` (or `snapstore`): inspect spill files and `.npz` snapshots.

A snapshot is named by a file, and in a spill file by a tag after a colon:
`run.h5:3`, `run.h5:best`, `best.npz`. A digit-only tag means the int tag if
the file has one, else the string. The file is the shortest part before a
colon that exists, so `run.h5:a:b` names tag `a:b`; `--tag` names any tag
(`show run.h5 --tag a:b`).

    snapstore list run.h5                  # tag, time, step, size, variables; damaged ones
    snapstore show run.h5:3                # one snapshot, per variable
    snapstore diff run.h5:3 run.h5:7       # per-variable max-abs and L2 difference
    snapstore verify run.h5                # every checksum
    snapstore verify --finite best.npz     # ... and no NaN or infinite values
    snapstore export run.h5:3 three.npz    # one snapshot as .npz

Exit status: 0 on success, 1 for a missing, corrupt or foreign file, an unknown
tag or a failed check, 2 for bad usage. A spill file with damaged snapshots
still lists and verifies the others: `verify` exits 1 and names the intact
ones, which `export` can save. Names read from a file are printed quoted when
they hold control characters.
"""

import argparse
import datetime
import os
import sys

import numpy as np

from snapstore.core import checks
from snapstore import errors
from snapstore.files import npz
from snapstore.spill import file as spill_file

# `list` pads the tag column to the longest tag up to this width; a longer tag
# is printed whole and pushes its own row only.
_TAG_WIDTH = 24
# `show` summarizes a variable this many elements at a time, so that it needs
# about the variable's own size in memory, not several float64 copies of it.
_CHUNK = 1 << 20


class _Source(object):
  """A spill file or an `.npz` archive, opened for reading."""

  _spill = None
  _archive = None

  def __init__(self, path):
    self.path = path
    self.is_npz = _is_zip(path)
    if self.is_npz:
      self._archive = npz.Archive(path)
    else:
      self._spill = spill_file.open_spill(path)

  def close(self):
    for f in (self._spill, self._archive):
      if f is not None:
        f.close()

  def entries(self):
    if self._spill is not None:
      return self._spill.entries()
    declared = self._archive.declared()
    return [
      spill_file.SpillEntry(
        os.path.basename(self.path),
        os.path.getmtime(self.path),
        None,
        sum(
          int(np.prod(shape)) * dtype.itemsize
          for shape, dtype in declared.values()
        ),
        tuple(sorted(declared)),
      )
    ]

  def incomplete(self):
    return self._spill.incomplete() if self._spill is not None else []

  def damaged(self):
    return self._spill.damaged() if self._spill is not None else []

  def declared(self, tag):
    """`{key: (shape, dtype)}` of snapshot `tag`, sorted by key."""
    declared = (
      self._archive.declared()
      if self._spill is None
      else self._spill.declared(tag)
    )
    return dict(sorted(declared.items()))

  def read_variable(self, tag, key):
    if self._spill is None:
      return self._archive.read(key)
    return self._spill.read_variable(tag, key)

  def resolve(self, text):
    """The tag `text` names (None: the archive, or a spill file's newest)."""
    if self._spill is None:
      if text is not None:
        raise errors.SnapshotFileError(
          "%s is an .npz archive, which holds one snapshot; name it without "
          ":%s." % (self.path, text)
        )
      return None
    if text is None:
      entries = self._spill.entries()
      if not entries:
        raise errors.UnknownTagError(
          "%s holds no complete snapshots." % self.path
        )
      return entries[-1].tag
    if text.lstrip("-").isdigit() and int(text) in self._spill:
      return int(text)
    return text

  def read(self, tag):
    if self._spill is None:
      return npz.read(self.path)
    return self._spill.read(tag)


def _parse_ref(ref, tag=None):
  """'file:tag' -> (file, tag text or None); see the module doc.

  A path that exists is taken whole; otherwise the file is the shortest part
  before a colon that exists, and the rest (colons included) the tag. With
  `tag` (the `--tag` option), `ref` is the file.
  """
  if tag is not None or os.path.exists(ref) or ":" not in ref:
    return ref, tag
  parts = ref.split(":")
  for i in range(1, len(parts)):
    if os.path.exists(":".join(parts[:i])):
      return ":".join(parts[:i]), ":".join(parts[i:])
  path, tag = ref.rsplit(":", 1)  # no such file: reading it says so
  return path, tag


def _open(ref, tag=None):
  path, tag_text = _parse_ref(ref, tag)
  source = _Source(path)
  try:
    return source, source.resolve(tag_text)
  except BaseException:
    source.close()
    raise


def _is_zip(path):
  path = checks.readable_file(path, "The file")
  with open(path, "rb") as f:
    return f.read(4) == b"PK\x03\x04"


def _time(seconds):
  return datetime.datetime.fromtimestamp(seconds).isoformat(" ", "seconds")


def _size(nbytes):
  for unit in ("B", "KiB", "MiB", "GiB"):
    if nbytes < 1024 or unit == "GiB":
      return (
        ("%d %s" % (nbytes, unit))
        if unit == "B"
        else "%.1f %s" % (nbytes, unit)
      )
    nbytes /= 1024.0


def cmd_list(args, out):
  source = _Source(args.file)
  try:
    entries = source.entries()
    rows = [("tag", "time", "step", "size", "variables")]
    for e in entries:
      rows.append(
        (
          repr(e.tag),
          _time(e.time),
          "-" if e.step is None else str(e.step),
          _size(e.nbytes),
          str(len(e.keys)),
        )
      )
    _table(rows, out, caps={0: _TAG_WIDTH})
    for tag in source.incomplete():
      out.write("incomplete (write interrupted, never read): %r\n" % (tag,))
    damaged = source.damaged()
    for d in damaged:
      out.write("damaged %s: %s\n" % (_damaged_name(d), d.problem))
    out.write(
      "%d snapshot(s) in %s%s\n"
      % (
        len(entries),
        args.file,
        ", %d damaged" % len(damaged) if damaged else "",
      )
    )
  finally:
    source.close()
  return 0


def cmd_show(args, out):
  source, tag = _open(args.snapshot, args.tag)
  rows = [("variable", "shape", "dtype", "min", "max", "mean", "non-finite")]
  try:
    entry = [e for e in source.entries() if source.is_npz or e.tag == tag]
    if not entry:  # a damaged snapshot whose data may still read
      entry = [spill_file.SpillEntry(tag, None, None, None, ())]
    for key, (shape, dtype) in source.declared(tag).items():
      # One variable in memory at a time, summarized in chunks.
      rows.append(
        (key, str(tuple(shape)), dtype.name)
        + _summary(source.read_variable(tag, key))
      )
  finally:
    source.close()
  entry = entry[0]
  out.write(
    "snapshot %r of %s: time %s, step %s, %s\n"
    % (
      entry.tag,
      source.path,
      "-" if entry.time is None else _time(entry.time),
      "-" if entry.step is None else entry.step,
      "-" if entry.nbytes is None else _size(entry.nbytes),
    )
  )
  _table(rows, out)
  return 0


def _summary(a):
  """(min, max, mean, non-finite count) of `a` as strings, `_CHUNK` at a time."""
  flat = a.reshape(-1)
  low, high, total, finite = np.inf, -np.inf, 0.0, 0
  for start in range(0, flat.size, _CHUNK):
    values = _as_float(flat[start : start + _CHUNK])
    if values.dtype.kind == "c":
      values = np.abs(values)
    values = values[np.isfinite(values)]
    if values.size:
      low, high = min(low, values.min()), max(high, values.max())
      total += values.sum()
      finite += values.size
  if not finite:
    return ("-", "-", "-", str(flat.size))
  return (
    "%.6g" % low,
    "%.6g" % high,
    "%.6g" % (total / finite),
    str(flat.size - finite),
  )


def cmd_diff(args, out):
  a, b = _read_ref(args.a), _read_ref(args.b)
  rows = [("variable", "max_abs", "l2", "bit-identical")]
  status = 0
  for key in sorted(set(a) | set(b)):
    if key not in a or key not in b:
      rows.append((key, "only in %s" % (args.a if key in a else args.b), ""))
      status = 1
    elif a[key].shape != b[key].shape:
      rows.append(
        (key, "shapes differ: %s vs %s" % (a[key].shape, b[key].shape), "")
      )
      status = 1
    else:
      rows.append((key,) + _difference(a[key], b[key]))
  _table(rows, out)
  return status


def cmd_verify(args, out):
  path, tag_text = _parse_ref(args.file, args.tag)
  source = _Source(path)
  failed, intact = 0, []
  try:
    tags = (
      [source.resolve(tag_text)]
      if tag_text is not None
      else [e.tag for e in source.entries()]
    )
    damaged = source.damaged() if tag_text is None else []
    for tag in tags:
      name = repr(tag) if tag is not None else path
      try:
        arrays = source.read(tag)
      except errors.Error as e:
        failed += 1
        out.write("FAILED  %s\n" % e)
        continue
      bad = _non_finite(arrays) if args.finite else []
      if bad:
        failed += 1
        out.write(
          "FAILED  %s: non-finite values in %s\n" % (name, errors.names(bad))
        )
      else:
        intact.append(name)
        out.write("ok      %s\n" % name)
    for d in damaged:
      out.write("FAILED  %s\n" % d.problem)
    for tag in source.incomplete():
      out.write("skipped %r: incomplete (write interrupted)\n" % (tag,))
  finally:
    source.close()
  checked, failed = len(tags) + len(damaged), failed + len(damaged)
  out.write("%d checked, %d failed\n" % (checked, failed))
  if failed and intact:
    out.write(
      "intact, can be saved (snapstore export %s:TAG out.npz): %s\n"
      % (path, ", ".join(intact))
    )
  return 1 if failed else 0


def _damaged_name(damaged):
  return (
    repr(damaged.tag)
    if damaged.tag is not None
    else "/snapshots/%s" % errors.names([damaged.name])
  )


def _non_finite(arrays):
  """'key (n of m)' for each array holding NaN or infinite values."""
  bad = []
  for key, a in arrays.items():
    if a.dtype.kind in "fc":
      count = int(a.size - np.count_nonzero(np.isfinite(a)))
      if count:
        bad.append("%s (%d of %d)" % (key, count, a.size))
  return bad


def cmd_export(args, out):
  source, tag = _open(args.snapshot, args.tag)
  try:
    if os.path.exists(args.output) and os.path.samefile(
      source.path, args.output
    ):
      raise errors.SnapshotFileError(
        "Refusing to export %s onto itself: writing %s would replace the "
        "file being read. Name another output file."
        % (args.snapshot, args.output)
      )
    arrays = source.read(tag)
  finally:
    source.close()
  npz.save(
    args.output, list(arrays), list(arrays.values()), compress=args.compress
  )
  out.write("wrote %s (%d variables)\n" % (args.output, len(arrays)))
  return 0


def _read_ref(ref):
  source, tag = _open(ref)
  try:
    return source.read(tag)
  finally:
    source.close()


def _difference(a, b):
  """(max-abs, L2, bit-identical) of a - b as strings.

  Elements with identical bits differ by 0, so equal NaNs and infinities do
  not turn the result into NaN; a NaN against a number does.
  """
  with np.errstate(all="ignore"):
    d = (_as_float(a) - _as_float(b)).reshape(-1)
    same = (
      _bits(a) == _bits(b) if a.dtype == b.dtype else np.zeros(d.shape, bool)
    )
    d[same] = 0
    d = np.abs(d)
    max_abs = d.max() if d.size else 0.0
    l2 = np.sqrt(np.sum(d * d))
  return "%.6g" % max_abs, "%.6g" % l2, "yes" if same.all() else "no"


def _bits(a):
  """Per element, the raw bytes as one comparable value."""
  flat = np.ascontiguousarray(a).reshape(-1)
  return (
    flat.view(np.dtype((np.void, a.dtype.itemsize)))
    if a.dtype.itemsize
    else flat
  )


def _as_float(a):
  if a.dtype.kind == "c":
    return a.astype(np.complex128)
  return a.astype(np.float64)


def _table(rows, out, caps=None):
  """Writes `rows` in columns; `caps` maps a column to its widest padding."""
  # A name from a hostile file must not move the cursor or clear the screen.
  rows = [[c if c.isprintable() else repr(c) for c in row] for row in rows]
  widths = [
    min(max(len(r[i]) for r in rows), (caps or {}).get(i, float("inf")))
    for i in range(len(rows[0]))
  ]
  for row in rows:
    out.write(
      "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n"
    )


def _parser():
  parser = argparse.ArgumentParser(
    prog="snapstore",
    description=__doc__.split("\n\n")[0],
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  sub = parser.add_subparsers(dest="command", metavar="command")
  sub.required = True
  p = sub.add_parser("list", help="list the snapshots of a spill file or .npz")
  p.add_argument("file")
  p.set_defaults(run=cmd_list)
  p = sub.add_parser("show", help="show one snapshot, per variable")
  p.add_argument("snapshot", help="file.h5:tag (default: newest) or file.npz")
  p.add_argument("--tag", help="the tag, when it holds a colon")
  p.set_defaults(run=cmd_show)
  p = sub.add_parser("diff", help="per-variable max-abs and L2 difference")
  p.add_argument("a", help="file.h5:tag or file.npz")
  p.add_argument("b", help="file.h5:tag or file.npz")
  p.set_defaults(run=cmd_diff)
  p = sub.add_parser("verify", help="check the checksums of every snapshot")
  p.add_argument("file", help="file.h5, file.h5:tag or file.npz")
  p.add_argument("--tag", help="check only this tag")
  p.add_argument(
    "--finite",
    action="store_true",
    help="also fail snapshots holding NaN or infinite values",
  )
  p.set_defaults(run=cmd_verify)
  p = sub.add_parser("export", help="write one snapshot as .npz")
  p.add_argument("snapshot", help="file.h5:tag (default: newest) or file.npz")
  p.add_argument("output", help="the .npz file to write")
  p.add_argument("--tag", help="the tag, when it holds a colon")
  p.add_argument("--compress", action="store_true", help="deflate the members")
  p.set_defaults(run=cmd_export)
  return parser


def main(argv=None, out=None, err=None):
  """Runs the command line `argv`; returns the exit status."""
  out = out or sys.stdout
  err = err or sys.stderr
  args = _parser().parse_args(argv)
  try:
    return args.run(args, out)
  # OSError: e.g. no permission to read; ValueError: a directory as a file.
  except (errors.Error, OSError, ValueError) as e:
    err.write("snapstore %s: error: %s\n" % (args.command, e))
    return 1
