# `make serve` and `make test` each set up .venv from the project's own files first
# (idempotent: a no-op when pyproject.toml and requirements.lock have not changed).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: serve test lint typecheck unit bench lock clean

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c requirements.lock -e '.[dev]'
	@touch $(STAMP)

serve: $(STAMP)
	$(BIN)/metering serve --host $(HOST) --port $(PORT)

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check metering tests bench
	$(BIN)/ruff format --check metering tests bench

typecheck: $(STAMP)
	$(BIN)/mypy metering

unit: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# `make bench` runs every benchmark; `make bench BENCH="ledger ingest"` runs those named.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

# Re-pin every dependency to what is installed in .venv now.
lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable \
		| grep -v -i -E '^(metering|yappi|py-spy|pyinstrument)' > requirements.lock

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
