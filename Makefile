# polyhead developer entry points. `make serve` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: serve test install install-test lint clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp files make re-runs instant while pyproject.toml is unchanged.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: install
	$(BIN)/polyhead serve $(ARGS)

lint: install-test
	$(BIN)/ruff check server router heads kernels tests
	$(BIN)/mypy router server

# Integration tests start Debian's redis-server and prometheus for real.
system-deps:
	scripts/install-system-deps.sh

test: lint system-deps
	$(BIN)/python -m pytest $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
