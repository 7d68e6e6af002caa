# Quick start:  make run   (install + build the sample index + one GetToC)
#               make test  (the whole test suite, as CI runs it)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INDEX ?= index
# The CPU build of torch. An unpinned `torch` pulls a multi-GB CUDA build; on a
# machine whose pip does not already serve the CPU wheel for this pin, add
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PYTEST_ARGS ?=

.PHONY: install run test test-fast clean-index

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

run: install
	rm -rf $(INDEX)
	$(VENV)/bin/ritrag build sample/pages --out $(INDEX) --site_depth 1
	$(VENV)/bin/ritrag toc $(INDEX) "How do I configure SSL client certificates?" --n 8

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

clean-index:
	rm -rf $(INDEX)
