# specwatch developer tasks. `make test` works on a fresh machine: it installs the Debian
# packages the suite drives (prometheus, prometheus-alertmanager) and a virtualenv in .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: help setup system-deps test test-all test-docs test-live lint lint-jsonnet fmt fmt-jsonnet generate check-generated demo bench fuzz clean dist docs docs-images

help:
	@echo "make demo             simulated vLLM + exporter (+ Prometheus when on the PATH); runtime install only"
	@echo "make test             default test suite (installs what it needs)"
	@echo "make test-all         default suite plus slow tests"
	@echo "make test-docs        run every command and config file of README.md and docs/ (wheel venv)"
	@echo "make test-live        against a real vLLM (CPU build in its own venv; ~7 min)"
	@echo "make lint             ruff, jsonnetfmt, import-linter layering contracts, long-module warnings, mkdocs --strict"
	@echo "make generate         render the mixin (dashboards/, alerts/) and the reference pages (docs/)"
	@echo "make docs             build the docs site into site/ (MkDocs, strict)"
	@echo "make docs-images      redraw the pictures (docs/img/: sweep, calibration, each dashboard on the demo) and the README caption's numbers"
	@echo "make check-generated  fail when generated files are out of date"
	@echo "make bench            benchmarks (ratios against a baseline in the same run)"
	@echo "make dist             sdist and wheel (the whole bundle) in dist/, checked by twine"
	@echo "make fuzz             long fuzzing run of the parse/derive path"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[analysis,dev]'
	touch $@

# Grafana's schema packages and TypeScript for tests/mixin/test_grafana_schema.py, from the lockfile.
SCHEMA_DIR := tests/grafana-schema
$(SCHEMA_DIR)/node_modules/.package-lock.json: $(SCHEMA_DIR)/package-lock.json | system-deps
	cd $(SCHEMA_DIR) && npm ci --no-audit --no-fund

setup: system-deps $(STAMP) $(SCHEMA_DIR)/node_modules/.package-lock.json

system-deps:
	@scripts/system-deps.sh

# The suites run on parallel pytest-xdist workers. Much of a test's time is spent waiting on
# a subprocess or a server (promtool, jsonnet, Prometheus, Alertmanager, polls on the wall
# clock), so more workers than cores pays (3 to 4 measured best on 2 cores; 6 was slower).
# `make test` uses worksteal, which evens out the long tests. A module fixture is made once
# per worker that runs one of the module's tests, so `make test-all` keeps each file on one
# worker (loadfile): its slow modules' fixtures run for minutes (the demo's story). What is
# costly to make is made once per run for all workers (tests/helpers/shared.py).
# PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 4

test: setup
	$(BIN)/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Every `specwatch ...` command and serve config file of README.md and docs/*.md, run from
# the installed wheel (tests/test_docs_commands.py; slow, so also part of test-all). It
# prints what it ran: where, the command, exit status and seconds.
test-docs: setup
	$(BIN)/python -m pytest -q -s tests/test_docs_commands.py $(PYTEST_ARGS)

# A real vLLM (CPU build, n-gram SD on a tiny random model), the exporter and Prometheus
# with the rules: tests/live/. The vLLM virtualenv (about 3.5 GB) is made once and reused
# (tests/live/install_vllm.sh; SPECWATCH_VLLM_VENV to put it elsewhere).
SPECWATCH_VLLM_VENV ?= $(HOME)/.cache/specwatch/vllm-venv
test-live: setup
	tests/live/install_vllm.sh $(SPECWATCH_VLLM_VENV)
	SPECWATCH_LIVE_REQUIRED=1 SPECWATCH_VLLM_VENV=$(SPECWATCH_VLLM_VENV) $(BIN)/python -m pytest -q -s -p no:cacheprovider \
	  tests/live/test_live_vllm.py tests/live/test_live_pair.py $(PYTEST_ARGS)

lint: $(STAMP) lint-jsonnet
	$(BIN)/ruff check src tests bench scripts setup.py
	$(BIN)/lint-imports
	$(BIN)/python scripts/module_size.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site-lint

fmt: $(STAMP)
	$(BIN)/ruff check --fix src tests bench scripts setup.py

bench: $(STAMP)
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The Jsonnet mixin (config.libsonnet, mixin.libsonnet, alerts/, dashboards/): sources are
# jsonnetfmt-clean (Debian's jsonnet package, kubernetes-mixin's flags); generated files are
# committed and must match a fresh render.
JSONNETFMT := jsonnetfmt -n 2 --max-blank-lines 2 --string-style s --comment-style s
JSONNET_SOURCES = $(shell git ls-files -co --exclude-standard '*.libsonnet' '*.jsonnet')

lint-jsonnet: system-deps
	$(JSONNETFMT) --test $(JSONNET_SOURCES) || { echo "jsonnet sources not formatted: run make fmt-jsonnet" >&2; exit 1; }

fmt-jsonnet: system-deps
	$(JSONNETFMT) -i $(JSONNET_SOURCES)

# The mixin renders alerts/*.yaml and dashboards/*.json first; the deploy manifests that
# carry them (deploy/kubernetes/mixin/) follow from those files.
# The reference pages (docs/metrics.md's table, docs/cli.md) come from the code: the metric
# table in specwatch.expose.metricdefs and each command's argparse parser.
generate: $(STAMP)
	$(BIN)/python scripts/generate.py
	$(BIN)/python scripts/generate_deploy.py
	$(BIN)/python scripts/generate_docs.py

check-generated: $(STAMP)
	$(BIN)/python scripts/generate.py --check
	$(BIN)/python scripts/generate_deploy.py --check
	$(BIN)/python scripts/generate_docs.py --check

# The docs site (MkDocs + Material; mkdocs.yml has the nav). `make lint` builds it strict too.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Pictures are redrawn on purpose (their bytes depend on the matplotlib version); the README's
# caption is written with its picture, from the same sweep, and its numbers are checked
# (check-generated, tests/test_docs_generated.py) against the shipped parameters.
docs-images: $(STAMP)
	$(BIN)/python scripts/generate_docs.py --images
	$(BIN)/python scripts/render_dashboards.py

# The demo needs only what a user installs: specwatch and its runtime dependencies, in a
# virtualenv of its own (no Debian packages, no npm, no dev extra). Prometheus, when on the
# PATH, is started by the demo; without it the demo runs the simulator and the exporter.
DEMO_VENV  ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-stamp
DEMO_ARGS  ?=
$(DEMO_STAMP): pyproject.toml setup.py $(shell git ls-files src mixin.libsonnet config.libsonnet alerts dashboards examples 2>/dev/null)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install -q .
	touch $@

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/specwatch demo $(DEMO_ARGS)

# Long fuzzing run of the parse-and-derive path (>= 100,000 cases; see tests/poll/test_fuzz.py).
FUZZ_EXAMPLES ?= 100000
fuzz: $(STAMP)
	SPECWATCH_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
	SPECWATCH_FUZZ_FAILURE_FILE=tests/fixtures/fuzz-corpus/new-failure.txt \
	$(BIN)/python -m pytest -q -s -p no:cacheprovider tests/poll/test_fuzz.py

# The wheel is the whole bundle: setup.py copies the mixin, rules, dashboards and examples into
# it (tests/common/test_bundle.py checks the contents; tests/test_wheel_install.py, slow, installs it
# into a fresh virtualenv and runs serve, demo, mixin render and calibrate).
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) $(DEMO_VENV) build dist site *.egg-info src/*.egg-info .pytest_cache $(SCHEMA_DIR)/node_modules

# Fitted parameters for the public Qwen3-32B sweep (one file per drafter; README "Calibration").
# The KV caches are what each server stated in its log ("GPU KV cache size: N tokens"; the
# no-SD server 69232, one per drafter after the ':'): tests/fixtures/sd-validation/README.md.
.PHONY: calibrate-examples
calibrate-examples: setup
	for d in eagle3:47264:Qwen3-32B+Qwen3-32B-speculator.eagle3 qwen3-1.7b:32528:Qwen3-32B+Qwen3-1.7B qwen3-4b:18560:Qwen3-32B+Qwen3-4B; do \
	  name=$${d%%:*}; rest=$${d#*:}; \
	  $(BIN)/specwatch calibrate tests/fixtures/sd-validation/tomasruizt_qwen3-32b_1xH100_vllm-bench.csv \
	    --system "$${rest#*:}" --kv-cache-tokens 69232 --kv-cache-tokens-sd "$${rest%%:*}" \
	    --out "examples/params/qwen3-32b-h100-$$name.yaml" || exit $$?; \
	done
