# Two entry points, each installing what it needs:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-ms27 test-mindformers test-mindformers2 lint dashboard browser install dist bench bench-smoke clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Editable install of gradmon with the demo and test extras; redone when pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# PyTorch (CPU build) is only an independent reference for the cross-check tests, never a runtime
# dependency. `make test TORCH=` skips installing it (those tests then skip).
TORCH ?= torch==2.13.0
TORCH_STAMP := $(VENV)/.torch
$(TORCH_STAMP): | $(STAMP)
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	touch $@

install: $(STAMP)

# The page's third-party code (ECharts) comes from the npm registry via the lockfile and is built
# into gradmon/static/, which the server serves. Nothing is loaded from a CDN.
gradmon/static/index.html: dashboard/package-lock.json dashboard/package.json dashboard/build.mjs $(wildcard dashboard/src/* dashboard/src/*/*)
	cd dashboard && npm ci --no-audit --no-fund && npm run build

dashboard: gradmon/static/index.html

# Release artifacts: dist/gradmon-<version>.tar.gz and dist/gradmon-<version>-py3-none-any.whl, both
# with the built page (the wheel is built from the sdist; setup.py builds the page first if needed).
# Installing either needs no Node. tests/test_wheel.py does the same build in a temporary directory.
dist: $(STAMP) dashboard
	rm -rf dist
	$(BIN)/python -m build --outdir dist

# Debian's Chromium for the browser tests; never a browser downloaded by a test tool.
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

demo: $(STAMP) dashboard
	$(BIN)/python examples/demo.py --logdir logs --serve

lint: $(STAMP)
	$(BIN)/ruff check .

# The suite on PYTEST_WORKERS processes (pytest-xdist), a test file per worker at a time, so that a
# module's fixtures (an msrun launch, a trained run) are set up once: pytest 990 -> 570-640 s on 2 cores.
# `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

test: $(STAMP) $(TORCH_STAMP) dashboard browser
	$(BIN)/ruff check .
	cd dashboard && npm test
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

# The whole suite on the oldest supported MindSpore (2.7.x) in its own venv; CI runs the newest.
VENV27 := .venv-ms27
test-ms27: dashboard browser
	test -x $(VENV27)/bin/python || $(PYTHON) -m venv $(VENV27)
	$(VENV27)/bin/python -m pip install -q -e ".[test]" "mindspore==2.7.*" $(if $(TORCH),"$(TORCH)")
	PATH="$(CURDIR)/$(VENV27)/bin:$$PATH" $(VENV27)/bin/python -m pytest -q $(PYTEST_PARALLEL)

# gradmon with mindformers (docs/mindformers.md) in its own venv: MindSpore 2.7.2, mindformers 1.8.0
# installed with --no-deps (its own requirements conflict with numpy < 2) plus what it then needs
# (tests/with_mindformers/requirements.txt), gradmon editable with its test extra. Runs the tests that
# need mindformers (tests/with_mindformers/, skipped in the main venv) and the rules' unit tests.
VENVMF := .venv-mf
MINDFORMERS ?= mindformers==1.8.0
MF_STAMP := $(VENVMF)/.installed
$(MF_STAMP): pyproject.toml tests/with_mindformers/requirements.txt
	test -x $(VENVMF)/bin/python || $(PYTHON) -m venv $(VENVMF)
	$(VENVMF)/bin/python -m pip install -q -r tests/with_mindformers/requirements.txt -e ".[test]"
	$(VENVMF)/bin/python -m pip install -q --no-deps "$(MINDFORMERS)"
	touch $@

test-mindformers: $(MF_STAMP)
	$(VENVMF)/bin/python -m pytest -q tests/with_mindformers tests/test_mindformers_options.py

# gradmon under mindformers 2.x's PyNative callback protocol (docs/mindformers.md, "mindformers 2.x") in
# its own venv: mindformers 2.1.0 wants MindSpore 2.11 and hyper_parallel, neither on the index, so it
# goes in with --no-deps beside MindSpore 2.10 plus what its imports ask for
# (tests/with_mindformers2/requirements.txt). Its PyNative Trainer does not import there; its callback,
# config and state classes do, and tests/with_mindformers2/ drives them from a loop that follows it.
VENVMF2 := .venv-mf2
MINDFORMERS2 ?= mindformers==2.1.0
MF2_STAMP := $(VENVMF2)/.installed
$(MF2_STAMP): pyproject.toml tests/with_mindformers2/requirements.txt
	test -x $(VENVMF2)/bin/python || $(PYTHON) -m venv $(VENVMF2)
	$(VENVMF2)/bin/python -m pip install -q -r tests/with_mindformers2/requirements.txt -e ".[test]"
	$(VENVMF2)/bin/python -m pip install -q --no-deps "$(MINDFORMERS2)"
	touch $@

test-mindformers2: $(MF2_STAMP)
	$(VENVMF2)/bin/python -m pytest -q tests/with_mindformers2 tests/test_trainer_state.py \
		tests/test_writer_rank.py tests/test_trainer_callback.py

bench: $(STAMP) dashboard browser
	$(BIN)/python -m benchmarks.run --device CPU

bench-smoke: $(STAMP)
	$(BIN)/python -m benchmarks.run --smoke

clean:
	rm -rf $(VENV) $(VENV27) $(VENVMF) $(VENVMF2) gradmon/static dashboard/node_modules dist build
