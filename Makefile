# The two commands a newcomer needs: `make run` and `make test`. Each sets itself up first.
# Python 3.11, 3.12 or 3.13: the newest one found on PATH, or PYTHON=/path/to/python3.x.
PYTHON ?= $(shell tools/find_python.sh)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8080
# Every install takes the exact versions (and hashes) of requirements.lock; `make lock` refreshes
# it from pyproject.toml for every supported Python at once.
LOCK := requirements.lock

# Test workers (pytest-xdist): one per core by default.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := ROUTERPANEL_DATA_DIR=$${ROUTERPANEL_DATA_DIR:-$$(mktemp -d)} $(PY) -m pytest
# Browser tests share a Playwright session and one panel server per worker: they run as one
# group on one worker (--dist loadgroup), never interleaved with asyncio tests, while the other
# workers take every other test one at a time.
PARALLEL := -n $(JOBS) --dist loadgroup

.PHONY: run test check bench-smoke lint docs docs-serve setup lock clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	@test -n "$(PYTHON)" || { echo "RouterPanel needs Python 3.11, 3.12 or 3.13 and found none on PATH; set PYTHON=/path/to/python3.x" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v <= (3, 13) else "RouterPanel needs Python 3.11, 3.12 or 3.13, not %d.%d (set PYTHON=/path/to/python3.x)" % v)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --universal --python-version 3.11 \
		--generate-hashes --custom-compile-command "make lock" --quiet -o $(LOCK)

run: $(STAMP)
	$(PY) manage.py serve --demo-if-empty --host $(HOST) --port $(PORT) $(ARGS)

# Every tier, in parallel, but the benchmark smoke test (make bench-smoke).
test: $(STAMP)
	$(PYTEST) $(PARALLEL) -m "not bench" $(PYTEST_ARGS)

# The edit loop: lint, then the unit and app tiers in parallel (under 2 minutes on 2 cores).
check: lint
	$(PYTEST) $(PARALLEL) tests/unit tests/app $(PYTEST_ARGS)

# Every benchmark part runs to its end on the real llama-server (bench/run_all.py --quick).
bench-smoke: $(STAMP)
	$(PYTEST) -m bench $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy routerpanel models_app

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a link to a missing page or anchor
# fails the build. docs-serve rebuilds it on every change at http://127.0.0.1:8000/.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(STAMP)
	$(MKDOCS) build --strict --quiet

docs-serve: $(STAMP)
	$(MKDOCS) serve --strict

clean:
	rm -rf $(VENV)
