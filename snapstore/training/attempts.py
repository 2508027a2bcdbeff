"""A guard's attempts: running the block, rolling back, trying again.

A use of a guard (a `with` block, or a `for` loop over it) is a `Use`: the
guard's settings and the record of its attempts. Each run of the block is an
`Attempt`, a context manager:

- the block ends normally: the attempt is "ok", and the use is over;
- the block raises an exception of a `catch` type (including the
  `NonFiniteError` of a watched value): the store's variables are restored
  from the use's snapshot, then the next attempt runs if any is left; after
  the last one the exception is re-raised (`reraise=True`) or swallowed
  (`failed` tells);
- any other exception (KeyboardInterrupt, a type outside `catch`, or what the
  guard refused because it could not vouch for the block) propagates at
  once, without a rollback.

An attempt runs its steps through the store engine's runner (`runner.py`)
and checks what they watch here, the same way on every engine.

    use = Use(store, session, runner, tensors, picker, catch, reraise,
              retries, tag, in_steps)
    with Attempt(use, 0, last=True) as attempt:
      attempt.run(train_op, feed)
"""

import numpy as np

from snapstore import errors
from snapstore.training import ps_joins


class Use(object):
  """One use of a guard (a `with` block or a `for` loop): settings and record.

  Attributes:
    store, session, catch, reraise, retries: The guard's.
    runner: The store engine's `runner.Runner`.
    tensors: The tensors each step fetches and checks (graph mode), or [].
    picker: What each step's result is checked for (eagerly), or None.
    tag: The tag the use snapshots under.
    in_steps: The `InStep`s of train ops snapshotting under `tag` (graph
      mode).
    active: The attempt running now, or None.
    failures: The exceptions of the failed attempts.
    failed: Whether the last attempt failed too.
  """

  def __init__(
    self,
    store,
    session,
    runner,
    tensors,
    picker,
    catch,
    reraise,
    retries,
    tag,
    in_steps,
  ):
    self.store = store
    self.session = session
    self.runner = runner
    self.tensors = tensors
    self.picker = picker
    self.catch = catch
    self.reraise = reraise
    self.retries = retries
    self.tag = tag
    self.in_steps = in_steps
    self.active = None
    self.failures = []
    self.failed = False


class Attempt(object):
  """One run of a guarded block (see module doc); it owns the attempt's state.

  Attributes:
    number: 0 for the first attempt, 1 for the first retry, ...
    last: Whether no attempt follows this one.
    outcome: "ok" or "failed" once the block has run, else None.
  """

  def __init__(self, use, number, last):
    self._use = use
    self.number = number
    self.last = last
    self.outcome = None
    self._steps = use.runner.new_attempt(use)

  def run(self, fetches, *args, **kwargs):
    """Runs and checks a step; see `Guard.run`."""
    if self._use.active is not self:
      raise RuntimeError("attempt.run() runs inside `with attempt:`.")
    result, names, values = self._steps.run(fetches, args, kwargs)
    self._check(names, values)
    return result

  def check(self, *values):
    """See `Guard.check`."""
    self._steps.check_allowed()
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
    if not isinstance(exc, use.catch) or exc is self._steps.refused:
      return False
    use.failures.append(exc)
    self._steps.before_rollback(exc)
    ps_joins.roll_back(use.store, use.tag, use.session, exc)
    if not self.last:
      return True
    use.failed = True
    return not use.reraise

  def _check(self, names, values):
    """Fails the attempt if a value is NaN or infinite.

    Raises:
      TypeError: A value that is not a float.
      NonFiniteError: A value has a NaN or infinite element.
    """
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


def _name(name):
  if ":" in name:
    return "Watched tensor %s" % name
  return name[:1].upper() + name[1:]  # keeps the case of keys: result['Loss']


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
