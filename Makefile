# streamidx: build, test and workbook targets. `make help` lists them.
#
# The venv (.venv) holds exactly requirements.lock plus this package, editable.
# Override the interpreter with `make PYTHON=/path/to/python3.11 ...`; a venv
# already made with another one stays until `make distclean`.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
VPY := $(VENV)/bin/python
LOCK := requirements.lock
STAMP := $(VENV)/.installed
# libtpu (the TPU compiler, for `compile_for` and `make aot`) goes here, off
# the import path: JAX's ordinary start-up then never tries a TPU (nor warns
# about the missing one); streamidx.compile_for loads it from there.
TPU_COMPILE := $(VENV)/tpu-compile
# The lock is installed by uv (pinned in the lock; pip only installs uv
# itself): its parallel downloads and unpacking take seconds where pip took
# most of a minute. --compile-bytecode: the installed modules' bytecode is
# written once, here, so that no process compiles jax, matplotlib or
# jupyter from source when it imports them (they cannot write it themselves
# where PYTHONDONTWRITEBYTECODE is set, as on this project's machines:
# then every notebook kernel and test subprocess did, ~40 s of `make test`).
PIP := $(VPY) -m pip --disable-pip-version-check
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --quiet --compile-bytecode --python $(VPY) --no-deps
PYTEST_ARGS ?=
WORKBOOK_ARGS ?=
AOT_ARGS ?=

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

.PHONY: help venv test test-full test-tpu workbook lab bench aot strip lock clean distclean

help:
	@echo "make venv      .venv from $(LOCK) + editable streamidx (re-runs when $(LOCK) or pyproject.toml change)"
	@echo "make test      pytest over tests/, notebooks included (CI profile, into build/ci/); what CI runs"
	@echo "make test-full make test plus the tests marked full (the whole case matrices)"
	@echo "make test-tpu  on a TPU: every variant compiled and checked on the chip, the run recorded"
	@echo "               (data/chip_measurements.json); one process, the checkout on PYTHONPATH;"
	@echo "               RESUME=1: only the tests whose newest outcome on this chip is not a pass"
	@echo "make workbook  every notebook with its default parameters, + HTML, into build/workbook/"
	@echo "               (2 at a time on 2+ cores, longest first; WORKBOOK_ARGS=\"--jobs 1\" for timing studies)"
	@echo "make lab       JupyterLab on notebooks/"
	@echo "make bench     python -m streamidx.bench"
	@echo "make aot       python -m streamidx.aot: compile every variant for TPU v4-v7x (no TPU needed)"
	@echo "make strip     clear outputs and Colab run metadata from notebooks/*.ipynb (keeps tags, TPU runtime)"
	@echo "make lock      re-resolve $(LOCK) with $(PYTHON) (newest versions)"
	@echo "make clean     remove build outputs and caches; distclean also removes .venv"

venv: $(STAMP)

$(STAMP): $(LOCK) pyproject.toml
	@test -n "$(PYTHON)" || { echo "make: no python3.11 or python3 on PATH; set PYTHON=" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "make: $(PYTHON) is $$($(PYTHON) --version 2>&1); $(LOCK) needs Python 3.11+" >&2; exit 1; }
	@test -x $(VPY) || { echo "creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing $(LOCK) into $(VENV) (libtpu into $(TPU_COMPILE))"
	@$(PIP) install -qq --no-deps --no-compile $$(grep '^uv==' $(LOCK))
	@grep -v '^libtpu==' $(LOCK) > $(VENV)/requirements-core.txt
	@$(UV_INSTALL) -r $(VENV)/requirements-core.txt
	@rm -rf $(TPU_COMPILE)
	@$(UV_INSTALL) --target $(TPU_COMPILE) $$(grep '^libtpu==' $(LOCK))
	@out=$$($(UV) pip check --python $(VPY) 2>&1) || { echo "$$out" >&2; echo "make: $(LOCK) is not self-consistent" >&2; exit 1; }
	@$(UV_INSTALL) --no-build-isolation -e .
	@touch $@

test: venv
	$(VPY) -m pytest -q -n 2 --dist loadfile tests $(PYTEST_ARGS)

test-full: venv
	STREAMIDX_TESTS=full $(VPY) -m pytest -q -n 2 --dist loadfile tests $(PYTEST_ARGS)

# On a TPU host, whose own JAX is kept: no venv (the lock's pins are its
# versions), the checkout on PYTHONPATH, one process (one program at a time
# holds a chip). Off a TPU the tier skips with one line saying why (pytest's
# exit status 5: nothing collected).
TPU_PYTHON ?= $(if $(wildcard $(VPY)),$(VPY),python3)
test-tpu:
	STREAMIDX_RECORD_TEST_RUN=1 STREAMIDX_TIER_RESUME=$(RESUME) \
	  PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} \
	  $(TPU_PYTHON) -m pytest -q -rs -p no:xdist -p no:cacheprovider tests/test_chip.py \
	  $(PYTEST_ARGS) || test $$? -eq 5

workbook: venv
	$(VPY) -m streamidx.workbook --profile default --html --out build/workbook $(WORKBOOK_ARGS)

lab: venv
	cd notebooks && ../$(VENV)/bin/jupyter lab

bench: venv
	$(VPY) -m streamidx.bench

aot: venv
	$(VPY) -m streamidx.aot $(AOT_ARGS)

strip: venv
	$(VPY) tools/strip_notebooks.py notebooks

lock:
	$(PYTHON) tools/update_lock.py

clean:
	rm -rf build .pytest_cache .hypothesis *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name .ipynb_checkpoints -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
