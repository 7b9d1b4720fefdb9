# The two commands of the README:
#   make smoke   create .venv (orchestrator + workload deps) and run matrices/cpu_smoke.toml
#   make test    create .venv and run the whole test suite, tier after tier
#   make lint    ruff, then mypy (orchestrator/, workload/ and benchmarks/, configured in pyproject.toml)
# The test tiers (derived from the fixtures a test uses: tests/tiers_support.py):
#   make test-fast         unit tier, in parallel: no process, no torch, no service (< 1 min)
#   make test-workload     workload tier: torch, the real workload, the floor venv
#   make test-integration  integration tier, serially: Docker, sshd, Slurm, Chromium, sweeps
# PYTEST_ARGS goes to every pytest run (e.g. PYTEST_ARGS="tests/test_matrix.py -x").
# Integration tests need a Docker engine, sshd and Slurm; .ci/run installs and starts them.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv smoke test test-fast test-workload test-integration lint clean-venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[workload,plots,dev,publish]'
	touch $@

smoke: venv
	$(BIN)/orchestrate matrix matrices/cpu_smoke.toml

# pytest's exit status 5 (no test selected: a PYTEST_ARGS without tests of that tier) is fine.
# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set (as on the project's machines):
# without it pytest rewrites the assertions of every test module on every run, in every xdist
# worker (about 9 s of the unit tier's wall time here); __pycache__/ is git-ignored.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
ALLOW_EMPTY = || [ $$? -eq 5 ]

test-fast: venv
	$(PYTEST) -m unit -n auto $(PYTEST_ARGS) $(ALLOW_EMPTY)

test-workload: venv
	$(PYTEST) -m workload $(PYTEST_ARGS) $(ALLOW_EMPTY)

test-integration: venv
	$(PYTEST) -m integration $(PYTEST_ARGS) $(ALLOW_EMPTY)

# Every tier, even after one failed; the status says whether all passed.
test: venv
	@status=0; \
	$(MAKE) --no-print-directory test-fast || status=1; \
	$(MAKE) --no-print-directory test-workload || status=1; \
	$(MAKE) --no-print-directory test-integration || status=1; \
	exit $$status

lint: venv
	$(BIN)/ruff check orchestrator workload tests benchmarks examples
	$(BIN)/mypy

clean-venv:
	rm -rf $(VENV)
