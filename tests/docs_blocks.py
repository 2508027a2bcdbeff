"""Every Python block of README.md runs, or says in the README why it does not.

A marker on the line before each ```python block says what this test does
with it (the marker is an HTML comment, so the rendered README does not show
it):

  <!-- test: run -->              a complete program: run in a child process
  <!-- test: run eager -->        a complete eager program (TensorFlow 2.x):
                                  run with each Keras the stack has (tf-keras
                                  or Keras 2, and Keras 3); skipped on 1.15
  <!-- test: continues -->        appended to the program of the nearest run
                                  block above it in the same section
  <!-- test: setup               a fragment (it uses the reader's model,
  ...code...                      session, files): run in a child process
  -->                             after the hidden setup code the comment
                                  holds (indented as the comment's first
                                  line), which makes what the fragment uses
  <!-- test: setup eager          the same for an eager fragment (as `run
  ...code...                      eager`: each Keras, TensorFlow 2.x only)
  -->
  <!-- test: skip (reason) -->    not run, for the reason given (what makes
                                  running it impossible)

The rendered README shows none of these comments, so a setup is code the
reader never sees: the fragment stays as written. A fragment's `...` line
(one holding only `...`) stands for code of the reader's, and its setup
says which: the setup's own `...` lines (at its first column) split it; the
first part runs before the fragment, and each next part replaces the
fragment's next `...` line, indented as that line. A fragment and its setup
must have as many `...` lines. E.g. a graph-mode fragment that builds a
store, then has `...` for "start the session", then runs it, gets a setup
that builds the graph, then a line `...`, then `sess = tf.Session()` and the
initializers' run. (In a `run` program, `...` is Python's no-op statement.)
A setup makes every name the fragment uses, and calls
`tf.disable_v2_behavior()` for a graph-mode fragment; the fragment's checks
in `CHECKS` see the setup's names and the fragment's.

An unmarked block, a marker on no block, an unknown marker and a skip without
a reason fail `test_every_block_is_marked`. Every block, skipped ones
included, must compile, and the snapstore names it uses must exist
(`test_names_exist`: `snapstore.X`, `store.X`, `store.files.X`,
`store.slots.X` and the keyword arguments of their calls). Programs run with
the suite's Python, so on whichever stack the suite runs, and must set up
graph mode themselves (`tf.disable_v2_behavior()`): nothing is added to them
but the checks in `CHECKS` below, after their last line (and a fragment's
setup before it). Every fragment program has a check in `CHECKS`
(`test_fragments_are_checked`): a fragment that runs but whose result is not
looked at tests only that it does not raise.
"""

import ast
import collections
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from absl.testing import parameterized

from snapstore import _tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Run after a program's last block, in its namespace: what its result must be.
# Keyed by the program's id (that of its `run` block).
CHECKS = {
  "eager_execution_tensorflow_2_x_1": (
    "assert np.isfinite(past_loss), past_loss\n"
    # The bad step was rolled back: every weight is finite.
    "assert all(np.isfinite(v.numpy()).all() for v in model.weights)\n"
    "with np.load('model.npz') as f:\n"
    "  assert sorted(f.files) == sorted(store.keys), f.files\n"
    # The copy holds snapshot `good`, bit for bit; its predictions are the
    # snapshot's (compiled in another function: equal up to rounding).
    "held = store.arrays(good)\n"
    "for k, v in past_store.variables.items():\n"
    "  assert v.numpy().tobytes() == held[k].tobytes(), k\n"
    "expect = store.evaluate_with(lambda: model(x[:8]).numpy(), tag=good)\n"
    "assert np.allclose(then.numpy(), expect, rtol=1e-5, atol=1e-6)\n"
    "assert all((m == expect).all() for m in members.values())\n"
    "assert np.allclose(mean_prediction, expect, rtol=1e-6)\n"
  ),
  "quick_start_1": (
    "assert np.isfinite(past_loss), past_loss\n"
    # Its device snapshots went with the closed session; the file stays.
    "assert store.tags() == [], store.tags()\n"
    "with np.load('best.npz') as f:\n"
    "  assert sorted(f.files) == sorted(store.keys), f.files\n"
  ),
  "training_loop_integration_1": (
    "assert np.isfinite(slow_loss) and np.isfinite(ema_loss)\n"
    # The guard's device snapshot went with the closed session.
    "assert store.tags() == [], store.tags()\n"
  ),
  # The fragments below run after their setups (hidden in README.md).
  "past_and_current_in_one_run_store_slots_past_and_snapstore_clone_1": (
    # The past is slot 0's initial parameters, bit for bit; the present is
    # one step later; after the refresh they agree.
    "assert np.array_equal(past, start)\n"
    "assert not np.allclose(current, past)\n"
    "current, past = sess.run([q, q_past], feed)\n"
    "assert np.array_equal(current, past)\n"
  ),
  "training_loop_integration_2": (
    # The bad batch's step was undone: finite weights, and Keras counted
    # only the three good steps (the rollback puts `iterations` back too).
    "assert all(np.isfinite(v.numpy()).all() for v in model.weights)\n"
    "assert int(opt.iterations.numpy()) == 3, opt.iterations.numpy()\n"
  ),
  "training_loop_integration_3": (
    "sess = tf.Session()\n"
    "sess.run([tf.global_variables_initializer(),"
    " tf.local_variables_initializer()])\n"
    "names = [v.op.name.split('/', 1)[1] for v in"
    " tf.trainable_variables('online')]\n"
    "live = lambda: dict(zip(names, sess.run(tf.trainable_variables())))\n"
    # Hard update: the target is the online network, bit for bit.
    "sess.run(train_op, feed)\n"
    "sess.run(hard_update)\n"
    "target, online = store.arrays('target', session=sess), live()\n"
    "assert sorted(target) == sorted(online), (sorted(target), names)\n"
    "for k in online:\n"
    "  assert target[k].tobytes() == online[k].tobytes(), k\n"
    # Soft update after the step: (1 - tau) * target + tau * online.
    "sess.run(train_and_update, feed)\n"
    "new_target, new_online = store.arrays('target', session=sess), live()\n"
    "for k in online:\n"
    "  assert not np.array_equal(new_online[k], online[k]), k\n"
    "  expect = (np.float32(1 - 0.005) * target[k]"
    " + np.float32(0.005) * new_online[k])\n"
    "  assert np.array_equal(new_target[k], expect), k\n"
  ),
  "training_loop_integration_4": (
    # Before any update the target slot holds the online weights, so the
    # target's q is the online network's.
    "assert np.allclose(q_next.numpy(), online(next_x).numpy(), rtol=1e-6)\n"
    "before = [v.numpy() for v in online.trainable_variables]\n"
    "held = store.arrays('target')\n"
    "train_step(x0, y0)\n"
    "after = [v.numpy() for v in online.trainable_variables]\n"
    "moved = store.arrays('target')\n"
    "assert sorted(moved) == sorted(held)\n"
    # Each target variable moved by tau towards its online one.
    "for old, new in zip(before, after):\n"
    "  assert not np.array_equal(old, new)\n"
    "  [k] = [k for k in held if held[k].tobytes() == old.tobytes()]\n"
    "  expect = np.float32(1 - 0.005) * old + np.float32(0.005) * new\n"
    "  assert np.array_equal(moved[k], expect), k\n"
    # Hard update: a copy of the online weights, bit for bit.
    "store.snapshot('target')\n"
    "held = store.arrays('target')\n"
    "for v in after:\n"
    "  assert any(h.tobytes() == v.tobytes() for h in held.values())\n"
  ),
  "training_loop_integration_5": (
    # The step ran (its loss is not finite) and was undone, bit for bit:
    # weights, Adam's slots and beta powers, and the global step.
    "assert not np.isfinite(sess.run(loss, feed))\n"
    "end = sess.run(tf.global_variables())\n"
    "assert len(end) == len(start)\n"
    "for a, b in zip(start, end):\n"
    "  assert np.asarray(a).tobytes() == np.asarray(b).tobytes()\n"
    "assert sess.run(step) == 0\n"
  ),
  "training_loop_integration_6": (
    # The gate skipped the copy; the restore went back to the initial
    # values, the newest start of a step with a finite loss (none yet).
    "assert not np.isfinite(value)\n"
    "end = sess.run(tf.global_variables())\n"
    "for a, b in zip(start, end):\n"
    "  assert np.asarray(a).tobytes() == np.asarray(b).tobytes()\n"
    "assert sess.run(step) == 0\n"
  ),
  "disk_mode_spill_files_and_the_cli_1": (
    "store.files.flush()\n"
    "assert os.path.exists('run7.h5')\n"
    "assert store.tags() == [tag], store.tags()\n"
    # A change undone from the snapshot, bit for bit.
    "net = tf.global_variables('net')\n"
    "sess.run([v.assign(v + 1.0) for v in net])\n"
    "store.restore(tag, session=sess)\n"
    "for a, b in zip(start, sess.run(net)):\n"
    "  assert a.tobytes() == b.tobytes()\n"
    "store.close()\n"
  ),
  "ensembles_of_checkpoints_store_files_load_checkpoint_and_snapstore_"
  "ensemble_1": (
    # Each member's probabilities are a numpy forward pass with the
    # weights its checkpoint holds; the combination is their mean and vote.
    "def forward(w):\n"
    "  h = np.maximum(0.0, batch.dot(w['dense/kernel']) + w['dense/bias'])\n"
    "  z = h.dot(w['dense_1/kernel']) + w['dense_1/bias']\n"
    "  e = np.exp(z - z.max(axis=1, keepdims=True))\n"
    "  return e / e.sum(axis=1, keepdims=True)\n"
    "tags = ['run_1', 'run_2', 'run_3']\n"
    "expect = [forward(weights[t]) for t in tags]\n"
    "assert list(result.members) == tags, list(result.members)\n"
    "for t, e in zip(tags, expect):\n"
    "  assert np.allclose(result.members[t]['probs'], e, atol=1e-5), t\n"
    "assert not np.allclose(expect[0], expect[1])\n"
    "assert np.allclose(result.combined['probs'], np.mean(expect, 0),"
    " atol=1e-5)\n"
    "labels = np.array([e.argmax(1) for e in expect])\n"
    "for row, label in zip(labels.T, result.combined['label']):\n"
    "  counts = np.bincount(row)\n"
    "  if counts.max() > 1:  # a majority\n"
    "    assert label == counts.argmax(), (row, label)\n"
  ),
}

_MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")
# The first line of a marker comment that goes on over the next lines.
_OPENING = re.compile(r"^<!--\s*test:\s*(.*?)\s*$")
_ELLIPSIS = re.compile(r"^(\s*)\.\.\.\s*$")

Block = collections.namedtuple(
  "Block",
  "id section line marker reason code setup setup_line",
  defaults=(None, None),
)


def _slug(heading):
  return re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")


def parse(text):
  """The README's Python blocks, and the problems of their markers.

  Returns:
    `(blocks, problems)`: a list of `Block`s in README order (`line` is the
    1-based line of the opening fence; `marker` is "run", "continues",
    "skip" or None; `code` is dedented; a fragment's `setup` is its hidden
    setup code, dedented, from README line `setup_line`) and a list of
    strings.
  """
  blocks, problems = [], []
  section, counts = "top", collections.Counter()
  # (line number, marker text, setup lines or None) of a marker not yet used
  pending = None
  fence = None  # (line number, indent, is python, lines) inside a block
  comment = None  # (line number, indent, marker text, lines) of a setup
  for number, raw in enumerate(text.splitlines(), 1):
    stripped = raw.strip()
    if comment is not None:
      if stripped == "-->":
        pending = (comment[0], comment[2], comment[1], comment[3])
        comment = None
      else:
        comment[3].append(raw)
      continue
    if fence is not None:
      if stripped == "```":
        start, indent, is_python, lines = fence
        fence = None
        if is_python:
          counts[section] += 1
          marker, reason, setup = _read_marker(pending, start, problems)
          code = "".join(line[indent:] + "\n" for line in lines)
          block_id = "%s_%d" % (section, counts[section])
          setup_line = pending[0] + 1 if setup is not None else None
          pending = None
          blocks.append(
            Block(
              block_id,
              section,
              start,
              marker,
              reason,
              code,
              setup,
              setup_line,
            )
          )
          if setup is not None:
            problem = _ellipsis_problem(code, setup)
            if problem:
              problems.append("line %d: %s" % (start, problem))
      else:
        fence[3].append(raw)
      continue
    if stripped.startswith("```"):
      info = stripped[3:].strip().lower()
      fence = (
        number,
        len(raw) - len(raw.lstrip()),
        info in ("python", "py"),
        [],
      )
      if not fence[2] and pending is not None:
        problems.append(
          "line %d: marker on a ```%s block, not a Python one"
          % (pending[0], info)
        )
        pending = None
      continue
    match = _MARKER.match(stripped)
    opening = _OPENING.match(stripped)
    if match or opening:
      if pending is not None:
        problems.append("line %d: marker on no block" % pending[0])
      pending = None
      if match:
        pending = (number, match.group(1), None, None)
      else:
        comment = (number, len(raw) - len(raw.lstrip()), opening.group(1), [])
    elif stripped:
      if pending is not None:
        problems.append(
          "line %d: marker on no block (text follows it)" % pending[0]
        )
        pending = None
      if raw.startswith("#"):
        section = _slug(raw.lstrip("#"))
  if pending is not None:
    problems.append("line %d: marker on no block" % pending[0])
  if comment is not None:
    problems.append("line %d: setup comment never closed" % comment[0])
  if fence is not None:
    problems.append("line %d: block never closed" % fence[0])
  return blocks, problems


def _read_marker(pending, start, problems):
  """`(marker, reason, setup)` of the marker before the block at `start`."""
  if pending is None:
    problems.append(
      "line %d: Python block without a marker; put <!-- test: run -->, "
      "<!-- test: continues --> or <!-- test: skip (reason) --> on the line "
      "before it (see tests/test_readme.py)" % start
    )
    return None, None, None
  number, text, indent, lines = pending
  if lines is not None:  # a comment over several lines: a setup
    setup = "".join(line[indent:] + "\n" for line in lines)
    if text not in ("setup", "setup eager"):
      problems.append(
        "line %d: a marker over several lines must be setup or setup eager, "
        "not %r" % (number, text)
      )
    elif not setup.strip():
      problems.append("line %d: setup without code" % number)
    else:
      return "run", "eager" if text == "setup eager" else None, setup
    return None, None, None
  if text in ("run", "continues"):
    return text, None, None
  if text == "run eager":
    return "run", "eager", None
  skip = _SKIP.match(text)
  if skip and skip.group(1).strip():
    return "skip", skip.group(1).strip(), None
  if text in ("setup", "setup eager"):
    problems.append(
      "line %d: setup without code (put the code on the lines after "
      "<!-- test: setup, and --> on a line of its own)" % number
    )
  else:
    problems.append(
      "line %d: marker %r is not run, continues, setup or skip (a reason)"
      % (number, text)
    )
  return None, None, None


def _split_setup(setup):
  """A setup's parts: the code before the fragment, then one per `...`."""
  parts = [[]]
  for line in setup.splitlines(True):
    if _ELLIPSIS.match(line):
      parts.append([])
    else:
      parts[-1].append(line)
  return ["".join(part) for part in parts]


def _ellipsis_problem(code, setup):
  """Why `setup`'s `...` lines do not match those of `code`, or None."""
  wanted = sum(1 for line in code.splitlines() if _ELLIPSIS.match(line))
  given = len(_split_setup(setup)) - 1
  if wanted != given:
    return (
      "the fragment has %d ... line(s), its setup %d: each ... of the "
      "fragment is replaced by the setup's code after its next ..."
      % (wanted, given)
    )
  return None


def fragment_program(block):
  """A block's code with its setup: before it, and in its `...` lines."""
  if block.setup is None:
    return block.code
  parts = _split_setup(block.setup)
  out = [parts[0]]
  replacements = iter(parts[1:])
  for line in block.code.splitlines(True):
    match = _ELLIPSIS.match(line)
    if match:
      part = next(replacements)
      out.extend(
        match.group(1) + s if s.strip() else s for s in part.splitlines(True)
      )
    else:
      out.append(line)
  return "".join(out)


def programs(blocks):
  """`{id of the run block: [its blocks]}`, with the blocks continuing it."""
  result, problems = collections.OrderedDict(), []
  current = None
  for block in blocks:
    if current is not None and current[0].section != block.section:
      current = None
    if block.marker == "run":  # with reason "eager" for an eager program
      current = [block]
      result[block.id] = current
    elif block.marker == "continues":
      if current is None:
        problems.append(
          "line %d: %s continues no run block of its section"
          % (block.line, block.id)
        )
      else:
        current.append(block)
  return result, problems


with open(README) as _f:
  BLOCKS, PROBLEMS = parse(_f.read())
PROGRAMS, _PROGRAM_PROBLEMS = programs(BLOCKS)
PROBLEMS += _PROGRAM_PROBLEMS


def _api():
  """`{receiver: class or module}` for the names `test_names_exist` checks."""
  import snapstore  # pylint: disable=g-import-not-at-top
  from snapstore import file_io, slots  # pylint: disable=g-import-not-at-top

  return {
    "snapstore": snapstore,
    "store": snapstore.SnapshotStore,
    "store.files": file_io.Files,
    "store.slots": slots.Slots,
  }


def _dotted(node):
  """The dotted name ("a.b.c") of a chain of names and attributes, or None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name):
    return None
  parts.append(node.id)
  return ".".join(reversed(parts))


def _keywords_taken(target, call):
  """The keyword names `target` takes, or None for any (a **kwargs)."""
  from snapstore.engines.graph.engine import GraphEngine  # pylint: disable=g-import-not-at-top
  from snapstore.modes import table  # pylint: disable=g-import-not-at-top

  function = target.__init__ if inspect.isclass(target) else target
  params = inspect.signature(function).parameters
  names = set(params)
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    import snapstore  # pylint: disable=g-import-not-at-top

    if target is not snapstore.SnapshotStore:
      return None
    # The store's **mode_options: those of the mode the call names.
    mode = params["mode"].default
    for keyword in call.keywords:
      if keyword.arg == "mode":
        mode = ast.literal_eval(keyword.value)  # the README names it
    names |= set(table.options(GraphEngine.modes[mode]))
  return names


def name_problems(code):
  """The snapstore names `code` uses that do not exist, as strings."""
  api = _api()
  problems = []
  tree = ast.parse(code)
  for node in ast.walk(tree):
    dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
    if dotted:
      receiver, _, name = dotted.rpartition(".")
      if receiver in api and not hasattr(api[receiver], name):
        problems.append("%s: no such name" % dotted)
    if isinstance(node, ast.Call):
      dotted = _dotted(node.func)
      if dotted is None:
        continue
      receiver, _, name = dotted.rpartition(".")
      target = getattr(api.get(receiver), name, None)
      if not callable(target):
        continue
      taken = _keywords_taken(target, node)
      for keyword in node.keywords:
        if taken is not None and keyword.arg is not None:
          if keyword.arg not in taken:
            problems.append(
              "%s(%s=...): no such argument" % (dotted, keyword.arg)
            )
  return sorted(problems)


def _graph_mode_problem(code):
  """Why a graph-mode program does not set up graph mode itself, or None."""
  graph_mode = any(s in code for s in ("tf.Session(", "tf.placeholder("))
  if graph_mode and "disable_v2_behavior()" not in code:
    return (
      "a graph-mode program must call tf.disable_v2_behavior() (TF 2.x; "
      "harmless on 1.15) after its imports: import snapstore does not"
    )
  return None


class ReadmeTest(parameterized.TestCase):
  def test_every_block_is_marked(self):
    self.assertTrue(BLOCKS, "no ```python block found in README.md")
    self.assertEqual(PROBLEMS, [], "README.md:\n" + "\n".join(PROBLEMS))

  def test_checks_name_programs(self):
    self.assertEqual(sorted(set(CHECKS) - set(PROGRAMS)), [])

  def test_fragments_are_checked(self):
    fragments = [i for i, b in PROGRAMS.items() if b[0].setup is not None]
    self.assertEqual(sorted(set(fragments) - set(CHECKS)), [])

  @parameterized.named_parameters((block.id, block) for block in BLOCKS)
  def test_names_exist(self, block):
    compile(block.code, "README.md:%d" % block.line, "exec")
    self.assertEqual(
      name_problems(block.code),
      [],
      "README.md line %d (%s)" % (block.line, block.id),
    )

  @parameterized.named_parameters(list(PROGRAMS.items()) or [("none", None)])
  def test_runs(self, blocks):
    self.assertIsNotNone(blocks, "README.md has no <!-- test: run --> block")
    head = blocks[0]
    code = "".join(fragment_program(block) for block in blocks)
    self.assertIsNone(_graph_mode_problem(code), head.id)
    where = []  # which program lines come from which README lines
    first = 1
    if head.setup is not None:
      # Its hidden setup around the fragment's lines: print the program.
      where.append(
        "setup: README.md line %d; the program:\n%s"
        % (
          head.setup_line,
          "".join(
            "%4d  %s" % (n, s) for n, s in enumerate(code.splitlines(True), 1)
          ),
        )
      )
      blocks = blocks[1:]  # the others continue it, after its lines
      first = code.count("\n") - sum(b.code.count("\n") for b in blocks) + 1
    for block in blocks:
      count = block.code.count("\n")
      where.append(
        "program lines %d-%d: README.md lines %d-%d (%s)"
        % (
          first,
          first + count - 1,
          block.line + 1,
          block.line + count,
          block.id,
        )
      )
      first += count
    code += CHECKS.get(head.id, "")
    kerases = [None]  # the suite's own TF_USE_LEGACY_KERAS
    if head.reason == "eager":
      if _tf.VERSION[0] < 2:
        self.skipTest("an eager program: TensorFlow 2.x only")
      if _tf.VERSION >= (2, 16) and importlib.util.find_spec("keras"):
        kerases = ["1", "0"]  # tf-keras, then Keras 3
    for legacy in kerases:
      env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
      if legacy is not None:
        env["TF_USE_LEGACY_KERAS"] = legacy
      result = _run_program(head.id, code, env)
      self.assertEqual(
        result.returncode,
        0,
        "TF_USE_LEGACY_KERAS=%s\n" % legacy
        + "\n".join(where)
        + "\n"
        + result.stdout,
      )


def _run_program(name, code, env):
  tmp = tempfile.mkdtemp(prefix="readme_")
  try:
    path = os.path.join(tmp, name + ".py")
    with open(path, "w") as f:
      f.write(code)
    return subprocess.run(
      [sys.executable, path],
      cwd=tmp,  # files the program writes land here
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      timeout=120,
    )
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


class ParseTest(unittest.TestCase):
  """The parser itself: unmarked and badly marked blocks are found."""

  def _problems(self, text):
    blocks, problems = parse(text)
    return blocks, problems + programs(blocks)[1]

  def test_markers(self):
    blocks, problems = self._problems(
      "## A b\n<!-- test: run -->\n```python\nx = 1\n# not a heading\n```\n"
      "text\n  <!-- test: continues -->\n  ```python\n  y = x\n  ```\n"
      "## C\n<!-- test: skip (needs a GPU) -->\n```python\nz\n```\n"
      "```sh\nls\n```\n"
    )
    self.assertEqual(problems, [])
    self.assertEqual(
      [(b.id, b.marker, b.reason) for b in blocks],
      [
        ("a_b_1", "run", None),
        ("a_b_2", "continues", None),
        ("c_1", "skip", "needs a GPU"),
      ],
    )
    self.assertEqual(blocks[1].code, "y = x\n")
    self.assertEqual(list(programs(blocks)[0]), ["a_b_1"])

  def test_unmarked_block(self):
    _, problems = self._problems("## A\n```python\nx = 1\n```\n")
    self.assertEqual(len(problems), 1)
    self.assertIn("line 2: Python block without a marker", problems[0])

  def test_bad_markers(self):
    for marker, fragment in [
      ("<!-- test: skip -->", "is not run, continues, setup or skip"),
      ("<!-- test: skip () -->", "is not run, continues, setup or skip"),
      ("<!-- test: runs -->", "is not run, continues, setup or skip"),
      ("<!-- test: setup -->", "setup without code"),
      ("<!-- test: setup eager -->", "setup without code"),
      ("<!-- test: setup\n\n-->", "setup without code"),
      ("<!-- test: skip (a)\nx = 1\n-->", "must be setup or setup eager"),
      ("<!-- test: setup\n...\n-->", "the fragment has 0 ... line(s)"),
    ]:
      _, problems = self._problems("%s\n```python\nx\n```\n" % marker)
      self.assertEqual(len(problems), 1, problems)
      self.assertIn(fragment, problems[0])

  def test_setup_markers(self):
    blocks, problems = self._problems(
      "## A\n<!-- test: setup\nimport os\n\ndef f():\n  return 1\n"
      "...\nsess = 2\n\ny = 3\n...\nz = 4\n-->\n"
      "```python\nfor i in []:\n  ...\nt = f()\n...\n```\n"
      "text\n- item\n\n  <!-- test: setup eager\n  m = 1\n  -->\n"
      "  ```python\n  n = m\n  ```\n"
      "<!-- test: continues -->\n```python\nk = n\n```\n"
    )
    self.assertEqual(problems, [])
    self.assertEqual(
      [(b.id, b.marker, b.reason, b.setup_line) for b in blocks],
      [
        ("a_1", "run", None, 3),
        ("a_2", "run", "eager", 24),
        ("a_3", "continues", None, None),
      ],
    )
    self.assertEqual(blocks[1].setup, "m = 1\n")
    # Before the fragment: the setup up to its first `...`; each `...` of
    # the fragment: the setup's next part, at the `...`'s indentation.
    self.assertEqual(
      fragment_program(blocks[0]),
      "import os\n\ndef f():\n  return 1\n"
      "for i in []:\n  sess = 2\n\n  y = 3\nt = f()\nz = 4\n",
    )
    self.assertEqual(fragment_program(blocks[1]), "m = 1\nn = m\n")
    self.assertEqual(fragment_program(blocks[2]), "k = n\n")
    self.assertEqual(list(programs(blocks)[0]), ["a_1", "a_2"])
    exec(fragment_program(blocks[0]), {})  # pylint: disable=exec-used

  def test_bad_setups(self):
    for text, fragment in [
      ("<!-- test: setup\nx = 1\n```python\nx\n```\n", "never closed"),
      (
        "<!-- test: setup\nx = 1\n-->\ntext\n```python\nx\n```\n",
        "marker on no block (text follows it)",
      ),
      (
        "<!-- test: setup\n...\n...\n-->\n```python\n...\n```\n",
        "the fragment has 1 ... line(s), its setup 2",
      ),
      (
        "<!-- test: setup\nx = 1\n-->\n```python\n...\n```\n",
        "the fragment has 1 ... line(s), its setup 0",
      ),
    ]:
      _, problems = self._problems(text)
      self.assertTrue(any(fragment in p for p in problems), (text, problems))

  def test_marker_on_no_block(self):
    for text in [
      "<!-- test: run -->\ntext\n```python\nx\n```\n",
      "<!-- test: run -->\n```sh\nls\n```\n",
    ]:
      _, problems = self._problems(text)
      self.assertTrue(any("marker on" in p for p in problems), problems)

  def test_continues_needs_run_in_its_section(self):
    _, problems = self._problems(
      "## A\n<!-- test: run -->\n```python\nx\n```\n"
      "## B\n<!-- test: continues -->\n```python\ny\n```\n"
    )
    self.assertEqual(len(problems), 1)
    self.assertIn("b_1 continues no run block", problems[0])

  def test_name_problems(self):
    self.assertEqual(
      name_problems(
        "store.snapshot(session=sess)\nstore.files.save_npz('a')\n"
        "snapstore.SnapshotStore(mode='disk', spill_path='x', memory_budget=1)\n"
      ),
      [],
    )
    self.assertEqual(
      name_problems(
        "store.save_npz('a')\nstore.slots.pin_slot(0, 't')\n"
        "snapstore.Guard(store, watch=x, retry=2)\n"
        "snapstore.SnapshotStore(mode='host', saveable=True)\n"
      ),
      [
        "snapstore.Guard(retry=...): no such argument",
        "snapstore.SnapshotStore(saveable=...): no such argument",
        "store.save_npz: no such name",
        "store.slots.pin_slot: no such name",
      ],
    )

  def test_graph_mode_problem(self):
    self.assertIn(
      "disable_v2_behavior", _graph_mode_problem("x = tf.placeholder(t)")
    )
    self.assertIsNone(
      _graph_mode_problem("tf.disable_v2_behavior()\nx = tf.placeholder(t)")
    )


if __name__ == "__main__":
  unittest.main()
