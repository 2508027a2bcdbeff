"""Disk mode and spill tiers: budget, tiers, background writes, faults, reopening."""

import errno
import os
import tempfile
import threading

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.spill import file as spill_file
from snapstore.spill import journal
from tests import helpers

_SPILL_CASES = [
  ("%s_%s" % (mode, kind), mode, use_resource)
  for mode in ("device", "host", "disk")
  for kind, use_resource in helpers.VARIABLE_KINDS
]


class _Case(tf.test.TestCase, parameterized.TestCase):
  def _path(self, name="spill.h5"):
    return os.path.join(self.get_temp_dir(), name)

  def _setup(
    self,
    mode="disk",
    use_resource=False,
    path=None,
    max_to_keep=None,
    dtypes=helpers.DTYPES,
    name="snapstore",
    **options,
  ):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.model = helpers.Model(use_resource=use_resource, dtypes=dtypes)
      self.store = self._store(mode, path, max_to_keep, name, **options)
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    helpers.init(self.sess)
    return self.store

  def _store(
    self, mode="disk", path=None, max_to_keep=None, name="snapstore", **options
  ):
    path = path or self._path()
    if mode == "disk":
      options.setdefault("memory_budget", 0)
    with self.graph.as_default():
      store = snapstore.SnapshotStore(
        scope="net",
        mode=mode,
        spill_path=path,
        max_to_keep=max_to_keep,
        name=name,
        **options,
      )
    self.addCleanup(_close_quietly, store)
    return store

  def _take(self, seed, tag=None, store=None):
    values = self.model.randomize(self.sess, seed)
    return (store or self.store).snapshot(tag, session=self.sess), values


def _close_quietly(store):
  try:
    store.close()
  except snapstore.Error:
    pass


class TiersTest(_Case):
  @parameterized.named_parameters(*_SPILL_CASES)
  def test_restore_from_every_tier_is_bit_exact(self, mode, use_resource):
    self._setup(
      mode,
      use_resource,
      max_to_keep=3,
      **({"memory_budget": 10**9} if mode == "disk" else {}),
    )
    states = dict(self._take(seed) for seed in range(3))
    self.assertEqual(self.store.files.spill(0, session=self.sess), 0)
    self.store.files.spill(1, session=self.sess)
    self.store.files.flush()
    in_memory = "host" if mode == "disk" else mode
    self.assertEqual(
      [self.store.files.tier(t) for t in (0, 1, 2)], ["file", "file", in_memory]
    )
    self.sess.run(self.model.train_op)
    for tag in (2, 0, 1, 0):
      current = self.model.values(self.sess)
      self.store.restore(tag, session=self.sess)
      helpers.assert_state(
        self.model.values(self.sess), states[tag], "tag %r" % tag
      )
      helpers.assert_state_differs(current, states[tag])
      self.sess.run(self.model.train_op)
    arrays = self.store.arrays(0, session=self.sess)
    helpers.assert_state(arrays, states[0])
    with self.assertRaisesRegex(ValueError, "read-only"):
      arrays["v1_float32"][0, 0] = 1

  @parameterized.named_parameters(*_SPILL_CASES)
  def test_evaluate_with_a_spilled_snapshot(self, mode, use_resource):
    self._setup(mode, use_resource, dtypes=(tf.float32,))
    w = self.model.variables["v0_float32"]
    tag, past = self._take(1)
    self.store.files.spill(tag, session=self.sess)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier(tag), "file")
    self.model.randomize(self.sess, 2)
    current = self.sess.run(w)
    got = self.store.evaluate_with(w, tag=tag, session=self.sess)
    helpers.assert_bit_equal(got, past["v0_float32"])
    helpers.assert_bit_equal(self.sess.run(w), current)

  def test_disk_spills_oldest_first_under_budget(self):
    self._setup(
      dtypes=(tf.float32,), memory_budget=2 * 60 + 30
    )  # 2.5 snapshots
    self.assertEqual(self.store.param_nbytes, 60)
    states = dict(self._take(seed) for seed in range(5))
    self.store.files.flush()
    self.assertEqual(
      [self.store.files.tier(t) for t in range(5)],
      ["file", "file", "file", "host", "host"],
    )
    self.assertEqual(self.store.nbytes, 2 * 60)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"is open for writing by another process"
    ):
      snapstore.open_spill(self._path())  # not while the store writes it
    self.store.close()  # writes the two held in memory too (see CloseTest)
    with snapstore.open_spill(self._path()) as f:
      entries = f.entries()
      self.assertEqual([e.tag for e in entries], [0, 1, 2, 3, 4])
      self.assertEqual(
        [e.time for e in entries], sorted(e.time for e in entries)
      )
      for e in entries:
        helpers.assert_state(f.read(e.tag), states[e.tag])
        self.assertEqual(e.nbytes, 60)
        self.assertIsNone(e.step)

  def test_zero_budget_writes_every_snapshot(self):
    self._setup(dtypes=(tf.float32,), memory_budget=0)
    for seed in range(3):
      self._take(seed)
    self.store.files.flush()
    self.assertEqual([self.store.files.tier(t) for t in range(3)], ["file"] * 3)
    self.assertEqual(self.store.nbytes, 0)

  def test_max_to_keep_bounds_all_tiers_and_deletes_from_file(self):
    self._setup(dtypes=(tf.float32,), max_to_keep=2)
    for seed in range(4):
      self._take(seed)
    self.assertEqual(self.store.tags(), [2, 3])
    self.store.close()
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual([e.tag for e in f.entries()], [2, 3])

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_spilled_snapshots_do_not_count_in_fast_tier(self, mode):
    self._setup(mode, dtypes=(tf.float32,), max_to_keep=1)
    first, state = self._take(0)
    self.store.files.spill(first, session=self.sess)
    for seed in (1, 2):
      self._take(seed)  # the fast tier keeps one: 1 is evicted, 0 stays
    self.assertEqual(self.store.tags(), [0, 2])
    self.store.files.flush()
    self.assertEqual(
      [self.store.files.tier(0), self.store.files.tier(2)], ["file", mode]
    )
    self.store.restore(0, session=self.sess)
    helpers.assert_state(self.model.values(self.sess), state)
    if mode == "device":
      with self.assertRaisesRegex(
        snapstore.ModeError,
        "Snapshot 0 is in the spill file .*not in a device slot",
      ):
        self.store.slots.slot_of(0)
      self.assertEqual(self.store.slots.slot_of(2), 0)

  @parameterized.named_parameters(*_SPILL_CASES)
  def test_replacing_and_deleting_spilled_snapshots(self, mode, use_resource):
    self._setup(mode, use_resource, dtypes=(tf.float32,), max_to_keep=2)
    self._take(0, tag="a")
    self.store.files.spill("a", session=self.sess)
    self.store.files.flush()
    _, newer = self._take(1, tag="a")  # replaces the spilled one
    self.store.files.flush()
    self.assertEqual(
      self.store.files.tier("a"), "file" if mode == "disk" else mode
    )
    self.store.restore("a", session=self.sess)
    helpers.assert_state(self.model.values(self.sess), newer)
    self._take(2, tag="b")
    self.store.files.spill("b", session=self.sess)
    self.store.delete("b")
    self.store.files.flush()
    self.assertEqual(self.store.tags(), ["a"])
    self.store.close()
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual(
        [e.tag for e in f.entries()], ["a"] if mode == "disk" else []
      )

  def test_tags_cannot_escape_their_group(self):
    self._setup(dtypes=(tf.float32,))
    tags = ["../x", "/", "..", ".", "a/b/../../c", "%2F", "ü/ñ", -3, 7]
    states = dict(self._take(seed, tag=tag) for seed, tag in enumerate(tags))
    self.store.close()
    import h5py  # pylint: disable=g-import-not-at-top

    with h5py.File(self._path(), "r") as h5:
      self.assertEqual(sorted(h5), ["snapshots"])
      names = list(h5["snapshots"])
      self.assertLen(names, len(tags))
      for name in names:
        self.assertNotIn("/", name)
        self.assertNotIn(".", name)
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual(
        sorted(map(repr, (e.tag for e in f.entries()))), sorted(map(repr, tags))
      )
      for tag in tags:
        helpers.assert_state(f.read(tag), states[tag])

  def test_step_recorded_when_covered(self):
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("w", [2])
      step = tf.train.get_or_create_global_step()
      store = snapstore.SnapshotStore(
        scope="net",
        include_global_step=True,
        mode="disk",
        spill_path=self._path(),
        memory_budget=0,
      )
      inc = tf.assign_add(step, 5)
    with tf.Session(graph=graph) as sess:
      helpers.init(sess)
      sess.run(inc)
      store.snapshot(session=sess)
      store.close()
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual(f.entries()[0].step, 5)

  @parameterized.named_parameters(("lzf", "lzf", None), ("gzip", "gzip", 4))
  def test_compression_round_trip(self, compression, level):
    self._setup(compression=compression, compression_opts=level)
    tag, state = self._take(3)
    self.store.files.flush()
    self.assertEqual(self.store.files.tier(tag), "file")
    self.store.restore(tag, session=self.sess)
    helpers.assert_state(self.model.values(self.sess), state)
    self.store.close()
    import h5py  # pylint: disable=g-import-not-at-top

    with h5py.File(self._path(), "r") as h5:
      ds = h5["snapshots/i0/vv1_float32"]
      self.assertEqual(ds.compression, compression)
      self.assertIsNotNone(ds.chunks)

  def test_finalized_graph_no_new_ops(self):
    self._setup(dtypes=(tf.float32,), memory_budget=60, max_to_keep=4)
    self.graph.finalize()
    with helpers.assert_no_new_ops(self.graph):
      for seed in range(30):
        tag, _ = self._take(seed)
        self.store.restore(tag, session=self.sess)
        self.store.restore(self.store.tags()[0], session=self.sess)
        self.store.evaluate_with(
          self.model.train_op, tag=self.store.tags()[0], session=self.sess
        )
        if seed % 10 == 0:
          self.store.files.flush()


class ReopenTest(_Case):
  @parameterized.named_parameters(*_SPILL_CASES)
  def test_store_over_existing_file_adopts_its_snapshots(
    self, mode, use_resource
  ):
    self._setup(mode, use_resource, max_to_keep=3)
    states = dict(self._take(seed) for seed in range(3))
    for tag in (0, 1):
      self.store.files.spill(tag, session=self.sess)
    self.store.close()
    other = self._store(
      mode,
      name="again",
      max_to_keep=3,
      **({"memory_budget": 0} if mode == "disk" else {}),
    )
    self.assertEqual(other.tags(), [0, 1] if mode != "disk" else [0, 1, 2])
    self.assertEqual(
      other.info(1).time, max(i.time for i in [other.info(0), other.info(1)])
    )
    for tag in other.tags():
      other.restore(tag, session=self.sess)
      helpers.assert_state(self.model.values(self.sess), states[tag])
    self.assertEqual(
      other.snapshot(session=self.sess), 3 if mode == "disk" else 2
    )

  def test_incomplete_snapshot_is_logged_and_removed(self):
    self._setup(dtypes=(tf.float32,))
    self._take(0)
    self.store.close()
    with spill_file.SpillFile(self._path(), writable=True) as f:
      group = f._snapshots.create_group("sbroken")  # pylint: disable=protected-access
      group.attrs["complete"] = 0
      f._commit()  # pylint: disable=protected-access
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual(f.incomplete(), ["broken"])
      with self.assertRaisesRegex(
        snapstore.UnknownTagError,
        r"no complete snapshot 'broken'.*writing was interrupted",
      ):
        f.read("broken")
    with self.assertLogs("snapstore", "WARNING") as logs:
      other = self._store(name="again")
    self.assertIn("removed incomplete snapshot(s) 'broken'", logs.output[0])
    self.assertEqual(other.tags(), [0])

  def test_two_stores_cannot_write_one_file(self):
    self._setup(dtypes=(tf.float32,))
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError, r"is open for writing by another process"
    ):
      self._store(name="second")

  def test_file_of_other_variables_is_rejected(self):
    self._setup(dtypes=(tf.float32, tf.int32))
    self.store.close()
    graph = tf.Graph()
    with graph.as_default():
      with tf.variable_scope("net"):
        tf.get_variable("v0_float32", [3, 6])
        tf.get_variable("v1_int32", [3, 5], dtype=tf.int64)
        tf.get_variable("extra", [1])
      with helpers.assert_raises_naming(
        self,
        snapstore.IncompatibleSnapshotError,
        r"Spill file \S*spill\.h5 does not match",
        r"missing variables: extra\b",
        r"v0_float32 has shape \(3, 5\), the variable has shape \(3, 6\)",
        r"v1_int32 has dtype int32, the variable has dtype int64",
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", memory_budget=0, spill_path=self._path()
        )


class WriterFaultTest(_Case):
  def _fail_writes(self, count, after=0):
    """Makes data writes raise ENOSPC: `count` of them, after `after` succeed."""
    real = spill_file.SpillFile._write_dataset  # pylint: disable=protected-access
    calls = [0]

    def failing(f, ds, array):
      calls[0] += 1
      if after < calls[0] <= after + count:
        raise OSError(errno.ENOSPC, "No space left on device")
      return real(f, ds, array)

    spill_file.SpillFile._write_dataset = failing  # pylint: disable=protected-access
    self.addCleanup(setattr, spill_file.SpillFile, "_write_dataset", real)

  def _fail_os_writes(self, predicate, code, times=1):
    """The next `times` pwrite calls of the spill file matching `predicate` fail."""
    left = [times]

    class FailingOs(object):
      def __getattr__(self, name):
        return getattr(os, name)

      def pwrite(self, fd, data, offset):
        if left[0] and predicate(fd, data, offset):
          left[0] -= 1
          raise OSError(code, os.strerror(code))
        return os.pwrite(fd, data, offset)

    journal.os = FailingOs()
    self.addCleanup(setattr, journal, "os", os)

  def test_failed_write_keeps_snapshot_and_reports_its_tag(self):
    self._setup(dtypes=(tf.float32, tf.int64))
    self._fail_writes(1, after=1)  # mid-spill: the second dataset fails
    tag, state = self._take(0, tag="precious")
    self.store._h.mode._writer.flush()  # pylint: disable=protected-access
    with helpers.assert_raises_naming(
      self,
      snapstore.SpillError,
      r"writing snapshot 'precious' failed \(no space left on the device: "
      r"OSError: \[Errno 28\]",
      r"kept in host memory",
    ):
      self.store.snapshot(session=self.sess)
    self.assertEqual(self.store.tags(), ["precious"])
    self.assertEqual(self.store.files.tier(tag), "host")
    self.sess.run(self.model.train_op)
    self.store.restore(tag, session=self.sess)  # reported once: works now
    helpers.assert_state(self.model.values(self.sess), state)
    # Later snapshots still work and spill, the failed one is written again.
    later, later_state = self._take(1)
    self.store.files.flush()
    self.assertEqual(
      [self.store.files.tier(t) for t in ("precious", later)], ["file", "file"]
    )
    self.store.close()
    with snapstore.open_spill(self._path()) as f:
      self.assertEqual([e.tag for e in f.entries()], ["precious", later])
      self.assertEqual(f.incomplete(), [])
      helpers.assert_state(f.read("precious"), state)
      helpers.assert_state(f.read(later), later_state)

  def test_failure_in_hdf5_metadata_rolls_back(self):
    self._setup(dtypes=(tf.float32,))
    self._take(0)
    self.store.files.flush()
    # The disk fails once, at the first write of HDF5's metadata.
    self._fail_os_writes(lambda fd, data, offset: offset < 4096, errno.EIO)
    tag, state = self._take(1)
    with self.assertRaisesRegex(
      snapstore.SpillError, r"writing snapshot 1 failed \(.*Input/output"
    ):
      self.store.files.flush()
    self.assertEqual(self.store.files.tier(tag), "host")
    self.store.files.flush()  # written again
    self.assertEqual(self.store.files.tier(tag), "file")
    self.store.restore(tag, session=self.sess)
    helpers.assert_state(self.model.values(self.sess), state)

  def test_close_keeps_snapshots_it_could_not_write(self):
    self._setup(dtypes=(tf.float32,))
    self._fail_writes(2)  # the write after the snapshot, and close()'s retry
    _, state = self._take(0, tag="kept")
    with helpers.assert_raises_naming(
      self,
      snapstore.SpillError,
      r"snapshot 'kept' failed \(no space left",
      r"The store stays open and nothing is dropped: call close\(\) again",
    ):
      self.store.close()
    self.assertEqual(self.store.tags(), ["kept"])
    self.sess.run(self.model.train_op)
    self.store.restore("kept", session=self.sess)
    helpers.assert_state(self.model.values(self.sess), state)
    self.store.close()  # the disk has room again: written, then closed
    self.store.close()  # safe twice
    with self.assertRaises(snapstore.StoreClosedError):
      self.store.files.flush()
    with snapstore.open_spill(self._path()) as f:
      helpers.assert_state(f.read("kept"), state)

  def test_back_pressure_blocks_until_writer_has_room(self):
    self._setup(dtypes=(tf.float32,), max_pending=1)
    gate = threading.Event()
    real = spill_file.SpillFile.write

    def slow(f, *args, **kwargs):
      gate.wait()
      return real(f, *args, **kwargs)

    spill_file.SpillFile.write = slow
    self.addCleanup(setattr, spill_file.SpillFile, "write", real)
    self._take(0)  # queued; the writer waits at the gate
    finished = threading.Event()

    def second():
      self._take(1)
      finished.set()

    thread = threading.Thread(target=second)
    thread.start()
    self.assertFalse(finished.wait(0.3))  # blocked: one write pending already
    gate.set()
    self.assertTrue(finished.wait(10))
    thread.join()
    self.store.files.flush()
    self.assertEqual(
      [self.store.files.tier(t) for t in (0, 1)], ["file", "file"]
    )


class CloseAndReopenTest(_Case):
  def test_close_writes_the_snapshots_held_in_memory(self):
    self._setup(dtypes=(tf.float32, tf.int64), memory_budget=1 << 20)
    states = dict(self._take(seed) for seed in range(3))
    self.assertEqual([self.store.files.tier(t) for t in range(3)], ["host"] * 3)
    self.store.close()
    reopened = self._store(name="reopened")
    self.assertEqual(reopened.tags(), [0, 1, 2])
    for tag, state in states.items():
      self.sess.run(self.model.train_op)
      reopened.restore(tag, session=self.sess)
      helpers.assert_state(self.model.values(self.sess), state)

  def test_empty_file_is_a_new_spill_file(self):
    fd, path = tempfile.mkstemp(suffix=".h5", dir=self.get_temp_dir())
    os.close(fd)
    self._setup(path=path, dtypes=(tf.float32,))
    _, state = self._take(0)
    self.store.close()
    reopened = self._store(path=path, name="reopened")
    self.assertEqual(reopened.tags(), [0])
    reopened.restore(0, session=self.sess)
    helpers.assert_state(self.model.values(self.sess), state)


class OptionErrorsTest(_Case):
  def _graph(self):
    graph = tf.Graph()
    with graph.as_default():
      helpers.Model(dtypes=(tf.float32,))
    return graph

  def test_missing_directory(self):
    with self._graph().as_default():
      with helpers.assert_raises_naming(
        self,
        snapstore.SnapshotFileError,
        r"spill file \S*/nowhere/s\.h5",
        r"directory \S*/nowhere does not exist",
      ):
        snapstore.SnapshotStore(
          scope="net",
          mode="disk",
          memory_budget=0,
          spill_path=self._path("nowhere/s.h5"),
        )

  def test_unwritable_directory(self):
    with self._graph().as_default():
      with self.assertRaisesRegex(
        snapstore.SnapshotFileError, r"Cannot create spill file /proc/s\.h5"
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", memory_budget=0, spill_path="/proc/s.h5"
        )

  def test_not_hdf5_and_foreign_hdf5(self):
    path = self._path("text.h5")
    with open(path, "w") as f:
      f.write("not hdf5 at all" * 100)
    import h5py  # pylint: disable=g-import-not-at-top

    foreign = self._path("foreign.h5")
    with h5py.File(foreign, "w") as h5:
      h5["x"] = 1
    with self._graph().as_default():
      with self.assertRaisesRegex(
        snapstore.SnapshotFileError, r"text\.h5 is not an HDF5 file"
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", memory_budget=0, spill_path=path
        )
      with self.assertRaisesRegex(
        snapstore.SnapshotFileError,
        r"foreign\.h5 is an HDF5 file, but not a snapstore spill",
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", memory_budget=0, spill_path=foreign
        )

  def test_bad_options(self):
    with self._graph().as_default():
      with self.assertRaisesRegex(ValueError, r"mode='disk' needs spill_path="):
        snapstore.SnapshotStore(scope="net", mode="disk", memory_budget=0)
      with self.assertRaisesRegex(
        ValueError, r"mode='disk' needs memory_budget="
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", spill_path=self._path()
        )
      with self.assertRaisesRegex(
        ValueError, r"memory_budget must be >= 0.*got -1"
      ):
        snapstore.SnapshotStore(
          scope="net", mode="disk", memory_budget=-1, spill_path=self._path()
        )
      with self.assertRaisesRegex(ValueError, r"compression_opts must be <= 9"):
        snapstore.SnapshotStore(
          scope="net",
          mode="disk",
          memory_budget=0,
          spill_path=self._path(),
          compression="gzip",
          compression_opts=10,
        )
      with self.assertRaisesRegex(
        ValueError,
        r"Invalid compression 'zip'; must be None or one of gzip, lzf",
      ):
        snapstore.SnapshotStore(
          scope="net",
          mode="disk",
          memory_budget=0,
          spill_path=self._path(),
          compression="zip",
        )
      with self.assertRaisesRegex(
        ValueError,
        r"compression, max_pending only apply to a spill file.*spill_path=",
      ):
        snapstore.SnapshotStore(
          scope="net", mode="host", compression="lzf", max_pending=3
        )
      with self.assertRaisesRegex(ValueError, r"max_pending must be >= 1"):
        snapstore.SnapshotStore(
          scope="net",
          mode="host",
          max_pending=0,
          spill_path=self._path("mp.h5"),
        )

  def test_spill_needs_a_spill_file(self):
    self.graph = self._graph()
    with self.graph.as_default():
      store = snapstore.SnapshotStore(scope="net", mode="host")
    store.load_arrays({"v0_float32": np.zeros([3, 5], np.float32)}, tag="t")
    with helpers.assert_raises_naming(
      self,
      snapstore.ModeError,
      r"spill\(\) needs a spill file",
      r"spill_path=",
      r"mode='disk'",
    ):
      store.files.spill("t")
    store.files.flush()  # nothing to wait for


class CorruptFileTest(_Case):
  def test_checksum_mismatch_names_the_variable(self):
    self._setup(dtypes=(tf.float32, tf.int32))
    tag, _ = self._take(0)
    self.store.close()
    import h5py  # pylint: disable=g-import-not-at-top

    with h5py.File(self._path(), "r") as h5:
      offset = h5["snapshots/i0/vv1_int32"].id.get_offset()
    with open(self._path(), "r+b") as f:
      f.seek(offset + 3)
      byte = f.read(1)
      f.seek(offset + 3)
      f.write(bytes([byte[0] ^ 1]))
    other = self._store(name="again")
    live = self.model.values(self.sess)
    with self.assertRaisesRegex(
      snapstore.SnapshotFileError,
      r"spill\.h5: checksum mismatch in variable 'v1_int32' of snapshot 0\b",
    ):
      other.restore(tag, session=self.sess)
    helpers.assert_state(self.model.values(self.sess), live)  # nothing written

  def test_truncated_file(self):
    self._setup(dtypes=(tf.float32,))
    self._take(0)
    self.store.close()
    size = os.path.getsize(self._path())
    with open(self._path(), "r+b") as f:
      f.truncate(size - 100)
    with self.assertRaisesRegex(snapstore.SnapshotFileError, r"is truncated"):
      snapstore.open_spill(self._path())


if __name__ == "__main__":
  tf.test.main()
