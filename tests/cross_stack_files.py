"""Writes snapshot files on this stack, or checks files that another stack wrote.

`tests/test_cross_stack.py` runs it with the Python of each TensorFlow stack
(TF 1.15 with numpy 1.18 and h5py 2; TF 2.x with numpy 2 and h5py 3):

    python tests/cross_stack_files.py write DIR
    python tests/cross_stack_files.py check DIR

`write` builds `helpers.Model` (float16/32/64, int32/64 and bool ref variables
under "net"), loads random bit patterns into it (NaN payloads, signed zeros,
infinities, denormals), and writes
  DIR/model.npz   `store.files.save_npz` of the snapshot of seed 1,
  DIR/spill.h5    a disk-mode store's spill file holding the snapshots of
                  seeds 1 and 2 under tags "a" and "b",
  DIR/writer.txt  the writer's stack and a digest of the values it loaded.
`check` recomputes the values with numpy alone from the same seeds (and checks
that its digest matches the writer's, so both sides loaded the same bits),
reads the files into a store of resource variables on this stack
(`load_npz`, `load_spill`) and through `open_spill`, restores each snapshot
into the variables and compares every value bit for bit with numpy's.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

import snapstore  # pylint: disable=g-import-not-at-top
from snapstore import _tf  # pylint: disable=g-import-not-at-top
from snapstore._tf import tf  # pylint: disable=g-import-not-at-top

from tests import helpers  # pylint: disable=g-import-not-at-top

tf.disable_v2_behavior()  # graph mode on TensorFlow 2.x

SEEDS = {"a": 1, "b": 2}


def expected(seed):
  """{key: array} that `Model.randomize(sess, seed)` loads, from numpy alone."""
  rng = np.random.RandomState(seed)
  return dict(
    (
      "v%d_%s" % (i, dtype.name),
      helpers.random_value(rng, [3, 5], dtype.as_numpy_dtype),
    )
    for i, dtype in enumerate(helpers.DTYPES)
  )


def digest(values):
  h = hashlib.sha256()
  for key in sorted(values):
    h.update(key.encode())
    h.update(np.ascontiguousarray(values[key]).tobytes())
  return h.hexdigest()


def write(directory):
  graph = tf.Graph()
  with graph.as_default():
    model = helpers.Model(use_resource=False)
    host = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=1)
    disk = snapstore.SnapshotStore(
      scope="net",
      mode="disk",
      memory_budget=0,
      spill_path=os.path.join(directory, "spill.h5"),
      name="disk",
    )
  with tf.Session(graph=graph) as sess, host, disk:
    helpers.init(sess)
    loaded = {}
    for tag, seed in sorted(SEEDS.items()):
      model.randomize(sess, seed)
      loaded[tag] = model.values(sess)
      helpers.assert_state(loaded[tag], expected(seed), "written %s" % tag)
      disk.snapshot(tag, session=sess)
      if tag == "a":
        host.files.save_npz(
          os.path.join(directory, "model.npz"),
          host.snapshot(session=sess),
          session=sess,
        )
    disk.files.flush()
  with open(os.path.join(directory, "writer.txt"), "w") as f:
    f.write(
      "%s\n%s\n" % (_tf.stack(), digest(loaded["a"]) + digest(loaded["b"]))
    )
  print("wrote on %s" % _tf.stack())


def check(directory):
  with open(os.path.join(directory, "writer.txt")) as f:
    writer, writer_digest = f.read().splitlines()
  want = dict((tag, expected(seed)) for tag, seed in SEEDS.items())
  assert digest(want["a"]) + digest(want["b"]) == writer_digest, (
    "numpy here draws other values from the seeds than the writer loaded"
  )
  spill = os.path.join(directory, "spill.h5")
  graph = tf.Graph()
  with graph.as_default():
    model = helpers.Model(use_resource=True)
    store = snapstore.SnapshotStore(scope="net", mode="host", max_to_keep=0)
  with tf.Session(graph=graph) as sess, store:
    helpers.init(sess)
    store.files.load_npz(
      os.path.join(directory, "model.npz"), tag="npz", session=sess
    )
    for tag in sorted(SEEDS):
      store.files.load_spill(spill, tag, tag=tag, session=sess)
    for tag, values in (("npz", want["a"]), ("a", want["a"]), ("b", want["b"])):
      model.randomize(sess, 99)  # the restore must change every variable back
      helpers.assert_state_differs(model.values(sess), values)
      store.restore(tag, session=sess)
      helpers.assert_state(model.values(sess), values, "restored %s" % tag)
  with snapstore.open_spill(spill) as f:
    for tag in sorted(SEEDS):
      helpers.assert_state(dict(f.read(tag)), want[tag], "open_spill %s" % tag)
  print(
    "checked npz and spill written on %s, here on %s" % (writer, _tf.stack())
  )


if __name__ == "__main__":
  command, path = sys.argv[1:]
  {"write": write, "check": check}[command](path)
