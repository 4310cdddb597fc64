"""The Grafana provisioning in ``dashboards/``: every panel's SQL, with Grafana's macros and the
``$account`` variable substituted as Grafana does, runs on PostgreSQL against usage sent through
the real app, and returns the columns its panel shows; money is exact numeric, never float."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from tests.conftest import NOW, Api, running_api
from tests.exports.helpers import DAY, midnight, send, tenant

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
DASHBOARD = DASHBOARDS / "json" / "metering.json"

# What each panel shows, by title and query: the columns Grafana reads.
EXPECTED_COLUMNS = {
    ("Spend per day by model", "A"): ["time", "metric", "spend_usd"],
    ("Tokens per hour", "A"): [
        "time",
        "uncached_input",
        "cache_read",
        "output_excluding_reasoning",
        "reasoning",
    ],
    ("Top API keys by spend", "A"): [
        "api_key",
        "key_name",
        "account",
        "requests",
        "input_tokens",
        "output_tokens",
        "spend_usd",
    ],
    ("Accounts closest to zero balance", "A"): [
        "account_id",
        "account",
        "balance_usd",
        "held_usd",
        "available_usd",
    ],
    ("Quarantined events by code", "A"): ["time", "metric", "events"],
    ("Ingest rate", "A"): ["time", "recorded_per_second"],
    ("Ingest rate", "B"): ["time", "quarantined_per_second"],
    ("Latest quarantined events", "A"): [
        "time",
        "code",
        "account_id",
        "api_key_id",
        "request_id",
        "model",
        "attempts",
        "message",
    ],
}
RANGE_FROM = midnight(DAY)
RANGE_TO = NOW


def grafana_time(at: datetime) -> str:
    return "'" + at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") + "'"


_INTERVALS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def expand(sql: str, accounts: list[str]) -> str:
    """Grafana's PostgreSQL macros and a multi-value variable, expanded as Grafana does."""

    def group(match: re.Match[str], alias: bool) -> str:
        column, interval = match.group(1).strip(), match.group(2).strip().strip("'")
        seconds = int(interval[:-1]) * _INTERVALS[interval[-1]]
        expression = f"floor(extract(epoch from {column})/{seconds})*{seconds}"
        return expression + (' AS "time"' if alias else "")

    sql = re.sub(r"\$__timeGroupAlias\(([^,]+),([^)]+)\)", lambda m: group(m, alias=True), sql)
    sql = re.sub(r"\$__timeGroup\(([^,]+),([^)]+)\)", lambda m: group(m, alias=False), sql)
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)",
        lambda m: f"{m.group(1)} BETWEEN {grafana_time(RANGE_FROM)} AND {grafana_time(RANGE_TO)}",
        sql,
    )
    sql = sql.replace("$__timeFrom()", grafana_time(RANGE_FROM))
    sql = sql.replace("$__timeTo()", grafana_time(RANGE_TO))
    sql = sql.replace("$account", ",".join(f"'{a}'" for a in accounts))
    assert "$" not in sql, sql
    return sql


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def targets() -> list[tuple[str, dict[str, Any]]]:
    return [(panel["title"], t) for panel in dashboard()["panels"] for t in panel["targets"]]


def test_provisioning_points_at_the_dashboard_and_one_datasource() -> None:
    (source,) = yaml.safe_load(
        (DASHBOARDS / "provisioning" / "datasources" / "metering.yaml").read_text()
    )["datasources"]
    (provider,) = yaml.safe_load(
        (DASHBOARDS / "provisioning" / "dashboards" / "metering.yaml").read_text()
    )["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./dashboards/json:{provider['options']['path']}:ro" in mounts
    board = dashboard()
    assert board["uid"] and board["title"]
    found = {(title, t["refId"]) for title, t in targets()}
    assert found == set(EXPECTED_COLUMNS)
    sources = [p["datasource"] for p in board["panels"]] + [t["datasource"] for _, t in targets()]
    sources += [v["datasource"] for v in board["templating"]["list"]]
    assert {(s["type"], s["uid"]) for s in sources} == {(source["type"], source["uid"])}
    for _, target in targets():
        assert target["rawQuery"] and target["format"] in ("time_series", "table")
        # Money is divided as exact numeric, never through float.
        assert not re.search(r"\b(float|real|double)", target["rawSql"], re.IGNORECASE)


@pytest.mark.pg_only
def test_every_panel_query_runs_on_postgresql_and_returns_its_columns(
    plain_pg_url: str, tmp_path: Path
) -> None:
    with running_api("postgresql", plain_pg_url, tmp_path) as api:
        check_panels(api)


def check_panels(api: Api) -> None:
    t = tenant(api)
    free = tenant(api, "unbilled", names=("lab",))
    prod, ci = t.keys
    glm, odd = sorted(t.models)
    grant = api.admin(
        "POST",
        f"/admin/v1/accounts/{t.account_id}/grants",
        json={"amount_cents": 250, "idempotency_key": "dash", "note": "dashboards"},
    )
    assert grant.status_code in (200, 201), grant.text
    start = midnight(DAY)
    send(api, t, prod, glm, start + timedelta(hours=1), 4000, 1000, 500, 200)
    send(api, t, ci, odd, start + timedelta(hours=1, minutes=5), 333, 0, 33)
    send(api, t, prod, odd, start + timedelta(hours=30), 1200, 600, 60, api_name="responses")
    send(api, free, free.keys[0], sorted(free.models)[0], start + timedelta(hours=2), 10, 0, 1)
    quarantined = send(api, t, ci, "no-such-model", start + timedelta(hours=3))
    assert quarantined["status"] == "quarantined"
    hold = api.gateway(
        "POST",
        "/v1/authorizations",
        json={
            "api_key": prod.secret,
            "model": glm,
            "api": "chat_completions",
            "prompt_tokens": 1000,
            "max_tokens": 100,
        },
    )
    assert hold.status_code == 200, hold.text
    held = int(hold.json()["estimate_microcents"])

    def run(title: str, ref: str, accounts: list[str]) -> tuple[list[str], list[Any]]:
        (target,) = [x for name, x in targets() if (name, x["refId"]) == (title, ref)]
        with api.database.engine.connect() as connection:
            result = connection.execute(text(expand(target["rawSql"], accounts)))
            return list(result.keys()), list(result)

    with api.database.engine.connect() as connection:
        everyone = [row[0] for row in connection.execute(text("SELECT id FROM accounts"))]
    for (title, ref), columns in EXPECTED_COLUMNS.items():
        for accounts in (everyone, [t.account_id]):  # "All", and one account
            names, rows = run(title, ref, accounts)
            assert names == columns, (title, ref)
            assert rows, (title, ref, "returns no data")
            for row in rows:
                assert not any(isinstance(value, float) for value in row), (title, row)

    # The figures are exact.
    _, spend = run("Spend per day by model", "A", [t.account_id])
    by_day_model = {(int(r[0].timestamp()), r[1]): r[2] for r in spend}
    costs: dict[tuple[int, str], int] = {}
    for s in t.sent:
        day_start = int(midnight(s.occurred_at.date()).timestamp())
        costs[(day_start, s.model)] = costs.get((day_start, s.model), 0) + s.cost
    assert by_day_model == {k: Decimal(v) / 100_000_000 for k, v in costs.items()}
    _, balances = run("Accounts closest to zero balance", "A", [t.account_id, free.account_id])
    (row,) = balances  # the unbilled account has no balance to run out of
    spent = sum(s.cost for s in t.sent)
    assert row[0] == t.account_id
    assert row[2] == Decimal(250_000_000 - spent) / 100_000_000
    assert row[3] == Decimal(held) / 100_000_000
    assert row[4] == Decimal(250_000_000 - spent - held) / 100_000_000
    _, keys = run("Top API keys by spend", "A", [t.account_id])
    assert [(r[0], r[1]) for r in keys] == [(prod.id, "prod"), (ci.id, "ci")]
    _, tokens = run("Tokens per hour", "A", [t.account_id])
    assert sum(int(r[4]) for r in tokens) == 200
    _, latest = run("Latest quarantined events", "A", [t.account_id])
    assert quarantined["request_id"] in {r[4] for r in latest}
