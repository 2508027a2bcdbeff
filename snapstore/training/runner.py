"""The engine's part of a guard or trial: the interface each engine's runner fills.

A guard runs and checks its block's steps, and a trial evaluates its metric,
in the way of the store's engine: in graph mode a step is a `session.run`
of fetches and the watched tensors (`graph_runner.py`); eagerly it is a call
of the step function, whose result is checked (`eager_runner.py`).
`runners.runner_for` picks the one for a store, once; `Guard`, `Trial` and
their attempts call it and never ask which engine runs.

A `Runner` serves one guard or trial; each attempt of a guard gets an
`AttemptSteps` of its own (`Runner.new_attempt`).

    runner = runners.runner_for(store, session, "Guard")
    tensors = runner.watch_tensors(loss, "watch_tensors")  # graph mode: [loss]
    steps = runner.new_attempt(use)                        # an attempts.Use
    result, names, values = steps.run(train_op, (feed,), {})
"""

import abc

from snapstore import errors


class Runner(abc.ABC):
  """One engine's part of one guard or trial.

  Args:
    store: The guarded store.
    session: The session the guard or trial was given, or None.
    what: "Guard" or "Trial", for messages.

  Raises:
    TypeError: `session` given for an engine without sessions.
  """

  # The engine it serves: the value of `store.engine.name` it is keyed by.
  engine = None
  # Guard's argument naming what to watch on this engine.
  watch_argument = None
  # The Guard method that the deprecated `Guard.call` is on this engine.
  call_means = None

  def __init__(self, store, session, what):
    del what
    self.store = store
    self.session = session

  # -- what a guard watches -----------------------------------------------------------

  @abc.abstractmethod
  def watch_tensors(self, value, argument):
    """The tensors `Guard(watch_tensors=value)` fetches with every step.

    Args:
      value: The argument, or None.
      argument: Its name as the user wrote it, for messages.

    Returns:
      A list of tensors ([] for None).

    Raises:
      TypeError: `value` is not what this engine watches.
    """

  @abc.abstractmethod
  def watch_result(self, value, argument):
    """What `Guard(watch_result=value)` picks of each step's result.

    Returns:
      An object with `pick(result) -> (names, values)`, or None.

    Raises:
      TypeError: `value` is not what this engine watches.
    """

  # -- a guard's tag -----------------------------------------------------------------

  def slots(self):
    """`store.slots`, or None for a store without device slots."""
    try:
      return self.store.slots
    except errors.ModeError:
      return None

  def in_steps(self, tag):
    """The in-step copies a guard of `tag` takes its snapshot with (graph mode).

    Returns:
      The `InStep` entries of the train ops snapshotting under `tag` in their
      run; [] on an engine without them.

    Raises:
      ValueError: One of them snapshots only when its loss is finite.
    """
    del tag
    return []

  @abc.abstractmethod
  def check_unpinned(self, tag, what):
    """Refuses a guard's or trial's `tag` pinned to a slot other code writes.

    Args:
      tag: The tag the guard or trial would snapshot under.
      what: "guard" or "trial", for messages.

    Raises:
      ValueError: `tag` is pinned.
    """

  @abc.abstractmethod
  def new_attempt(self, use):
    """The `AttemptSteps` of one attempt of the guard's use `use`."""

  # -- a trial's metric --------------------------------------------------------------

  @abc.abstractmethod
  def check_metric(self, metric, feed_dict):
    """Refuses a trial's `metric` and `feed_dict` this engine cannot evaluate.

    Raises:
      TypeError: Not this engine's form of a metric.
      GraphMismatchError: A metric of another graph than the store's.
    """

  @abc.abstractmethod
  def evaluate(self, metric, feed_dict):
    """The trial's `metric`, evaluated now, as numpy values."""


class AttemptSteps(object):
  """The steps of one attempt of a guard, run the engine's way.

  Attributes:
    refused: An error the attempt raised because the guard could not vouch
      for the block (it propagates without a rollback), or None.
  """

  refused = None

  def run(self, fetches, args, kwargs):
    """Runs one step.

    Returns:
      (what the step returned, names of the watched values, their values).
    """
    raise NotImplementedError

  def check_allowed(self):
    """Refuses `guard.check()` when the guard holds no snapshot yet."""

  def before_rollback(self, exc):
    """Refuses a rollback the guard cannot vouch for (raised from `exc`)."""
