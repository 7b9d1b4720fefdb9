# The two commands of the README:
#   make smoke   create .venv (orchestrator + workload deps) and run matrices/cpu_smoke.toml
#   make test    create .venv and run the test suite
#   make lint    ruff, then mypy (orchestrator/ and workload/, configured in pyproject.toml)
# Integration tests need a Docker engine and sshd; .ci/run installs and starts them.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv smoke test lint clean-venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[workload,plots,dev]'
	touch $@

smoke: venv
	$(BIN)/orchestrate matrix matrices/cpu_smoke.toml

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check orchestrator workload tests benchmarks
	$(BIN)/mypy

clean-venv:
	rm -rf $(VENV)
