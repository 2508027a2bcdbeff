"""No module imports from a layer above its own (README, "Layout").

The layers, lowest first. A module may import from its own layer and the
layers below it; the test reads every module's imports (no import runs).
"""

import ast
import os
import unittest

import snapstore

# Layer of each module or folder of the package, lowest first.
LAYERS = [
  ("errors", "_version", "_tf_startup", "_tf", "_keras"),
  ("core",),
  ("spill",),
  ("files",),
  ("modes",),
  ("engines",),
  ("holdings", "slots", "file_io"),
  ("store",),
  ("training",),
  ("ensemble", "cli", "__main__", "demo", "demo_eager", "__init__"),
]

_ROOT = os.path.dirname(snapstore.__file__)
# What asks which engine runs (EnginesTest): an `eager` flag, TensorFlow's
# own question and the one that decides the engine.
_ENGINE_ASKS = frozenset(["eager", "builds_eagerly", "executing_eagerly"])


def _layer(module):
  """The layer of a dotted module name inside snapstore ("core.copies")."""
  head = module.split(".")[0]
  for number, names in enumerate(LAYERS):
    if head in names:
      return number
  raise AssertionError(
    "snapstore.%s is in no layer of LAYERS: add it to the "
    "test and to the README's layout table." % module
  )


def _modules():
  for folder, _, names in os.walk(_ROOT):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        relative = os.path.relpath(path, _ROOT)[: -len(".py")]
        yield relative.replace(os.sep, "."), path


def _imports(path):
  """The snapstore modules `path` imports, dotted and relative to the package."""
  with open(path) as f:
    return _imports_in(f.read(), path)


def _imports_in(source, name):
  """The snapstore modules Python `source` imports (see `_imports`)."""
  tree = ast.parse(source, name)
  found = []
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.ImportFrom)
      and node.module
      and (node.module == "snapstore" or node.module.startswith("snapstore."))
    ):
      base = (
        node.module[len("snapstore.") :] if node.module != "snapstore" else ""
      )
      for alias in node.names:
        found.append(base + "." + alias.name if base else alias.name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("snapstore."):
          found.append(alias.name[len("snapstore.") :])
  return found


class LayersTest(unittest.TestCase):
  def test_every_module_imports_only_from_its_layer_and_below(self):
    upward = []
    for module, path in _modules():
      own = _layer(module)
      for imported in _imports(path):
        if _layer(imported) > own:
          upward.append(
            "snapstore.%s imports snapstore.%s" % (module, imported)
          )
    self.assertEqual(upward, [], "imports that run up the layers")

  def test_the_check_sees_an_upward_import(self):
    # The store may not import the training loop's pieces.
    self.assertGreater(_layer("training.guards"), _layer("store"))
    self.assertGreater(_layer("slots"), _layer("engines.graph.in_step"))
    self.assertEqual(
      _imports_in(
        "from snapstore.training import steps\n"
        "import snapstore.engines.graph.copies\n",
        "probe",
      ),
      ["training.steps", "engines.graph.copies"],
    )


class EnginesTest(unittest.TestCase):
  """Each engine in a package of its own, which the other does not import."""

  def test_neither_engine_imports_the_other(self):
    crossing = []
    for module, path in _modules():
      parts = module.split(".")
      if parts[0] != "engines" or len(parts) < 3:
        continue
      other = "eager" if parts[1] == "graph" else "graph"
      for imported in _imports(path):
        if imported.startswith("engines.%s." % other):
          crossing.append(
            "snapstore.%s imports snapstore.%s" % (module, imported)
          )
    self.assertEqual(crossing, [])

  def test_only_the_choice_imports_both(self):
    # engines/base.py is the interface: it imports neither engine.
    both = []
    for module, path in _modules():
      if module.split(".")[0] != "engines":
        continue
      engines = set(
        i.split(".")[1] for i in _imports(path) if i.startswith("engines.")
      ) & set(["graph", "eager"])
      if module in ("engines.base",) and engines:
        both.append(module)
      if len(engines) == 2 and module != "engines.choice":
        both.append(module)
    self.assertEqual(both, [])

  def test_nothing_reads_a_stores_private_attributes(self):
    readers = []
    for module, path in _modules():
      if module == "store":
        continue
      with open(path) as f:
        for number, line in enumerate(f, 1):
          if "store._" in line.replace("snapstore._", ""):
            readers.append("%s:%d: %s" % (module, number, line.strip()))
    self.assertEqual(readers, [])

  def test_only_the_engines_ask_which_engine_runs(self):
    # Outside snapstore/engines/ (whose choice.py makes the one choice) and
    # _tf.py (which says how), nothing asks whether it runs eagerly: it
    # asks the store's engine.
    asking = []
    for module, path in _modules():
      if module.split(".")[0] == "engines" or module == "_tf":
        continue
      with open(path) as f:
        tree = ast.parse(f.read(), path)
      for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and node.attr in _ENGINE_ASKS:
          name = node.attr
        elif isinstance(node, ast.Name) and node.id in _ENGINE_ASKS:
          name = node.id
        elif isinstance(node, ast.keyword) and node.arg == "eager":
          name = "eager="
        elif isinstance(node, ast.ImportFrom):
          names = [a.name for a in node.names if a.name in _ENGINE_ASKS]
          name = names[0] if names else None
        if name:
          asking.append("snapstore.%s:%d: %s" % (module, node.lineno, name))
    self.assertEqual(asking, [])

  def test_no_module_is_over_700_lines(self):
    long = []
    for module, path in _modules():
      with open(path) as f:
        lines = len(f.read().splitlines())
      if lines > 700:
        long.append("snapstore.%s: %d lines" % (module, lines))
    self.assertEqual(long, [])


class FacadeTest(unittest.TestCase):
  def test_the_store_facade_is_the_snapshot_lifecycle_and_two_parts(self):
    public = sorted(
      n for n in dir(snapstore.SnapshotStore) if not n.startswith("_")
    )
    self.assertEqual(
      public,
      sorted(
        [
          # what the store covers
          "name",
          "graph",
          "mode",
          "max_to_keep",
          "keys",
          "variables",
          "key_of",
          "variable_of",
          "param_nbytes",
          "nbytes",
          # the snapshot lifecycle
          "snapshot",
          "restore",
          "delete",
          "tags",
          "info",
          "evicts",
          "evaluate_with",
          "evaluate_each",
          "recover",
          "arrays",
          "load_arrays",
          "close",
          # its parts, and the engine it runs on
          "files",
          "slots",
          "engine",
        ]
      ),
    )

  def test_the_store_module_stays_small(self):
    # (600 until key_of and variable_of joined the facade; their work is
    # VariableSet's)
    with open(os.path.join(_ROOT, "store.py")) as f:
      self.assertLessEqual(len(f.read().splitlines()), 640)


if __name__ == "__main__":
  unittest.main()
