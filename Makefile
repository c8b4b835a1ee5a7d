# transformer-mt: `make train` and `make test` set up .venv on first use (or when
# pyproject.toml changes), then run. `make help` lists every target.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help setup train test test-all lint format clean

help:  ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,export,serve,postgres]"
	@# The Hydra Optuna plugin pinned optuna<3; a venv made before it was dropped still has it.
	@$(BIN)/pip uninstall --quiet --yes hydra-optuna-sweeper 2>/dev/null || true
	@touch $(STAMP)

setup: $(STAMP)  ## create .venv with the package and dev tools

train: $(STAMP)  ## train the tiny model on the embedded number-words data set (CPU, ~5 min)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)  ## run the fast test suite (no network, a few minutes on 2 cores)
	$(BIN)/python -m pytest $(ARGS)

test-all: $(STAMP)  ## run every test, the slow ones included
	$(BIN)/python -m pytest -m "" $(ARGS)

lint: $(STAMP)  ## ruff lint + format check + the import rule of the wings (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(STAMP)  ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:  ## remove the venv and caches (keeps outputs/)
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
