# Two entry points (README "Set up"): `make demo` and `make test`.  Both install what is missing first.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
# Debian's own python3 refuses pip installs (externally managed): everything goes into a virtualenv, the
# one already active if there is one, else .venv here.  Its bin/ comes first on PATH, so memviz, ruff and
# jlpm are the venv's.
VENV ?= $(or $(VIRTUAL_ENV),.venv)
VENV_DIR := $(abspath $(VENV))
PYTHON := $(VENV_DIR)/bin/python
PIP := $(PYTHON) -m pip
export PATH := $(VENV_DIR)/bin:$(PATH)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CHROMIUM ?= /usr/bin/chromium
# what the package build reads: a change to any of these rebuilds and reinstalls, nothing else does
BUILD_INPUTS := pyproject.toml package.json yarn.lock tsconfig.json install.json \
	$(wildcard labextension/*.mjs labextension/*.js) $(shell find labextension/src labextension/style -type f 2>/dev/null)
BUILT := memviz/labextension labextension/lib memviz/static
INSTALLED := $(VENV_DIR)/.memviz-installed
TEST_INSTALLED := $(VENV_DIR)/.memviz-test-installed

.PHONY: demo test install install-test clean-build chromium lint-py lint-ts test-ts test-py test-ui

demo: install
	@# the demo's own output, regenerated on every run
	memviz demo --output memviz-demo.html --overwrite

test: install-test
	@# -k: run every check even when an earlier one fails, so one failure does not hide another.
	$(MAKE) -k lint-py lint-ts test-ts test-py test-ui

$(PYTHON):
	python3 -m venv $(VENV_DIR)

install: $(INSTALLED)
install-test: $(TEST_INSTALLED) chromium

# torch first, from the local CPU wheel: a bare `torch` requirement would fetch a multi-GB CUDA build.
# The TypeScript is built exactly once, by the package's build hook (hatch-jupyter-builder); `pip install`
# silently reuses an existing build (skip-if-exists), so a reinstall starts from no build at all.
$(INSTALLED): $(BUILD_INPUTS) | $(PYTHON)
	rm -rf $(BUILT)
	$(PIP) install torch==2.13.0
	$(PIP) install -e .
	touch $@

$(TEST_INSTALLED): $(BUILD_INPUTS) ui-tests/package.json ui-tests/yarn.lock | $(PYTHON)
	rm -rf $(BUILT)
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[test]"
	jlpm install --immutable
	cd ui-tests && jlpm install --immutable
	touch $@ $(INSTALLED)

clean-build:
	rm -rf $(BUILT) $(INSTALLED) $(TEST_INSTALLED)

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y chromium; \
	fi

lint-py:
	ruff check .

# ui-tests are type-checked too (Playwright runs them untyped: an implicit any passed unnoticed there)
lint-ts:
	jlpm lint:check
	jlpm tsc --noEmit -p ui-tests/tsconfig.json

test-ts:
	jlpm test

# Two pytest-xdist workers (one intra-op thread each, tests/conftest.py) on CI's 2 cores.  worksteal: a
# worker that runs dry takes half of the other's queue, so the slow tests left at the end are shared and
# each module mostly stays on one worker (its module fixtures and caches are built once).
PYTEST_WORKERS ?= 2
test-py:
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=25

test-ui:
	cd ui-tests && CHROMIUM=$(CHROMIUM) jlpm playwright test
