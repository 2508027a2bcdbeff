"""Two processes racing to build a disk store over one spill path.

`race(engine, directory, rounds)` starts two processes (spawned: each imports
TensorFlow afresh, in graph mode or eagerly) that, in each round, wait at a
barrier and then build a disk-mode store over the same new path, as two
workers given one `spill_path` do. Odd rounds start from an empty file (what
`tempfile.mkstemp` gives), even ones from no file. The one whose store was
built takes a snapshot of its own values, waits until the other has tried
(so that its `close()` cannot let the other in), and closes its store.

    outcomes = race("graph", tmp_dir, rounds=20)
    # {round: [(index, "built" | "refused" | "error", message), ...]}

A store over one variable, `v` = [index, index + 0.5, -0.0], so the file
tells whose snapshot it holds.
"""

import multiprocessing
import os
import queue
import time

_TIMEOUT = 180  # seconds for a whole race, TensorFlow's import included


def value(index):
  import numpy as np  # pylint: disable=g-import-not-at-top

  return np.array([index, index + 0.5, -0.0], np.float32)


def path(directory, round_):
  return os.path.join(directory, "race_%d.h5" % round_)


def _contender(engine, directory, rounds, index, barrier, results):
  """One process of the race (module doc); reports on `results`."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  if engine == "graph":
    tf.disable_v2_behavior()
    graph = tf.Graph()
    with graph.as_default():
      v = tf.Variable(value(index), name="v")
    session = tf.Session(graph=graph)
    session.run(v.initializer)
  else:
    import tensorflow as tf2  # pylint: disable=g-import-not-at-top

    graph, session = None, None
    v = tf2.Variable(value(index), name="v")

  def build(round_):
    options = dict(
      var_list=[v],
      mode="disk",
      memory_budget=0,
      spill_path=path(directory, round_),
    )
    if graph is None:
      return snapstore.SnapshotStore(**options)
    with graph.as_default():
      return snapstore.SnapshotStore(**options)

  for round_ in range(rounds):
    barrier.wait(_TIMEOUT)
    store = None
    try:
      store = build(round_)
    except snapstore.SnapshotFileError as e:
      results.put((round_, index, "refused", str(e)))
    except Exception as e:  # pylint: disable=broad-except
      results.put((round_, index, "error", "%s: %s" % (type(e).__name__, e)))
    barrier.wait(_TIMEOUT)  # both have tried: a close cannot let the other in
    if store is None:
      continue
    try:
      store.snapshot("from_%d" % index, session=session)
      store.close()
      results.put((round_, index, "built", ""))
    except Exception as e:  # pylint: disable=broad-except
      results.put((round_, index, "error", "%s: %s" % (type(e).__name__, e)))


def race(engine, directory, rounds):
  """Runs the race (module doc); returns {round: [(index, outcome, message)]}.

  Raises:
    AssertionError: A process failed or the race took more than `_TIMEOUT`.
  """
  for round_ in range(1, rounds, 2):
    open(path(directory, round_), "wb").close()  # an empty file
  context = multiprocessing.get_context("spawn")
  barrier = context.Barrier(2)
  results = context.Queue()
  procs = [
    context.Process(
      target=_contender,
      args=(engine, directory, rounds, index, barrier, results),
      daemon=True,
    )
    for index in range(2)
  ]
  for proc in procs:
    proc.start()
  outcomes, deadline, left = {}, time.time() + _TIMEOUT, 2 * rounds
  try:
    while left:
      try:
        round_, index, outcome, message = results.get(timeout=1)
      except queue.Empty:
        if time.time() > deadline or any(p.exitcode for p in procs):
          raise AssertionError(
            "the race did not finish (exit codes %s); outcomes so far: %s"
            % ([p.exitcode for p in procs], outcomes)
          )
        continue
      outcomes.setdefault(round_, []).append((index, outcome, message))
      left -= 1
  finally:
    for proc in procs:
      proc.join(30)
      if proc.is_alive():
        proc.kill()
        proc.join()
  return outcomes
