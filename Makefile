# `make serve` and `make test` each set up .venv from the project's own files first
# (idempotent: a no-op when pyproject.toml and requirements.lock have not changed).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The LiteLLM proxy of the gateway tests and demo, in a virtualenv of its own: litellm[proxy]
# pins websockets<16 and rich<14, below the service's (clients/python/README.md, "LiteLLM").
GATEWAY_VENV := .venv-gateway
GATEWAY_STAMP := $(GATEWAY_VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
CITUS_URL ?= postgresql+psycopg://postgres@127.0.0.1:9700/postgres

.PHONY: serve test test-long lint typecheck unit promtool browser citus citus-stop bench bench-compare \
	bench-per-request lock \
	lock-gateway gateway-demo clean

# The service, its dev tools, and the gateway's client library (clients/python, editable).
$(STAMP): pyproject.toml requirements.lock clients/python/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		-c requirements.lock -e '.[dev]' -e clients/python
	@touch $(STAMP)

$(GATEWAY_STAMP): clients/python/pyproject.toml clients/python/litellm.lock
	@test -x $(GATEWAY_VENV)/bin/python || $(PYTHON) -m venv $(GATEWAY_VENV)
	$(GATEWAY_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c clients/python/litellm.lock -e 'clients/python[litellm]'
	@touch $(GATEWAY_STAMP)

serve: $(STAMP)
	$(BIN)/metering serve --host $(HOST) --port $(PORT)

test: browser citus lint typecheck unit

# The model-based test at length (nightly): many more examples of more steps than `make test`
# runs, on a new seed each time (printed; METERING_MODEL_SEED=<seed> replays a run).
MODEL_EXAMPLES ?= 40
MODEL_STEPS ?= 120
test-long: $(STAMP)
	METERING_MODEL_EXAMPLES=$(MODEL_EXAMPLES) METERING_MODEL_STEPS=$(MODEL_STEPS) \
	METERING_TEST_BACKENDS="$${METERING_TEST_BACKENDS:-sqlite,postgresql,citus}" \
	METERING_TEST_CITUS_URL="$${METERING_TEST_CITUS_URL:-$(CITUS_URL)}" \
		$(BIN)/pytest tests/reliability/test_model_based.py -s -q $(PYTEST_ARGS)

# The portal's tests drive a real browser: Debian's chromium and its chromedriver, installed
# when missing (as root, as on CI; `apt-get update` first, as a fresh machine has no lists).
browser:
	@if ! test -x /usr/bin/chromium || ! test -x /usr/bin/chromedriver; then \
		echo "installing chromium and chromium-driver (Debian packages) for the portal's tests"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			chromium chromium-driver fonts-dejavu-core; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check metering tests bench clients/python
	$(BIN)/ruff format --check metering tests bench clients/python

typecheck: $(STAMP)
	$(BIN)/mypy metering clients/python/src

# The Citus backend is on unless METERING_TEST_BACKENDS says otherwise (`make test` starts the
# cluster first; `make unit` alone needs `make citus` once). The suite runs in TEST_WORKERS
# processes (pytest-xdist): its tests mostly wait on servers, databases and browsers, so two
# share two cores well; each worker makes its own databases, servers and ports. A worker that
# runs out of tests takes half of the other's queue (worksteal), so neither idles at the end.
TEST_WORKERS ?= 2
unit: $(STAMP) $(GATEWAY_STAMP) promtool
	METERING_TEST_BACKENDS="$${METERING_TEST_BACKENDS:-sqlite,postgresql,citus}" \
	METERING_TEST_CITUS_URL="$${METERING_TEST_CITUS_URL:-$(CITUS_URL)}" \
		$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# A local Citus cluster (coordinator 127.0.0.1:9700, workers 9701 and 9702, and a spare node on
# 9703 that only the rebalance test registers, in its own database), Citus built from the
# vendored source when it is not installed (scripts/citus.sh). The suite's `citus` backend runs on
# it: METERING_TEST_CITUS_URL=postgresql+psycopg://postgres@127.0.0.1:9700/postgres and `citus`
# in METERING_TEST_BACKENDS (as .ci/run sets them).
citus:
	@bash scripts/citus.sh start

citus-stop:
	@bash scripts/citus.sh stop

# promtool (Debian's prometheus package) checks /metrics' output in the tests.
promtool:
	@bash .ci/install-promtool

# `make bench` runs every benchmark; `make bench BENCH="ledger ingest"` runs those named.
# `make bench BENCH=citus` starts the local Citus cluster (scripts/citus.sh; CITUS_PORT,
# CITUS_DIR) when its coordinator does not answer.
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH)

# `make bench-compare [BASE=<rev>] [BENCH="ledger ingest"]`: those benchmarks on a clean checkout
# of BASE (default: the commit before HEAD), on the working tree and on the pinned REFERENCE,
# alternated three times; one table of medians and ratios, flagging any figure more than 10%
# worse than BASE's, or whose ratio to its ceiling is more than 10% below REFERENCE's
# (`REFERENCE=` leaves it out; see docs/performance.md).
BASE ?= HEAD~1
# The gateway's routes as measured on 2026-12-01, before grants, access rules, webhooks and the
# Citus forms (docs/performance.md, "Figures").
REFERENCE ?= 2d348c8
bench-compare: $(STAMP)
	$(BIN)/python -m bench.compare --base "$(BASE)" $(if $(REFERENCE),--reference "$(REFERENCE)") $(BENCH)

# `make bench-per-request [BENCH="ingest authorize"] [CODE=<dir>]`: instructions, statements and
# WAL per gateway request, which a busy machine does not change (bench/per_request.py;
# docs/performance.md, "Costs too small for throughput").
bench-per-request: $(STAMP)
	$(BIN)/python -m bench.per_request $(if $(CODE),--code "$(CODE)") $(BENCH)

# Re-pin every dependency to what is installed in .venv now.
lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable \
		| grep -v -i -E '^(metering|yappi|py-spy|pyinstrument)' > requirements.lock

# The same for the LiteLLM proxy's virtualenv.
lock-gateway: $(GATEWAY_STAMP)
	$(GATEWAY_VENV)/bin/python -m pip freeze --exclude-editable \
		| grep -v -i -E '^metering' > clients/python/litellm.lock

# Metering on embedded SQLite, the LiteLLM proxy in front of it (mock models), one request
# through the proxy that spends credit (scripts/gateway-demo.sh; KEEP=1 leaves both running).
gateway-demo: $(STAMP) $(GATEWAY_STAMP)
	@bash scripts/gateway-demo.sh

clean:
	rm -rf $(VENV) $(GATEWAY_VENV) .mypy_cache .pytest_cache .ruff_cache
