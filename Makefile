# Two commands do the whole set-up on a fresh machine with Python 3.10+ and pip:
#   make demo   installs the package into .venv, builds a calibrated index over the standard library's docs (into
#               the index home, ~/.local/share/retriever/indexes unless RETRIEVER_HOME says otherwise), searches it
#   make test   installs into .venv with the test extras, Ray (for `--engine ray`), LangChain and Haystack (for
#               their adapters and the frameworks' own test suites), and Debian's chromium and
#               chromium-driver for the browser tests (apt-get, as root or through sudo: said before it runs;
#               BROWSER=no skips it, and those tests then fail), then runs the test suite
# CPU machines get the CPU build of torch pinned; on a CUDA machine: make demo TORCH=torch

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
DATA ?= ../shared/data
BROWSER ?= yes
# The tests run in a worker per CPU core (pytest-xdist's -n auto, up to 4), a test file to each; PARALLEL= runs them
# in one process.
PARALLEL ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder
# pip shows what it collects and installs (a quiet install of a few minutes looks hung); setuptools' banner about
# editable installs, a warning for package authors, is left out.
PIP := PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install --progress-bar on

.PHONY: install browser demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Re-run pip only when the dependency list changes. The demo needs the package alone; the tests add their
# extras and Ray.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@echo "installing retriever and $(TORCH) into $(VENV) (a few minutes on a fresh machine)"
	$(PIP) "$(TORCH)" -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	@echo "installing the test extras, the file readers, Ray, LangChain and Haystack into $(VENV)"
	$(PIP) "$(TORCH)" -e ".[dev,files,ray,langchain,haystack]"
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

# The page tests drive Debian's chromium through chromium-driver. Installing them needs root (or sudo, which may
# ask for a password): said first, in plain words, and skipped with BROWSER=no.
browser:
	@command -v chromedriver >/dev/null 2>&1 || [ "$(BROWSER)" = no ] || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; else \
	    echo "the browser tests need chromium and chromium-driver: apt-get install chromium chromium-driver" \
	         "(or make test BROWSER=no to go on without them)" >&2; exit 1; fi; \
	  echo "make test: installing Debian's chromium and chromium-driver for the browser tests with" \
	       "$${SUDO:-root's} apt-get (make test BROWSER=no skips this)"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    chromium chromium-driver >/dev/null; }

test: $(VENV)/.installed-test browser
	RETRIEVER_DATA=$(DATA) $(BIN)/python -m pytest $(PARALLEL) --durations=15

clean:
	rm -rf $(VENV) .pytest_cache
