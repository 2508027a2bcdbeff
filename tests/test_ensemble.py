"""Ensembles of separately written checkpoints, and the Ensemble API.

The checkpoints of the first two test classes are written by three separate
processes (`tests/checkpoint_writer.py`), one under another scope and one in
the V1 format, as three training runs would write them.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import parameterized
import numpy as np

import snapstore
from snapstore._tf import tf
from snapstore.demo import make_data
from tests import checkpoint_writer
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Per member: its tag, w, classifier seed, scope and format in the writing
# process, and how it is loaded (member 3 by its directory's latest checkpoint).
MEMBERS = (
  dict(tag="w1", w=1.0, seed=1, scope="net", format="v2", load={}),
  dict(
    tag="w2",
    w=2.0,
    seed=2,
    scope="member_2",
    format="v1",
    load={"strip_prefix": "member_2"},
  ),
  dict(
    tag="w3", w=3.0, seed=3, scope="net", format="v2", load={}, directory=True
  ),
)
TAGS = [m["tag"] for m in MEMBERS]
_written = {}  # tag -> {"linear": path, "classifier": path}
_workdir = None


def setUpModule():  # pylint: disable=invalid-name
  global _workdir
  _workdir = tempfile.mkdtemp(prefix="snapstore_ensemble_test_")
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  processes = []
  for m in MEMBERS:  # in parallel: one process per member
    args = [
      sys.executable,
      "-m",
      "tests.checkpoint_writer",
      "--dir",
      os.path.join(_workdir, m["tag"]),
      "--w",
      str(m["w"]),
      "--seed",
      str(m["seed"]),
      "--scope",
      m["scope"],
      "--format",
      m["format"],
    ]
    processes.append(
      (
        m,
        subprocess.Popen(
          args,
          cwd=ROOT,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          universal_newlines=True,
        ),
      )
    )
  for m, process in processes:
    out, err = process.communicate(timeout=300)
    if process.returncode != 0:
      raise RuntimeError(
        "checkpoint_writer failed for %s:\n%s" % (m["tag"], err)
      )
    paths = json.loads(out.strip().splitlines()[-1])
    if m.get("directory"):
      paths = dict((k, os.path.dirname(p)) for k, p in paths.items())
    _written[m["tag"]] = paths


def tearDownModule():  # pylint: disable=invalid-name
  shutil.rmtree(_workdir, ignore_errors=True)


class SeparateProcessesTest(tf.test.TestCase, parameterized.TestCase):
  """y = x + w with w = 1, 2, 3 from three processes, in one graph."""

  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_three_checkpoints_give_11_12_13_and_mean_12(
    self, mode, use_resource
  ):
    graph = tf.Graph()
    with graph.as_default():
      x, y, w = checkpoint_writer.build_linear("net", use_resource)
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=3)
      ensemble = snapstore.Ensemble(store, y, tags=TAGS, combine="mean")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with helpers.assert_no_new_ops(graph), tf.Session(graph=graph) as sess:
      sess.run(init)
      w.load(100.0, sess)
      live = sess.run(w)
      for i, m in enumerate(MEMBERS):
        tag = store.files.load_checkpoint(
          _written[m["tag"]]["linear"], tag=m["tag"], session=sess, **m["load"]
        )
        self.assertEqual(tag, m["tag"])
        # No load overwrote the live variable or an earlier member.
        helpers.assert_bit_equal(sess.run(w), live, "live w")
        for earlier in MEMBERS[: i + 1]:
          helpers.assert_bit_equal(
            store.arrays(earlier["tag"], session=sess)["w"],
            np.float32(earlier["w"]),
            earlier["tag"],
          )
      runs = helpers.CountingSession(sess, with_callables=False)
      result = ensemble.evaluate({x: [10.0]}, session=runs)
      if mode == "device":
        self.assertEqual(runs.runs, 1)  # every member in one session.run
      self.assertEqual(list(result.members), TAGS)
      for m in MEMBERS:
        self.assertAllEqual(result.members[m["tag"]], [10.0 + m["w"]])
      self.assertAllEqual(result.combined, [12.0])
      # Member by member through the store gives the same.
      for m in MEMBERS:
        self.assertAllEqual(
          store.evaluate_with(y, {x: [10.0]}, tag=m["tag"], session=sess),
          result.members[m["tag"]],
        )
      helpers.assert_bit_equal(sess.run(w), live, "live w after the ensemble")
      self.assertAllEqual(sess.run(y, {x: [10.0]}), [110.0])
      for m in MEMBERS:
        helpers.assert_bit_equal(
          store.arrays(m["tag"], session=sess)["w"],
          np.float32(m["w"]),
          m["tag"],
        )
      self.assertEqual(ensemble.device_nbytes, 3 * 4 if mode == "device" else 0)
      self.assertEqual(ensemble.host_nbytes, 3 * 4 if mode == "host" else 0)
    # Device members went with their session; host members are arrays.
    self.assertEqual(ensemble.device_nbytes, 0)
    self.assertEqual(ensemble.host_nbytes, 3 * 4 if mode == "host" else 0)

  def test_nbytes_count_members_where_they_are(self):
    graph = tf.Graph()
    with graph.as_default():
      _, y, _ = checkpoint_writer.build_linear("net")
      store = snapstore.SnapshotStore(
        scope="net",
        mode="disk",
        memory_budget=4,  # one member in memory
        spill_path=os.path.join(self.get_temp_dir(), "members.h5"),
      )
      ensemble = snapstore.Ensemble(store, y, tags=TAGS)
    self.assertEqual(ensemble.host_nbytes, 0)  # no member held yet
    with store:
      for m in MEMBERS:
        store.load_arrays({"w": np.float32(m["w"])}, tag=m["tag"])
      store.files.flush()
      self.assertEqual(
        [store.files.tier(t) for t in TAGS], ["file", "file", "host"]
      )
      self.assertEqual(ensemble.host_nbytes, 4)
      self.assertEqual(ensemble.device_nbytes, 0)


class ClassifierTest(tf.test.TestCase, parameterized.TestCase):
  """Three separately trained classifiers: vote and mean against each run alone."""

  def _reference(self, m, test_x):
    """Member m's probabilities from its checkpoint restored into its own graph."""
    graph = tf.Graph()
    with graph.as_default():
      x, _, probs = checkpoint_writer.build_classifier(m["scope"])
      saver = tf.train.Saver()
    path = _written[m["tag"]]["classifier"]
    with tf.Session(graph=graph) as sess:
      saver.restore(
        sess, tf.train.latest_checkpoint(path) if m.get("directory") else path
      )
      return sess.run(probs, {x: test_x})

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_vote_and_mean_match_members_evaluated_alone(self, mode):
    _, (test_x, test_y) = make_data()
    graph = tf.Graph()
    with graph.as_default():
      x, logits, probs = checkpoint_writer.build_classifier("net")
      store = snapstore.SnapshotStore(scope="net", mode=mode, max_to_keep=3)
      ensemble = snapstore.Ensemble(
        store,
        {"probs": probs, "label": tf.argmax(logits, 1)},
        tags=TAGS,
        combine={"probs": "mean", "label": "vote"},
      )
      score_vote = snapstore.Ensemble(store, probs, tags=TAGS, combine="vote")
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    graph.finalize()
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      live = sess.run(list(store.variables.values()))
      for m in MEMBERS:  # the checkpoints hold Adam's slots and the step too
        store.files.load_checkpoint(
          _written[m["tag"]]["classifier"],
          tag=m["tag"],
          allow_extra=True,
          session=sess,
          **m["load"],
        )
      runs = helpers.CountingSession(sess, with_callables=False)
      result = ensemble.evaluate({x: test_x}, session=runs)
      votes_of_scores = score_vote.evaluate({x: test_x}, session=sess).combined
      for before, after in zip(live, sess.run(list(store.variables.values()))):
        helpers.assert_bit_equal(after, before, "live parameters")
    if mode == "device":
      self.assertEqual(runs.runs, 1)

    references = np.stack([self._reference(m, test_x) for m in MEMBERS])
    for m, reference in zip(MEMBERS, references):
      self.assertAllClose(
        result.members[m["tag"]]["probs"], reference, rtol=1e-6, atol=1e-7
      )
      self.assertAllEqual(
        result.members[m["tag"]]["label"], reference.argmax(1)
      )
    self.assertAllClose(
      result.combined["probs"], references.mean(axis=0), rtol=1e-6, atol=1e-7
    )
    labels = references.argmax(axis=2)  # [member, example]
    majority = np.array(
      [
        np.bincount(labels[:, i], minlength=4).argmax()
        for i in range(labels.shape[1])
      ]
    )
    self.assertAllEqual(result.combined["label"], majority)
    self.assertAllEqual(votes_of_scores, majority)
    # The members disagree somewhere, so the vote is not one member's labels.
    for member_labels in labels:
      self.assertTrue(np.any(member_labels != majority))
    # They are real classifiers: better than chance (4 classes), as is the vote.
    self.assertGreater(np.mean(majority == test_y), 0.6)


class _EnsembleCase(tf.test.TestCase, parameterized.TestCase):
  """A two-layer model under "net" and three snapshots of random parameters."""

  def _setup(self, mode, use_resource=False, tags=TAGS, build_ensembles=None):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.x = tf.placeholder(tf.float32, [None, 3])
      self.hidden, self.logits = helpers.dense_net(
        self.x,
        use_resource=use_resource,
        hidden=5,
        outputs=4,
        activation=tf.nn.tanh,
        with_hidden=True,
      )
      self.store = snapstore.SnapshotStore(
        scope="net", mode=mode, max_to_keep=3
      )
      self.ensembles = build_ensembles() if build_ensembles else None
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    self.graph.finalize()
    self.sess = tf.Session(graph=self.graph)
    self.addCleanup(self.sess.close)
    self.sess.run(init)
    rng = np.random.RandomState(0)
    self.weights = {}
    for tag in tags:
      arrays = dict(
        (k, rng.randn(*v.shape.as_list()).astype(np.float32))
        for k, v in self.store.variables.items()
      )
      self.store.load_arrays(arrays, tag=tag, session=self.sess)
      self.weights[tag] = arrays
    self.live = self.sess.run(list(self.store.variables.values()))
    self.feed = {self.x: rng.randn(7, 3).astype(np.float32)}

  def numpy_logits(self, tag, x=None):
    return helpers.dense_net_numpy(
      self.feed[self.x], self.weights[tag], activation=np.tanh
    )

  def assertLiveUnchanged(self):
    for before, after in zip(
      self.live, self.sess.run(list(self.store.variables.values()))
    ):
      helpers.assert_bit_equal(after, before, "live parameters")


class CombineTest(_EnsembleCase):
  @parameterized.named_parameters(*helpers.mode_and_kind_cases())
  def test_mean_vote_and_function(self, mode, use_resource):
    def build():
      return [
        snapstore.Ensemble(self.store, self.logits, combine="mean"),
        snapstore.Ensemble(self.store, self.logits, combine="vote"),
        snapstore.Ensemble(
          self.store,
          self.logits,
          tags=["w3", "w1"],
          combine=lambda s: np.max(s, axis=0),
        ),
      ]

    self._setup(mode, use_resource, build_ensembles=build)
    with helpers.assert_no_new_ops(self.graph):
      mean, vote, biggest = [
        e.evaluate(self.feed, session=self.sess) for e in self.ensembles
      ]
      expected = np.stack([self.numpy_logits(t) for t in TAGS])
      self.assertEqual(
        list(mean.members), TAGS
      )  # tags=None: every snapshot, oldest first
      for tag, value in zip(TAGS, expected):
        self.assertAllClose(mean.members[tag], value, rtol=1e-5, atol=1e-6)
      self.assertAllClose(
        mean.combined, expected.mean(axis=0), rtol=1e-5, atol=1e-6
      )
      labels = expected.argmax(axis=2)
      self.assertAllEqual(
        vote.combined,
        [
          np.bincount(labels[:, i], minlength=4).argmax()
          for i in range(labels.shape[1])
        ],
      )
      self.assertEqual(list(biggest.members), ["w3", "w1"])
      self.assertAllClose(
        biggest.combined,
        np.maximum(expected[2], expected[0]),
        rtol=1e-5,
        atol=1e-6,
      )
      self.assertLiveUnchanged()

  def test_vote_counts_and_ties(self):
    labels = np.array([[0, 2, 1, 3], [2, 2, 3, 1], [2, 0, 3, 1], [0, 1, 1, 2]])
    # Column 0: 0,2,2,0 tie -> 0; column 1: 2,2,0,1 -> 2; column 2: 1,3,3,1
    # tie -> 1; column 3: 3,1,1,2 -> 1.
    self.assertAllEqual(snapstore.ensemble.vote(labels), [0, 2, 1, 1])
    scores = np.eye(4)[labels]  # one-hot scores vote like their labels
    self.assertAllEqual(snapstore.ensemble.vote(scores), [0, 2, 1, 1])
    self.assertEqual(snapstore.ensemble.vote(labels).dtype, np.int64)
    with self.assertRaisesRegex(
      ValueError, r"vote needs class labels >= 0, got -1"
    ):
      snapstore.ensemble.vote(np.array([[0, -1]]))
    with self.assertRaisesRegex(ValueError, r"got one float per member"):
      snapstore.ensemble.vote(np.array([0.5, 0.7]))
    with self.assertRaisesRegex(
      ValueError, r"integer labels or float scores, got dtype"
    ):
      snapstore.ensemble.vote(np.array([["a"], ["b"]]))

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_fed_intermediate_tensor_reaches_every_member(self, mode):
    def build():
      return [snapstore.Ensemble(self.store, self.logits)]

    self._setup(mode, build_ensembles=build)
    hidden = np.ones([2, 5], np.float32)
    result = self.ensembles[0].evaluate(
      {self.hidden: hidden}, session=self.sess
    )
    for tag in TAGS:
      w = self.weights[tag]
      self.assertAllClose(
        result.members[tag],
        hidden.dot(w["dense_1/kernel"]) + w["dense_1/bias"],
        rtol=1e-5,
        atol=1e-6,
      )
    self.assertLiveUnchanged()


class RunPathsTest(_EnsembleCase):
  def test_device_members_run_in_one_run_and_rewire_false_swaps(self):
    def build():
      return [
        snapstore.Ensemble(self.store, self.logits),
        snapstore.Ensemble(self.store, self.logits, rewire=False),
      ]

    self._setup("device", build_ensembles=build)
    together, apart = self.ensembles
    self.assertTrue(together.rewired)
    self.assertFalse(apart.rewired)
    counting = helpers.CountingSession(self.sess, with_callables=False)
    one = together.evaluate(self.feed, session=counting)
    self.assertEqual(counting.runs, 1)
    counting.runs = 0
    many = apart.evaluate(self.feed, session=counting)
    self.assertGreaterEqual(counting.runs, 3)  # at least one run per member
    for tag in TAGS:
      helpers.assert_bit_equal(one.members[tag], many.members[tag], tag)
    self.assertLiveUnchanged()
    self.assertEqual(together.device_nbytes, 3 * self.store.param_nbytes)

  def test_store_evaluate_each_without_rewired_copies_swaps_each(self):
    self._setup(
      "device"
    )  # no Ensemble built: the outputs have no rewired copies
    counting = helpers.CountingSession(self.sess, with_callables=False)
    values = self.store.evaluate_each(
      self.logits, self.feed, tags=TAGS[::-1], session=counting
    )
    self.assertEqual(list(values), TAGS[::-1])
    self.assertGreaterEqual(counting.runs, 3)
    for tag in TAGS:
      helpers.assert_bit_equal(
        values[tag],
        self.store.evaluate_with(
          self.logits, self.feed, tag=tag, session=self.sess
        ),
        tag,
      )
    self.assertLiveUnchanged()
    with self.assertRaisesRegex(
      snapstore.UnknownTagError, r"No snapshot tagged 'z'"
    ):
      self.store.evaluate_each(
        self.logits, self.feed, tags=["z"], session=self.sess
      )

  def test_unrewirable_outputs_name_the_way_out(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.placeholder(tf.float32, [])
      with tf.variable_scope("net"):
        w = tf.get_variable("w", [])
      out = tf.while_loop(
        lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + w * x), (0, 0.0)
      )[1]
      store = snapstore.SnapshotStore(scope="net", mode="device", max_to_keep=2)
      with helpers.assert_raises_naming(
        self,
        snapstore.RewireError,
        r"part of a tf\.while_loop",
        r"Ensemble\(\.\.\., rewire=False\)",
      ):
        snapstore.Ensemble(store, out)
      ensemble = snapstore.Ensemble(store, out, rewire=False)
      init = [
        tf.global_variables_initializer(),
        tf.local_variables_initializer(),
      ]
    with tf.Session(graph=graph) as sess:
      sess.run(init)
      for tag, value in (("a", 1.0), ("b", 2.0)):
        w.load(value, sess)
        store.snapshot(tag, session=sess)
      w.load(5.0, sess)
      result = ensemble.evaluate({x: 1.0}, session=sess)
      self.assertAllClose(result.members, {"a": 3.0, "b": 6.0})
      self.assertAllClose(result.combined, 4.5)
      self.assertEqual(sess.run(w), 5.0)

  def test_rewire_on_a_host_store(self):
    def build():
      with self.assertRaisesRegex(
        snapstore.ModeError, r"rewire=True\) runs the members from device slots"
      ):
        snapstore.Ensemble(self.store, self.logits, rewire=True)

    self._setup("host", build_ensembles=build)


class EnsembleErrorsTest(_EnsembleCase):
  def test_bad_arguments(self):
    def build():
      other = tf.Graph()
      with other.as_default():
        foreign = tf.constant(1.0)
      cases = [
        (
          TypeError,
          r"outputs must be tensors .*got <tf\.Operation",
          dict(outputs=self.logits.op),
        ),
        (ValueError, r"needs at least one output tensor", dict(outputs=[])),
        (
          snapstore.GraphMismatchError,
          r"Const:0 belongs to another graph",
          dict(outputs=foreign),
        ),
        (
          ValueError,
          r"Invalid combine 'median'; must be one of mean, vote",
          dict(combine="median"),
        ),
        (
          TypeError,
          r"combine must be 'mean', 'vote' or a function, got 3",
          dict(combine=3),
        ),
        (
          ValueError,
          r"combine must be .* a structure like outputs",
          dict(outputs={"a": self.logits}, combine={"b": "mean"}),
        ),
        (
          ValueError,
          r"a float scalar holds no class scores",
          dict(outputs=tf.reduce_sum(self.logits), combine="vote"),
        ),
        (ValueError, r"tags is empty", dict(tags=[])),
        (
          ValueError,
          r"tags names 'w1' more than once",
          dict(tags=["w1", "w1"]),
        ),
        (
          TypeError,
          r"tags must be ints or non-empty strings, got None",
          dict(tags=["w1", None]),
        ),
        (
          TypeError,
          r"A tag must be an int or a non-empty string, got 1\.5",
          dict(tags=[1.5]),
        ),
        (TypeError, r"tags must be a list of tags, got 'w1'", dict(tags="w1")),
      ]
      for error, message, kwargs in cases:
        kwargs.setdefault("outputs", self.logits)
        with self.assertRaisesRegex(error, message):
          snapstore.Ensemble(self.store, **kwargs)

    self._setup("device", build_ensembles=build)

  @parameterized.named_parameters(("device", "device"), ("host", "host"))
  def test_unknown_member_at_evaluate(self, mode):
    def build():
      return [snapstore.Ensemble(self.store, self.logits, tags=["w1", "gone"])]

    self._setup(mode, build_ensembles=build)
    with self.assertRaisesRegex(
      snapstore.UnknownTagError, r"No snapshot tagged 'gone'.*'w1', 'w2', 'w3'"
    ):
      self.ensembles[0].evaluate(self.feed, session=self.sess)
    self.assertLiveUnchanged()

  def test_no_snapshots_at_all(self):
    def build():
      return [snapstore.Ensemble(self.store, self.logits)]

    self._setup("host", tags=(), build_ensembles=build)
    with self.assertRaisesRegex(
      snapstore.UnknownTagError, r"holds no snapshots yet; load the members"
    ):
      self.ensembles[0].evaluate(self.feed, session=self.sess)


if __name__ == "__main__":
  tf.test.main()
