"""Reading what ingest stored, straight from the database (the state a report or an export
reads), and sending batches."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from metering.models import Account, LedgerEntry, QuarantinedEvent, UsageEvent, UsageRollup
from tests.conftest import Api


def balance(api: Api, account_id: str) -> int:
    with api.database.unit_of_work() as session:
        account = session.get(Account, account_id)
        assert account is not None
        return int(account.balance_microcents)


def charge_entries(api: Api, account_id: str) -> list[int]:
    with api.database.unit_of_work() as session:
        return [
            int(amount)
            for amount in session.execute(
                select(LedgerEntry.amount_microcents)
                .where(LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge")
                .order_by(LedgerEntry.id)
            ).scalars()
        ]


def events_of(api: Api, account_id: str) -> list[UsageEvent]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(UsageEvent)
                .where(UsageEvent.account_id == account_id)
                .order_by(UsageEvent.id)
            ).scalars()
        )


def rollups_of(
    api: Api, account_id: str
) -> dict[tuple[str, str, datetime, str, str], tuple[int, ...]]:
    """(width, grouping, bucket start, key, model) -> (requests, input, cache read, output,
    reasoning, cost)."""
    with api.database.unit_of_work() as session:
        return {
            (r.bucket_width, r.grouping, r.bucket_start, r.api_key_id, r.model_id): (
                r.requests,
                r.input_tokens,
                r.cache_read_tokens,
                r.output_tokens,
                r.reasoning_tokens,
                r.cost_microcents,
            )
            for r in session.execute(
                select(UsageRollup).where(UsageRollup.account_id == account_id)
            ).scalars()
        }


def quarantine_of(api: Api, account_id: str | None = None, **params: Any) -> list[dict[str, Any]]:
    """Every quarantine entry (of one account), through the admin API, following the cursor."""
    entries: list[dict[str, Any]] = []
    query: dict[str, Any] = {"limit": 1000, **params}
    if account_id is not None:
        query["account_id"] = account_id
    while True:
        response = api.admin("GET", "/admin/v1/quarantine", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        entries.extend(body["data"])
        if not body["has_more"]:
            return entries
        query["after"] = body["next_cursor"]


def quarantine_rows(api: Api, request_id: str) -> list[QuarantinedEvent]:
    with api.database.unit_of_work() as session:
        return list(
            session.execute(
                select(QuarantinedEvent).where(QuarantinedEvent.request_id == request_id)
            ).scalars()
        )


def statuses(body: dict[str, Any]) -> list[str]:
    return [result["status"] for result in body["data"]]
