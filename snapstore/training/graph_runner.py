"""Guards and trials in graph mode: a step is a `session.run`.

`guard.run(fetches, feed_dict=None, options=None, run_metadata=None)` runs
as `Session.run` does, in the guard's session (default: the default
session; a `MonitoredSession` as is, so its hooks see the step), and
fetches the watched tensors (`Guard(watch_tensors=...)`) in the same run;
any NaN or infinite element fails the attempt. A trial's metric is a tensor
(or any fetches) run with its `feed_dict` in the raw session.

A guard whose tag is that of a train op from
`store.slots.snapshot_before(..., tag=T)` takes each attempt's snapshot in
that train op's run: the attempt's first `run` fetches it (or runs
`store.snapshot()` first when it fetches something else), and also fetches
the count of in-step copies into the slot, which a rollback compares. What
the guard cannot vouch for is refused with a ValueError that propagates
without a rollback (see `Guard`). Why: docs/design/guards.md, "In-step
tags".
"""

from snapstore._tf import tf
from snapstore.core import checks
from snapstore import errors
from snapstore.engines.graph import in_step
from snapstore.training import runner


class GraphRunner(runner.Runner):
  """The graph engine's part of a guard or trial (see module doc)."""

  engine = "graph"
  watch_argument = "watch_tensors"
  call_means = "call_block"

  # -- what a guard watches -----------------------------------------------------------

  def watch_tensors(self, value, argument):
    if value is None:
      return []
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    for t in value:
      if not isinstance(t, tf.Tensor):
        raise TypeError(
          "%s takes float tensors (e.g. the loss), got %r. For a "
          "variable, pass a tensor reading it." % (argument, t)
        )
      if not (t.dtype.is_floating or t.dtype.is_complex):
        raise TypeError(
          "Watched tensor %s has dtype %s; only float tensors can "
          "be NaN or infinite." % (t.name, t.dtype.name)
        )
    check_graph(value, self.store.graph)
    return value

  def watch_result(self, value, argument):
    if value is None:
      return None
    raise TypeError(
      "%s=%r picks what an eager step function returns, but this store "
      "runs in graph mode. Pass watch_tensors= (e.g. the loss tensor), which "
      "guard.run fetches in each of its runs." % (argument, value)
    )

  # -- a guard's tag -----------------------------------------------------------------

  def in_steps(self, tag):
    slots = self.slots()
    steps = slots.in_steps(tag) if slots is not None else []
    conditional = [e.train_op.name for e in steps if e.condition is not None]
    if conditional:
      # After a step whose loss is not finite, such a slot holds an older
      # step's parameters, not the block's start: a rollback would undo more.
      raise ValueError(
        "A guard of tag %r cannot use %s: it snapshots under that tag only "
        "when its loss is finite (snapshot_before(if_finite=...)), so the "
        "slot may hold an older step's parameters than the block started "
        "from. Give the guard another tag (it then takes its own snapshot), "
        "or use SnapshotHook(store, loss=..., in_step_tag=%r)."
        % (tag, errors.names(conditional), tag)
      )
    return steps

  def check_unpinned(self, tag, what):
    slots = self.slots()
    if slots is None or tag not in slots.pinned():
      return
    writers = slots.in_step_ops(tag)
    if writers:
      by = (
        "train op %s writes in each of its runs (snapshot_before), so the "
        "block's steps would overwrite the %s's snapshot"
        % (errors.names([op.name for op in writers]), what)
      )
    else:
      by = (
        "in-graph ops write (store.slots.pin: an average, Lookahead's slow "
        "weights, a target network): a snapshot there would replace what they "
        "keep, and they could overwrite it"
      )
    raise ValueError(
      "%s(tag=%r): that tag is pinned to slot %d, which %s. Give the %s "
      "another tag (the default %r), which takes a snapshot of its own."
      % (what, tag, slots.slot_of(tag), by, what, what)
    )

  def new_attempt(self, use):
    return _SessionRuns(use)

  # -- a trial's metric --------------------------------------------------------------

  def check_metric(self, metric, feed_dict):
    if metric is not None:
      check_graph(tf.nest.flatten(metric), self.store.graph)

  def evaluate(self, metric, feed_dict):
    session = self.store.engine.session(self.session, "trial")
    return session.run(metric, feed_dict=feed_dict)


class _SessionRuns(runner.AttemptSteps):
  """One attempt's `session.run`s, and its in-step snapshot (see module doc).

  Args:
    use: The guard's use (`attempts.Use`) the attempt belongs to.
  """

  def __init__(self, use):
    self._use = use
    self._owed = bool(use.in_steps)  # the snapshot is still to be taken
    self._counts = None  # the in-step copy counts at the attempt's snapshot

  def run(self, fetches, args, kwargs):
    return self._session_run(fetches, *args, **kwargs)

  def _session_run(
    self, fetches, feed_dict=None, options=None, run_metadata=None
  ):
    use = self._use
    use.store.engine.session(use.session, "guard.run")  # checks it
    # As given, not the raw session: a MonitoredSession's hooks see the step.
    session = (
      use.session if use.session is not None else tf.get_default_session()
    )
    counts = self._snapshot_for(fetches)
    result, watched, counted = session.run(
      (fetches, use.tensors, counts or []),
      feed_dict=feed_dict,
      options=options,
      run_metadata=run_metadata,
    )
    if counts:
      self._counts = counted
    return result, [t.name for t in use.tensors], watched

  def check_allowed(self):
    if self._owed:
      self.refused = ValueError(
        "guard.check(): the guard of tag %r takes its snapshot in the "
        "block's first guard.run (train op %s snapshots under that tag in "
        "its run), and this block ran no step through guard.run, so the "
        "guard cannot tell what the slot holds and cannot roll back. Run "
        "the step as guard.run(train_op, feed_dict), then check; or give the "
        "guard another tag, so that it snapshots on entry."
        % (self._use.tag, self._train_ops())
      )
      raise self.refused

  def before_rollback(self, exc):
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
        "that it snapshots on entry." % (self._use.tag, self._train_ops())
      ) from exc
    self._check_counts(exc)

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

    Raises:
      ValueError: A second run of such a train op in the attempt.
    """
    use = self._use
    if not use.in_steps:
      return None
    fetched = in_step.fetched(
      fetches, use.store.graph, [e.train_op for e in use.in_steps]
    )
    if fetched and not self._owed:
      self.refused = ValueError(
        "guard.run(): this is the second run of %s in the guarded block; it "
        "snapshots under the guard's tag %r in its run, which would replace "
        "the snapshot the guard rolls back to. Run it once per guarded block "
        "(one step per block), or run a train op built without "
        "snapshot_before() for the other steps." % (fetched[0].name, use.tag)
      )
      raise self.refused
    if not self._owed:
      return None
    if not fetched:
      use.store.snapshot(use.tag, session=use.session)
    self._owed = False
    return [
      e.counted if e.train_op in fetched else e.count for e in use.in_steps
    ]

  def _check_counts(self, exc):
    """Raises if an in-step train op wrote the slot since the guard's snapshot."""
    use = self._use
    if not use.in_steps or self._counts is None:
      return  # no in-step tag, or the first run failed: nothing ran after it
    now = use.store.engine.session(use.session, "guard").run(
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


def check_graph(tensors, graph):
  """Refuses tensors of another graph than `graph` (the store's).

  Raises:
    GraphMismatchError: One of `tensors` belongs to another graph.
  """
  for t in tensors:
    if hasattr(t, "graph"):  # a metric may hold names as well as tensors
      checks.same_graph(
        t, graph, t.name, fix="Pass tensors of the store's graph (store.graph)."
      )
