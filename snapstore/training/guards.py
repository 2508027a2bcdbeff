"""Blocks of a training loop that roll the store's variables back when they fail.

`snapstore.Guard(store, ...)` takes a snapshot on entry and restores it when the block
raises or when a watched tensor (a loss) comes out NaN or infinite; it then
retries the block from the restored state, re-raises, or carries on.
`snapstore.Trial(store, ...)` tries an update and keeps it or rolls it back by a criterion.

What a rollback restores is exactly the store's variables. With
`optimizer=opt` and `include_global_step=True` those are the model, the
optimizer's slots and non-slot variables (Adam's `beta1_power`) and the global
step, so a rollback is exact: training on the same batches again gives
bit-identical parameters. Nothing else goes back: variables the store does not
cover, the position of input pipelines (the next run reads the next batch), and
the state of random ops (a retried step draws new dropout masks).

In graph mode a loss is only known after `session.run`, so the guard runs the
step for you (`guard.run`, which also fetches the watched tensors) or checks
values you fetched yourself (`guard.check`). A loss fetched in the same run as
the train op is computed before the update; to check what the step did, fetch
the loss again after it, as below. (Otherwise a step that ruins the
parameters passes, and the next guard snapshots the ruined parameters.
`SnapshotHook` avoids the second run by rolling back to an older snapshot.)

    store = snapstore.SnapshotStore(scope="net", optimizer=opt,
                                    include_global_step=True)
    with tf.Session() as sess:
      ...
      for feed in batches:
        # Roll back and go on with the next batch when the step blows up.
        with snapstore.Guard(store, watch=loss, reraise=False,
                             session=sess) as guard:
          guard.run(train_op, feed)
          guard.run(loss, feed)  # the loss after the step

        # Or try the batch up to 3 times, halving the learning rate each time.
        for attempt in snapstore.Guard(store, watch=loss, retries=2,
                                       session=sess):
          with attempt:
            attempt.run(train_op, {**feed, lr: 0.1 * 0.5 ** attempt.number})
            attempt.run(loss, feed)

      # Keep a step only if the loss on a held-out batch did not rise.
      with snapstore.Trial(store, metric=loss, feed_dict=held_out,
                           session=sess) as trial:
        sess.run(train_op, feed)
      print(trial.kept, trial.before, trial.after)

Eagerly (a store built with eager execution on, TF 2.x's default), the
guard calls the step for you: `guard.run(fn, *args, **kwargs)` calls `fn` (a
`tf.function` train step, or any Python callable), returns what it returned,
and checks the part of it that `watch` picks: `True` for all of it, an index
or key, or a function of the result (see `Guard`). A `tf.function` step
returns the loss it computed from the parameters the step started from, so a
NaN batch (whose NaN gradients ruin the parameters) fails its own step; to
catch a step that ruins finite parameters with a finite loss, check the loss
after it too (`guard.run(eval_loss, x, y)`, or `guard.check(value)`). A
trial's `metric` is a function of no arguments. No call takes a session.

    store = snapstore.SnapshotStore(var_list=model, optimizer=opt)

    @tf.function
    def train_step(x, y):
      ...
      return loss

    guard = snapstore.Guard(store, watch=True, reraise=False)
    for x, y in batches:
      with guard:                     # snapshot "guard" (one traced copy)
        guard.run(train_step, x, y)   # a NaN loss rolls the step back
    # Or with retries: guard.call(train_step, x, y) checks what it returns.

An eager guard takes its snapshot on entry, always: a tag pinned by
`store.slots.snapshot_in_step()` is refused (see `_check_unpinned`), since
the guard cannot see when the user's `tf.function` writes that slot.

Parameter servers (v2: an eager store over variables made in a
`tf.distribute.experimental.ParameterServerStrategy`'s scope, steps
scheduled on a `ClusterCoordinator`). The block schedules its steps, and
`guard.run(coordinator.schedule, train_step, args=(x, y))` checks the
step's result: a `RemoteValue` (there, or returned by a trial's metric) is
fetched, which waits for that step. Entering a guard or trial while
functions scheduled before it may still run is refused (ValueError: call
`coordinator.join()` first), since its snapshot would catch their writes
half done. A rollback first waits for every function the block scheduled
(`coordinator.join()`; they are all the block's, and one fetched may not
count as done yet), then restores; a trial waits for them before it
evaluates its metric again. If one of them failed with an error the block
did not raise itself, that error is raised after the rollback, from the
block's failure (the coordinator's next `join()` would have raised it).

    guard = snapstore.Guard(store, watch="loss", reraise=False)
    for x, y in batches:
      with guard:
        guard.run(coordinator.schedule, train_step, args=(x, y))

Guards and trials are plain Python objects: creating one per step adds no
graph ops.

Nesting. A guard or trial entered inside another one of the same store rolls
back to its own entry state: when the enclosing one uses the same tag (the
default "guard"), the inner one takes its snapshot under `<tag>/1` (`/2` one
level deeper, ...; `guard.tag` tells), so the inner snapshot never replaces
the outer one. Each level needs a snapshot the store can keep: an inner entry
whose snapshot would evict an enclosing one's is refused before it takes it
(build the store with one more `max_to_keep` per level).

    with snapstore.Guard(store, session=sess):   # snapshot "guard"
      sess.run(train_op)
      with snapstore.Guard(store, session=sess): # snapshot "guard/1"
        sess.run(train_op)
        raise ValueError                       # back to "guard/1", then out
"""

import numpy as np

from snapstore._tf import tf
from snapstore.engines.graph import attached
from snapstore.core import checks
from snapstore.engines.graph import sessions
from snapstore import errors
from snapstore.engines.eager import distributed as eager_distributed
from snapstore.engines.graph import in_step


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
    self._eager = _eager(store, session, "Guard")
    if self._eager:
      self._watch = _Picker(watch)
    else:
      self._watch = _watched_tensors(watch, store.graph)
    self._retries = checks.integer(retries, "retries", 0)
    if not isinstance(reraise, bool):
      raise TypeError("reraise must be a bool, got %r." % (reraise,))
    self._reraise = reraise
    self._catch = _exception_types(catch) + (errors.NonFiniteError,)
    self._requested = _check_tag(store, tag)
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
    return self._watch.spec if self._eager else list(self._watch)

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
    self._entered = _Attempt(self._use, 0, last=True).__enter__()
    return self

  def __exit__(self, exc_type, exc, tb):
    attempt, self._entered = self._entered, None
    try:
      return attempt.__exit__(exc_type, exc, tb)
    finally:
      _leave(self._store, self._use.tag)

  # -- several attempts: `for attempt in guard:` ----------------------------------

  def __iter__(self):
    self._begin()
    use = self._use
    try:
      for number in range(self._retries + 1):
        attempt = _Attempt(use, number, last=number == self._retries)
        yield attempt
        if attempt.outcome is None:
          raise RuntimeError(
            "Use each attempt of a guard as a context manager: "
            "`for attempt in guard: with attempt: ...`."
          )
        if attempt.outcome == "ok" or use.failed:
          return
    finally:
      _leave(self._store, use.tag)

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
        if self._eager:
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
    own = _own_tag(self._store, self._requested)
    steps = _in_steps(self._store, own)
    if not steps:
      _check_unpinned(self._store, own, "guard")
    conditional = [e.train_op.name for e in steps if e.condition is not None]
    if conditional:
      # After a step whose loss is not finite, such a slot holds an older
      # step's parameters, not the block's start: a rollback would undo more.
      raise ValueError(
        "A guard of tag %r cannot use %s: it snapshots under that tag only "
        "when its loss is finite (snapshot_before(if_finite=...)), so the "
        "slot may hold an older step's parameters than the block started "
        "from. Give the guard another tag (it then takes its own snapshot), "
        "or use SnapshotHook(store, loss=..., in_step=%r)."
        % (own, errors.names(conditional), own)
      )
    # With a train op that snapshots under the tag in its run, each attempt's
    # first run takes the snapshot (see _Attempt.snapshot_for).
    tag = _enter(self._store, own, self._session, "Guard", not steps)
    self._use = _Use(
      self._store,
      self._session,
      self._watch,
      self._catch,
      self._reraise,
      self._retries,
      tag,
      steps,
      self._eager,
    )


class _Use(object):
  """One use of a guard (a `with` block or a `for` loop): settings and record.

  Attributes:
    store, session, watch, catch, reraise, retries: The guard's.
    tag: The tag the use snapshots under.
    eager: Whether the store is eager (`run` calls a function).
    in_steps: The `in_step.InStep`s of train ops snapshotting under `tag`.
    active: The attempt running now, or None.
    failures: The exceptions of the failed attempts.
    failed: Whether the last attempt failed too.
  """

  def __init__(
    self, store, session, watch, catch, reraise, retries, tag, in_steps, eager
  ):
    self.store = store
    self.eager = eager
    self.session = session
    self.watch = watch
    self.catch = catch
    self.reraise = reraise
    self.retries = retries
    self.tag = tag
    self.in_steps = in_steps
    self.active = None
    self.failures = []
    self.failed = False


class _Attempt(object):
  """One run of a guarded block (see `Guard`); it owns the attempt's state.

  A guard of an in-step tag (see `Guard`) owes its snapshot until the
  attempt's first `run`; that run also fetches the count of in-step copies
  into the slot, which a rollback compares.
  """

  def __init__(self, use, number, last):
    self._use = use
    self.number = number  # 0 for the first attempt
    self.last = last
    self.outcome = None  # "ok" or "failed" once the block has run
    self._owed = bool(use.in_steps)  # the snapshot is still to be taken
    self._counts = None  # the in-step copy counts at the attempt's snapshot
    self._refused = None  # a call refused inside the block: no rollback

  def run(self, fetches, *args, **kwargs):
    """Runs and checks a step; see `Guard.run`."""
    if self._use.active is not self:
      raise RuntimeError("attempt.run() runs inside `with attempt:`.")
    if self._use.eager:
      return self._call(fetches, args, kwargs)
    return self._session_run(fetches, *args, **kwargs)

  def _call(self, fn, args, kwargs):
    """`run` on an eager store: calls `fn` and checks what `watch` picks."""
    if not callable(fn):
      raise TypeError(
        "guard.run() on an eager store calls a function with its arguments, "
        "e.g. guard.run(train_step, x, y) for a tf.function train_step; got "
        "%r. Sessions and fetches are for graph mode." % (fn,)
      )
    result = fn(*args, **kwargs)
    self._check(*self._use.watch.pick(result))
    return result

  def _session_run(
    self, fetches, feed_dict=None, options=None, run_metadata=None
  ):
    """`run` in graph mode: a `session.run` that also fetches the watch."""
    use = self._use
    sessions.resolve(use.session, use.store.graph, "guard.run")
    session = (
      use.session if use.session is not None else tf.get_default_session()
    )
    counts = self._snapshot_for(fetches)
    result, watched, counted = session.run(
      (fetches, use.watch, counts or []),
      feed_dict=feed_dict,
      options=options,
      run_metadata=run_metadata,
    )
    if counts:
      self._counts = counted
    self._check([t.name for t in use.watch], watched)
    return result

  def check(self, *values):
    """See `Guard.check`."""
    if self._owed:
      self._refused = ValueError(
        "guard.check(): the guard of tag %r takes its snapshot in the "
        "block's first guard.run (train op %s snapshots under that tag in "
        "its run), and this block ran no step through guard.run, so the "
        "guard cannot tell what the slot holds and cannot roll back. Run "
        "the step as guard.run(train_op, feed_dict), then check; or give the "
        "guard another tag, so that it snapshots on entry."
        % (self._use.tag, self._train_ops())
      )
      raise self._refused
    self._check(["value %d" % i for i in range(len(values))], values)

  def __enter__(self):
    self._use.active = self
    return self

  def __exit__(self, exc_type, exc, tb):
    use = self._use
    use.active = None
    if exc is None:
      self.outcome = "ok"
      return False
    self.outcome = "failed"
    if not isinstance(exc, use.catch) or exc is self._refused:
      return False
    use.failures.append(exc)
    self._rollback(exc)
    if not self.last:
      return True
    use.failed = True
    return not use.reraise

  # -- internals ----------------------------------------------------------------------

  def _train_ops(self):
    return errors.names([e.train_op.name for e in self._use.in_steps])

  def _snapshot_for(self, fetches):
    """Takes the attempt's snapshot before its first run, unless the run does.

    With a train op from `store.slots.snapshot_before(..., tag=<the guard's
    tag>)`, the attempt's first `run` takes the snapshot: in that train op's
    run if it fetches it, else with `store.snapshot()` first.

    Returns:
      For the attempt's first run: the tensors to fetch with it that count
      the in-step copies into the slot as of the guard's snapshot (see
      `_check_counts`). Otherwise None.
    """
    use = self._use
    if not use.in_steps:
      return None
    fetched = in_step.fetched(
      fetches, use.store.graph, [e.train_op for e in use.in_steps]
    )
    if fetched and not self._owed:
      self._refused = ValueError(
        "guard.run(): this is the second run of %s in the guarded block; it "
        "snapshots under the guard's tag %r in its run, which would replace "
        "the snapshot the guard rolls back to. Run it once per guarded block "
        "(one step per block), or run a train op built without "
        "snapshot_before() for the other steps." % (fetched[0].name, use.tag)
      )
      raise self._refused
    if not self._owed:
      return None
    if not fetched:
      use.store.snapshot(use.tag, session=use.session)
    self._owed = False
    return [
      e.counted if e.train_op in fetched else e.count for e in use.in_steps
    ]

  def _check(self, names, values):
    bad = []
    for name, value in zip(names, values):
      value = np.asarray(value)
      if value.dtype.kind not in "fc":
        raise TypeError(
          "%s is not a float value (dtype %s); only floats can "
          "be NaN or infinite." % (_name(name), value.dtype)
        )
      if not np.all(np.isfinite(value)):
        bad.append("%s is %s" % (_name(name), _describe(value)))
    if bad:
      raise errors.NonFiniteError(
        "%s (attempt %d of %d). The guard rolls the store's variables back "
        "to snapshot %r."
        % (
          "; ".join(bad),
          self.number + 1,
          self._use.retries + 1,
          self._use.tag,
        )
      )

  def _rollback(self, exc):
    use = self._use
    if self._owed:
      # Only a guard of an in-step tag owes its snapshot: it had none to
      # take, and the block may have run the train op in a session.run of
      # its own, writing the slot with something other than the block's start.
      raise ValueError(
        "The guard of tag %r cannot roll back: it takes its snapshot in the "
        "block's first guard.run (train op %s snapshots under that tag in "
        "its run), and the block failed but ran no step through guard.run, "
        "so the guard does not know what the slot holds. Run the "
        "block's steps with guard.run, or give the guard another tag, so "
        "that it snapshots on entry." % (use.tag, self._train_ops())
      ) from exc
    self._check_counts(exc)
    _roll_back(use.store, use.tag, use.session, exc)

  def _check_counts(self, exc):
    """Raises if an in-step train op wrote the slot since the guard's snapshot."""
    use = self._use
    if not use.in_steps or self._counts is None:
      return  # no in-step tag, or the first run failed: nothing ran after it
    now = sessions.resolve(use.session, use.store.graph, "guard").run(
      [e.count for e in use.in_steps]
    )
    moved = [
      "%s ran %d time%s" % (e.train_op.name, n - c, "" if n - c == 1 else "s")
      for e, c, n in zip(use.in_steps, self._counts, now)
      if n != c
    ]
    if moved:
      raise ValueError(
        "The guard of tag %r cannot roll back: %s outside guard.run since "
        "the guard's snapshot, and each run wrote the slot (snapshot_before), "
        "so the slot holds the start of the last of them, not the block's. "
        "Run every step of the block through guard.run (one run of the train "
        "op per block), or give the guard another tag, so that its snapshot "
        "is its own." % (use.tag, errors.names(moved))
      ) from exc


class Trial(object):
  """Tries an update; keeps it or rolls it back by a criterion.

  Create with `snapstore.Trial(store, ...)`. On entry the store's variables are
  snapshotted (under `tag`) and, with a `metric`, the metric is evaluated
  (`before`). The block makes its update. On exit the trial decides:

  - the block raised: roll back, and the exception propagates;
  - the block called `keep()` / `reject()` / `decide(flag)`: that decision;
  - otherwise, with a `metric`: evaluate it again (`after`) and keep the
    update if `accept(before, after)` is true (default: `after` is finite and
    no larger than `before`);
  - otherwise: roll back and raise `TrialError`.

  After the block, `kept` says what happened. The metric runs in the raw
  session (a `MonitoredSession`'s hooks do not see it).

  A pinned tag is refused on entry (ValueError): its slot is written by
  in-graph ops (an average, Lookahead's slow weights, a train op from
  `snapshot_before`, whose every run in the block would replace the trial's
  snapshot), and a trial cannot see the block's runs.

      with snapstore.Trial(store, metric=loss, feed_dict=held_out,
                           session=sess) as trial:
        sess.run(train_op, feed)
      if not trial.kept:
        ...  # the variables hold exactly what they held before the block

  On an eager store, `metric` is a function of no arguments, called before
  and after the block (its tensors turned into numpy values for `before`,
  `after` and `accept`), and no call takes a session or a feed:

      with snapstore.Trial(
          store, metric=lambda: loss_fn(y_held, model(x_held))) as trial:
        train_step(x, y)

  Args:
    store: The `SnapshotStore` whose variables are tried.
    metric: A tensor (or any fetches) to evaluate before and after the block;
      on an eager store, a function of no arguments returning the metric.
    feed_dict: The feed for `metric`, e.g. a held-out batch (graph mode).
    accept: A function `(before, after) -> bool`; needs `metric`.
    tag: The store tag of the trial's snapshot.
    session: As for the store's methods (graph mode).

  Under parameter-server training (v2), the trial waits for the functions
  the block scheduled on the `ClusterCoordinator` before it evaluates the
  metric again or rolls back, and refuses to enter while functions
  scheduled before it may still run (see the module doc).

  Raises:
    ValueError: `accept` without `metric`. On entry: a pinned tag; on an
      eager store over parameter-server variables (v2), functions scheduled
      on the `ClusterCoordinator` that may still be running.
    TypeError: A non-callable `accept`, or a bad `tag`; on an eager store, a
      `metric` that is not callable, a `feed_dict` or a `session`.
    GraphMismatchError: A metric of another graph than the store's.
  """

  def __init__(
    self,
    store,
    metric=None,
    feed_dict=None,
    accept=None,
    tag="trial",
    session=None,
  ):
    eager = _eager(store, session, "Trial")
    if accept is not None and metric is None:
      raise ValueError(
        "accept=... compares the metric before and after the "
        "block; pass metric= too (or decide with trial.keep())."
      )
    if accept is not None and not callable(accept):
      raise TypeError(
        "accept must be a function (before, after) -> bool, got %r." % (accept,)
      )
    if eager:
      _check_eager_metric(metric, feed_dict)
    elif metric is not None:
      _check_graph(tf.nest.flatten(metric), store.graph)
    self._eager = eager
    self._store = store
    self._metric = metric
    self._feed_dict = feed_dict
    self._accept = accept or _not_worse
    self._requested = self._tag = _check_tag(store, tag)
    self._session = session
    self._decision = None
    self.before = None
    self.after = None
    self.kept = None

  @property
  def tag(self):
    """The tag of the trial's snapshot: `tag`, or `<tag>/<n>` when nested."""
    return self._tag

  def keep(self):
    """Keeps the block's update."""
    self._decision = True

  def reject(self):
    """Rolls the block's update back on exit."""
    self._decision = False

  def decide(self, keep):
    """Keeps the update if `keep` is true, else rolls it back on exit."""
    self._decision = bool(keep)

  def __enter__(self):
    self._decision = None
    self.before = self.after = self.kept = None
    own = _own_tag(self._store, self._requested)
    _check_unpinned(self._store, own, "trial")
    self._tag = _enter(self._store, own, self._session, "Trial")
    try:
      if self._metric is not None:
        self.before = self._evaluate()
    except BaseException:
      _leave(self._store, self._tag)
      raise
    return self

  def __exit__(self, exc_type, exc, tb):
    try:
      return self._decide(exc)
    finally:
      _leave(self._store, self._tag)

  def _decide(self, exc):
    if exc is not None:
      self._roll_back(exc)
      return False
    decision = self._decision
    if decision is None and self._metric is not None:
      failed = _join_block(self._store, None)  # the block's steps first
      if failed is not None:
        self._roll_back(failed)
        raise failed
      self.after = self._evaluate()
      decision = bool(self._accept(self.before, self.after))
    if decision is None:
      error = errors.TrialError(
        "The trial block ended without a decision, so its update was rolled "
        "back. Call trial.keep() or trial.reject() in the block, or pass "
        "metric= (and accept=) to snapstore.Trial()."
      )
      self._roll_back(error)
      raise error
    if not decision:
      self._roll_back(None)
    self.kept = decision
    return False

  def _evaluate(self):
    if self._eager:
      return tf.nest.map_structure(_numpy, self._metric())
    sess = sessions.resolve(self._session, self._store.graph, "trial")
    return sess.run(self._metric, feed_dict=self._feed_dict)

  def _roll_back(self, exc):
    self.kept = False
    _roll_back(self._store, self._tag, self._session, exc)


_ACTIVE = attached.PerObject("active_guards")  # on each store: [tag, ...]


def _own_tag(store, tag):
  """The tag a guard or trial entering with `tag` snapshots under.

  Inside another guard or trial of `store` with the same tag, the snapshot
  goes under `<tag>/<n>` instead, so that it does not replace the enclosing
  one's (see module doc).

  Raises:
    ValueError: The snapshot would evict an enclosing guard's or trial's.
  """
  active = _ACTIVE.get(store) or []
  own, depth = tag, 0
  while own in active:
    depth += 1
    own = "%s/%d" % (tag, depth)
  victim = store.evicts(own)
  if victim in active:
    raise ValueError(
      "A guard or trial nested in another one needs a snapshot of its own, "
      "but the store keeps max_to_keep=%s snapshots and taking %r would evict "
      "%r, which an enclosing guard or trial rolls back to. Build the store "
      "with a larger max_to_keep (one more per nesting level)."
      % (store.max_to_keep, own, victim)
    )
  return own


def _enter(store, own, session, what, snapshot=True):
  """Registers a guard or trial entering under tag `own`; snapshots unless told not.

  Returns:
    `own`.

  Raises:
    ValueError: Functions scheduled on a `ClusterCoordinator` may be
      writing the store's variables (see `_check_nothing_in_flight`).
  """
  _check_nothing_in_flight(store, what)
  if snapshot:
    store.snapshot(own, session=session)
  active = _ACTIVE.get(store)
  if active is None:
    active = []
    _ACTIVE.set(store, active)
  active.append(own)
  return own


def _roll_back(store, tag, session, exc):
  """Restores `tag`; a snapstore error is raised from `exc`, the block's failure.

  First waits for the functions the block scheduled on a
  `ClusterCoordinator` (`_join_block`): if one of them failed with another
  error than `exc`, that error is raised, from `exc`, once the variables
  are restored.
  """
  failed = _join_block(store, exc)
  try:
    store.restore(tag, session=session)
  except errors.Error as e:
    raise e from exc
  if failed is not None:
    raise failed from exc


def _check_nothing_in_flight(store, what):
  """Refuses entering a guard or trial (`what`: "Guard" or "Trial") of an
  eager store over parameter-server variables (v2) while functions
  scheduled on the `ClusterCoordinator` may run.

  They were scheduled before the block: their writes would interleave with
  the snapshot taken on entry, which would then hold no state the block
  starts from. Whether they belong before the block is the caller's to say,
  by joining them. The functions the block schedules are the guard's:
  `_join_block` waits for them.

  Raises:
    ValueError: Such functions may be running.
  """
  if not store.engine.functions_in_flight():
    return
  waits = {
    "Guard": "before it rolls back",
    "Trial": "before it evaluates the metric after the block or rolls back",
  }[what]
  raise ValueError(
    "Entering snapstore.%s while functions scheduled on the "
    "ClusterCoordinator may still be running on the workers and writing "
    "the store's variables: the snapshot it takes on entry would hold a mix "
    "of states, not the state the block starts from. Call "
    "coordinator.join() before the block (the %s itself waits for the "
    "functions the block schedules, %s)." % (what, what.lower(), waits)
  )


def _join_block(store, exc):
  """Waits for the functions a guarded block scheduled on a
  `ClusterCoordinator` (eager store over parameter-server variables, v2).

  Entering the guard or trial made sure none ran before the block, so every
  function running now is the block's: a rollback must wait for them, or
  they would write over the restored values (and a trial's metric would
  see a mix). A `RemoteValue` the block fetched does not tell: TensorFlow
  sets it before it counts its function done.

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


def _check_unpinned(store, tag, what):
  """Refuses a guard's or trial's tag that is pinned to a slot ops write.

  A pinned tag names a device slot that in-graph ops write (`store.slots.pin`): an
  average, Lookahead's slow weights, a target network, or a train op's
  in-step copy. A snapshot there would replace what they keep, and they
  would overwrite it during the block. (A guard may take an in-step tag:
  it takes its snapshot in `guard.run`, see `Guard`.) On an eager store every
  pinned tag is refused, `snapshot_in_step`'s too: the slot is written inside
  the user's `tf.function`, where no guard can count the writes (see
  `Guard`).

  Raises:
    ValueError: `tag` is pinned.
  """
  slots = _slots(store)
  if slots is None or tag not in slots.pinned():
    return
  if store.engine.name == "eager":
    raise ValueError(
      "%s(tag=%r): that tag is pinned to slot %d, which your own code "
      "writes: an in-step snapshot (store.slots.snapshot_in_step) in your "
      "tf.function, or your ops after store.slots.pin. The %s cannot see "
      "those writes (the function may run its step outside the block, more "
      "than once, or skip the copy with commit(if_finite=...)), so when it "
      "rolled back the slot could hold another state than the block's "
      "start. Give the %s another tag (the default %r), which takes a "
      "snapshot of its own on entry; or, with an unconditional in-step "
      "snapshot, call store.restore(%r) yourself after a step whose loss "
      "is not finite (the slot then holds that step's start)."
      % (what, tag, slots.slot_of(tag), what, what, what, tag)
    )
  writers = slots.in_step_ops(tag)
  if writers:
    by = (
      "train op %s writes in each of its runs (snapshot_before), so the "
      "block's steps would overwrite the %s's snapshot"
      % (errors.names([op.name for op in writers]), what)
    )
  else:
    by = (
      "in-graph ops write (store.slots.pin: an average, Lookahead's slow weights, "
      "a target network): a snapshot there would replace what they keep, "
      "and they could overwrite it"
    )
  raise ValueError(
    "%s(tag=%r): that tag is pinned to slot %d, which %s. Give the %s "
    "another tag (the default %r), which takes a snapshot of its own."
    % (what, tag, slots.slot_of(tag), by, what, what)
  )


def _slots(store):
  """`store.slots`, or None for a store without device slots."""
  try:
    return store.slots
  except errors.ModeError:
    return None


def _in_steps(store, tag):
  """The `InStep`s of train ops snapshotting under `tag` in their run."""
  slots = _slots(store)
  return slots.in_steps(tag) if slots is not None else []


def _leave(store, tag):
  active = _ACTIVE.get(store)
  if active and tag in active:
    active.remove(tag)


def _not_worse(before, after):
  before, after = np.asarray(before), np.asarray(after)
  if not np.all(np.isfinite(after)):
    return False
  return bool(np.all(~np.isfinite(before) | (after <= before)))


def _watched_tensors(watch, graph):
  if watch is None:
    return []
  watch = list(watch) if isinstance(watch, (list, tuple)) else [watch]
  for t in watch:
    if not isinstance(t, tf.Tensor):
      raise TypeError(
        "watch takes float tensors (e.g. the loss), got %r. For a "
        "variable, pass a tensor reading it." % (t,)
      )
    if not (t.dtype.is_floating or t.dtype.is_complex):
      raise TypeError(
        "Watched tensor %s has dtype %s; only float tensors can "
        "be NaN or infinite." % (t.name, t.dtype.name)
      )
  _check_graph(watch, graph)
  return watch


def _check_graph(tensors, graph):
  for t in tensors:
    if hasattr(t, "graph"):  # a metric may hold names as well as tensors
      checks.same_graph(
        t, graph, t.name, fix="Pass tensors of the store's graph (store.graph)."
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


def _check_tag(store, tag):
  if tag is None:
    raise TypeError(
      "A guard or trial needs a fixed tag (an int or a non-empty "
      "string), got None."
    )
  return checks.tag(tag)


def _name(name):
  if ":" in name:
    return "Watched tensor %s" % name
  return name[:1].upper() + name[1:]  # keeps the case of keys: result['Loss']


def _eager(store, session, what):
  """Whether `store` is eager; refuses a session for one.

  Raises:
    TypeError: `session` given for an eager store.
  """
  eager = store.engine.name == "eager"
  if eager and session is not None:
    store.engine.session(session, "snapstore.%s" % what)
  return eager


def _check_eager_metric(metric, feed_dict):
  if metric is not None and not callable(metric):
    raise TypeError(
      "On an eager store, a trial's metric is a function of no arguments "
      "that returns the metric (e.g. metric=lambda: loss_fn(y_held, "
      "model(x_held))), called before and after the block; got %r." % (metric,)
    )
  if feed_dict is not None:
    raise TypeError(
      "On an eager store, a trial takes no feed_dict: pass the metric's "
      "inputs inside its function (metric=lambda: loss_fn(y_held, "
      "model(x_held)))."
    )


def _numpy(value):
  """An eager tensor's (or Keras variable's) numpy value, a `RemoteValue`'s
  fetched value; else `value`."""
  value = eager_distributed.fetched(value)
  return value.numpy() if hasattr(value, "numpy") else value


class _Picker(object):
  """What an eager guard checks of its function's result (see `Guard`).

  Args:
    spec: `watch` as given: None, a bool, an int or string, or a function.

  Raises:
    TypeError: Any other `watch` (a tensor: the graph-mode form).
  """

  def __init__(self, spec):
    if not (
      spec is None
      or isinstance(spec, (bool, int, str))
      or (callable(spec) and not isinstance(spec, tf.Tensor))
    ):
      raise TypeError(
        "On an eager store, watch picks what guard.run's function returns: "
        "True (all of it), an index or key (watch=0, watch='loss'), or a "
        "function of the result (watch=lambda out: out[0]); got %r. "
        "Tensors to fetch are for graph mode." % (spec,)
      )
    if isinstance(spec, str) and not spec:
      raise TypeError("watch='' picks nothing; name a key of the result.")
    self.spec = spec

  def pick(self, result):
    """(names, values) to check in `result`; none for `watch=None`/False.

    Raises:
      TypeError: `watch` picks an index or key the result does not have.
    """
    spec = self.spec
    if spec is None or spec is False:
      return [], []
    # `guard.run(coordinator.schedule, step, ...)`: the step's result.
    result = eager_distributed.fetched(result)
    if spec is True:
      return _leaves("result", result)
    if isinstance(spec, (int, str)):
      try:
        picked = result[spec]
      except (KeyError, IndexError, TypeError, ValueError) as e:
        raise TypeError(
          "watch=%r picks result[%r], but the function returned %s, which "
          "has no such element (%s: %s). Pick an element it has, or pass "
          "watch=True to check all of it."
          % (spec, spec, _kind(result), type(e).__name__, e)
        ) from e
      return _leaves("result[%r]" % (spec,), picked)
    return _leaves("watch(result)", spec(result))


def _leaves(name, value):
  """(names, values) of the leaves of a nest of lists, tuples and dicts
  (a `RemoteValue` fetched)."""
  value = eager_distributed.fetched(value)
  if isinstance(value, dict):
    names, values = [], []
    for key in sorted(value, key=repr):
      n, v = _leaves("%s[%r]" % (name, key), value[key])
      names += n
      values += v
    return names, values
  if isinstance(value, (list, tuple)):
    names, values = [], []
    for i, item in enumerate(value):
      n, v = _leaves("%s[%d]" % (name, i), item)
      names += n
      values += v
    return names, values
  return [name], [_numpy(value)]


def _kind(value):
  if isinstance(value, (list, tuple, dict)):
    return "a %s of %d" % (type(value).__name__, len(value))
  return "a %s" % type(value).__name__


def _describe(value):
  flat = value.reshape(-1)
  bad = flat[~np.isfinite(flat)]
  if flat.size == 1:
    return str(flat[0])
  return "%d of %d elements not finite (first: %s)" % (
    bad.size,
    flat.size,
    bad[0],
  )
