# `make demo` and `make test` each create .venv when missing and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: demo test fuzz bench conformance-report conformance-python lint clean fuzz-loaders

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tensorvm.demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

# The differential program fuzzer's long campaign (tests/fuzz/program_campaign.py; `make test` runs a
# budget of it): prints programs x calls x executors and mismatches, shrunk failures go to fuzz-failures/.
# FUZZ_ARGS sets the budget, e.g. make fuzz FUZZ_ARGS="--programs 2000 --seed 7". Then the loader fuzzers.
FUZZ_ARGS ?= --minutes 30

fuzz: $(STAMP)
	$(BIN)/python tests/fuzz/program_campaign.py $(FUZZ_ARGS)
	$(MAKE) fuzz-loaders

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e ".[dev,bench]"
	touch $(BENCH_STAMP)

# The five-model suite and the real-model corpus (benchmarks/README.md), ~25 min; e.g.
# `make bench BENCH_ARGS="--models corpus --threads 1"` or `BENCH_ARGS=--quick`.
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# Per-op pass/skip/fail counts of ONNX's backend suite (target c, as `make test` runs it; conformance-python:
# on the NumPy kernels).
conformance-report: $(STAMP)
	$(BIN)/python tests/conformance/report.py -n 2

conformance-python: $(STAMP)
	TENSORVM_ONNX_TARGET=python $(BIN)/python tests/conformance/report.py -n 2

# Mutation fuzzing of every loader (.tvx, graph, params, Relay text, ONNX); defect examples in loader-fuzz-out/.
# LOADER_FUZZ_ARGS="--targets tvx --mutations 10000" narrows it.
LOADER_FUZZ_ARGS ?= --targets tvx,graph,params,text,onnx --mutations 10000 --workers 2
fuzz-loaders: $(STAMP)
	$(BIN)/python tests/fuzz/loader_campaign.py $(LOADER_FUZZ_ARGS) --out loader-fuzz-out

lint: $(STAMP)
	$(BIN)/ruff check tensorvm tests

clean:
	rm -rf $(VENV) build *.egg-info
