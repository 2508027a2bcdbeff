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
also fetches the `watch_tensors`) or checks values fetched by hand
(`guard.check`). Fetch the loss again after the step: the one fetched with
the train op is computed before the update.

    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)
    with tf.Session() as sess:
      ...
      for feed in batches:
        with snapstore.Guard(store, watch_tensors=loss, reraise=False,
                             session=sess) as guard:
          guard.run(train_op, feed)
          guard.run(loss, feed)  # the loss after the step

Eagerly the guard calls the step function and checks what `watch_result`
picks of its result; no call takes a session:

    guard = snapstore.Guard(store, watch_result=True, reraise=False)
    for x, y in batches:
      with guard:
        guard.run(train_step, x, y)   # a NaN loss rolls the step back

How the parts fit: the engine's part of a guard is its runner
(`runners.py`: `graph_runner.py`, `eager_runner.py`); attempts and retries
are in `attempts.py`, guards inside guards in `nesting.py`,
parameter-server joins in `ps_joins.py`, and `snapstore.Trial` in
`trial.py`. Why it works this way: docs/design/guards.md.
"""

import warnings

from snapstore.core import checks
from snapstore import errors
from snapstore.training import attempts
from snapstore.training import nesting
from snapstore.training import runners
from snapstore.training.trial import Trial

__all__ = ["Guard", "Trial"]

# What each new name means, for the deprecation warnings of the old ones.
_MEANS = {
  "watch_tensors": "the float tensors guard.run fetches and checks in "
  "each session.run",
  "watch_result": "what guard.run checks of its step function's result",
  "call_block": "calls a block that runs its steps through guard.run, "
  "with the guard's retries",
  "call_step": "runs one step through guard.run, with the guard's retries",
}


class Guard(object):
  """Snapshot on entry; roll back when the block raises or a loss is not finite.

  Create with `snapstore.Guard(store, ...)`. Use it as `with guard:` for one
  attempt, or iterate over it for up to `1 + retries` attempts:

      for attempt in snapstore.Guard(store, watch_tensors=loss, retries=2,
                                     session=sess):
        with attempt:
          attempt.run(train_op, feed)
          attempt.run(loss, feed)  # the loss after the step

  or let `call_step` (one step) or `call_block` (a function running the
  block) do the loop:

      guard = snapstore.Guard(store, watch_result="loss", retries=2)
      loss = guard.call_step(train_step, x, y)  # returns {"loss": ..., ...}

  Every use (a `with` block, a `for` loop, a `call_*`) starts with a fresh
  snapshot under `tag`, so one guard can serve every step of a loop. The
  snapshot stays in the store afterwards (replaced by the next use) and
  counts against its `max_to_keep`.

  When an attempt raises an exception of a `catch` type (including the
  `NonFiniteError` of a watched value), the store's variables are restored
  from the snapshot. Then the next attempt runs, if any is left; after the
  last one the exception is re-raised (`reraise=True`) or swallowed
  (`reraise=False`; `failed` tells). Other exceptions (KeyboardInterrupt, or
  types outside `catch`) propagate at once, without a rollback.

  A pinned tag (an average's, Lookahead's, a target network's, an eager
  in-step snapshot's) is refused on entry. In graph mode, the tag of a train
  op from `store.slots.snapshot_before(..., tag=T)` is the exception: each
  attempt takes its snapshot in that train op's run, and what the guard then
  cannot vouch for is refused with a ValueError that propagates without a
  rollback (`graph_runner.py`; docs/design/guards.md, "In-step tags").

  Args:
    store: The `SnapshotStore` whose variables are guarded.
    watch: Deprecated: `watch_tensors` on a graph-mode store, `watch_result`
      on an eager one (a DeprecationWarning names the one).
    retries: How many more attempts to make after a failed one (iteration
      and `call_*` only; a `with` block runs once).
    reraise: After the last failed attempt, re-raise the exception (default)
      or swallow it.
    catch: An exception type or tuple of types that fail an attempt (and roll
      back), besides the guard's own `NonFiniteError`. Default: `Exception`.
    tag: The store tag of the guard's snapshot.
    session: The session for snapshots, rollbacks and `run`; default: the
      default session. A `MonitoredSession` is used as is by `run` (its hooks
      see the training step) and unwrapped for the store's copies. Graph mode
      only: an eager store takes none.
    watch_tensors: Graph mode: a float tensor or a list of them (a loss)
      that `run` fetches in each of its runs; any NaN or infinite element
      fails the attempt.
    watch_result: Eager store: what `run` checks of its function's result:
      None or False (nothing), True (every element of the result, a nest of
      float tensors or numbers), an int or string (`result[watch_result]`:
      a tuple's element, a dict's key), or a function `result -> value(s)`.

  Raises:
    TypeError: A watched tensor that is not a float tensor; a `watch_result`
      that is not one of the forms above; the other engine's argument
      (`watch_tensors` on an eager store, `watch_result` in graph mode);
      `watch` with its new name; a bad `catch`, `retries`, `reraise` or
      `tag`; a `session` on an eager store.
    ValueError: Negative `retries`. On entry (`with`, iteration or a
      `call_*`): the tag is pinned (see above); or, on an eager store over
      parameter-server variables (v2), functions scheduled on the
      `ClusterCoordinator` may still be running (`ps_joins.py`).
    GraphMismatchError: A watched tensor of another graph than the store's.

  Example:
    Eager: a NaN loss rolls the step back, the optimizer's state too.

    ```python
    store = snapstore.SnapshotStore(var_list=model, optimizer=opt)
    guard = snapstore.Guard(store, watch_result=True, reraise=False)
    for x, y in batches:
      with guard:  # a snapshot on entry
        guard.run(train_step, x, y)  # its loss is checked; NaN: rolled back
    ```
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
    *,
    watch_tensors=None,
    watch_result=None,
  ):
    self._store = store
    self._runner = runners.runner_for(store, session, "Guard")
    given = _renamed_watch(self._runner, watch, watch_tensors, watch_result)
    self._tensors = self._runner.watch_tensors(*given["watch_tensors"])
    self._picker = self._runner.watch_result(*given["watch_result"])
    self._watch_result = given["watch_result"][0]
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
  def watch_tensors(self):
    """The tensors `run` fetches and checks (graph mode); [] eagerly."""
    return list(self._tensors)

  @property
  def watch_result(self):
    """`watch_result` as given (eager store); None in graph mode."""
    return self._watch_result

  @property
  def watch(self):
    """Deprecated: `watch_tensors` in graph mode, `watch_result` eagerly."""
    new = self._runner.watch_argument
    _deprecated("guard.watch", "guard.%s" % new, new, self._store)
    return getattr(self, new)

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
        "...): with attempt: ...`, or use guard.call_step(step, ...) or "
        "guard.call_block(fn)." % self._retries
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

  def call_block(self, fn, *args, **kwargs):
    """Calls `fn(*args, **kwargs)` as the guarded block, with the retries.

    `fn` runs the block's steps through `guard.run` (or checks values with
    `guard.check`); each failed attempt is rolled back and `fn` called
    again, up to `1 + retries` times. The same on both engines.

        def block():
          guard.run(train_op, feed)
          return guard.run(loss, feed)  # the loss after the step

        loss = guard.call_block(block)

    Returns:
      What `fn` returned, or None when every attempt failed and
      `reraise=False`.
    """
    for attempt in self:
      with attempt:
        return fn(*args, **kwargs)
    return None

  def call_step(self, step, *args, **kwargs):
    """Runs one step through `run`, with the retries.

    `guard.call_step(train_step, x, y)` is `guard.run(train_step, x, y)`
    (eagerly; in graph mode `guard.call_step(train_op, feed)`), retried from
    the snapshot up to `1 + retries` times while it fails.

    Returns:
      What `run` returned, or None when every attempt failed and
      `reraise=False`.
    """
    for attempt in self:
      with attempt:
        return attempt.run(step, *args, **kwargs)
    return None

  def call(self, fn, *args, **kwargs):
    """Deprecated: `call_block` in graph mode, `call_step` eagerly."""
    new = self._runner.call_means
    _deprecated("guard.call()", "guard.%s()" % new, new, self._store)
    return getattr(self, new)(fn, *args, **kwargs)

  # -- inside an attempt ------------------------------------------------------------

  def run(self, fetches, *args, **kwargs):
    """Runs a step and checks it: `Session.run`, or eagerly a call.

    Graph mode: `run(fetches, feed_dict=None, options=None,
    run_metadata=None)` runs as `Session.run` does; the watched tensors are
    fetched in the same run. On an eager store: `run(fn, *args, **kwargs)`
    calls `fn(*args, **kwargs)` (e.g. a `tf.function` train step) and checks
    what `watch_result` picks of its result.

    Returns:
      What `Session.run(fetches, ...)` returns; eagerly, what `fn` returns.

    Raises:
      NonFiniteError: A watched tensor (eagerly, a watched part of the
        result) has a NaN or infinite element. The guarded block fails and
        the guard rolls back.
      TypeError: Eagerly: `fn` is not callable, or what `watch_result`
        picks is not a float value (the block fails).
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


def _renamed_watch(runner, watch, watch_tensors, watch_result):
  """{argument: (value, the name the user gave it)}: `watch` under its new name.

  Raises:
    TypeError: `watch` and its new name both given.
  """
  given = {
    "watch_tensors": (watch_tensors, "watch_tensors"),
    "watch_result": (watch_result, "watch_result"),
  }
  if watch is None:
    return given
  new = runner.watch_argument
  if given[new][0] is not None:
    raise TypeError(
      "snapstore.Guard() got watch= and %s=; pass %s= only (watch= is its "
      "deprecated name on this store)." % (new, new)
    )
  _deprecated(
    "snapstore.Guard(watch=...)", "%s=..." % new, new, runner.store, 4
  )
  given[new] = (watch, "watch")
  return given


def _deprecated(old, new, meaning, store, stacklevel=3):
  warnings.warn(
    "%s is deprecated and will be removed in the next release: on this "
    "store (engine %r) use %s, %s."
    % (old, store.engine.name, new, _MEANS[meaning]),
    DeprecationWarning,
    stacklevel=stacklevel,
  )
