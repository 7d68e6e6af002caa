# Quick start:  make run   (install + build the bundled sample index + one GetToC)
#               make test  (the whole test suite and the installed-product check, as CI runs them)
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
# The product is tested as users get it: the wheel, installed (not editable).
WHEEL := dist/ritrag-0.1.0-py3-none-any.whl
SOURCES := setup.py $(shell find ritrag pipelines transforms serving evaluation cli -name '*.py' -o -name '*.html')
# The installed-product check: a fresh venv with only the wheel and a user's extras.
USER_VENV ?= .venv-user
USER_EXTRAS ?= pipeline,serving,crawl

.PHONY: install run test test-fast test-installed clean-index

$(WHEEL): $(SOURCES)
	rm -rf dist build
	$(PYTHON) -m pip wheel -q --no-deps -w dist .

# Dependencies once per setup.py; the product itself whenever a source changed.
$(VENV)/.deps: setup.py $(WHEEL)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q "$(WHEEL)[dev]"
	touch $@

$(VENV)/.installed: $(VENV)/.deps $(WHEEL)
	$(PY) -m pip install -q --no-deps --force-reinstall $(WHEEL)
	touch $@

install: $(VENV)/.installed

run: install
	rm -rf $(INDEX)
	$(VENV)/bin/ritrag build sample/pages --out $(INDEX) --site_depth 1
	$(VENV)/bin/ritrag toc $(INDEX) "How do I password-protect a directory on my Apache web server?" --n 8

# pytest as a script (not `python -m pytest`, which would put the checkout's
# ritrag/ folder ahead of the installed package).
# The installed-product check runs even when pytest fails; either failing fails the target.
test: install
	status=0; $(VENV)/bin/pytest -q $(PYTEST_ARGS) || status=$$?; \
	$(MAKE) test-installed || status=1; exit $$status

test-fast: install
	$(VENV)/bin/pytest -q -m "not slow" $(PYTEST_ARGS)

test-installed: $(WHEEL)
	rm -rf $(USER_VENV)
	$(PYTHON) -m venv $(USER_VENV)
	$(USER_VENV)/bin/python -m pip install -q --upgrade pip
	$(USER_VENV)/bin/python -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(USER_VENV)/bin/python -m pip install -q "$(WHEEL)[$(USER_EXTRAS)]"
	$(USER_VENV)/bin/python .ci/installed_product.py $(CURDIR)

clean-index:
	rm -rf $(INDEX)
