"""The move of a single-server database onto a Citus cluster (docs/citus.md, "Moving an existing
database onto a cluster"), run as written.

A plain PostgreSQL database is made by ``metering migrate`` and filled through the real app:
accounts, keys, credit grants, holds (active, voided, settled), usage events (a batch, a single
one, a resent one, a quarantined one), a webhook endpoint, reports. Then the document's two blocks
run in bash, substituting only what is the reader's own: the source's URL, the cluster's nodes
(the local cluster's), a database name of the test's own, ``PGUSER``, and the virtualenv's path.
Afterwards every table of the schema holds on the cluster exactly the rows of the source,
the operator's and the account's views answer the same, ``metering verify`` is clean (the block
runs it), every table is placed by the rule, and the service keeps working there: a hold, and a
usage event that settles it, on a moved account, then ``verify`` clean again. Needs ``postgresql``
and ``citus`` in METERING_TEST_BACKENDS."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from metering.models import Base
from tests.conftest import (
    ADMIN_TOKEN,
    BACKENDS,
    CITUS,
    CITUS_MAINTENANCE_URL,
    GATEWAY_TOKEN,
    NOW,
    SECRET_KEY,
    Api,
    fresh_pg_database,
    running_api,
)
from tests.factories import (
    Key,
    authorize,
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.test_citus import rows

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CITUS_DOC = (ROOT / "docs" / "citus.md").read_text()


def move_blocks() -> tuple[str, str]:
    """docs/citus.md's two blocks of the move: where from and to, then the steps."""
    start = CITUS_DOC.index("\n## Moving an existing database onto a cluster\n")
    end = CITUS_DOC.index("\n## ", start + 1)
    blocks = re.findall(r"```sh\n(.*?)```", CITUS_DOC[start:end], re.DOTALL)
    assert len(blocks) == 2, blocks
    return blocks[0], blocks[1]


def metering(command: str, url: str, tmp: Path) -> None:
    """``metering <command>`` on the database at ``url``, as an operator runs it; it succeeds."""
    done = subprocess.run(
        [str(BIN / "metering"), command],
        env=cli_env(url, tmp),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def cli_env(url: str | None, tmp: Path) -> dict[str, str]:
    """An operator's shell: the service's settings (the Quickstart on PostgreSQL's), the
    database's URL if given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("METERING_", "PG"))}
    env.update(
        {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "METERING_ADMIN_TOKENS": ADMIN_TOKEN,
            "METERING_GATEWAY_TOKENS": GATEWAY_TOKEN,
            "METERING_SECRET_KEY": SECRET_KEY,
            "METERING_PUBLIC_BASE_URL": "http://testserver",
            "METERING_DATA_DIR": str(tmp / "data"),
            "METERING_EXPORT_DIR": str(tmp / "exports"),
        }
    )
    if url is not None:
        env["METERING_DATABASE_URL"] = url
    return env


def every_table(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of the schema, its rows in a stable order (all columns, as text)."""
    found = {}
    for name, table in Base.metadata.tables.items():
        columns = ", ".join(f'"{c.name}"::text' for c in table.columns)
        order = ", ".join(str(i + 1) for i in range(len(table.columns)))
        found[name] = rows(url, f'SELECT {columns} FROM "{name}" ORDER BY {order}')
    found["alembic_version"] = rows(url, "SELECT version_num FROM alembic_version")
    return found


# --- The source: a single server, filled through the service ------------------------------


def fill(api: Api) -> dict[str, Any]:
    """What an operator and a gateway did over a few days; what to look at afterwards."""
    model = priced_model(api, NOW - timedelta(days=30))
    other = priced_model(api, NOW - timedelta(days=30), rates=(1_000_000, 2_000_000, 500_000))
    prepaid, second, unbilled = (
        create_account(api),
        create_account(api),
        create_account(api, billing="unbilled"),
    )
    keys: dict[str, list[Key]] = {
        prepaid: [create_key(api, prepaid), create_key(api, prepaid, limit_cents=5000)],
        second: [create_key(api, second)],
        unbilled: [create_key(api, unbilled)],
    }
    grant(api, prepaid, 10_000)
    grant(api, second, 2_500)
    promotional = api.admin(
        "POST",
        f"/admin/v1/accounts/{prepaid}/grants",
        json={
            "amount_cents": 700,
            "idempotency_key": "promo",
            "category": "promotional",
            "expires_at": "2027-01-31T00:00:00Z",
        },
    )
    assert promotional.status_code == 201, promotional.text

    # Holds: one voided, one settled by its event, one left active on each prepaid account.
    key = keys[prepaid][0]
    voided = authorize(api, key, model, max_tokens=500)
    assert voided.status_code == 200, voided.text
    assert api.gateway("DELETE", f"/v1/authorizations/{voided.json()['id']}").status_code == 200
    settled = authorize(api, key, model, max_tokens=800, request_id="req-settled")
    assert settled.status_code == 200, settled.text
    for account in (prepaid, second):
        active = authorize(api, keys[account][0], model, max_tokens=300)
        assert active.status_code == 200, active.text

    # Usage over three days: a batch over every key, the settling event, a resend, a single
    # event, and one of a key the service does not know (quarantined).
    batch = [
        usage_event(
            keys[account][index % len(keys[account])],
            (model, other)[index % 2],
            NOW - timedelta(hours=5 * index + 1),
            chat_usage(1000 + 37 * index, 50 + index, cached=index * 10),
        )
        for index in range(12)
        for account in (prepaid, second, unbilled)
    ]
    settling = usage_event(key, model, NOW - timedelta(minutes=3), request_id="req-settled")
    assert ingest(api, *batch, settling)["recorded"] == len(batch) + 1
    assert ingest(api, batch[0])["duplicates"] == 1
    assert ingest(api, usage_event(keys[second][0], other, NOW))["recorded"] == 1
    stranger = Key("key_unknown0000000000000000", "", prepaid)
    assert ingest(api, usage_event(stranger, model, NOW))["quarantined"] == 1
    endpoint = api.admin(
        "POST",
        "/admin/v1/webhook-endpoints",
        json={
            "url": "https://hooks.example.com/metering",
            "event_types": ["credit.balance_low", "webhook.test"],
            "account_id": prepaid,
        },
    )
    assert endpoint.status_code == 201, endpoint.text
    return {"accounts": [prepaid, second, unbilled], "keys": keys, "model": model}


def views(api: Api, filled: dict[str, Any]) -> dict[str, Any]:
    """What the operator and each account see: credits, grants, ledger, holds, usage reports,
    quarantine, audit log."""
    seen: dict[str, Any] = {}

    def get(path: str, response: Any) -> None:
        assert response.status_code == 200, (path, response.text)
        seen[path] = response.json()

    for account in filled["accounts"]:
        for what in ("credits", "grants", "ledger", "api-keys"):
            path = f"/admin/v1/accounts/{account}/{what}"
            get(path, api.admin("GET", path))
        path = f"/admin/v1/authorizations?account_id={account}"
        get(path, api.admin("GET", "/admin/v1/authorizations", params={"account_id": account}))
        secret = filled["keys"][account][0].secret
        get(f"{account} /v1/credits", api.as_key(secret, "GET", "/v1/credits"))
        for params in (
            {"starting_at": "2026-11-20", "group_by": "model"},
            {"starting_at": "2026-11-20", "group_by": "api_key"},
            {"starting_at": "2026-11-28T00:00:00Z", "bucket_width": "1h"},
        ):
            get(
                f"{account} /v1/usage {params}",
                api.as_key(secret, "GET", "/v1/usage", params=params),
            )
    get("/admin/v1/quarantine", api.admin("GET", "/admin/v1/quarantine"))
    get("/admin/v1/audit-events", api.admin("GET", "/admin/v1/audit-events"))
    return seen


# --- The cluster's side ----------------------------------------------------------------------


def cluster_nodes() -> list[str]:
    """The local cluster's nodes as ``host:port``, the coordinator first."""
    coordinator = make_url(CITUS_MAINTENANCE_URL)
    workers = rows(
        CITUS_MAINTENANCE_URL,
        "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 AND isactive ORDER BY 2",
    )
    return [f"{coordinator.host}:{coordinator.port}", *(f"{h}:{p}" for h, p in workers)]


@contextmanager
def dropped_afterwards(nodes: list[str], database: str) -> Iterator[None]:
    try:
        yield
    finally:
        user = make_url(CITUS_MAINTENANCE_URL).username or "postgres"
        for node in nodes:
            engine = create_engine(
                f"postgresql+psycopg://{user}@{node}/postgres", isolation_level="AUTOCOMMIT"
            )
            try:
                with engine.connect() as connection:
                    connection.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            finally:
                engine.dispose()


def test_a_single_server_database_moved_onto_the_cluster_as_the_readme_says(
    tmp_path: Path,
) -> None:
    if "postgresql" not in BACKENDS or not CITUS:
        pytest.fail("this test needs PostgreSQL and Citus (METERING_TEST_BACKENDS)")
    where, steps = move_blocks()
    # The reader's own values are set in the first block only, by these names.
    assigned = re.findall(r"^(?:export )?(\w+)=", where, re.MULTILINE)
    assert assigned == ["OLD", "NODES", "DB", "PGUSER"], where
    assert ".venv/bin/metering migrate" in steps and "pg_restore" in steps

    with fresh_pg_database() as source:
        # The source as an operator made it: `metering migrate`, then the service's traffic.
        metering("migrate", source, tmp_path)
        with running_api("postgresql", source, tmp_path / "source") as api:
            filled = fill(api)
            before = views(api, filled)
        source_rows = every_table(source)
        assert source_rows["usage_events"] and source_rows["quarantined_events"]

        nodes = cluster_nodes()
        database = f"metering_move_{secrets.token_hex(5)}"
        user = make_url(CITUS_MAINTENANCE_URL).username or "postgres"
        source_libpq = make_url(source).set(drivername="postgresql").render_as_string(False)
        settings = (
            f"OLD={source_libpq}\nNODES=({' '.join(nodes)})\nDB={database}\nexport PGUSER={user}\n"
        )
        script = "set -euo pipefail\n" + settings + steps.replace(".venv/bin/", f"{BIN}/")
        with dropped_afterwards(nodes, database):
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=tmp_path,
                env=cli_env(None, tmp_path),
                capture_output=True,
                text=True,
                timeout=900,
            )
            out = done.stdout + done.stderr
            assert done.returncode == 0, out
            assert "nothing to apply" in out, out  # the dump was at the newest migration
            assert re.search(r"Citus: \d+ account tables distributed by account", out), out
            assert re.search(r"^verified \d+ accounts", out, re.MULTILINE), out

            target = f"postgresql+psycopg://{user}@{nodes[0]}/{database}"
            placed = dict(
                rows(target, "SELECT table_name::text, citus_table_type FROM citus_tables")
            )
            assert set(placed) == set(Base.metadata.tables), placed
            assert placed["usage_events"] == "distributed" and placed["api_keys"] == "reference"
            # The rows arrived whole, in every table, and read from their new places.
            assert every_table(target) == source_rows

            with running_api("citus", target, tmp_path / "cluster") as moved:
                assert views(moved, filled) == before
                # The service keeps working there: a hold, then the event that settles it.
                account = filled["accounts"][0]
                key = filled["keys"][account][0]
                hold = authorize(moved, key, filled["model"], max_tokens=200, request_id="after")
                assert hold.status_code == 200 and hold.json()["status"] == "active", hold.text
                event = usage_event(key, filled["model"], NOW, request_id="after")
                assert ingest(moved, event)["recorded"] == 1
                [(status,)] = rows(
                    target,
                    "SELECT status FROM authorizations WHERE id = :id",
                    id=hold.json()["id"],
                )
                assert status == "settled"
                credits = moved.as_key(key.secret, "GET", "/v1/credits").json()
                assert (
                    credits["balance_microcents"]
                    < before[f"{account} /v1/credits"]["balance_microcents"]
                )
            metering("verify", target, tmp_path)
