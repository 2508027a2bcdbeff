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
  <!-- test: skip (reason) -->    not run, for the reason given (a fragment
                                  that needs the reader's model, files, ...)

An unmarked block, a marker on no block, an unknown marker and a skip without
a reason fail `test_every_block_is_marked`. Every block, skipped ones
included, must compile, and the snapstore names it uses must exist
(`test_names_exist`: `snapstore.X`, `store.X`, `store.files.X`,
`store.slots.X` and the keyword arguments of their calls). Programs run with
the suite's Python, so on whichever stack the suite runs, and must set up
graph mode themselves (`tf.disable_v2_behavior()`): nothing is added to them
but the checks in `CHECKS` below, after their last line.
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
}

_MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")

Block = collections.namedtuple("Block", "id section line marker reason code")


def _slug(heading):
  return re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")


def parse(text):
  """The README's Python blocks, and the problems of their markers.

  Returns:
    `(blocks, problems)`: a list of `Block`s in README order (`line` is the
    1-based line of the opening fence; `marker` is "run", "continues",
    "skip" or None; `code` is dedented) and a list of strings.
  """
  blocks, problems = [], []
  section, counts = "top", collections.Counter()
  pending = None  # (line number, marker text) of a marker not yet used
  fence = None  # (line number, indent, is python, lines) inside a block
  for number, raw in enumerate(text.splitlines(), 1):
    stripped = raw.strip()
    if fence is not None:
      if stripped == "```":
        start, indent, is_python, lines = fence
        fence = None
        if is_python:
          counts[section] += 1
          marker, reason = _read_marker(pending, start, problems)
          pending = None
          code = "".join(line[indent:] + "\n" for line in lines)
          block_id = "%s_%d" % (section, counts[section])
          blocks.append(Block(block_id, section, start, marker, reason, code))
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
    if match:
      if pending is not None:
        problems.append("line %d: marker on no block" % pending[0])
      pending = (number, match.group(1))
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
  if fence is not None:
    problems.append("line %d: block never closed" % fence[0])
  return blocks, problems


def _read_marker(pending, start, problems):
  """`(marker, reason)` of the marker before the block at line `start`."""
  if pending is None:
    problems.append(
      "line %d: Python block without a marker; put <!-- test: run -->, "
      "<!-- test: continues --> or <!-- test: skip (reason) --> on the line "
      "before it (see tests/test_readme.py)" % start
    )
    return None, None
  text = pending[1]
  if text in ("run", "continues"):
    return text, None
  if text == "run eager":
    return "run", "eager"
  skip = _SKIP.match(text)
  if skip and skip.group(1).strip():
    return "skip", skip.group(1).strip()
  problems.append(
    "line %d: marker %r is not run, continues or skip (a reason)"
    % (pending[0], text)
  )
  return None, None


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
    names |= set(table.options(table.get(mode)))
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
    code = "".join(block.code for block in blocks)
    self.assertIsNone(_graph_mode_problem(code), blocks[0].id)
    where = []  # which program lines come from which README lines
    first = 1
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
    code += CHECKS.get(blocks[0].id, "")
    kerases = [None]  # the suite's own TF_USE_LEGACY_KERAS
    if blocks[0].reason == "eager":
      if _tf.VERSION[0] < 2:
        self.skipTest("an eager program: TensorFlow 2.x only")
      if _tf.VERSION >= (2, 16) and importlib.util.find_spec("keras"):
        kerases = ["1", "0"]  # tf-keras, then Keras 3
    for legacy in kerases:
      env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
      if legacy is not None:
        env["TF_USE_LEGACY_KERAS"] = legacy
      result = _run_program(blocks[0].id, code, env)
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
      ("<!-- test: skip -->", "is not run, continues or skip"),
      ("<!-- test: skip () -->", "is not run, continues or skip"),
      ("<!-- test: runs -->", "is not run, continues or skip"),
    ]:
      _, problems = self._problems("%s\n```python\nx\n```\n" % marker)
      self.assertEqual(len(problems), 1, problems)
      self.assertIn(fragment, problems[0])

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
