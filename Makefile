# Two commands a new user needs (see README):
#   make demo   create .venv/ (Python 3.7, TensorFlow 1.15.5) and run the demo
#   make test   the same environment, then the test suite
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test bench venv clean

demo: venv
	$(PY) -m snapstore.demo

test: venv
	$(PY) -m pytest tests -q

bench: venv
	$(PY) bench/run_all.py

venv:
	./scripts/bootstrap

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
