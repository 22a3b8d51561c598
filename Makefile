# Everything a fresh Linux machine with Python 3.11 needs: `make quickstart`, `make test`.
# torch==2.13.0 is installed first: on these machines it resolves to a CPU wheel on local disk.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install quickstart test test-fast lint benchmarks

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

quickstart: install
	$(PY) tutorials/quickstart.py

test: install
	$(PY) -m pytest -q --durations=10
	$(VENV)/bin/ruff check pyro_bbb tests tutorials benchmarks

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check pyro_bbb tests tutorials benchmarks

benchmarks: install
	$(PY) benchmarks/step_time.py
	$(PY) benchmarks/init_scale.py
	$(PY) benchmarks/predict.py
	$(PY) benchmarks/fit_overhead.py
	$(PY) benchmarks/gradient_variance.py
