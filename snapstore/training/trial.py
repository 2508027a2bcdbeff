"""`snapstore.Trial`: try an update, then keep it or roll it back by a criterion.

On entry a trial snapshots the store's variables and, with a `metric`,
evaluates it (`before`). The block makes its update. On exit the trial
keeps it or restores the snapshot, by the block's own decision or by
comparing the metric after the block (`after`) with `before`.

    with snapstore.Trial(store, metric=loss, feed_dict=held_out,
                         session=sess) as trial:
      sess.run(train_op, feed)
    print(trial.kept, trial.before, trial.after)

Eagerly the metric is a function of no arguments:

    with snapstore.Trial(
        store, metric=lambda: loss_fn(y_held, model(x_held))) as trial:
      train_step(x, y)
"""

import numpy as np

from snapstore import errors
from snapstore.training import nesting
from snapstore.training import ps_joins
from snapstore.training import runners


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

  Under parameter-server training (v2), the trial waits for the functions
  the block scheduled on the `ClusterCoordinator` before it evaluates the
  metric again or rolls back, and refuses to enter while functions
  scheduled before it may still run (see `ps_joins.py`).

  Args:
    store: The `SnapshotStore` whose variables are tried.
    metric: A tensor (or any fetches) to evaluate before and after the block;
      on an eager store, a function of no arguments returning the metric.
    feed_dict: The feed for `metric`, e.g. a held-out batch (graph mode).
    accept: A function `(before, after) -> bool`; needs `metric`.
    tag: The store tag of the trial's snapshot.
    session: As for the store's methods (graph mode).

  Raises:
    ValueError: `accept` without `metric`. On entry: a pinned tag; on an
      eager store over parameter-server variables (v2), functions scheduled
      on the `ClusterCoordinator` that may still be running.
    TypeError: A non-callable `accept`, or a bad `tag`; on an eager store, a
      `metric` that is not callable, a `feed_dict` or a `session`.
    GraphMismatchError: A metric of another graph than the store's.

  Example:
    Eager: keep the block's update only if the held-out loss did not rise.

    ```python
    with snapstore.Trial(store, metric=lambda: float(loss_fn(y_held, model(x_held)))) as trial:
      train_step(x, y)
    if not trial.kept:
      opt.learning_rate.assign(opt.learning_rate * 0.5)
    ```
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
    runner = runners.runner_for(store, session, "Trial")
    if accept is not None and metric is None:
      raise ValueError(
        "accept=... compares the metric before and after the "
        "block; pass metric= too (or decide with trial.keep())."
      )
    if accept is not None and not callable(accept):
      raise TypeError(
        "accept must be a function (before, after) -> bool, got %r." % (accept,)
      )
    runner.check_metric(metric, feed_dict)
    self._runner = runner
    self._store = store
    self._metric = metric
    self._feed_dict = feed_dict
    self._accept = accept or _not_worse
    self._requested = self._tag = nesting.requested_tag(tag)
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
    own = nesting.own_tag(self._store, self._requested)
    self._runner.check_unpinned(own, "trial")
    self._tag = nesting.enter(self._store, own, self._session, "Trial")
    try:
      if self._metric is not None:
        self.before = self._evaluate()
    except BaseException:
      nesting.leave(self._store, self._tag)
      raise
    return self

  def __exit__(self, exc_type, exc, tb):
    try:
      return self._decide(exc)
    finally:
      nesting.leave(self._store, self._tag)

  def _decide(self, exc):
    if exc is not None:
      self._roll_back(exc)
      return False
    decision = self._decision
    if decision is None and self._metric is not None:
      failed = ps_joins.join_block(self._store, None)  # the block's steps first
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
    return self._runner.evaluate(self._metric, self._feed_dict)

  def _roll_back(self, exc):
    self.kept = False
    ps_joins.roll_back(self._store, self._tag, self._session, exc)


def _not_worse(before, after):
  """The default `accept`: `after` is finite and no element rose."""
  before, after = np.asarray(before), np.asarray(after)
  if not np.all(np.isfinite(after)):
    return False
  return bool(np.all(~np.isfinite(before) | (after <= before)))
