"""Two processes building a disk store over one spill path: one store, always.

Two workers given the same `spill_path` race to build their stores
(`tests/spill_race.py`): in every round exactly one store is built, and the
other is refused when it is built, with the clear `SnapshotFileError`; the
file then holds the built store's snapshot, bit for bit. Before, both were
often built (each created the file and renamed it into place, so each locked
a file of its own), and the loser's background writes failed later.
"""

import numpy as np

import snapstore
from tests import spill_race

ROUNDS = 20
REFUSAL = "is open for writing by another process (a running store)"


def check_race(engine, directory):
  """Runs the race on `engine`; asserts one store built per round (module doc)."""
  outcomes = spill_race.race(engine, directory, ROUNDS)
  assert sorted(outcomes) == list(range(ROUNDS)), outcomes
  for round_, seen in sorted(outcomes.items()):
    kinds = sorted(outcome for _, outcome, _ in seen)
    assert kinds == ["built", "refused"], (round_, seen)
    (winner,) = [index for index, outcome, _ in seen if outcome == "built"]
    (message,) = [m for _, outcome, m in seen if outcome == "refused"]
    path = spill_race.path(directory, round_)
    assert message == (
      "%s %s; close that store first, or read its snapshots through it."
      % (path, REFUSAL)
    ), (round_, message)
    with snapstore.open_spill(path) as spill:
      assert [e.tag for e in spill.entries()] == ["from_%d" % winner], round_
      held = spill.read("from_%d" % winner)["v"]
    assert held.tobytes() == spill_race.value(winner).tobytes(), round_
    assert held.dtype == np.float32


def test_one_of_two_racing_stores_is_built_every_time(tmp_path):
  check_race("graph", str(tmp_path))


def test_an_empty_file_another_creator_holds_is_refused(tmp_path):
  # Another process creating the store's file holds the empty file there
  # locked until its rename replaces it (a descriptor of this process
  # conflicts with the store's own as another process's would).
  import fcntl  # pylint: disable=g-import-not-at-top

  from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

  path = str(tmp_path / "spill.h5")
  with open(path, "wb") as held:
    fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    graph = tf.Graph()
    with graph.as_default():
      v = tf.Variable(spill_race.value(0), name="v")
      try:
        snapstore.SnapshotStore(
          var_list=[v], mode="disk", memory_budget=0, spill_path=path
        )
      except snapstore.SnapshotFileError as e:
        assert str(e) == (
          "%s %s; close that store first, or read its snapshots through it."
          % (path, REFUSAL)
        )
      else:
        raise AssertionError("a store was built over a file being created")
    assert held.tell() == 0 and not (tmp_path / "spill.h5").read_bytes()
