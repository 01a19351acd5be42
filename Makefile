# specwatch developer tasks. `make test` works on a fresh machine: it installs the Debian
# packages the suite drives (prometheus, prometheus-alertmanager) and a virtualenv in .venv.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: help setup system-deps test test-all lint fmt generate check-generated demo bench fuzz clean

help:
	@echo "make demo             simulated vLLM + exporter (+ Prometheus when installed)"
	@echo "make test             default test suite (installs what it needs)"
	@echo "make test-all         default suite plus slow tests"
	@echo "make lint             ruff"
	@echo "make generate         render the Jsonnet mixin into dashboards/ and alerts/"
	@echo "make check-generated  fail when generated files are out of date"
	@echo "make bench            benchmarks (ratios against a baseline in the same run)"
	@echo "make fuzz             long fuzzing run of the parse/derive path"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[analysis,dev]'
	touch $@

setup: system-deps $(STAMP)

system-deps:
	@scripts/system-deps.sh

test: setup
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check exporter tests bench scripts

fmt: $(STAMP)
	$(BIN)/ruff check --fix exporter tests bench scripts

bench: $(STAMP)
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Deploy manifests that carry the mixin's output (deploy/kubernetes/mixin/); runs after the
# mixin rendering so the PrometheusRule and dashboard ConfigMaps follow alerts/ and dashboards/.
generate: $(STAMP)
	$(BIN)/python scripts/generate_deploy.py

check-generated: $(STAMP)
	$(BIN)/python scripts/generate_deploy.py --check

demo: setup
	$(BIN)/specwatch demo

clean:
	rm -rf $(VENV) build *.egg-info exporter/*.egg-info .pytest_cache

# Fitted parameters for the public Qwen3-32B sweep (one file per drafter; README "Calibration").
.PHONY: calibrate-examples
calibrate-examples: setup
	for d in eagle3:Qwen3-32B+Qwen3-32B-speculator.eagle3 qwen3-1.7b:Qwen3-32B+Qwen3-1.7B qwen3-4b:Qwen3-32B+Qwen3-4B; do \
	  $(BIN)/specwatch calibrate tests/fixtures/sd-validation/tomasruizt_qwen3-32b_1xH100_vllm-bench.csv \
	    --system "$${d#*:}" --max-concurrency 64 --out "examples/params/qwen3-32b-h100-$${d%%:*}.yaml" || exit $$?; \
	done
