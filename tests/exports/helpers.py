"""Usage sent through the real ingest route, and what the export files must say about it,
computed here from the events themselves (the price oracle, never the code under test)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from sqlalchemy import func, select

from metering.exports.service import Exporter
from metering.kit.clock import FrozenClock
from metering.kit.timeutil import format_timestamp
from metering.models import ExportDay, ExportRun, UsageEvent
from tests import oracle
from tests.conftest import Api
from tests.factories import Key, create_account, priced_model, usage_object

PRICED_FROM = datetime(2026, 1, 1, tzinfo=UTC)
DAY = date(2026, 11, 28)  # ended: the app's clock (tests.conftest.NOW) is 2026-11-29 12:00
MICRO = timedelta(microseconds=1)
COLUMNS = [
    "date",
    "account_id",
    "api_key_id",
    "api_key_name",
    "model",
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
    "cost_usd",
    "project_id",
    "member_id",
]
# (input, output, cache read) microcents per million tokens
RATES = {
    "glm": (22_000_000, 339_000_000, 17_750_000),
    "odd": (333_333, 777_777, 33_333),
}


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def usd(microcents: int) -> str:
    """Exact dollars, plain notation without trailing zeros (e.g. 0.0008746)."""
    text = format(Decimal(microcents).scaleb(-8), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


@dataclass(frozen=True)
class Sent:
    key: Key
    model: str
    rates: tuple[int, int, int]
    occurred_at: datetime
    prompt: int
    cached: int
    output: int
    reasoning: int
    billed: bool

    @property
    def cost(self) -> int:
        """The price oracle's charge (nothing for an unbilled account)."""
        if not self.billed:
            return 0
        tokens = oracle.Tokens(self.prompt, self.cached, self.output, self.reasoning)
        return oracle.charge(tokens, self.rates).total_microcents


@dataclass
class Tenant:
    account_id: str
    billed: bool
    keys: list[Key]
    key_names: dict[str, str]
    models: dict[str, tuple[int, int, int]]  # model id → rates
    key_members: dict[str, str] = field(default_factory=dict)  # key id → member id, if any
    key_projects: dict[str, str] = field(default_factory=dict)  # key id → project, if not Default
    sent: list[Sent] = field(default_factory=list)


def tenant(api: Api, billing: str = "prepaid", names: Iterable[str] = ("prod", "ci")) -> Tenant:
    account_id = create_account(api, billing)
    names = tuple(names)
    keys, key_names, key_members = [], {}, {}
    # The last key is a member's (the export names it), the others service keys.
    member = api.admin(
        "POST", f"/admin/v1/accounts/{account_id}/members", json={"email": "dev@example.com"}
    ).json()["id"]
    for index, name in enumerate(names, start=1):
        owner = {"member_id": member} if index == len(names) else {}
        response = api.admin(
            "POST", f"/admin/v1/accounts/{account_id}/api-keys", json={"name": name, **owner}
        )
        assert response.status_code == 201, response.text
        key = Key(response.json()["id"], response.json()["key"], account_id)
        keys.append(key)
        key_names[key.id] = name
        if owner:
            key_members[key.id] = member
    models = {priced_model(api, PRICED_FROM, rates): rates for rates in RATES.values()}
    return Tenant(
        account_id, billing == "prepaid", keys, key_names, models, key_members=key_members
    )


def send(
    api: Api,
    t: Tenant,
    key: Key,
    model: str,
    occurred_at: datetime,
    prompt: int = 1000,
    cached: int = 0,
    output: int = 100,
    reasoning: int = 0,
    *,
    api_name: str = "chat_completions",
    outcome: str = "completed",
    request_id: str | None = None,
) -> dict[str, Any]:
    """One event through ``POST /v1/usage/events``; remembered when recorded."""
    event = {
        "request_id": request_id or secrets.token_hex(8),
        "api_key_id": key.id,
        "model": model,
        "api": api_name,
        "usage": usage_object(api_name, prompt, cached, output, reasoning),
        "occurred_at": format_timestamp(occurred_at),
        "outcome": outcome,
    }
    response = api.gateway("POST", "/v1/usage/events", json={"events": [event]})
    assert response.status_code == 200, response.text
    result = response.json()["data"][0]
    if result["status"] == "recorded":
        sent = Sent(
            key, model, t.models[model], occurred_at, prompt, cached, output, reasoning, t.billed
        )
        assert result["charge"]["total_microcents"] == sent.cost, (result, sent)
        t.sent.append(sent)
    return dict(result)


def expected_rows(t: Tenant, day: date) -> list[list[str]]:
    """The CSV rows (as text) the account's file for ``day`` must hold, in key, model order."""
    start, end = midnight(day), midnight(day) + timedelta(days=1)
    sums: dict[tuple[str, str], list[int]] = {}
    for s in t.sent:
        if start <= s.occurred_at < end:
            row = sums.setdefault((s.key.id, s.model), [0] * 6)
            for index, value in enumerate((1, s.prompt, s.cached, s.output, s.reasoning, s.cost)):
                row[index] += value
    rows = []
    for (key_id, model), values in sorted(sums.items(), key=lambda item: item[0]):
        cost = values[5]
        rows.append(
            [
                day.isoformat(),
                t.account_id,
                key_id,
                t.key_names[key_id],
                model,
                *(str(v) for v in values[:5]),
                str(cost) if t.billed else "",
                usd(cost) if t.billed else "",
                # the key's project (the account's Default unless the test made it in another)
                t.key_projects.get(key_id, "proj_" + t.account_id.removeprefix("acct_")),
                t.key_members.get(key_id, ""),
            ]
        )
    return rows


def exporter(api: Api, export_dir: Path, at: datetime) -> tuple[Exporter, FrozenClock]:
    clock = FrozenClock(at)
    return Exporter(api.database, export_dir, clock, runner="test"), clock


def read_csv(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text("utf-8"), newline="")))


def read_parquet_rows(path: Path) -> list[list[str]]:
    """The Parquet file's rows rendered as the CSV renders them (ints as digits, nulls empty)."""
    table = pq.read_table(path)
    assert table.column_names == COLUMNS
    columns = table.to_pydict()
    rows = []
    for index in range(table.num_rows):
        row = []
        for name in COLUMNS:
            value = columns[name][index]
            assert not isinstance(value, float), (name, value)
            row.append("" if value is None else str(value))
        rows.append(row)
    return rows


def manifest(directory: Path) -> dict[str, Any]:
    return dict(json.loads((directory / "manifest.json").read_text("utf-8")))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def newest_event_id(api: Api, account_id: str | None, day: date) -> int:
    """The newest recorded event of ``day`` (ingest order), read from the raw events."""
    start = midnight(day)
    query = select(func.max(UsageEvent.id)).where(
        UsageEvent.occurred_at >= start, UsageEvent.occurred_at < start + timedelta(days=1)
    )
    if account_id is not None:
        query = query.where(UsageEvent.account_id == account_id)
    with api.database.unit_of_work() as session:
        return int(session.execute(query).scalar_one())


def runs(api: Api, day: date) -> list[ExportRun]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(ExportRun).where(ExportRun.export_date == day).order_by(ExportRun.id)
            ).scalars()
        )


def day_state(api: Api, day: date) -> ExportDay | None:
    with api.database.unit_of_work() as session:
        return session.get(ExportDay, day)


def report_day(api: Api, secret: str, day: date) -> dict[str, Any]:
    """``GET /v1/usage`` for exactly ``day`` (the real report route)."""
    response = api.as_key(
        secret,
        "GET",
        "/v1/usage",
        params={
            "starting_at": day.isoformat(),
            "ending_at": (day + timedelta(days=1)).isoformat(),
        },
    )
    assert response.status_code == 200, response.text
    return dict(response.json())
