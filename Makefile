# Everything a fresh Linux machine with Python 3.11 needs: `make quickstart`, `make test`.
# torch==2.13.0 is installed first: on these machines it resolves to a CPU wheel on local disk.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install quickstart test test-slow lint benchmarks docs figures

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps ivon-opt==0.1.3  # IVON's reference implementation, for the tests only
	$(PY) -m pip install --quiet --no-deps mnist1d==0.0.2.post1  # its procedural data, for benchmarks/uncertainty.py
	touch $@

install: $(VENV)/.installed

# The README's first model: trains, prints its figures, writes bnn_band.png here.
quickstart: install
	$(PY) docs/code_blocks.py README.md

# Every module's correctness in minutes (the long statistical and training tests are marked `slow`), then ruff.
test: install
	$(PY) -m pytest -q -m "not slow" --durations=10
	$(MAKE) lint

# The long statistical and training tests (CI runs them after `make test`).
test-slow: install
	$(PY) -m pytest -q -m slow --durations=10

lint: install
	$(VENV)/bin/ruff check pyro_bbb tests tutorials benchmarks docs conftest.py

# HTML documentation in docs/_build/html: the landing page, concepts, the user guide, benchmarks, the tutorials with
# their outputs and figures (docs/figures, written by `make figures`), the API grouped by role. Warnings are errors:
# a broken docstring fails the build. Then headless Chromium (Debian's package, installed here if missing) looks at
# three pages: screenshots in docs/_build/screenshots, an error if a code block overflows or a figure does not load.
docs: install
	$(PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	$(PY) docs/check_site.py docs/_build/html

# Run every tutorial at its default settings, writing the figures and printed outputs the documentation shows, and
# the README's example (takes a while).
figures: install
	for t in tutorials/*.py; do $(PY) docs/run_tutorial.py $$t --out-dir docs/figures || exit 1; done
	cd docs/figures && ../../$(PY) ../code_blocks.py ../../README.md  # the README's example: bnn_band.png

benchmarks: install
	$(PY) benchmarks/step_time.py
	$(PY) benchmarks/init_scale.py
	$(PY) benchmarks/predict.py
	$(PY) benchmarks/fit_overhead.py
	$(PY) benchmarks/gradient_variance.py
