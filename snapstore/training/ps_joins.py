"""Guards and trials over parameter-server variables: waiting for scheduled steps.

Under `tf.distribute.experimental.ParameterServerStrategy` (v2), a guarded
block schedules its steps on a `ClusterCoordinator`, and they run on the
workers after the block's own Python code has moved on:

    guard = snapstore.Guard(store, watch_result="loss", reraise=False)
    for x, y in batches:
      with guard:   # a RemoteValue result is fetched: waits for the step
        guard.run(coordinator.schedule, train_step, args=(x, y))

The contract:

- Entering a guard or trial while functions scheduled before it may still
  run is refused (`check_nothing_in_flight`): call `coordinator.join()`
  first.
- A rollback first waits for every function the block scheduled, then
  restores (`roll_back`); a trial waits for them before it evaluates its
  metric again (`join_block`).
- If one of them failed with an error the block did not raise itself, that
  error is raised after the rollback, from the block's failure.

On a store of any other kind these are a plain restore and no-ops: the
store's engine says whether functions are in flight (`store.engine`). Why
it works this way: docs/design/guards.md, "Parameter servers".
"""

from snapstore import errors

# What each helper waits for, in the message refusing its entry.
_WAITS = {
  "Guard": "before it rolls back",
  "Trial": "before it evaluates the metric after the block or rolls back",
}


def check_nothing_in_flight(store, what):
  """Refuses entering a guard or trial while scheduled functions may run.

  Args:
    store: The guarded store.
    what: "Guard" or "Trial".

  Raises:
    ValueError: Functions scheduled on the `ClusterCoordinator` of the
      store's variables may be running.
  """
  if not store.engine.functions_in_flight():
    return
  raise ValueError(
    "Entering snapstore.%s while functions scheduled on the "
    "ClusterCoordinator may still be running on the workers and writing "
    "the store's variables: the snapshot it takes on entry would hold a mix "
    "of states, not the state the block starts from. Call "
    "coordinator.join() before the block (the %s itself waits for the "
    "functions the block schedules, %s)." % (what, what.lower(), _WAITS[what])
  )


def join_block(store, exc):
  """Waits for the functions a guarded block scheduled on a `ClusterCoordinator`.

  Entering made sure none ran before the block, so every function running
  now is the block's.

  Args:
    store: The guarded store.
    exc: The block's failure, or None.

  Returns:
    The error a scheduled function raised, unless it is `exc` (the block
    saw it already), else None. Waiting took it from the coordinator, whose
    next `join()` would have raised it; TensorFlow has cancelled the
    coordinator's other functions, so none runs any more.
  """
  try:
    store.engine.join()
  except Exception as e:  # pylint: disable=broad-except
    return None if e is exc else e
  return None


def roll_back(store, tag, session, exc):
  """Restores snapshot `tag` once the block's scheduled functions are done.

  Args:
    store: The guarded store.
    tag: The snapshot the guard or trial took on entry.
    session: The session to restore in (graph mode), or None.
    exc: The block's failure, or None.

  Raises:
    Error: The restore failed (a snapstore error, raised from `exc`).
    Exception: A function the block scheduled failed with another error
      than `exc`: raised from `exc` once the variables are restored.
  """
  failed = join_block(store, exc)
  try:
    store.restore(tag, session=session)
  except errors.Error as e:
    raise e from exc
  if failed is not None:
    raise failed from exc
