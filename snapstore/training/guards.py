"""`snapstore.Guard`: roll a block of training back when it fails.

A guard takes a snapshot of the store's variables on entry and restores it
when the block raises or a watched value (a loss) comes out NaN or
infinite; it then retries the block from the restored state, re-raises, or
carries on. What a rollback restores is exactly the store's variables: with
`optimizer=opt` and `include_global_step=True`, the model, the optimizer's
slots and non-slot variables and the global step, so training on the same
batches again gives bit-identical parameters. Nothing else goes back: other
variables, the position of input pipelines, the state of random ops.

In graph mode the guard runs the steps (`guard.run`, a `session.run` that
also fetches the watched tensors) or checks values fetched by hand
(`guard.check`). Fetch the loss again after the step: the one fetched with
the train op is computed before the update.

    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)
    with tf.Session() as sess:
      ...
      for feed in batches:
        with snapstore.Guard(store, watch=loss, reraise=False,
                             session=sess) as guard:
          guard.run(train_op, feed)
          guard.run(loss, feed)  # the loss after the step

Eagerly the guard calls the step function and checks what `watch` picks of
its result; no call takes a session:

    guard = snapstore.Guard(store, watch=True, reraise=False)
    for x, y in batches:
      with guard:
        guard.run(train_step, x, y)   # a NaN loss rolls the step back

How the parts fit: the engine's part of a guard is its runner
(`runners.py`: `graph_runner.py`, `eager_runner.py`); attempts and retries
are in `attempts.py`, guards inside guards in `nesting.py`,
parameter-server joins in `ps_joins.py`, and `snapstore.Trial` in
`trial.py`. Why it works this way: docs/design/guards.md.
"""

from snapstore.core import checks
from snapstore import errors
from snapstore.training import attempts
from snapstore.training import nesting
from snapstore.training import runners
from snapstore.training.trial import Trial

__all__ = ["Guard", "Trial"]


class Guard(object):
  """Snapshot on entry; roll back when the block raises or a loss is not finite.

  Create with `snapstore.Guard(store, ...)`. Use it as `with guard:` for one attempt, or
  iterate over it for up to `1 + retries` attempts:

      for attempt in snapstore.Guard(store, watch=loss, retries=2,
                                       session=sess):
        with attempt:
          attempt.run(train_op, feed)
          attempt.run(loss, feed)  # the loss after the step

  Every use (a `with` block or a `for` loop) starts with a fresh snapshot
  under `tag`, so one guard can serve every step of a loop. The snapshot stays
  in the store afterwards (replaced by the next use) and counts against its
  `max_to_keep`.

  With a train op from `store.slots.snapshot_before(..., tag=T)` and a guard of tag
  `T`, the snapshot is the step's: each attempt's first `run`, if it fetches
  that train op, takes it in the step's own run (with no `snapshot()` call);
  if it fetches something else, `snapshot()` runs first, as usual. Run the
  block's steps through `run` then: the guard cannot see a run of the train
  op made with your own `session.run`, and each such run writes the slot.
  What it cannot vouch for is refused with a ValueError that propagates
  without a rollback: a second run of that train op in one attempt (it would
  replace the guard's snapshot); `check()`, or a failure, before the
  attempt's first `run` (the guard holds no snapshot yet); a rollback after
  the train op ran outside `run` since the guard's snapshot (the train op
  counts its copies into the slot, and the guard compares the count, reading
  it once when it rolls back). A train op built with `if_finite=` is refused
  on entry: it skips the snapshot when its loss is not finite, so its slot
  need not hold the block's start. Any other pinned tag (an average's,
  Lookahead's, a target network's: a slot in-graph ops write) is refused on
  entry too.

  When an attempt raises an exception of a `catch` type (including the
  `NonFiniteError` of a watched tensor), the store's variables are restored
  from the snapshot. Then the next attempt runs, if any is left; after the
  last one the exception is re-raised (`reraise=True`) or swallowed
  (`reraise=False`; `failed` tells). Other exceptions (KeyboardInterrupt, or
  types outside `catch`) propagate at once, without a rollback.

  On an eager store, `run(fn, *args, **kwargs)` calls `fn` and checks the
  part of its result that `watch` picks (see the module doc); `call(fn, ...)`
  does the same with the guard's retries. Every attempt starts from the
  snapshot taken on entry: an eager guard never uses a slot that the user's
  `tf.function` writes (`store.slots.snapshot_in_step()`), and refuses such
  a tag on entry (ValueError naming the other ways), because it cannot see
  those writes: the function may run its step inside `run` or outside, more
  than once per call, or skip its copy (`commit(if_finite=...)`), and the
  slot would then hold another state than the block's start.

      guard = snapstore.Guard(store, watch="loss", retries=2)
      for attempt in guard:
        with attempt:
          opt.learning_rate.assign(0.1 * 0.5 ** attempt.number)
          attempt.run(train_step, x, y)   # returns {"loss": ..., ...}

  Args:
    store: The `SnapshotStore` whose variables are guarded.
    watch: Graph mode: a float tensor or a list of them (a loss) that `run`
      fetches and checks; any NaN or infinite element fails the attempt.
      Eager store: what `run` checks of its function's result: None or False
      (nothing), True (every element of the result, a nest of float tensors
      or numbers), an int or string (`result[watch]`: a tuple's element, a
      dict's key), or a function `result -> value(s)`.
    retries: How many more attempts to make after a failed one (iteration
      only; a `with` block runs once).
    reraise: After the last failed attempt, re-raise the exception (default)
      or swallow it.
    catch: An exception type or tuple of types that fail an attempt (and roll
      back), besides the guard's own `NonFiniteError`. Default: `Exception`.
    tag: The store tag of the guard's snapshot.
    session: The session for snapshots, rollbacks and `run`; default: the
      default session. A `MonitoredSession` is used as is by `run` (its hooks
      see the training step) and unwrapped for the store's copies. Graph mode
      only: an eager store takes none.

  Raises:
    TypeError: A watched value that is not a float tensor (eager: a `watch`
      that is not one of the forms above); a bad `catch`, `retries`,
      `reraise` or `tag`; a `session` on an eager store.
    ValueError: Negative `retries`. On entry (`with` or iteration): the
      tag is pinned (see above); or, on an eager store over
      parameter-server variables (v2), functions scheduled on the
      `ClusterCoordinator` may still be running (see the module doc).
    GraphMismatchError: A watched tensor of another graph than the store's.
  """

  def __init__(
    self,
    store,
    watch=None,
    retries=0,
    reraise=True,
    catch=(Exception,),
    tag="guard",
    session=None,
  ):
    self._store = store
    self._runner = runners.runner_for(store, session, "Guard")
    given = {"watch_tensors": None, "watch_result": None}
    given[self._runner.watch_argument] = watch
    self._tensors = self._runner.watch_tensors(given["watch_tensors"], "watch")
    self._picker = self._runner.watch_result(given["watch_result"], "watch")
    self._watch = watch if self._picker is not None else self._tensors
    self._retries = checks.integer(retries, "retries", 0)
    if not isinstance(reraise, bool):
      raise TypeError("reraise must be a bool, got %r." % (reraise,))
    self._reraise = reraise
    self._catch = _exception_types(catch) + (errors.NonFiniteError,)
    self._requested = nesting.requested_tag(tag)
    self._session = session
    self._use = None  # the current `with` block or `for` loop
    self._entered = None  # the attempt of a `with` block

  @property
  def tag(self):
    """The tag of the guard's snapshot: `tag`, or `<tag>/<n>` when nested."""
    return self._use.tag if self._use is not None else self._requested

  @property
  def watch(self):
    """The watched tensors; on an eager store, `watch` as given."""
    return self._watch if self._picker is not None else list(self._tensors)

  @property
  def failures(self):
    """The exceptions of the failed attempts of the latest use, in order."""
    return list(self._use.failures) if self._use is not None else []

  @property
  def failed(self):
    """Whether the latest use failed in every attempt (with `reraise=False`)."""
    return self._use is not None and self._use.failed

  # -- one attempt: `with guard:` -------------------------------------------------

  def __enter__(self):
    if self._retries:
      raise ValueError(
        "retries=%d needs the block to run again, which a `with` statement "
        "cannot do. Iterate instead: `for attempt in snapstore.Guard(store, "
        "...): with attempt: ...`, or use guard.call(fn)." % self._retries
      )
    self._begin()
    self._entered = attempts.Attempt(self._use, 0, last=True).__enter__()
    return self

  def __exit__(self, exc_type, exc, tb):
    attempt, self._entered = self._entered, None
    try:
      return attempt.__exit__(exc_type, exc, tb)
    finally:
      nesting.leave(self._store, self._use.tag)

  # -- several attempts: `for attempt in guard:` ----------------------------------

  def __iter__(self):
    self._begin()
    use = self._use
    try:
      for number in range(self._retries + 1):
        attempt = attempts.Attempt(use, number, last=number == self._retries)
        yield attempt
        if attempt.outcome is None:
          raise RuntimeError(
            "Use each attempt of a guard as a context manager: "
            "`for attempt in guard: with attempt: ...`."
          )
        if attempt.outcome == "ok" or use.failed:
          return
    finally:
      nesting.leave(self._store, use.tag)

  def call(self, fn, *args, **kwargs):
    """Runs `fn(*args, **kwargs)` under the guard, with its retries.

    Graph mode: inside `fn`, `guard.run` runs and checks steps. On an eager
    store, what `fn` returns is checked as `run` checks it (`call` is `run`
    with retries), so `guard.call(train_step, x, y)` guards one step.

    Returns:
      What `fn` returned, or None when every attempt failed and
      `reraise=False`.
    """
    for attempt in self:
      with attempt:
        if self._runner.call_means == "call_step":
          return attempt.run(fn, *args, **kwargs)
        return fn(*args, **kwargs)
    return None

  # -- inside an attempt ------------------------------------------------------------

  def run(self, fetches, *args, **kwargs):
    """Runs a step and checks it: `Session.run`, or eagerly a call.

    Graph mode: `run(fetches, feed_dict=None, options=None,
    run_metadata=None)` runs as `Session.run` does; the watched tensors are
    fetched in the same run. On an eager store: `run(fn, *args, **kwargs)`
    calls `fn(*args, **kwargs)` (e.g. a `tf.function` train step) and checks
    what `watch` picks of its result.

    Returns:
      What `Session.run(fetches, ...)` returns; eagerly, what `fn` returns.

    Raises:
      NonFiniteError: A watched tensor (eagerly, a watched part of the
        result) has a NaN or infinite element. The guarded block fails and
        the guard rolls back.
      TypeError: Eagerly: `fn` is not callable, or what `watch` picks is not
        a float value (the block fails).
      RuntimeError: Called outside the guarded block.
    """
    return self._active("run").run(fetches, *args, **kwargs)

  def check(self, *values):
    """Fails the attempt if any of `values` (fetched numbers) is NaN or infinite.

    For losses you fetch yourself. Values are named by position.

    Raises:
      NonFiniteError: A value has a NaN or infinite element.
      RuntimeError: Called outside the guarded block.
    """
    self._active("check").check(*values)

  # -- internals ----------------------------------------------------------------------

  def _active(self, what):
    attempt = self._use.active if self._use is not None else None
    if attempt is None:
      raise RuntimeError(
        "guard.%s() runs inside the guarded block (`with guard:` "
        "or `with attempt:`), where a failure can be rolled back." % what
      )
    return attempt

  def _begin(self):
    own = nesting.own_tag(self._store, self._requested)
    steps = self._runner.in_steps(own)
    if not steps:
      self._runner.check_unpinned(own, "guard")
    # With a train op that snapshots under the tag in its run, each attempt's
    # first run takes the snapshot (see graph_runner.py).
    tag = nesting.enter(self._store, own, self._session, "Guard", not steps)
    self._use = attempts.Use(
      self._store,
      self._session,
      self._runner,
      self._tensors,
      self._picker,
      self._catch,
      self._reraise,
      self._retries,
      tag,
      steps,
    )


def _exception_types(catch):
  types = catch if isinstance(catch, tuple) else (catch,)
  if not types or not all(
    isinstance(t, type) and issubclass(t, BaseException) for t in types
  ):
    raise TypeError(
      "catch must be an exception type or a tuple of them, got %r." % (catch,)
    )
  return types
