# Everyday commands. Each target creates the virtual environment it needs when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo batch-demo test test-vllm bench-vllm bench-sim-vllm lint bench bench-report bench-compare clean browser

$(BIN)/.installed-dev: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

# The demos need plait alone: no test tools, browser driver, Ray or pyarrow.
$(BIN)/.installed-demo: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(BIN)/.installed-bench: $(BIN)/.installed-dev
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $@

# The demo prints its comparison and writes no result record: bench/results/ holds the
# figures docs/benchmarks.md is rendered from, which a demo run must not change.
demo: $(BIN)/.installed-demo
	$(BIN)/plait run examples/research_team.py
	$(BIN)/python bench/demo.py --no-save

# The batch example: 2,000 generated documents, 4 questions each, an extractor and a verifier
# agent per question, on four simulated H100s (about a minute); output in out/batch-demo/.
BATCH_ROWS ?= 2000
batch-demo: $(BIN)/.installed-demo
	rm -rf out/batch-demo
	$(BIN)/python examples/doc_analytics.py generate out/batch-demo/documents.jsonl --rows $(BATCH_ROWS)
	$(BIN)/plait batch run --input out/batch-demo/documents.jsonl --output out/batch-demo/answers.jsonl \
	  --workflow examples/doc_analytics.py:analyse --config examples/batch.toml \
	  --summary-json out/batch-demo/summary.json

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint browser
	$(BIN)/python -m pytest

# The live DAG page's test drives Debian's Chromium headless; installed here when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing Debian's chromium and chromium-driver for the browser test"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null || { \
	    $(SUDO) apt-get update -q >/dev/null && \
	    $(SUDO) apt-get install -y -q chromium chromium-driver >/dev/null; }; }

# `make bench BENCH_ARGS=--quick` for the short run.
# A real vLLM (CPU build) in its own environment, on a generated tiny model; the tests in
# tests_vllm start it and compare the simulator with it. Several minutes the first time.
VLLM_BIN := .venv-vllm/bin

$(VLLM_BIN)/.installed-plait: pyproject.toml bench/vllm/setup.sh
	bash bench/vllm/setup.sh
	$(VLLM_BIN)/python -m pip install -q -e . pytest
	touch $@

test-vllm: $(VLLM_BIN)/.installed-plait
	$(VLLM_BIN)/python -m pytest tests_vllm -p no:cacheprovider -o testpaths=tests_vllm -s

# plait against the naive baseline on two real vLLM servers it starts itself;
# `make bench-vllm BENCH_ARGS=--quick` for the short run (a few minutes).
bench-vllm: $(VLLM_BIN)/.installed-plait
	$(VLLM_BIN)/python bench/vllm_cpu.py $(BENCH_ARGS)

# The simulator's prefix hits and latency against one real vLLM (CPU build); quiet machine only.
bench-sim-vllm: $(VLLM_BIN)/.installed-plait
	$(VLLM_BIN)/python bench/sim_vs_vllm.py

bench: $(BIN)/.installed-bench
	$(BIN)/python bench/overhead.py $(BENCH_ARGS)

# docs/benchmarks.md rendered from bench/results/ (the tests run `bench/report.py --check`).
bench-report: $(BIN)/.installed-dev
	$(BIN)/python bench/report.py

# The benchmarks at the base commit and at the working tree, one after the other, with their
# tolerances (about an hour); `make bench-compare COMPARE_ARGS="--only jct,batch"` for a subset.
bench-compare: $(BIN)/.installed-dev
	$(BIN)/python bench/compare.py $(COMPARE_ARGS)

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache .mypy_cache .ruff_cache *.egg-info
