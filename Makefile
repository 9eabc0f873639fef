# Everyday commands. Each target creates the virtual environment it needs when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/.installed-dev: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

$(BIN)/.installed-bench: $(BIN)/.installed-dev
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $@

demo: $(BIN)/.installed-dev
	$(BIN)/plait run examples/research_team.py

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

# `make bench BENCH_ARGS=--quick` for the short run.
bench: $(BIN)/.installed-bench
	$(BIN)/python bench/overhead.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
