# The two commands a newcomer needs: `make run` and `make test`. Each sets itself up first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "RouterPanel needs Python 3.11 (set PYTHON=/path/to/python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py serve --demo-if-empty --host $(HOST) --port $(PORT) $(ARGS)

test: $(STAMP)
	ROUTERPANEL_DATA_DIR=$${ROUTERPANEL_DATA_DIR:-$$(mktemp -d)} $(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy routerpanel/router

clean:
	rm -rf $(VENV)
