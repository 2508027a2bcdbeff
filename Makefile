# Two commands a new user needs (see README):
#   make demo   create .venv/ (Python 3.7, TensorFlow 1.15.5) and run the demo
#   make test   the same environment, then the test suite (two shards at once)
# The same on TensorFlow 2.x, graph mode and the eager engine:
#   make demo-tf2 / make test-tf2       .venv-tf2/   (Python 3.13, TensorFlow 2.21 with tf-keras)
#   make test-tf215                     .venv-tf215/ (Python 3.9, TensorFlow 2.15)
#   make lint / make format             ruff (ruff.toml), from .venv-tf2/
#   make docs / make docs-serve         the docs site (mkdocs.yml, docs/), from .venv-docs/
# The TF 2.x targets also build .venv/, so that the test writing files on one
# stack and reading them on the other runs in both directions.
VENV := .venv
PY := $(VENV)/bin/python
# TF 2.16+ routes tf.compat.v1.layers and tf.keras to tf-keras (the TF1-style
# Keras) only with this set; Keras 3 has no graph mode.
TF2_ENV := TF_USE_LEGACY_KERAS=1
PY_TF2 := $(TF2_ENV) .venv-tf2/bin/python
PY_TF215 := .venv-tf215/bin/python
# The demo shows its own output only, without TensorFlow's start-up notices
# (snapstore/_tf_startup.py): set before `python -m snapstore.demo`
# imports the package, and TensorFlow with it.
QUIET := SNAPSTORE_QUIET_TF=1

.PHONY: demo test bench venv demo-tf2 test-tf2 bench-tf2 venv-tf2 test-tf215 venv-tf215 check-wheel lint format docs docs-serve venv-docs clean

demo: venv
	$(QUIET) $(PY) -m snapstore.demo

# The graph-mode suite on TF 1.15 as two processes, one per core, each half
# of the tests (SNAPSTORE_TEST_SHARD, tests/conftest.py): in one process it
# took over CI's 10 minutes. (PYTEST is defined with the TF 2.x targets.)
test: venv
	./scripts/run_parallel \
	  'export SNAPSTORE_TEST_SHARD=0/2; $(PY) $(PYTEST) tests' \
	  'export SNAPSTORE_TEST_SHARD=1/2; $(PY) $(PYTEST) tests'

bench: venv
	$(PY) bench/run_all.py

venv:
	./scripts/bootstrap

demo-tf2: venv-tf2
	$(QUIET) $(PY_TF2) -m snapstore.demo

# The graph-mode suite, then the eager engine's (tests/eager) with each Keras:
# tf-keras, and Keras 3 (TF_USE_LEGACY_KERAS=0). Two processes, one per core,
# each run half of the tests (SNAPSTORE_TEST_SHARD, tests/conftest.py), so
# that a stack's suites stay under CI's 10 minutes.
EAGER := SNAPSTORE_TEST_ENGINE=eager
PYTEST := -m pytest -q -p no:cacheprovider --durations=10
# Every suite runs even if one fails; the process fails if any did.
TF2_SUITES = rc=0; $(PY_TF2) $(PYTEST) tests || rc=1; \
	  $(EAGER) $(PY_TF2) $(PYTEST) tests/eager || rc=1; \
	  $(EAGER) TF_USE_LEGACY_KERAS=0 .venv-tf2/bin/python $(PYTEST) tests/eager \
	  || rc=1; exit $$rc
TF215_SUITES = rc=0; $(PY_TF215) $(PYTEST) tests || rc=1; \
	  $(EAGER) $(PY_TF215) $(PYTEST) tests/eager || rc=1; exit $$rc

# Single quotes: `$$rc` must reach run_parallel's shells, not be expanded
# (to nothing) by this one (tests/test_shards.py, MakeTargetsTest).
test-tf2: venv-tf2 venv
	./scripts/run_parallel \
	  'export SNAPSTORE_TEST_SHARD=0/2; $(TF2_SUITES)' \
	  'export SNAPSTORE_TEST_SHARD=1/2; $(TF2_SUITES)'

bench-tf2: venv-tf2
	$(PY_TF2) bench/run_all.py

venv-tf2:
	./scripts/bootstrap tf2

test-tf215: venv-tf215 venv
	./scripts/run_parallel \
	  'export SNAPSTORE_TEST_SHARD=0/2; $(TF215_SUITES)' \
	  'export SNAPSTORE_TEST_SHARD=1/2; $(TF215_SUITES)'

venv-tf215:
	./scripts/bootstrap tf215

# The release as a user installs it: `python -m build`, the wheel with its cpu
# extra in a fresh venv (TensorFlow 2.21, Python 3.13), an eager program, the
# demo's eager run and the CLI, from a directory outside the tree.
check-wheel: venv-tf2
	./scripts/check_wheel

# The formatter (check only) and the linter, configured in ruff.toml; ruff is
# installed in the TF 2.x venv (requirements/tf2.txt).
RUFF := .venv-tf2/bin/ruff

lint: venv-tf2
	$(RUFF) format --check --diff .
	$(RUFF) check .

format: venv-tf2
	$(RUFF) format .

# The docs site into site/: --strict fails the build on a broken link, a
# reference (`::: snapstore.X`) to nothing, or a page left out of the nav.
# The code blocks of docs/ run in the suites (tests/test_docs.py).
MKDOCS := .venv-docs/bin/mkdocs

docs: venv-docs
	$(MKDOCS) build --strict

docs-serve: venv-docs
	$(MKDOCS) serve

venv-docs:
	./scripts/bootstrap docs

clean:
	rm -rf $(VENV) .venv-tf2 .venv-tf215 .venv-docs site build dist *.egg-info .pytest_cache
