# Two entry points (README "Set up"): `make demo` and `make test`.  Both install everything first.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
PIP := $(PYTHON) -m pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
CHROMIUM ?= /usr/bin/chromium

.PHONY: demo test install install-test clean-build chromium lint-py lint-ts test-ts test-py test-ui

demo: install
	memviz demo --output memviz-demo.html

test: install-test
	@# -k: run every check even when an earlier one fails, so one failure does not hide another.
	$(MAKE) -k lint-py lint-ts test-ts test-py test-ui

# torch first, from the local CPU wheel: a bare `torch` requirement would fetch a multi-GB CUDA build.
# The TypeScript is built exactly once, by the package's build hook (hatch-jupyter-builder).
install: clean-build
	$(PIP) install torch==2.13.0
	$(PIP) install -e .

install-test: clean-build chromium
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[test]"
	jlpm install --immutable
	cd ui-tests && jlpm install --immutable

# `pip install` silently reuses an existing build (skip-if-exists): start from no build at all.
clean-build:
	rm -rf memviz/labextension labextension/lib memviz/static

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		$(SUDO) apt-get update && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y chromium; \
	fi

lint-py:
	ruff check .

lint-ts:
	jlpm lint:check

test-ts:
	jlpm test

test-py:
	$(PYTHON) -m pytest -q

test-ui:
	cd ui-tests && CHROMIUM=$(CHROMIUM) jlpm playwright test
