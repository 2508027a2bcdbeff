"""A copy mode with a spill file under it: tiers of one store.

`TieredMode` wraps a device or host mode (the fast tier) and adds an HDF5
spill file (see `snapstore.spill.file`). A snapshot lives in exactly one tier:

- the fast tier (device slots or host arrays), where it was taken;
- host memory, on its way to the file: queued for the background writer, or
  kept after a failed write (it is written again by the next spill or flush);
- the file, once its write is complete and committed.

`spill(tag)` moves a snapshot from the fast tier to the file: it is read into
host memory (a device read for device slots; host arrays are handed over
without a copy), leaves the fast tier at once, and is written in the
background. It leaves host memory only after its write is committed. `restore`,
`evaluate_with` and `arrays` find a snapshot in whichever tier holds it; a
spilled one is read, checked (names, shapes, dtypes, checksums) and then fed to
the variables by placeholders and one grouped assign built at construction.

A snapshot of mirrored variables whose replicas differ, or of sync-on-read
ones (a device slot's, or a host snapshot's kept replicas:
`CopyMode.replicas`, see `snapstore.core.distributed`) is spilled as one
array per variable, as `arrays()` gives it (the first replica's, or the
aggregate); the replicas' own values stay in host memory beside it
(statistics vectors, small; counted in `nbytes`), so a restore from the file
is exact while the store lives. A store that adopts the file writes each
variable's value as a host write does (`distributed.spread`).

With a spill file, device and host stores bound only their fast tier by
`max_to_keep` (eviction drops the oldest snapshot of the fast tier, as without
a file); a spilled snapshot stays in the file until `delete(tag)`. The disk
mode (`snapstore/modes/disk.py`) spills automatically and bounds all tiers together.

A store built over an existing spill file lists the file's complete snapshots
as its own, oldest first; an incomplete one (a write interrupted by a crash) is
logged and removed. A damaged one (a broken link, damaged attributes) is
logged and listed as the oldest: restoring it raises `SnapshotFileError`
naming the problem, `delete(tag)` removes it, and the others work as usual.

A failed write (a full disk) keeps its snapshot in host memory, over the
budget if need be, and the store's next call raises `SpillError` naming the
cause, the file and the bytes held. While writes fail, each call retries only
the oldest failed snapshot; once one is written, the others follow. `close()`
writes what is in memory first and stays open, raising, if it cannot. At
interpreter exit the file is closed all the same (`close_at_exit`): what cannot
be written then is lost with the process and named on stderr.
"""

import errno
import logging
import weakref

import numpy as np

from snapstore._tf import tf
from snapstore.core import checks
from snapstore import errors
from snapstore.modes import base
from snapstore.spill import file as spill_file
from snapstore.spill import journal
from snapstore.spill import layout
from snapstore.spill import writer

_LOG = logging.getLogger("snapstore")

# Where a held snapshot is on its way to the file.
_QUEUED = "queued"
_FAILED = "failed"


class _Held(object):
  """A snapshot in host memory on its way to the file, and its write job.

  `replicas` is what the fast tier held of replicas that differ
  (`CopyMode.replicas`): it stays in memory beside the file's copy.
  """

  def __init__(self, tag, info, arrays, replicas=None):
    self.tag = tag
    self.info = info
    self.arrays = tuple(arrays)
    self.replicas = replicas
    self.state = _QUEUED

  @property
  def nbytes(self):
    return sum(a.nbytes for a in self.arrays) + base.replicas_nbytes(
      self.replicas
    )


class TieredMode(base.CopyMode):
  """A fast-tier mode plus a spill file (see module doc).

  Args:
    inner: The fast tier: a `DeviceMode` or `HostMode` built for the store.
    varset: The store's `VariableSet`.
    spill_path: The HDF5 spill file; created if missing, else checked against
      the store's variables and its complete snapshots adopted.
    compression: None (default, fastest), "lzf" or "gzip".
    compression_opts: gzip's level, 0-9.
    max_pending: How many snapshots may wait for the background writer before
      `spill` (or a disk-mode `snapshot`) blocks (back-pressure).
    durable: `fsync` at each commit, so that spilled snapshots also survive a
      power cut or kernel crash (slower); a killed process loses none either
      way.

  Raises:
    ValueError: A bad compression, compression_opts or max_pending.
    SnapshotFileError: The file cannot be created or written, or is not a
      snapstore spill file.
    IncompatibleSnapshotError: The file holds other variables.
  """

  def __init__(
    self,
    inner,
    varset,
    spill_path,
    compression=None,
    compression_opts=None,
    max_pending=2,
    durable=False,
  ):
    super(TieredMode, self).__init__(varset, inner.capacity, inner.store_name)
    _check_compression(compression, compression_opts)
    self._inner = inner
    self._compression = compression
    self._compression_opts = compression_opts
    self._write_arrays = inner.array_writer("restore_spilled")
    self._step_index = _global_step_index(varset)
    self._held = {}  # tag -> _Held
    self._in_file = {}  # tag -> SpillEntry
    # tag -> replicas of a spilled snapshot (see `_Held`): kept in memory,
    # so that its restore is exact while the store lives.
    self._file_replicas = {}
    self._errors = []  # (tag, what, exception) not yet reported
    self._writing = True  # False after a failed write, until one succeeds
    self._file = spill_file.SpillFile.open_for_writing(
      spill_path, varset, durable
    )
    try:
      dropped = self._file.delete_incomplete()
      if dropped or self._file.rolled_back:
        done = (
          ["rolled back its unfinished change"]
          if self._file.rolled_back
          else []
        ) + (
          ["removed incomplete snapshot(s) %s" % ", ".join(map(repr, dropped))]
          if dropped
          else []
        )
        _LOG.warning(
          "snapstore: spill file %s was left by a process that "
          "stopped while writing to it; %s.",
          self._file.path,
          " and ".join(done),
        )
      self._in_file = dict((e.tag, e) for e in self._file.entries())
      self._adopt_damaged(self._file.damaged())
      self._writer = writer.BackgroundWriter("snapstore-spill", max_pending)
    except BaseException:
      self._file.close()
      raise
    writer.close_at_exit(self)
    # A store dropped without close() must not leave its writer thread
    # waiting forever and its file uncommitted.
    self._release = weakref.finalize(self, _release, self._writer, self._file)
    # At exit, close_at_exit closes a live mode fully (memory tier included);
    # this finalizer must not release its writer and file before that.
    self._release.atexit = False

  # -- tiers -----------------------------------------------------------------------

  @property
  def inner(self):
    """The fast tier's mode (device slots or host arrays)."""
    return self._inner

  def tier(self, tag):
    """ "device" or "host" (in memory), or "file"."""
    if tag in self._held:
      return "host"
    if tag in self._in_file:
      return "file"
    return self._inner.name

  def counts_toward_capacity(self, tag):
    return tag not in self._held and tag not in self._in_file

  def adopted(self):
    return sorted(
      ((e.tag, e.time) for e in self._in_file.values()),
      key=lambda pair: pair[1],
    )

  def spill(self, tag, info, session):
    """Moves snapshot `tag` to the file (in the background); see module doc."""
    self._collect()
    self._retry_failed()
    if tag not in self._held and tag not in self._in_file:
      self._move_to_file(tag, info, session)

  def flush(self):
    """Writes everything queued or failed, and waits for it."""
    self._retry_failed(everything=True)
    self._writer.flush()
    self._collect()
    self.check()

  def check(self):
    """Raises SpillError for background failures not reported yet."""
    self._collect()
    if not self._errors:
      return
    failures, self._errors = self._errors, []
    raise errors.SpillError(
      "Spill file %s: %s. This call did nothing else; call it again."
      % (self._file.path, self._report(failures))
    )

  def _report(self, failures):
    """What went wrong in `failures` and where the snapshots are, for a message."""
    parts = []
    for what, kept in (
      (
        "write",
        "kept in host memory%s and written again with "
        "the next spill or flush()" % self._memory_note(),
      ),
      ("delete", "the file still holds them"),
    ):
      causes = []  # [(cause, [tags])], in order
      for tag, kind, error in failures:
        if kind != what:
          continue
        cause = _describe(error)
        for known, tags in causes:
          if known == cause:
            if tag not in tags:
              tags.append(tag)
            break
        else:
          causes.append((cause, [tag]))
      for cause, tags in causes:
        parts.append(
          "%s snapshot %s failed (%s); %s"
          % (
            "writing" if what == "write" else "deleting from the file",
            ", ".join(map(repr, tags)),
            cause,
            kept,
          )
        )
    if any(_is_full(error) for _, _, error in failures):
      parts.append("free space on that disk: writing resumes by itself")
    elif any(_too_large(error) for _, _, error in failures):
      parts.append(
        "raise the file-size limit (ulimit -f) or use a file system that "
        "allows larger files: writing resumes by itself"
      )
    return "; ".join(parts)

  def _memory_note(self):
    """A phrase on the host memory the held snapshots take (see DiskMode)."""
    return " (%d bytes)" % sum(h.nbytes for h in self._held.values())

  # -- CopyMode ------------------------------------------------------------------

  @property
  def initializer(self):
    return self._inner.initializer

  def tags(self):
    return self._inner.tags() + list(self._held) + list(self._in_file)

  @property
  def nbytes(self):
    return (
      self._inner.nbytes
      + sum(h.nbytes for h in self._held.values())
      + sum(base.replicas_nbytes(r) for r in self._file_replicas.values())
    )

  def take(self, tag, session, victim=None):
    self._inner.take(tag, session, self._inner_victim(victim))
    self._took(tag, victim)

  def put(self, tag, arrays, session, victim=None):
    self._inner.put(tag, arrays, session, self._inner_victim(victim))
    self._took(tag, victim)

  def restore(self, tag, session):
    if tag in self._inner.tags():
      self._inner.restore(tag, session)
    else:
      arrays = self.arrays(tag, session)  # read and checked in full first
      self._write_arrays(arrays, session, self.replicas(tag, session))

  def arrays(self, tag, session):
    if tag in self._held:
      return list(self._held[tag].arrays)
    if tag in self._in_file:
      values = list(self._file.read(tag, self._varset).values())
      for value in values:
        value.setflags(write=False)
      return values
    return self._inner.arrays(tag, session)

  def arrays_one_by_one(self, tag):
    """Snapshot `tag`'s arrays as an iterator reading (and checking) one at
    a time if it is in the file, else None: `save_npz` writes a spilled
    snapshot member by member, never whole in memory. Hold the store's lock
    until it is done (nothing may delete the tag meanwhile)."""
    if tag in self._held or tag not in self._in_file:
      return None
    return (self._file.read_variable(tag, key) for key in self._varset.keys)

  def replicas(self, tag, session):
    if tag in self._held:
      return self._held[tag].replicas
    if tag in self._in_file:
      return self._file_replicas.get(tag)
    return self._inner.replicas(tag, session)

  def delete(self, tag):
    if tag in self._held:
      held = self._held.pop(tag)
      if held.state == _QUEUED:  # its write may be done by now
        self._writer.submit(_Delete(self._file, tag))
    elif tag in self._in_file:
      del self._in_file[tag]
      self._file_replicas.pop(tag, None)
      self._writer.submit(_Delete(self._file, tag))
    else:
      self._inner.delete(tag)

  def array_writer(self, name):
    return self._inner.array_writer(name)

  def stash(self, session):
    return self._inner.stash(session)

  def unstash(self, token, session):
    self._inner.unstash(token, session)

  def close(self):
    """Finishes the writes and closes the file. Safe to call twice.

    Raises:
      SpillError: A snapshot could not be written (a full disk): nothing is
        closed or dropped, the snapshots stay in host memory, and calling
        `close()` again (after freeing space) writes them. Or a delete
        failed: the file is closed and still holds that snapshot.
    """
    if self._file is None:
      return
    if not self._release.alive:  # released already: writer and file are closed
      self._file = None
      self.closed = True
      return
    path = self._file.path
    failures = self._write_held()
    if self._held:
      raise errors.SpillError(
        "Closing the store's spill file %s: %s. The store stays open and "
        "nothing is dropped: call close() again once the file can be written, "
        "or save the snapshots elsewhere first (save_npz)."
        % (
          path,
          self._report(failures)
          or "snapshot(s) %s are not written"
          % ", ".join(map(repr, self._held)),
        )
      )
    self._shut()
    failures, self._errors = self._errors, []
    if failures:
      raise errors.SpillError(
        "Closing the store's spill file %s: %s."
        % (path, self._report(failures))
      )

  def close_at_exit(self):
    """`close()` at interpreter exit: the file is closed whatever happens.

    The process ends next, so snapshots that cannot be written now (a full
    disk) are lost with it; they are dropped and named. The file must be
    closed before Python shuts down: HDF5's own exit handler would close it
    later, through h5py's Python file driver, when there is no interpreter
    left to run it, and the process would crash (SIGSEGV).

    Raises:
      SpillError: Snapshots that could not be written, now lost (the file is
        closed and holds every snapshot committed before), or a failed
        delete, as for `close()`.
    """
    if self._file is None or not self._release.alive:
      self.close()
      return
    path = self._file.path
    try:
      failures = self._write_held()
      if not self._held:
        self.close()  # everything written: an ordinary close
        return
    finally:
      lost = list(self._held)
      if self._file is not None:
        self._shut()
    failures += self._errors
    self._errors = []
    raise errors.SpillError(_lost_at_exit(path, lost, failures))

  def _write_held(self):
    """Writes every snapshot in memory that must reach the file, and waits.

    Returns:
      [(tag, what, exception)] of the failures; the snapshots whose write
      failed stay in `_held`.
    """
    self._before_close()
    self._writer.flush()  # then every failed write, old or new, is tried again
    self._collect()
    self._retry_failed(everything=True)
    self._writer.flush()
    self._collect()
    failures, self._errors = self._errors, []
    return failures

  def _shut(self):
    """Stops the writer (after its queue) and closes the file and fast tier."""
    try:
      self._writer.close()
      self._collect()
    finally:
      self._writer.close()
      self._file.close()
      self._file = None
      self._release.detach()
      self._inner.close()
      self._held.clear()
      self._file_replicas.clear()
      self.closed = True

  def _before_close(self):
    """Called first by `close()`; the disk mode writes its memory tier."""

  # -- what the mode can do: the fast tier's, and a spill file -----------------------

  @property
  def name(self):
    return self._inner.name

  @property
  def data_needs_session(self):
    return self._inner.data_needs_session

  @property
  def slot_set(self):
    return self._inner.slot_set

  @property
  def tiers(self):
    return self

  def uninitialized(self, error):
    return self._inner.uninitialized(error)

  # -- internals -----------------------------------------------------------------------

  def _inner_victim(self, victim):
    return victim if victim in self._inner.tags() else None

  def _took(self, tag, victim):
    """After `tag` was stored in the fast tier: drops its other copies."""
    for old in (tag, victim):
      if old is not None and (old in self._held or old in self._in_file):
        self.delete(old)

  def _move_to_file(self, tag, info, session):
    """Hands fast-tier snapshot `tag` to the writer; returns its bytes."""
    held = _Held(
      tag,
      info,
      self._inner.arrays(tag, session),
      self._inner.replicas(tag, session),
    )
    self._inner.delete(tag)
    self._queue(held)
    return held.nbytes

  def _queue(self, held):
    self._held[held.tag] = held
    held.state = _QUEUED
    self._writer.submit(
      _Write(
        self._file,
        held,
        self._varset.keys,
        self._step(held.arrays),
        self._compression,
        self._compression_opts,
      )
    )

  def _retry_failed(self, everything=False):
    """Queues failed writes again: all of them, or while writes keep failing
    (a full disk) only the oldest, so that each call tries one write, not all."""
    for held in list(self._held.values()):
      if held.state == _FAILED:
        self._queue(held)
        if not (everything or self._writing):
          return

  def _collect(self):
    """Applies finished background jobs to the bookkeeping (caller's thread)."""
    for job, error in self._writer.done():
      current = self._held.get(job.tag)
      if isinstance(job, _Write):
        if current is not job.held:
          continue  # deleted or replaced meanwhile; a queued delete follows
        if error is None:
          del self._held[job.tag]
          self._in_file[job.tag] = job.entry
          if job.held.replicas:
            self._file_replicas[job.tag] = job.held.replicas
          self._writing = True
        else:
          job.held.state = _FAILED
          self._errors.append((job.tag, "write", error))
          self._writing = False
      elif error is not None:
        self._errors.append((job.tag, "delete", error))

  def _adopt_damaged(self, damaged):
    """Lists the file's damaged snapshots as the oldest, and logs them."""
    if not damaged:
      return
    for d in damaged:
      if d.tag is not None and d.tag not in self._in_file:
        self._in_file[d.tag] = spill_file.SpillEntry(d.tag, 0.0, None, 0, ())
    _LOG.warning(
      "snapstore: spill file %s holds %d damaged snapshot(s); the others are "
      "usable. Restoring a damaged one raises SnapshotFileError, delete(tag) "
      "removes it. %s",
      self._file.path,
      len(damaged),
      " ".join(d.problem for d in damaged),
    )

  def _step(self, arrays):
    if self._step_index is None:
      return None
    return int(np.asarray(arrays[self._step_index]))


class _Write(object):
  """Writes one held snapshot; `entry` is set when it is in the file.

  It holds no reference to the mode, nor does anything it runs: its outcome
  (and a failure's traceback) waits in the writer until collected, and must
  not keep a dropped store's mode, and so its thread and file, alive.
  """

  def __init__(self, spill, held, keys, step, compression, compression_opts):
    self._file = spill
    self.held = held
    self.tag = held.tag
    self._keys = tuple(keys)
    self._step = step
    self._compression = compression
    self._compression_opts = compression_opts
    self.entry = None

  def __call__(self):
    held = self.held
    self._file.write(
      held.tag,
      held.info.time,
      self._step,
      self._keys,
      held.arrays,
      self._compression,
      self._compression_opts,
    )
    self.entry = spill_file.SpillEntry(
      held.tag,
      held.info.time,
      self._step,
      sum(a.nbytes for a in held.arrays),  # what the file holds
      self._keys,
    )


class _Delete(object):
  def __init__(self, spill_file, tag):
    self._file = spill_file
    self.tag = tag

  def __call__(self):
    self._file.delete(self.tag)


def _release(background_writer, spill_file):
  """Finishes the writes and closes the file of a mode dropped unclosed."""
  background_writer.close()
  spill_file.close()


def _lost_at_exit(path, lost, failures):
  """The message of `close_at_exit` for snapshots that could not be written."""
  causes, undeleted = [], []
  for tag, what, error in failures:
    if what == "delete":
      undeleted.append(tag)
    elif _describe(error) not in causes:
      causes.append(_describe(error))
  errnos = set(
    getattr(_cause(error), "errno", None) for _, _, error in failures
  )
  if errnos & set((errno.ENOSPC, errno.EDQUOT)):
    room = "free space on that disk, or "
  elif errno.EFBIG in errnos:
    room = (
      "raise the file-size limit (ulimit -f) or use a file system that "
      "allows larger files, or "
    )
  else:
    room = ""
  return (
    "the program is ending, and snapshot(s) %s could not be written to the "
    "spill file %s (%s): they are lost with the process. The file is closed "
    "and valid, with every snapshot committed before%s. Next time, %s"
    "call the store's close() before the program ends and handle its "
    "SpillError (the snapshots stay in memory: call close() again once the "
    "file can be written, or save them elsewhere with save_npz)."
    % (
      ", ".join(map(repr, lost)),
      path,
      "; ".join(causes) or "not written",
      "; deleting snapshot(s) %s from it failed, so it still holds them"
      % ", ".join(map(repr, undeleted))
      if undeleted
      else "",
      room,
    )
  )


def _check_compression(compression, opts):
  if compression is not None and compression not in layout.COMPRESSIONS:
    raise ValueError(
      "Invalid compression %r; must be None or one of %s."
      % (compression, ", ".join(layout.COMPRESSIONS))
    )
  if opts is not None and compression != "gzip":
    raise ValueError(
      "compression_opts=%r is for compression='gzip' (a level "
      "0-9); lzf takes none." % (opts,)
    )
  if opts is not None:
    checks.integer(opts, "compression_opts", 0, 9, hint="a gzip level")


def _global_step_index(varset):
  if varset.graph is None:  # eager: no global step
    return None
  step = tf.train.get_global_step(varset.graph)
  for i, spec in enumerate(varset.specs):
    if step is not None and spec.variable is step:
      return i
  return None


def _cause(error):
  """The error a spill write really failed with (`journal.underlying`)."""
  return journal.underlying(error)


def _is_full(error):
  return getattr(_cause(error), "errno", None) in (errno.ENOSPC, errno.EDQUOT)


def _too_large(error):
  return getattr(_cause(error), "errno", None) == errno.EFBIG


def _describe(error):
  error = _cause(error)
  if _is_full(error):
    return "no space left on the device: %s: %s" % (type(error).__name__, error)
  return "%s: %s" % (type(error).__name__, error)
