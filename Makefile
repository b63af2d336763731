# Two commands do the whole set-up on a fresh machine with Python 3.10+ and pip:
#   make demo   installs into .venv, builds a calibrated index over the standard library's docs (into the index
#               home, ~/.local/share/retriever/indexes unless RETRIEVER_HOME says otherwise), searches it
#   make test   installs into .venv (with test extras and Ray for `--engine ray`) and runs the test suite
# CPU machines get the CPU build of torch pinned; on a CUDA machine: make demo TORCH=torch

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
DATA ?= ../shared/data

.PHONY: install browser demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-run pip only when the dependency list changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e ".[dev,ray]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python -m retriever.demo_corpus indexes/stdlib-docs.jsonl
	$(BIN)/retriever build indexes/stdlib-docs.jsonl --name stdlib-docs --replace
	$(BIN)/retriever search "read a file line by line" --name stdlib-docs -k 5
	$(BIN)/retriever search "random number from a normal distribution" --name stdlib-docs -k 5
	$(BIN)/retriever search "compress data with gzip" --name stdlib-docs -k 5
	@echo "serve it (HTTP API + search page on http://127.0.0.1:8000): $(BIN)/retriever serve"
	@echo "the retriever command is in $(BIN): run 'source $(BIN)/activate' to use it by name"

# The search page's browser test drives Debian's chromium through chromium-driver (root or sudo installs them).
browser:
	@command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else \
	    echo "the browser test needs chromium and chromium-driver: apt-get install chromium chromium-driver" >&2; exit 1; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    chromium chromium-driver >/dev/null; }

test: install browser
	RETRIEVER_DATA=$(DATA) $(BIN)/python -m pytest --durations=15

clean:
	rm -rf $(VENV) .pytest_cache
