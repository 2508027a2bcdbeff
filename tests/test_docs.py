"""Every Python block of README.md and docs/ is marked, names what exists,
and runs: the graph-mode programs here (the graph suites), the eager ones in
tests/eager/test_docs.py. The markers: tests/docs_blocks.py."""

import os
import unittest

from absl.testing import parameterized

from tests import docs_blocks
from tests import docs_checks

BLOCKS, PROGRAMS, PROBLEMS = docs_blocks.read_all()
GRAPH = [(i, b) for i, b in PROGRAMS.items() if b[0].reason != "eager"]


class DocsTest(parameterized.TestCase):
  def test_every_block_is_marked(self):
    self.assertTrue(BLOCKS, "no ```python block found")
    self.assertEqual(PROBLEMS, [], "\n".join(PROBLEMS))

  def test_checks_name_programs(self):
    self.assertEqual(sorted(set(docs_checks.CHECKS) - set(PROGRAMS)), [])

  def test_fragments_are_checked(self):
    fragments = [i for i, b in PROGRAMS.items() if b[0].setup is not None]
    self.assertEqual(sorted(set(fragments) - set(docs_checks.CHECKS)), [])

  def test_readme_runs_both_quick_starts(self):
    # The README has an eager and a graph-mode quick start, both run.
    readme = [
      b[0].reason for i, b in PROGRAMS.items() if i.startswith("README__")
    ]
    self.assertIn("eager", readme)
    self.assertIn(None, readme)

  @parameterized.named_parameters((block.id, block) for block in BLOCKS)
  def test_names_exist(self, block):
    compile(block.code, "%s:%d" % (block.page, block.line), "exec")
    self.assertEqual(
      docs_blocks.name_problems(block.code),
      [],
      "%s line %d (%s)" % (block.page, block.line, block.id),
    )

  @parameterized.named_parameters(GRAPH or [("none", None)])
  def test_runs(self, blocks):
    self.assertIsNotNone(blocks, "no graph-mode <!-- test: run --> block")
    code, where = docs_blocks.program(
      blocks, docs_checks.CHECKS.get(blocks[0].id, "")
    )
    self.assertIsNone(docs_blocks.graph_mode_problem(code), blocks[0].id)
    result = docs_blocks.run_program(blocks[0].id, code, os.environ)
    self.assertEqual(
      result.returncode, 0, "\n".join(where) + "\n" + result.stdout
    )


class ParseTest(unittest.TestCase):
  """The parser itself: unmarked and badly marked blocks are found."""

  def _problems(self, text):
    blocks, problems = docs_blocks.parse(text)
    return blocks, problems + docs_blocks.programs(blocks)[1]

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
    self.assertEqual(list(docs_blocks.programs(blocks)[0]), ["a_b_1"])

  def test_pages(self):
    # A docs page's blocks are named by their page; a program does not go
    # on from one page into the next.
    blocks, problems = docs_blocks.parse(
      "## A\n<!-- test: run -->\n```python\nx = 1\n```\n",
      "docs/how-to/rollback-fit.md",
    )
    self.assertEqual(problems, [])
    self.assertEqual(blocks[0].id, "how_to_rollback_fit__a_1")
    self.assertEqual(blocks[0].page, "docs/how-to/rollback-fit.md")
    other, _ = docs_blocks.parse(
      "## A\n<!-- test: continues -->\n```python\ny = x\n```\n",
      "docs/index.md",
    )
    self.assertEqual(other[0].id, "index__a_1")
    found, problems = docs_blocks.programs(blocks + other)
    self.assertEqual(list(found), ["how_to_rollback_fit__a_1"])
    self.assertEqual(len(problems), 1)
    self.assertIn("index__a_1 continues no run block", problems[0])
    self.assertEqual(docs_blocks.page_id("README.md"), "README")

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
      docs_blocks.fragment_program(blocks[0]),
      "import os\n\ndef f():\n  return 1\n"
      "for i in []:\n  sess = 2\n\n  y = 3\nt = f()\nz = 4\n",
    )
    self.assertEqual(docs_blocks.fragment_program(blocks[1]), "m = 1\nn = m\n")
    self.assertEqual(docs_blocks.fragment_program(blocks[2]), "k = n\n")
    self.assertEqual(list(docs_blocks.programs(blocks)[0]), ["a_1", "a_2"])
    exec(docs_blocks.fragment_program(blocks[0]), {})  # pylint: disable=exec-used

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
      docs_blocks.name_problems(
        "store.snapshot(session=sess)\nstore.files.save_npz('a')\n"
        "snapstore.SnapshotStore(mode='disk', spill_path='x', memory_budget=1)\n"
      ),
      [],
    )
    self.assertEqual(
      docs_blocks.name_problems(
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
      "disable_v2_behavior",
      docs_blocks.graph_mode_problem("x = tf.placeholder(t)"),
    )
    self.assertIsNone(
      docs_blocks.graph_mode_problem(
        "tf.disable_v2_behavior()\nx = tf.placeholder(t)"
      )
    )


if __name__ == "__main__":
  unittest.main()
