"""Hostile spill files: each is refused with a clear error, allocating little.

The corpus is made here from a spill file a store wrote: truncated and
bit-flipped files, wrong root attributes, a foreign layout (groups and datasets
snapstore never writes, soft and external links, data in external files,
unknown filters), wrong and non-numeric dtypes, huge declared shapes, and a
journal left next to the file that cannot be its own. Reading (`open_spill`,
the CLI's `verify`) and a store over the file must refuse each with a
`snapstore.Error` naming the problem, without allocating more than a few MiB;
a store that cannot use the file is not built and leaks no file or thread; a
store over a file with one bad snapshot still restores the others exactly. A
damaged snapshot (a link, damaged attributes, a foreign group or dataset) is
listed as such, on its own: the file's other snapshots are listed, verified
and restored as usual.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

from absl.testing import absltest
from absl.testing import parameterized
import h5py
import numpy as np

import snapstore
from snapstore.spill import layout
from tests import helpers
from tests import hostile

_FILE_ERROR = snapstore.SnapshotFileError
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_all(path):
  """Every snapshot of the file, or the error of the first damaged one."""
  with snapstore.open_spill(path) as f:
    for damaged in f.damaged():
      raise snapstore.SnapshotFileError(damaged.problem)
    return dict((e.tag, f.read(e.tag)) for e in f.entries())


def sweep(template, path):
  """Reads every one-bit flip and every cut of `template`, written to `path`.

  Prints a JSON line with how many files read back exactly, how many were
  refused with a `snapstore.Error`, and a description of any other outcome.
  Run by `test_every_bit_flip_and_cut_is_exact_or_refused` in a child process.
  """
  originals = {0: hostile.values(0), "x": hostile.values(1)}
  with open(template, "rb") as f:
    good = f.read()
  # The unchanged file comes first, as a control: it must read back exactly.
  blobs = [good] + [
    bytes(good[:pos]) + bytes([good[pos] ^ (1 << pos % 8)]) + good[pos + 1 :]
    for pos in range(0, len(good), 2)
  ]
  blobs += [good[:cut] for cut in range(0, len(good), 61)]
  counts = {"files": len(blobs), "exact": 0, "refused": 0, "failures": []}
  for i, blob in enumerate(blobs):
    with open(path, "wb") as f:
      f.write(blob)
    try:
      arrays = _read_all(path)
    except snapstore.Error:
      counts["refused"] += 1
      continue
    except Exception as e:  # pylint: disable=broad-except
      counts["failures"].append("file %d: %r" % (i, e))
      continue
    try:
      if sorted(arrays, key=str) != [0, "x"]:
        raise AssertionError("tags %r" % sorted(arrays, key=str))
      for tag, state in originals.items():
        helpers.assert_state(arrays[tag], state, "snapshot %r" % (tag,))
    except AssertionError as e:
      counts["failures"].append("file %d: %s" % (i, e))
      continue
    counts["exact"] += 1
    if i == 0:
      counts["control_exact"] = True
  if not counts.get("control_exact"):
    counts["failures"].append("file 0 (unchanged) was not read back exactly")
  print(json.dumps(counts))


def _replace(h5, name, **kwargs):
  del h5[name]
  return h5.create_dataset(name, **kwargs)


def _declare(h5, key, shape):
  """Rewrites the root's variable list so that `key` has `shape`."""
  declared = json.loads(h5.attrs["variables"].decode())
  for entry in declared:
    if entry[0] == key:
      entry[1] = shape
  h5.attrs["variables"] = np.array(json.dumps(declared).encode())


def _set(name, value):
  def mutate(h5):
    h5[os.path.dirname(name) or "/"].attrs[os.path.basename(name)] = value

  return mutate


class _OnBytes(object):
  """A mutation of the file's bytes rather than of its HDF5 objects."""

  def __init__(self, change):
    self.change = change


def _journal(size, records=()):
  head = struct.pack("<8sQ", b"SNAPJRN1", size)
  out = head + struct.pack("<I", zlib.crc32(head))
  for offset, data in records:
    out += struct.pack("<QII", offset, len(data), zlib.crc32(data)) + data
  return out


# File-level cases: (name, mutate(h5 file opened r+) or bytes -> bytes, message).
# Reading, the CLI and a store over the file all refuse with the message.
_FILE_CASES = [
  ("not_hdf5", _OnBytes(lambda data: b"hello " * 500), r"is not an HDF5 file"),
  (
    "truncated",
    _OnBytes(lambda data: data[: len(data) * 3 // 5]),
    r"(is truncated|damaged|corrupt)",
  ),
  (
    "format",
    _set("format", b"netcdf"),
    r"is an HDF5 file, but not a snapstore spill file",
  ),
  (
    "version",
    _set("version", 7),
    r"format version 7; this snapstore reads version 1",
  ),
  (
    "version_text",
    _set("version", b"one"),
    r"format version -1; this snapstore reads version 1",
  ),
  ("checksum", _set("checksum", b"md5"), r"unknown checksum algorithm 'md5'"),
  ("variables_json", _set("variables", b"[["), r"variable list is corrupt"),
  (
    "variables_object",
    _set("variables", b'[["a", [4, 3], "|O"]]'),
    r"variable list is corrupt \(a has the dtype object, not a number\)",
  ),
  (
    "variables_negative",
    _set("variables", b'[["a", [-4, 3], "<f4"]]'),
    r"variable list is corrupt \(a has the shape \[-4, 3\]\)",
  ),
  (
    "snapshots_dataset",
    lambda h5: _replace(h5, "snapshots", data=np.zeros(3)),
    r"the snapshot list is a Dataset where a Group belongs",
  ),
  (
    "snapshots_soft_link",
    lambda h5: (
      h5.__delitem__("snapshots"),
      h5.__setitem__("snapshots", h5py.SoftLink("/")),
    ),
    r"the snapshot list is a link \(SoftLink\)",
  ),
  (
    "journal_past_file",
    "journal_size",
    r"-journal does not belong to it \(it records a file of 1000000000000 bytes\)",
  ),
  (
    "journal_record_past_end",
    "journal_record",
    r"does not belong to it \(it saves bytes past the file's committed end\)",
  ),
]

# One damaged snapshot: (name, mutate, message, its tag or None, whether its
# data still restores). The file lists it as damaged and the others as usual.
_DAMAGED_CASES = [
  (
    "foreign_group",
    lambda h5: h5["snapshots"].create_group("xyz"),
    r"/snapshots/xyz is not a snapstore snapshot",
    None,
    False,
  ),
  (
    "external_link",
    "external_link",
    r"snapshot 5 is a link \(ExternalLink\)",
    5,
    False,
  ),
  (
    "soft_link_snapshot",
    lambda h5: h5["snapshots"].__setitem__(
      "i6", h5py.SoftLink("/snapshots/i0")
    ),
    r"snapshot 6 is a link \(SoftLink\)",
    6,
    False,
  ),
  (
    "missing_time",
    lambda h5: h5["snapshots/i0"].attrs.__delitem__("time"),
    r"snapshot 0 has damaged attributes",
    0,
    True,
  ),
  (
    "text_time",
    _set("snapshots/i0/time", b"noon"),
    r"snapshot 0 has damaged attributes",
    0,
    True,
  ),
  (
    "foreign_dataset",
    lambda h5: h5["snapshots/i0"].create_dataset("weird", data=np.zeros(1)),
    r"snapshot 0 holds weird, which is not a snapstore variable",
    0,
    False,
  ),
]

# Snapshot-level cases: (name, mutate, message, store error, store message).
# The file opens; reading snapshot 0 is refused. A store over the file
# refuses to restore 0 (store error and message) and restores "x" exactly.
_SNAPSHOT_CASES = [
  (
    "flipped_data",
    "flip",
    r"checksum mismatch in variable 'a' of snapshot 0\b",
    _FILE_ERROR,
    "same",
  ),
  (
    "group_for_dataset",
    lambda h5: (
      h5["snapshots/i0"].__delitem__("va"),
      h5["snapshots/i0"].create_group("va"),
    ),
    r"variable 'a' of snapshot 0 is a Group where a Dataset belongs",
    _FILE_ERROR,
    "same",
  ),
  (
    "checksum_missing",
    lambda h5: h5["snapshots/i0/va"].attrs.__delitem__(layout.CHECKSUM),
    r"checksum mismatch in variable 'a' of snapshot 0",
    _FILE_ERROR,
    "same",
  ),
  (
    "float64_data",
    lambda h5: _replace(h5, "snapshots/i0/va", data=np.zeros([4, 3])),
    r"snapshot 0 does not hold the variables the file declares",
    snapstore.IncompatibleSnapshotError,
    r"a has dtype float64, the variable has dtype float32",
  ),
  (
    "text_data",
    lambda h5: _replace(
      h5, "snapshots/i0/va", shape=(4, 3), dtype=h5py.string_dtype()
    ),
    r"dataset /snapshots/i0/va holds object, not numbers",
    _FILE_ERROR,
    "same",
  ),
  (
    "external_data",
    "external_data",
    r"variable 'a' of snapshot 0 keeps its data in 1 external file",
    _FILE_ERROR,
    "same",
  ),
  (
    "unknown_filter",
    lambda h5: _replace(
      h5, "snapshots/i0/vb%2Fc", shape=(5,), dtype=np.int32, scaleoffset=0
    ),
    r"variable 'b/c' of snapshot 0 needs HDF5 filter\(s\) \[6\]",
    _FILE_ERROR,
    "same",
  ),
  (
    "huge_contiguous",
    lambda h5: (
      _replace(h5, "snapshots/i0/va", shape=(1 << 32,), dtype=np.float32),
      _declare(h5, "a", [1 << 32]),
    ),
    r"variable 'a' of snapshot 0 declares 17179869184 bytes .*the file holds 0",
    snapstore.IncompatibleSnapshotError,
    None,
  ),
  (
    "huge_chunked",
    lambda h5: (
      _replace(
        h5,
        "snapshots/i0/va",
        shape=(1 << 32,),
        dtype=np.float32,
        chunks=(1 << 20,),
        compression="gzip",
      ),
      _declare(h5, "a", [1 << 32]),
    ),
    r"variable 'a' of snapshot 0 declares 17179869184 bytes .*the file holds 0",
    snapstore.IncompatibleSnapshotError,
    None,
  ),
  (
    "huge_undeclared",
    lambda h5: _replace(
      h5, "snapshots/i0/va", shape=(1 << 32,), dtype=np.float32
    ),
    r"snapshot 0 does not hold the variables the file declares",
    snapstore.IncompatibleSnapshotError,
    r"a has shape \(4294967296,\), the variable has shape \(4, 3\)",
  ),
]


class HostileSpillFileTest(hostile.HostileFileCase, parameterized.TestCase):
  @classmethod
  def setUpClass(cls):
    super(HostileSpillFileTest, cls).setUpClass()
    cls.template = os.path.join(cls.dir, "template.h5")
    cls.originals = {0: hostile.values(0), "x": hostile.values(1)}
    with cls.graph.as_default():
      store = snapstore.SnapshotStore(
        scope="net",
        mode="disk",
        memory_budget=0,
        spill_path=cls.template,
        name="template",
      )
    for tag, state in sorted(cls.originals.items(), key=lambda kv: str(kv[0])):
      cls.load(state)
      store.snapshot(tag, session=cls.sess)
    store.close()
    cls.outside = os.path.join(cls.dir, "outside.h5")
    with h5py.File(cls.outside, "w") as h5:
      h5.create_group("snapshots")
      h5["data"] = np.arange(12, dtype=np.float32)

  def _make(self, name, mutate):
    path = self.path(name + ".h5")
    shutil.copy(self.template, path)
    if mutate == "external_link":
      with h5py.File(path, "r+") as h5:
        h5["snapshots/i5"] = h5py.ExternalLink(
          "../" + os.path.basename(self.dir) + "/outside.h5", "/snapshots"
        )
    elif mutate == "external_data":
      with h5py.File(path, "r+") as h5:
        _replace(
          h5,
          "snapshots/i0/va",
          shape=(4, 3),
          dtype=np.float32,
          external=[(self.outside, 0, 48)],
        )
    elif mutate == "flip":
      with h5py.File(path, "r") as h5:
        offset = h5["snapshots/i0/va"].id.get_offset()
      with open(path, "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)[0]
        f.seek(offset + 5)
        f.write(bytes([byte ^ 4]))
    elif mutate in ("journal_size", "journal_record"):
      size = os.path.getsize(path)
      with open(path + "-journal", "wb") as f:
        f.write(
          _journal(10**12)
          if mutate == "journal_size"
          else _journal(size, [(size - 10, b"\0" * 4096)])
        )
    elif isinstance(mutate, _OnBytes):
      with open(path, "rb") as f:
        data = f.read()
      with open(path, "wb") as f:
        f.write(mutate.change(data))
    else:
      with h5py.File(path, "r+") as h5:
        mutate(h5)
    return path

  def _store_over(self, path):
    with self.graph.as_default():
      return snapstore.SnapshotStore(
        scope="net", mode="disk", memory_budget=0, spill_path=path
      )

  @parameterized.named_parameters(*_FILE_CASES)
  def test_file_refused(self, mutate, message):
    path = self._make(self._testMethodName, mutate)
    with open(path, "rb") as f:
      before = f.read()
    self.assert_refused(lambda: _read_all(path), _FILE_ERROR, message)
    status, out, err = hostile.run_cli("verify", path)
    self.assertEqual((status, out), (1, ""))
    self.assertRegex(err, r"^snapstore verify: error: .*" + message)
    self.assertEqual(err.count("\n"), 1)
    fds, threads = hostile.open_fds(), hostile.threading.active_count()
    self.assert_refused(lambda: self._store_over(path), _FILE_ERROR, message)
    self.assert_nothing_leaked(fds, threads)
    with open(path, "rb") as f:
      self.assertEqual(f.read(), before)  # refused, never "repaired"
    for store in self.stores.values():
      self.assert_usable(store)

  def _assert_others_usable(self, store):
    """Snapshot "x" of a store over a damaged file restores; new ones work."""
    store.restore("x", session=self.sess)
    helpers.assert_state(self.current(), self.originals["x"])
    store.snapshot("new", session=self.sess)
    store.restore("new", session=self.sess)
    helpers.assert_state(self.current(), self.originals["x"])

  @parameterized.named_parameters(*_DAMAGED_CASES)
  def test_one_damaged_snapshot(self, mutate, message, tag, restorable):
    path = self._make(self._testMethodName, mutate)
    with snapstore.open_spill(path) as f:
      intact = [e.tag for e in f.entries()]
      damaged = f.damaged()
      self.assertEqual([d.tag for d in damaged], [tag])
      self.assertRegex(damaged[0].problem, message)
      for t in intact:
        helpers.assert_state(f.read(t), self.originals[t], t)
    self.assertEqual(
      sorted(intact, key=str), sorted(set(self.originals) - {tag}, key=str)
    )
    status, out, _ = hostile.run_cli("list", path)
    self.assertEqual(status, 0)
    self.assertRegex(out, r"(?m)^'x' ")
    self.assertRegex(out, r"(?m)^damaged .*" + message)
    self.assertRegex(out, r"%d snapshot\(s\) in .*, 1 damaged" % len(intact))
    status, out, _ = hostile.run_cli("verify", path)
    self.assertEqual(status, 1)
    self.assertIn("ok      'x'\n", out)
    self.assertRegex(out, r"FAILED  .*" + message)
    self.assertRegex(out, r"intact, can be saved .*'x'")
    store = self._store_over(path)
    self.addCleanup(store.close)
    self.assertEqual(
      set(store.tags()), set(intact) | ({tag} if tag is not None else set())
    )
    live = hostile.values(9)
    self.load(live)
    if tag is not None and restorable:  # its data is intact
      store.restore(tag, session=self.sess)
      helpers.assert_state(self.current(), self.originals[tag])
    elif tag is not None:
      self.assert_refused(
        lambda: store.restore(tag, session=self.sess), _FILE_ERROR, message
      )
      helpers.assert_state(self.current(), live, "after the refused restore")
    self._assert_others_usable(store)

  @parameterized.named_parameters(*_SNAPSHOT_CASES)
  def test_snapshot_refused(self, mutate, message, store_error, store_message):
    path = self._make(self._testMethodName, mutate)
    self.assert_refused(lambda: _read_all(path), _FILE_ERROR, message)
    status, out, _ = hostile.run_cli("verify", path)
    self.assertEqual(status, 1)
    self.assertRegex(out, r"FAILED  .*" + message)
    if store_message is None:  # the file declares other variables
      self.assert_refused(
        lambda: self._store_over(path),
        store_error,
        r"does not match the store's variables",
      )
      return
    store = self._store_over(path)
    self.addCleanup(store.close)
    self.assertEqual(store.tags(), [0, "x"])
    live = hostile.values(9)
    self.load(live)
    self.assert_refused(
      lambda: store.restore(0, session=self.sess),
      store_error,
      message if store_message == "same" else store_message,
    )
    helpers.assert_state(self.current(), live, "after the refused restore")
    self._assert_others_usable(store)

  def test_non_finite_values_are_data(self):
    path = self.path("non_finite.h5")
    shutil.copy(self.template, path)
    with snapstore.open_spill(path) as f:
      for tag, state in self.originals.items():
        helpers.assert_state(f.read(tag), state, tag)
    self.assertFalse(np.isfinite(self.originals[0]["a"]).all())  # NaN, inf
    status, out, _ = hostile.run_cli("verify", path)
    self.assertEqual(
      (status, out), (0, "ok      0\nok      'x'\n2 checked, 0 failed\n")
    )
    status, out, _ = hostile.run_cli("verify", "--finite", path)
    self.assertEqual(status, 1)
    self.assertRegex(out, r"^FAILED  0: non-finite values in a \(\d+ of 12\)\n")

  def test_every_bit_flip_and_cut_is_exact_or_refused(self):
    # Files a store writes carry checksums on all their HDF5 metadata and on
    # the data: one flipped bit anywhere, or a cut, gives the original arrays
    # or a snapstore error, never another exception (or a crash in HDF5).
    # The sweep runs in a child process: after HDF5 1.10 refuses a file whose
    # metadata checksum fails, it keeps some internal state of the failed open
    # and prints "infinite loop closing library" when the interpreter exits.
    # That is harmless (no handle of ours stays open), but it belongs to the
    # library's process-wide state, which the other tests must not share.
    child = subprocess.run(
      [
        sys.executable,
        "-c",
        "import sys; from tests import test_hostile_h5 "
        "as t; t.sweep(sys.argv[1], sys.argv[2])",
        self.template,
        self.path("sweep.h5"),
      ],
      cwd=_REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      timeout=600,
    )
    self.assertEqual(child.returncode, 0, child.stderr.decode()[-3000:])
    counts = json.loads(child.stdout.decode().splitlines()[-1])
    self.assertEqual(counts["failures"], [])
    self.assertEqual(counts["exact"] + counts["refused"], counts["files"])
    self.assertGreater(counts["files"], 1000)
    self.assertGreater(counts["refused"], 0)

  def test_root_attributes_are_inline(self):
    # HDF5 keeps variable-length strings in its global heap, which has no
    # checksum; flipping bits there crashed HDF5. No attribute may use it.
    with h5py.File(self.template, "r") as h5:
      self.assertEqual(
        h5.id.get_create_plist().get_version()[0], 3
      )  # superblock
      objects = [h5] + [
        h5[n] for n in ("snapshots", "snapshots/i0", "snapshots/i0/va")
      ]
      for obj in objects:
        for name in obj.attrs:
          self.assertIsNone(
            h5py.check_vlen_dtype(obj.attrs.get_id(name).dtype),
            "%s attribute %s" % (obj.name, name),
          )


if __name__ == "__main__":
  absltest.main()
