"""The docs site covers the package: every public name has its reference
entry and a docstring with its sections, and every page is in the nav; its
changelog (CHANGELOG.md) has a dated section for the package's version.

`make docs` builds the site with --strict (broken links and references fail
it); this checks what the build does not: that nothing public is left out.
"""

import datetime
import inspect
import os
import re
import textwrap
import unittest

import snapstore
from tests import docs_blocks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# Module-level values: their docstring is the string after their assignment.
VALUES = frozenset(["MODES", "SHADOW_VARIABLES", "__version__"])

_SECTION = re.compile(r"^[ \t]*(Args|Returns|Raises|Examples?):[ \t]*$", re.M)


def _reference_entries():
  """The names `::: snapstore.NAME` lines of docs/reference/ render."""
  names = set()
  folder = os.path.join(DOCS, "reference")
  for page in os.listdir(folder):
    with open(os.path.join(folder, page)) as f:
      names.update(re.findall(r"^::: snapstore\.(\w+)\s*$", f.read(), re.M))
  return names


def _nav_pages():
  """The pages mkdocs.yml's nav lists, as paths under docs/."""
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    text = f.read()
  nav = text[text.index("\nnav:") : text.index("\nmarkdown_extensions:")]
  return set(re.findall(r"([\w./-]+\.md)\s*$", nav, re.M))


def _pages():
  found = set()
  for where, dirs, files in os.walk(DOCS):
    dirs[:] = [d for d in dirs if d != "eager-spike"]  # exclude_docs
    for name in files:
      if name.endswith(".md"):
        found.add(os.path.relpath(os.path.join(where, name), DOCS))
  return found


_VERSION_HEADING = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def _changelog_headings():
  """The `## ` headings of CHANGELOG.md, outside code blocks, in order."""
  with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
    text = re.sub(r"(?ms)^```.*?^```", "", f.read())
  return re.findall(r"^## .*?[ \t]*$", text, re.M)


def _sections(doc):
  return set(
    s.rstrip("s") if s == "Examples" else s for s in _SECTION.findall(doc)
  )


def _parameters(obj):
  """The parameters a caller passes, without self and *args/**kwargs."""
  function = obj.__init__ if inspect.isclass(obj) else obj
  try:
    params = inspect.signature(function).parameters.values()
  except (TypeError, ValueError):
    return []
  return [
    p.name
    for p in params
    if p.name not in ("self", "cls")
    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
  ]


def _args_documented(doc):
  """The names the docstring's Args section lists."""
  match = re.search(
    r"^([ \t]*)Args:[ \t]*\n((?:\1 .*\n|[ \t]*\n)*)", doc + "\n", re.M
  )
  if not match:
    return set()
  indent = len(match.group(1)) + 2
  names = set()
  for line in match.group(2).splitlines():
    if len(line) - len(line.lstrip()) == indent:
      head = line.strip().split(":", 1)[0]
      names.update(n.strip().split(" ")[0] for n in head.split(","))
  return names


class DocsSiteTest(unittest.TestCase):
  def test_every_public_name_has_a_reference_entry(self):
    missing = sorted(set(snapstore.__all__) - _reference_entries())
    self.assertEqual(
      missing, [], "add `::: snapstore.NAME` to a page of docs/reference/"
    )

  def test_every_page_is_in_the_nav(self):
    self.assertEqual(sorted(_pages() - _nav_pages()), [])
    self.assertEqual(sorted(_nav_pages() - _pages()), [])

  def test_values_have_docstrings(self):
    sources = {
      "MODES": "snapstore/modes/table.py",
      "SHADOW_VARIABLES": "snapstore/engines/graph/variables.py",
      "__version__": "snapstore/_version.py",
    }
    self.assertEqual(set(sources), VALUES)
    for name, path in sources.items():
      with open(os.path.join(ROOT, path)) as f:
        text = f.read()
      found = re.search(r"(?m)^%s = .*\n\"\"\"[^\"]+" % re.escape(name), text)
      self.assertTrue(found, "%s (%s): no docstring after it" % (name, path))

  def test_public_docstrings_have_their_sections(self):
    problems = []
    for name in sorted(set(snapstore.__all__) - VALUES):
      obj = getattr(snapstore, name)
      doc = inspect.getdoc(obj) or ""
      have = _sections(doc)
      if "Example" not in have:
        problems.append("%s: no Example section" % name)
      if inspect.isclass(obj) and issubclass(obj, Exception):
        continue  # raised, not called: an example of when is enough
      params = _parameters(obj)
      if params and "Args" not in have and not _is_namedtuple(obj):
        problems.append("%s: no Args section" % name)
      undocumented = [p for p in params if p not in _args_documented(doc)]
      if undocumented and not _is_namedtuple(obj):
        problems.append("%s: Args misses %s" % (name, ", ".join(undocumented)))
      if inspect.isfunction(obj) and "Returns" not in have:
        problems.append("%s: no Returns section" % name)
      if params and "Raises" not in have and not _is_namedtuple(obj):
        problems.append("%s: no Raises section" % name)
    self.assertEqual(problems, [], "\n".join(problems))


class ChangelogTest(unittest.TestCase):
  """CHANGELOG.md follows Keep a Changelog: `## [Unreleased]`, then one
  `## [X.Y.Z] - YYYY-MM-DD` per release, newest first, the newest being
  the version the package says it is."""

  def test_unreleased_then_the_package_version(self):
    headings = _changelog_headings()
    self.assertGreaterEqual(len(headings), 2, headings)
    self.assertEqual(headings[0], "## [Unreleased]")
    newest = _VERSION_HEADING.match(headings[1])
    self.assertTrue(newest, "not a version heading: %r" % headings[1])
    self.assertEqual(newest.group(1), snapstore.__version__)

  def test_every_later_heading_is_a_dated_version(self):
    releases = []
    for heading in _changelog_headings()[1:]:
      match = _VERSION_HEADING.match(heading)
      self.assertTrue(match, "not `## [X.Y.Z] - YYYY-MM-DD`: %r" % heading)
      version = tuple(int(n) for n in match.group(1).split("."))
      try:
        date = datetime.datetime.strptime(match.group(2), "%Y-%m-%d").date()
      except ValueError:
        self.fail("not a date: %r" % heading)
      releases.append((version, date))
    versions = [v for v, _ in releases]
    dates = [d for _, d in releases]
    self.assertEqual(versions, sorted(set(versions), reverse=True))
    self.assertEqual(dates, sorted(dates, reverse=True), "newest first")


def _docstring_examples():
  """`(where, code)` of every ```python block in the docstrings of the public
  names and of their public methods and properties."""
  found = []
  for name in sorted(snapstore.__all__):
    obj = getattr(snapstore, name)
    owners = [(name, obj)]
    if inspect.isclass(obj):
      for attr, member in sorted(vars(obj).items()):
        if not attr.startswith("_"):
          owners.append(("%s.%s" % (name, attr), member))
    for where, member in owners:
      doc = inspect.getdoc(getattr(member, "fget", member)) or ""
      blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
      for i, code in enumerate(textwrap.dedent(b) for b in blocks):
        found.append(("%s, example %d" % (where, i + 1), code))
  return found


class DocstringExamplesTest(unittest.TestCase):
  def test_examples_compile_and_name_what_exists(self):
    examples = _docstring_examples()
    self.assertGreater(len(examples), 20)
    problems = []
    for where, code in examples:
      try:
        compile(code, where, "exec")
      except SyntaxError as e:
        problems.append("%s: %s" % (where, e))
        continue
      problems += [
        "%s: %s" % (where, p) for p in docs_blocks.name_problems(code)
      ]
    self.assertEqual(problems, [], "\n".join(problems))


def _is_namedtuple(obj):
  return (
    inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")
  )


if __name__ == "__main__":
  unittest.main()
