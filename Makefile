# Two commands on a fresh machine: `make run` and `make test`.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90
export DVC_NO_ANALYTICS ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0

.PHONY: install run test test-bench test-fast test-timing lint docs bench lock clean clean-state system-deps

# What the cycle needs from the OS (Chromium): installed as root, else one line and exit 2, before any pip work.
system-deps:
	@PY=$(PY) VENV=$(VENV) bin/ensure-system-deps

$(STAMP): pyproject.toml constraints.txt | system-deps
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: system-deps $(STAMP)

run: system-deps $(STAMP)
	$(BIN)/agentflow run

test: system-deps $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not timing and not bench"

# the benchmark commands end to end at their smallest sizes (every documented bench command): CI runs it after make test
test-bench: system-deps $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m bench

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not timing"

# wall-clock assertions (timeouts really fire on time, hot paths stay cheap): on a quiet machine
test-timing: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m timing

lint: $(STAMP)
	$(BIN)/ruff check agentflow_core agentflow_refund agentflow_oscar tasks benchmarks flows tests
	$(BIN)/ruff format --check agentflow_core agentflow_refund agentflow_oscar tasks benchmarks flows tests
	$(BIN)/mypy agentflow_core agentflow_refund agentflow_oscar tasks benchmarks flows
	$(BIN)/lint-imports

# The docs/ site (mkdocs.yml) into site/; --strict fails on a missing page, a broken link or anchor.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(STAMP)
	$(BIN)/agentflow bench all --repeat 3

# dvc.lock for the shipped params.yaml: runs the stages whose deps or params changed (all of them on a
# fresh clone), then records their hashes. Commit dvc.lock afterwards.
lock: $(STAMP)
	$(BIN)/dvc repro
	@echo "dvc.lock now matches params.yaml and the code: commit it"

# Only what a rebuild recreates: the virtualenv, tool caches, bytecode and the flow's phase cache.
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info .agentflow/phase-cache site
	find agentflow_core tasks flows tests -name __pycache__ -type d -prune -exec rm -rf {} +

# History that nothing rebuilds: the DVC remote, MLflow runs and registry, Prefect runs (all of .agentflow).
clean-state:
	@echo "deleting .agentflow: the DVC remote, the MLflow runs and registry, the Prefect history"
	rm -rf .agentflow
