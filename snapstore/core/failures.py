"""How a TensorFlow failure inside a store call is reported: one table.

Every store call that runs TensorFlow runs it inside `translated(kind, ...)`,
which turns a `tf.errors.OpError` into the snapstore error of that kind of
step, with a message saying what failed, what state the variables and the
snapshots are in, and how to finish the job:

    with failures.translated("restore", tag, mode.uninitialized):
      mode.restore(tag, session)

A failure to read a device slot that this session never initialized (the
local initializer did not run) gets its own message naming the initializer:
the mode tells which slot such an error is about (`uninitialized`), and
nothing was written (a restore waits for the slot's check; see
`engines/graph/device.py`).
"""

import collections
import contextlib

from snapstore._tf import tf
from snapstore import errors

_Kind = collections.namedtuple("_Kind", "error message uninitialized")

# kind -> the error raised, its message, and the message when the failure is
# an uninitialized device slot. {tag}, {what}, {cause} (the first line of
# TF's message), {slot}, {fix} (UNINITIALIZED_FIX) and {note} (what the
# caller adds) are filled in.
KINDS = {
  "snapshot": _Kind(
    errors.SnapshotError,
    "Taking snapshot {tag!r} failed: {cause}. The variables are "
    "unchanged.{note}",
    None,
  ),
  "store": _Kind(
    errors.SnapshotError,
    "Storing snapshot {tag!r} failed: {cause}.{note}",
    None,
  ),
  "restore": _Kind(
    errors.RestoreError,
    "Restoring snapshot {tag!r} failed: {cause}. The variables may hold a "
    "mix of old and restored values; the snapshot is intact, call "
    "restore({tag!r}) again.",
    "Restoring snapshot {tag!r} failed: {fix} Nothing was written.",
  ),
  "set_aside": _Kind(
    errors.SnapshotError,
    "evaluate_with could not set the current parameters aside: {cause}. "
    "Nothing was changed.",
    None,
  ),
  "load": _Kind(
    errors.SnapshotError,
    "evaluate_with could not load snapshot {tag!r}: {cause}. The current "
    "parameters are put back.",
    "evaluate_with could not load snapshot {tag!r}: {fix} The current "
    "parameters are put back.",
  ),
  "put_back": _Kind(
    errors.RestoreError,
    "evaluate_with could not write the current parameters back: {cause}. "
    "The store keeps them and writes them back at the start of its next "
    "call, or call recover().",
    None,
  ),
  "pending": _Kind(
    errors.RestoreError,
    "The current parameters that evaluate_with set aside are still not "
    "written back: {cause}. The store keeps them; call recover() with a "
    "working session.",
    None,
  ),
  "read": _Kind(
    errors.SnapshotError,
    "{what} could not read snapshot {tag!r}: {cause}.",
    "{what} could not read snapshot {tag!r}: {fix}",
  ),
  "spill": _Kind(
    errors.SnapshotError,
    "Spilling snapshot {tag!r} failed: reading it failed: {cause}. It "
    "stays where it was.",
    "Spilling snapshot {tag!r} failed: {fix} It stays where it was.",
  ),
}

UNINITIALIZED_FIX = (
  "it is in device slot {slot}, whose shadow variables are not initialized "
  "in this session: the local variable initializer has not run. Run "
  "tf.local_variables_initializer() after the global one "
  "(MonitoredTrainingSession, Estimators and tf.train.Scaffold do), or "
  "store.slots.initializer."
)


def translate(error, kind, tag=None, what=None, uninitialized=None, note=""):
  """The snapstore error for `error`, a `tf.errors.OpError` in a step of `kind`.

  Args:
    error: The OpError.
    kind: A key of `KINDS`.
    tag: The snapshot the call was about.
    what: The call's name, for messages that name it.
    uninitialized: None, or a function from an OpError to the device slot
      whose uninitialized shadows it is about (or None); see
      `CopyMode.uninitialized`.
    note: A sentence the caller adds (what was lost, say).
  """
  entry = KINDS[kind]
  slot = uninitialized(error) if uninitialized is not None else None
  template = entry.message
  fix = ""
  if slot is not None and entry.uninitialized is not None:
    template = entry.uninitialized
    fix = UNINITIALIZED_FIX.format(slot=slot)
  return entry.error(
    template.format(
      tag=tag,
      what=what,
      cause=errors.first_line(error),
      slot=slot,
      fix=fix,
      note=note,
    )
  )


@contextlib.contextmanager
def translated(
  kind, tag=None, uninitialized=None, what=None, note=None, lost=None
):
  """Raises `translate(...)` from an OpError the block raises.

  Args:
    kind, tag, uninitialized, what: As for `translate`.
    note: None, or a function of no arguments called on failure (after the
      block, before the message is made) that returns the note: the
      bookkeeping of what the failure lost, and the sentence saying so.
    lost: None, or a function from the OpError to the error to raise
      instead, or None: for a failure that lost the variables for good (a
      parameter server restarted, `Holdings.lost`), which calling again
      cannot mend.
  """
  try:
    yield
  except tf.errors.OpError as e:
    instead = lost(e) if lost is not None else None
    if instead is not None:
      raise instead from e
    raise translate(
      e, kind, tag, what, uninitialized, note() if note is not None else ""
    ) from e
