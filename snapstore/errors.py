"""Errors raised by snapstore.

Every error snapstore raises on purpose derives from `Error`, so a training loop
can catch them in one place. Bad arguments (a wrong type, an unknown mode name, an
empty variable set) raise the usual `TypeError` / `ValueError` instead.

When one of these is raised, no variable has been changed by the failing call,
unless the error says otherwise and says how to finish the job (`RestoreError`).
"""


class Error(Exception):
  """Base class for the errors snapstore raises.

  Example:
    Catch every error snapstore raises on purpose in one place:

    ```python
    try:
      store.restore(tag)
    except snapstore.Error as e:
      print("rollback failed:", e)
    ```
  """


def first_line(error):
  """The first line of `error`'s message (a TF OpError's without its traceback)."""
  message = getattr(error, "message", None) or str(error)
  return (
    message.strip().splitlines()[0] if message.strip() else type(error).__name__
  )


def names(items, limit=10):
  """Names read from a file, for a message: at most `limit`, unprintable ones quoted.

  A hostile file can hold thousands of names, or names with control
  characters; the message stays short and one line.
  """
  items = [
    n if isinstance(n, str) and n.isprintable() else repr(n) for n in items
  ]
  shown = ", ".join(items[:limit])
  if len(items) > limit:
    shown += ", and %d more" % (len(items) - limit)
  return shown


class UnknownTagError(Error, LookupError):
  """Raised when a tag names no snapshot held by the store.

  The message lists the tags that exist.

  Example:
    ```python
    try:
      store.restore("best")
    except snapstore.UnknownTagError as e:
      print(e)  # ... holds no snapshot 'best'; held tags: 0, 1
    ```
  """

  def __str__(self):  # LookupError would quote the message like a dict key.
    return str(self.args[0]) if self.args else ""


class NoSessionError(Error):
  """Raised when a call needs a session, none was passed and none is default.

  Example:
    Graph mode: pass the session, or make one the default.

    ```python
    store.snapshot(session=sess)
    with sess.as_default():
      store.snapshot()
    ```
  """


class GraphMismatchError(Error):
  """Raised when a session or tensor belongs to another graph than the store's.

  A store is bound to the graph of its variables, as a Sonnet module is bound to
  one graph.

  Example:
    A store built in one graph, called with another graph's session:

    ```python
    with tf.Graph().as_default():
      other = tf.Session()
    store.snapshot(session=other)  # GraphMismatchError
    ```
  """


class SessionMismatchError(Error):
  """Raised when a device snapshot is used from a session that does not hold it.

  Device snapshots are variables, whose values live in the session that took
  them (a local `tf.Session`) or on the cluster's tasks (a `grpc://` target);
  see `snapstore.engines.graph.places`. The message names where the snapshot is held
  and how to use or carry it over; also raised for a snapshot dropped because
  its session was closed or its cluster's tasks restarted (eagerly: a
  parameter server holding it restarted, `snapstore.engines.eager.restarts`),
  saying so.

  Example:
    A device snapshot taken in one session, carried over to another while
    the first is still open:

    ```python
    store.load_arrays(store.arrays(tag, session=old), tag=tag, session=new)
    ```
  """


class NotChiefError(Error):
  """Raised when a call that writes is made on a task that is not the chief.

  In between-graph replication every worker's store shares its device
  shadows on the ps tasks, and the variables: a snapshot, restore,
  `evaluate_with` swap or stored arrays on another worker would overwrite
  the chief's snapshots or roll back every worker
  (`snapstore/engines/graph/between_graph.py`). Nothing was run; the message names
  the chief, and `SnapshotStore(..., chief_only=False)` lets a task write.

  Example:
    On a worker that is not the chief, let it write by building its store
    with:

    ```python
    store = snapstore.SnapshotStore(scope="net", chief_only=False)
    ```
  """


class StoreClosedError(Error):
  """Raised when a store is used after `close()` (or its `with` block).

  A closed store has released its files and writer thread; build a new store
  (over the same spill file, to find the snapshots written to it).

  Example:
    ```python
    store.close()
    store.snapshot()  # StoreClosedError
    ```
  """


class IncompatibleSnapshotError(Error):
  """Raised when arrays from a file do not match the store's variables.

  The message names every missing or unexpected variable and every shape or
  dtype mismatch, so one run shows all that is wrong.

  Example:
    ```python
    try:
      store.files.load_npz("other_model.npz", tag="other")
    except snapstore.IncompatibleSnapshotError as e:
      print(e)  # every missing, unexpected and mismatching variable
    ```
  """


class SnapshotFileError(Error):
  """Raised when a snapshot file cannot be read safely.

  For example a file that is not an `.npz` archive, is truncated, or holds
  pickled objects (snapstore never unpickles).

  Example:
    ```python
    try:
      store.files.load_npz("download.npz", tag="theirs")
    except snapstore.SnapshotFileError as e:
      print("refused:", e)  # nothing was stored
    ```
  """


class CheckpointError(SnapshotFileError):
  """Raised when a path is not a TensorFlow checkpoint snapstore can read.

  For example no checkpoint at the path, a directory without a `checkpoint`
  state file, a file that is not a checkpoint, one file of a checkpoint instead
  of its prefix, or a tensor TF's checkpoint reader fails to read. The message
  names the path and the fix.

  Example:
    Pass the checkpoint's prefix (or its directory), not one of its files:

    ```python
    store.files.load_checkpoint("runs/1/model.ckpt-5000", tag="run_1")
    ```
  """


class ModeError(Error):
  """Raised when a call needs a copy mode the store does not use.

  For example `snapshot_op()` on a host-mode store: host snapshots are numpy
  arrays and have no graph op.

  Example:
    ```python
    store = snapstore.SnapshotStore(scope="net", mode="host")
    store.slots  # ModeError: a host store has no device slots
    ```
  """


class SnapshotError(Error):
  """Raised when taking a snapshot failed in TensorFlow.

  Also when `evaluate_with` could not set the current values aside. The
  variables are unchanged (a snapshot only reads them). The message says
  which stored snapshot, if any, was overwritten and dropped.

  Example:
    ```python
    try:
      tag = store.snapshot(session=sess)
    except snapstore.SnapshotError as e:
      print(e)  # the variables are unchanged
    ```
  """


class RestoreError(Error):
  """Raised when writing parameters into the variables failed part-way.

  The variables may hold a mix of values. The message says where the intended
  values are kept and which call finishes the job; the store keeps them until
  that call succeeds.

  Example:
    After the cause is fixed, the call the message names finishes the job:

    ```python
    try:
      store.restore(tag)
    except snapstore.RestoreError:
      store.recover()  # writes the kept values back
    ```
  """


class CoordinationError(Error):
  """Raised when the workers of a multi-worker strategy do not restore together.

  Under `MultiWorkerMirroredStrategy` every worker must restore the same
  snapshot at the same point (`snapstore/engines/eager/multi_worker.py`; graph
  mode: `snapstore/engines/graph/multi_worker.py`). Nothing was written; the
  message names the workers and the fix.

  Example:
    Every worker restores the same tag at the same point:

    ```python
    store.restore("good")  # on every worker
    ```
  """


class TracedCallError(Error):
  """Raised when a store call is traced into a `tf.function` where it cannot work.

  A traced call runs each time the function runs, but what the store holds
  (its tags, its arrays, which snapshot a slot holds) is Python state that
  changes between runs. `evaluate_with(fn, tag=...)` and `restore(tag)`
  look their snapshot up at every run; calls that change or read that
  state (`snapshot`, `delete`, `tags`, `arrays`, ...) would be fixed to
  what it was when the function was traced, so they are refused. The
  message names the call that works inside a traced step.

  Example:
    ```python
    @tf.function
    def step():
      store.snapshot()  # TracedCallError: use store.slots.snapshot_in_step()
    ```
  """


class RewireError(Error):
  """Raised when `store.slots.past` cannot rewire outputs to a slot's shadows.

  The message names the op and why (it writes a variable, it is part of a
  `tf.while_loop`, ...). Nothing is built, and `evaluate_with(past=True)`
  evaluates such fetches by swapping the parameters instead.

  Example:
    ```python
    try:
      q_past = store.slots.past(q, slot=0)
    except snapstore.RewireError as e:
      print(e)  # names the op that cannot read the slot
    ```
  """


class CloneError(Error):
  """Raised when `snapstore.clone` cannot copy a subgraph faithfully.

  The message names the op or variable and the way out. Nothing is built.

  Example:
    ```python
    try:
      copy = snapstore.clone(outputs, inputs=[x], scope="copy")
    except snapstore.CloneError as e:
      print(e)  # e.g. a tf.while_loop, which clone refuses
    ```
  """


class NonFiniteError(Error):
  """Raised when a watched tensor (a loss) is NaN or infinite.

  Raised by `snapstore.Guard(store)` when it re-raises, and by `SnapshotHook` /
  `SnapshotCallback` when rolling back does not help. The message names the
  tensors and the snapshot the variables were rolled back to.

  Example:
    ```python
    guard = snapstore.Guard(store, watch_result=True)  # reraise=True
    with guard:
      guard.run(train_step, x, y)  # NonFiniteError after the rollback
    ```
  """


class TrialError(Error):
  """Raised when a `snapstore.Trial(store)` block ends without a decision.

  The block neither called `keep()` nor `reject()` and the trial has no
  `metric` to decide by; the trial's update is rolled back.

  Example:
    Decide in the block, or give the trial a metric:

    ```python
    with snapstore.Trial(store) as trial:
      train_step(x, y)
      trial.keep() if val_loss() < best else trial.reject()
    ```
  """


class PinnedTagError(Error):
  """Raised when a call would delete or evict a pinned snapshot.

  A pinned tag names a device slot that in-graph ops write (`store.slots.pin`):
  Lookahead's slow weights, a moving average, a target network. Deleting or
  evicting it would hand that slot to another snapshot while the ops still
  write it.

  Example:
    ```python
    store.slots.pin(0, "target")
    store.delete("target")  # PinnedTagError
    ```
  """


class SpillError(Error):
  """Raised when writing a snapshot to, or deleting one from, a spill file failed.

  Writes run on a background thread, so the error is raised by the store's next
  call (which then does nothing else; call it again). The message names the
  snapshot's tag and the cause, e.g. a full disk. A snapshot whose write failed
  stays in host memory, usable as before, and is written again later.

  Example:
    Free space, then call again: the snapshot is still in memory.

    ```python
    try:
      store.snapshot()
    except snapstore.SpillError as e:
      print(e)  # names the tag, "no space left", the file
      store.snapshot()
    ```
  """
