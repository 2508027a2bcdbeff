"""Hostile `.npz` files: each is refused with a clear error, allocating little.

The corpus is built here: truncated and bit-flipped archives, pickled objects,
wrong and non-numeric dtypes, huge and negative declared shapes, overlong and
deeply nested headers, member names with `..`, `/` and control characters,
duplicate members, declared and real zip bombs, unsupported compression and
encryption, thousands of members. Each goes to `load_npz` of a store in every
mode, which must raise the expected error without allocating more than a few
MiB and stay usable (same tags, exact snapshot and restore), and to the CLI,
which must exit 1 with a one-line error where the archive itself is bad.
NaN and infinite values are data, and load bit for bit.
"""

import io
import os
import struct
import warnings
import zipfile

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore.engines.graph.variables import variable_set
from snapstore.files import npz
from snapstore.files import sources
from tests import helpers
from tests import hostile

_LOCAL = (
  b"PK\x03\x04",
  26,
  30,
  {"flag": 6, "method": 8, "csize": 18, "usize": 22},
)
_CENTRAL = (
  b"PK\x01\x02",
  28,
  46,
  {"flag": 8, "method": 10, "csize": 20, "usize": 24},
)


def npy(array):
  buf = io.BytesIO()
  np.lib.format.write_array(buf, np.asarray(array), allow_pickle=True)
  return buf.getvalue()


def raw_npy(header, data=b"", version=(1, 0)):
  """.npy bytes with the header dict text `header` as given, and `data`."""
  magic = b"\x93NUMPY" + bytes(version)
  fmt = "<H" if version == (1, 0) else "<I"
  header += " " * (-(len(magic) + struct.calcsize(fmt) + len(header) + 1) % 64)
  header += "\n"
  return magic + struct.pack(fmt, len(header)) + header.encode("latin1") + data


def header(descr, shape):
  return "{'descr': %r, 'fortran_order': False, 'shape': %s, }" % (descr, shape)


def archive(members, method=zipfile.ZIP_STORED):
  """Zip bytes of [(member name, bytes)], duplicates allowed."""
  buf = io.BytesIO()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # zipfile warns of duplicate names
    with zipfile.ZipFile(buf, "w", method) as zf:
      for name, data in members:
        zf.writestr(name, data)
  return buf.getvalue()


def good_members(state=None):
  state = state or hostile.values(0)
  return [("a.npy", npy(state["a"])), ("b/c.npy", npy(state["b/c"]))]


def _load(path, varset):
  """The arrays of `path` for `varset`, read as `store.files.load_npz` reads them."""
  with npz.Archive(path) as source:
    arrays = sources.read(source, varset, sources.NameMap(varset))
  return dict(zip(varset.keys, arrays))


def patch(data, member, **fields):
  """Sets zip header fields (flag, method, csize, usize) of `member`, both copies."""
  data = bytearray(data)
  for signature, name_length_at, fixed, where in (_LOCAL, _CENTRAL):
    pos = data.find(signature)
    while pos >= 0:
      (length,) = struct.unpack_from("<H", data, pos + name_length_at)
      if bytes(data[pos + fixed : pos + fixed + length]) == member.encode():
        for field, value in fields.items():
          struct.pack_into(
            "<H" if field in ("flag", "method") else "<I",
            data,
            pos + where[field],
            value,
          )
      pos = data.find(signature, pos + 4)
  return bytes(data)


def _flip(data, pos):
  data = bytearray(data)
  data[pos] ^= 1 << (pos % 8)
  return bytes(data)


def _corpus():
  """[(name, archive bytes, error class, store message, CLI message or None)].

  A CLI message of None: the archive is sound, only not for this store, and
  `snapstore list` reads it.
  """
  good = archive(good_members())
  a_npy = npy(hostile.values(0)["a"])
  data_at = good.index(a_npy) + len(a_npy) - 5
  deflated = archive(good_members(), zipfile.ZIP_DEFLATED)
  bomb = io.BytesIO()
  np.savez_compressed(
    bomb,
    **{"a": np.zeros([8192, 8192], np.uint8), "b/c": np.zeros(5, np.int32)},
  )
  nested = header("<f4", "(" * 2000 + ")" * 2000)
  file_error = snapstore.SnapshotFileError
  mismatch = snapstore.IncompatibleSnapshotError
  return [
    (
      "truncated_half",
      good[: len(good) // 2],
      file_error,
      r"is not an \.npz archive",
      "same",
    ),
    (
      "truncated_end",
      good[:-30],
      file_error,
      r"is not an \.npz archive",
      "same",
    ),
    (
      "member_past_end",
      patch(good, "a.npy", csize=len(good) * 2, usize=len(good) * 2),
      file_error,
      r"array 'a' ends past the end of the file",
      "same",
    ),
    (
      "flipped_header",
      good.replace(b"(4, 3)", b"(4, 9)"),
      file_error,
      r"array 'a' is truncated or corrupt \(Bad CRC-32",
      "same",
    ),
    (
      "shape_and_data_differ",
      archive([("a.npy", raw_npy(header("<f4", "(4, 9)"), b"\0" * 48))]),
      file_error,
      r"array 'a' declares shape \(4, 9\) of float32 .*member holds 48",
      "same",
    ),
    (
      "flipped_data",
      _flip(good, data_at),
      file_error,
      r"array 'a' is truncated or corrupt \(Bad CRC-32",
      "same",
    ),
    (
      "flipped_deflate",
      _flip(deflated, 60),
      file_error,
      r"array 'a' (is truncated or corrupt|has no valid \.npy header)",
      "same",
    ),
    (
      "pickled",
      archive(
        [
          ("a.npy", npy(np.array([{"x": 1}] * 12).reshape(4, 3))),
          ("b/c.npy", npy(np.zeros(5, np.int32))),
        ]
      ),
      file_error,
      r"holds pickled Python objects in a\b",
      "same",
    ),
    (
      "wrong_dtype",
      archive(
        [
          ("a.npy", npy(np.zeros([4, 3]))),
          ("b/c.npy", npy(np.zeros(5, np.int32))),
        ]
      ),
      mismatch,
      r"a has dtype float64, the variable has dtype float32",
      None,
    ),
    (
      "text_dtype",
      archive(
        [
          ("a.npy", npy(np.full([4, 3], b"abc"))),
          ("b/c.npy", npy(np.zeros(5, np.int32))),
        ]
      ),
      file_error,
      r"arrays that are not numeric \('a': \|S3\)",
      "same",
    ),
    (
      "record_dtype",
      archive(
        [
          ("a.npy", npy(np.zeros([4, 3], "f4,i4"))),
          ("b/c.npy", npy(np.zeros(5, np.int32))),
        ]
      ),
      file_error,
      r"arrays that are not numeric \('a': ",
      "same",
    ),
    (
      "huge_shape",
      archive(
        [
          (
            "a.npy",
            raw_npy(header("<f4", "(1048576, 1048576, 16)"), b"\0" * 48),
          )
        ]
      ),
      file_error,
      r"array 'a' declares shape \(1048576, 1048576, 16\) .*member holds 48",
      "same",
    ),
    (
      "negative_shape",
      archive([("a.npy", raw_npy(header("<f4", "(-4, 3)")))]),
      file_error,
      r"array 'a' declares the negative shape \(-4, 3\)",
      "same",
    ),
    (
      "overlong_header",
      archive(
        [("a.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 31) + b"{")]
      ),
      file_error,
      r"array 'a' has no valid \.npy header \(a header of 2147483648 bytes",
      "same",
    ),
    (
      "nested_header",
      archive([("a.npy", raw_npy(nested))]),
      file_error,
      r"array 'a' has no valid \.npy header",
      "same",
    ),
    (
      "trailing_data",
      archive([("a.npy", a_npy + b"\0" * 12)]),
      file_error,
      r"array 'a' declares shape \(4, 3\) of float32 .*member holds 60",
      "same",
    ),
    (
      "escaping_names",
      archive(
        good_members()
        + [
          ("../../escape.npy", a_npy),
          ("/abs.npy", a_npy),
          ("a/../b/c.npy", a_npy),
        ]
      ),
      mismatch,
      r"variables the store does not have: \.\./\.\./escape, /abs, a/\.\./b/c\b",
      None,
    ),
    (
      "control_names",
      archive(good_members() + [("evil\x1b[2J\n.npy", a_npy)]),
      mismatch,
      r"variables the store does not have: 'evil\\x1b\[2J\\n'",
      None,
    ),
    (
      "duplicate",
      archive(good_members() + [("a.npy", a_npy)]),
      file_error,
      r"holds array 'a' twice",
      "same",
    ),
    (
      "declared_bomb",
      patch(deflated, "a.npy", usize=(1 << 32) - 1),
      file_error,
      r"array 'a' declares 4294967295 bytes from \d+ deflated bytes",
      "same",
    ),
    (
      "real_bomb",
      bomb.getvalue(),
      mismatch,
      r"a has shape \(8192, 8192\), .*a has dtype uint8",
      None,
    ),
    (
      "bzip2",
      archive(good_members(), zipfile.ZIP_BZIP2),
      file_error,
      r"array 'a' is compressed with zip method 12",
      "same",
    ),
    (
      "encrypted",
      patch(good, "a.npy", flag=1),
      file_error,
      r"array 'a' is encrypted",
      "same",
    ),
    (
      "many_members",
      archive(
        good_members()
        + [("x%04d.npy" % i, npy(np.zeros(1))) for i in range(2000)]
      ),
      mismatch,
      r"variables the store does not have: x0000, x0001, .*, x0009, and 1990 more",
      None,
    ),
  ]


_CORPUS = _corpus()


class HostileNpzTest(hostile.HostileFileCase, parameterized.TestCase):
  def _write(self, name, data):
    path = self.path(name + ".npz")
    with open(path, "wb") as f:
      f.write(data)
    return path

  @parameterized.named_parameters(*[(c[0],) + c[1:] for c in _CORPUS])
  def test_refused_by_every_store_and_the_cli(
    self, data, error, message, cli_message
  ):
    path = self._write(self._testMethodName, data)
    for mode, store in sorted(self.stores.items()):
      live = hostile.values(3)
      self.load(live)
      self.assert_refused(
        lambda: store.files.load_npz(path, session=self.sess),  # pylint: disable=cell-var-from-loop
        error,
        message,
      )
      helpers.assert_state(self.current(), live, mode)
      self.assert_usable(store)
    status, out, err = hostile.run_cli("list", path)
    if cli_message is None:
      self.assertEqual((status, err), (0, ""))
      self.assertNotIn("\x1b", out)
    else:
      self.assertEqual((status, out), (1, ""))
      self.assertRegex(err, r"^snapstore list: error: .*" + message)
      self.assertEqual(err.count("\n"), 1)

  def test_non_finite_values_are_data(self):
    state = hostile.values(5)  # NaN payloads, infinities, -0.0, denormals
    self.assertFalse(np.isfinite(state["a"]).all())
    members = [
      ("a.npy", npy(state["a"].astype(">f4"))),  # big-endian too
      ("b/c.npy", npy(state["b/c"])),
    ]
    path = self._write("non_finite", archive(members))
    for mode, store in sorted(self.stores.items()):
      store.files.load_npz(path, tag="nan", session=self.sess)
      store.restore("nan", session=self.sess)
      helpers.assert_state(self.current(), state, mode)
      store.delete("nan")
    status, out, _ = hostile.run_cli("verify", path)
    self.assertEqual(
      (status, out), (0, "ok      'non_finite.npz'\n1 checked, 0 failed\n")
    )
    status, out, _ = hostile.run_cli("verify", "--finite", path)
    bad = int(state["a"].size - np.isfinite(state["a"]).sum())
    self.assertEqual(
      (status, out),
      (
        1,
        "FAILED  'non_finite.npz': non-finite "
        "values in a (%d of 12)\n1 checked, 1 "
        "failed\n" % bad,
      ),
    )

  def test_every_bit_flip_and_cut_is_exact_or_refused(self):
    # Whatever one flipped bit or a cut does to an archive, reading it gives
    # the original arrays bit for bit, or a snapstore error: never another
    # exception and never other values.
    original = hostile.values(0)
    with self.graph.as_default():
      varset = variable_set(scope="net")
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
      good = archive(good_members(original), method)
      blobs = [_flip(good, pos) for pos in range(len(good))]
      blobs += [good[:cut] for cut in range(0, len(good), 3)]
      for i, blob in enumerate(blobs):
        path = self._write("sweep", blob)
        for read in (npz.read, lambda p: _load(p, varset)):
          try:
            arrays = read(path)
          except snapstore.Error:
            continue
          except Exception as e:  # pylint: disable=broad-except
            self.fail("archive %d of method %d: %r" % (i, method, e))
          if set(arrays) == set(original):  # a flipped entry count drops one
            helpers.assert_state(arrays, original, "archive %d" % i)

  def test_cli_export_writes_only_its_output(self):
    path = self._write(
      "escaping",
      archive(good_members() + [("../escape.npy", npy(np.zeros(1)))]),
    )
    out_path = self.path("exported.npz")
    parent = os.path.dirname(self.dir)

    def files():  # but the disk store's own spill file and journal
      return (
        set(n for n in os.listdir(self.dir) if not n.startswith("store.h5")),
        set(os.listdir(parent)),
      )

    before = files()
    status, _, err = hostile.run_cli("export", path, out_path)
    self.assertEqual((status, err), (0, ""))
    # The names stay member names: nothing is extracted, no path is made.
    self.assertEqual(sorted(npz.read(out_path)), ["../escape", "a", "b/c"])
    self.assertEqual(files(), (before[0] | {"exported.npz"}, before[1]))


if __name__ == "__main__":
  absltest.main()
