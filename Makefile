# Quick start targets: `make run` (daemon on embedded defaults) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint format dashboards clean

$(BIN)/edgewatt: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

run: $(BIN)/edgewatt
	$(BIN)/edgewatt serve

# The client tests run a second time on the psutil backend (macOS, Windows, BSD).
CLIENT_TESTS := tests/test_client.py tests/test_monitors.py tests/test_run_report.py tests/test_backends.py

test: $(BIN)/edgewatt
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest
	EDGEWATT_CLIENT_BACKEND=psutil $(BIN)/pytest $(CLIENT_TESTS)

lint: $(BIN)/edgewatt
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(BIN)/edgewatt
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

dashboards: $(BIN)/edgewatt
	$(BIN)/python deploy/grafana/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
