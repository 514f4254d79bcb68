# Quick start targets: `make run` (daemon on embedded defaults) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint format dashboards clean mutate

# `make run` installs what the daemon needs; `make test` adds the test extras.
$(VENV)/.runtime: pyproject.toml setup.py core/power/_stream.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(VENV)/.runtime
	$(BIN)/edgewatt serve $(ARGS)

# The client tests run a second time on the psutil backend (macOS, Windows, BSD).
CLIENT_TESTS := tests/test_client.py tests/test_monitors.py tests/test_run_report.py tests/test_backends.py

# fetch-stores unpacks Debian 13's VictoriaMetrics and Prometheus into .cache/stores
# for the fleet tests (no system change), fetch-flower Flower 1.42 into a venv of its
# own in .cache/flower for the Flower tests, fetch-heflwr heflwr 0.1.91 (--no-deps, with
# psutil and prometheus-client) into .cache/heflwr for tests/test_heflwr_compat.py,
# fetch-codecarbon codecarbon 3.3.2 into .cache/codecarbon for tests/test_emissions.py;
# where they cannot, the tests say why.
# other-pythons runs the client, run/report, daemon and exit tests on Python 3.8 and
# 3.13 where they are present (pyenv here), each in .cache/python-X.Y.
test: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	tests/bin/fetch-stores
	tests/bin/fetch-flower
	tests/bin/fetch-heflwr
	tests/bin/fetch-codecarbon
	$(BIN)/pytest
	EDGEWATT_CLIENT_BACKEND=psutil $(BIN)/pytest $(CLIENT_TESTS)
	tests/bin/other-pythons 3.8 3.13

# The mutation check of the modules that compute figures (tests/mutation/targets.txt,
# docs/mutation.md): slow, so neither in `make test` nor in .ci/run. MODULES= picks some.
mutate: $(VENV)/.test
	tests/bin/mutate $(MODULES)

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.test
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

dashboards: $(VENV)/.runtime
	$(BIN)/python deploy/grafana/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
