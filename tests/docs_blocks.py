"""The Python blocks of README.md and docs/: what each is, and running them.

Every Python block of README.md and of the docs pages (docs/**/*.md) runs in
the suite, or says in the page why it does not: tests/test_docs.py checks
the markers and the names, and runs the graph-mode programs (in the graph
suites); tests/eager/test_docs.py runs the eager ones (in the eager suites:
on TensorFlow 2.21 once with tf-keras and once with Keras 3). What a
program's result must be is in tests/docs_checks.py.

A marker on the line before each ```python block says what the tests do
with it (the marker is an HTML comment, so the rendered page does not show
it):

  <!-- test: run -->              a complete graph-mode program: run in a
                                  child process by the graph suites
  <!-- test: run eager -->        a complete eager program (TensorFlow 2.x):
                                  run in a child process by the eager suites,
                                  with the suite's Keras; not on 1.15
  <!-- test: continues -->        appended to the program of the nearest run
                                  block above it in the same section
  <!-- test: setup               a fragment (it uses the reader's model,
  ...code...                      session, files): run in a child process
  -->                             after the hidden setup code the comment
                                  holds (indented as the comment's first
                                  line), which makes what the fragment uses
  <!-- test: setup eager          the same for an eager fragment (as `run
  ...code...                      eager`: the eager suites, TensorFlow 2.x)
  -->
  <!-- test: skip (reason) -->    not run, for the reason given (what makes
                                  running it impossible)

The rendered page shows none of these comments, so a setup is code the
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
see the setup's names and the fragment's.

A block's id is its page (`README`, `how_to_rollback_fit`: the path under
docs/ without `.md`), two underscores, its section's heading and its number
in that section: `how_to_rollback_fit__the_program_1`.

An unmarked block, a marker on no block, an unknown marker and a skip without
a reason fail `test_every_block_is_marked`. Every block, skipped ones
included, must compile, and the snapstore names it uses must exist
(`test_names_exist`: `snapstore.X`, `store.X`, `store.files.X`,
`store.slots.X` and the keyword arguments of their calls). Programs run with
the suite's Python, so on whichever stack the suite runs, and must set up
graph mode themselves (`tf.disable_v2_behavior()`): nothing is added to them
but their checks (tests/docs_checks.py), after their last line (and a
fragment's setup before it). Every fragment program has a check
(`test_fragments_are_checked`): a fragment that runs but whose result is not
looked at tests only that it does not raise.
"""

import ast
import collections
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

_MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")
_SKIP = re.compile(r"^skip\s*\((.*)\)$")
# The first line of a marker comment that goes on over the next lines.
_OPENING = re.compile(r"^<!--\s*test:\s*(.*?)\s*$")
_ELLIPSIS = re.compile(r"^(\s*)\.\.\.\s*$")

Block = collections.namedtuple(
  "Block",
  "id section line marker reason code setup setup_line page",
  defaults=(None, None, "README.md"),
)


def _slug(heading):
  return re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")


def parse(text, page=None):
  """A page's Python blocks, and the problems of their markers.

  Args:
    text: the page's Markdown.
    page: its path from the repository's root (`README.md`,
      `docs/how-to/rollback-fit.md`), which prefixes the blocks' ids; None
      for none.

  Returns:
    `(blocks, problems)`: a list of `Block`s in README order (`line` is the
    1-based line of the opening fence; `marker` is "run", "continues",
    "skip" or None; `code` is dedented; a fragment's `setup` is its hidden
    setup code, dedented, from README line `setup_line`) and a list of
    strings.
  """
  blocks, problems = [], []
  prefix = "" if page is None else page_id(page) + "__"
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
          block_id = "%s%s_%d" % (prefix, section, counts[section])
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
              page or "README.md",
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


def page_id(page):
  """`README`, or a docs page's path under docs/ without `.md`, as a name."""
  if page == "README.md":
    return "README"
  return _slug(os.path.splitext(os.path.relpath(page, "docs"))[0])


def pages():
  """README.md and every page under docs/, as paths from the root."""
  found = ["README.md"]
  for where, _, files in sorted(os.walk(DOCS)):
    for name in sorted(files):
      if name.endswith(".md"):
        found.append(os.path.relpath(os.path.join(where, name), ROOT))
  return found


def read_all():
  """`(blocks, programs, problems)` of README.md and every docs page."""
  blocks, problems = [], []
  for page in pages():
    with open(os.path.join(ROOT, page)) as f:
      found, trouble = parse(f.read(), page)
    blocks += found
    problems += ["%s %s" % (page, p) for p in trouble]
  found, trouble = programs(blocks)
  return blocks, found, problems + trouble


def _read_marker(pending, start, problems):
  """`(marker, reason, setup)` of the marker before the block at `start`."""
  if pending is None:
    problems.append(
      "line %d: Python block without a marker; put <!-- test: run -->, "
      "<!-- test: continues --> or <!-- test: skip (reason) --> on the line "
      "before it (see tests/docs_blocks.py)" % start
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
    if current is not None and (current[0].page, current[0].section) != (
      block.page,
      block.section,
    ):
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


def graph_mode_problem(code):
  """Why a graph-mode program does not set up graph mode itself, or None."""
  graph_mode = any(s in code for s in ("tf.Session(", "tf.placeholder("))
  if graph_mode and "disable_v2_behavior()" not in code:
    return (
      "a graph-mode program must call tf.disable_v2_behavior() (TF 2.x; "
      "harmless on 1.15) after its imports: import snapstore does not"
    )
  return None


def program(blocks, check=""):
  """`(code, where)`: a program's code with its setup and `check` after it,
  and lines saying which program lines come from which lines of its page."""
  head = blocks[0]
  code = "".join(fragment_program(block) for block in blocks)
  where = []
  first = 1
  if head.setup is not None:
    # Its hidden setup around the fragment's lines: print the program.
    where.append(
      "setup: %s line %d; the program:\n%s"
      % (
        head.page,
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
      "program lines %d-%d: %s lines %d-%d (%s)"
      % (
        first,
        first + count - 1,
        block.page,
        block.line + 1,
        block.line + count,
        block.id,
      )
    )
    first += count
  return code + check, where


def run_program(name, code, env):
  """Runs `code` as a script in a temporary directory of its own (where the
  files it writes land); returns the `subprocess.CompletedProcess`, output
  and errors together in `stdout`."""
  tmp = tempfile.mkdtemp(prefix="docs_")
  try:
    path = os.path.join(tmp, name + ".py")
    with open(path, "w") as f:
      f.write(code)
    return subprocess.run(
      [sys.executable, path],
      cwd=tmp,
      env=dict(env, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      universal_newlines=True,
      # Seconds each alone on a quiet machine; under a load of several
      # suites at once on 2 cores (a developer's machine), some of the
      # graph-mode ones took over the 120 s the README test allowed. A
      # program that hangs still fails.
      timeout=300,
    )
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
