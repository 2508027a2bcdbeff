"""The one choice of a guard's or trial's engine part, by the store's engine.

    runner = runner_for(store, session, "Guard")   # a GraphRunner or EagerRunner

Nothing else in the guards and trials asks which engine a store runs on;
they call the runner (`runner.py`).
"""

from snapstore.training import eager_runner
from snapstore.training import graph_runner

# {store.engine.name: the Runner class serving that engine}
RUNNERS = {
  graph_runner.GraphRunner.engine: graph_runner.GraphRunner,
  eager_runner.EagerRunner.engine: eager_runner.EagerRunner,
}


def runner_for(store, session, what):
  """A new runner of `store`'s engine, for one guard or trial.

  Args:
    store: The guarded store.
    session: The session the guard or trial was given, or None.
    what: "Guard" or "Trial", for messages.

  Raises:
    TypeError: `session` given for an engine without sessions.
  """
  return RUNNERS[store.engine.name](store, session, what)
