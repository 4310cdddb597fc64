"""What each page shows, taken from the services behind the JSON routes (never a second
computation): ``/v1/credits``'s balance, ``/v1/usage``'s report, ``/v1/models``' cards, the
spend-limit check's spend, the ledger and the export manifests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.catalog.service import listed_models
from metering.kit.timeutil import format_timestamp, next_month, start_of_month
from metering.ledger import service as ledger
from metering.models import ApiKey
from metering.reports import params, service
from metering.reports.params import ReportQuery
from metering.reports.service import Report
from metering.usage.spend import key_charges

if TYPE_CHECKING:
    from metering.exports.files import AccountFile

OVERVIEW_DAYS = 30
ACTIVITY_DAYS = 31


def credits(session: Session, account_id: str, now: datetime) -> dict[str, Any]:
    """Exactly ``GET /v1/credits``."""
    return ledger.credit_balance(session, account_id, now)


def report(session: Session, account_id: str, billing: str, query: ReportQuery) -> Report:
    """Exactly ``GET /v1/usage``'s report for the same query."""
    with service.cyclic_gc_paused():
        return service.usage_report(session, account_id, billing, query)


def usage_query(
    now: datetime,
    starting_at: str | None,
    ending_at: str | None,
    bucket_width: str | None,
    group_by: str | None,
) -> ReportQuery:
    """The report query of the Usage page's form, checked by ``GET /v1/usage``'s own rules;
    without a start, the last 7 days (or 24 hours)."""
    width = bucket_width or "1d"
    if not starting_at and width in params.BUCKET_WIDTHS:
        current = params.floor_to_bucket(now, width)
        back = timedelta(days=6) if width == "1d" else timedelta(hours=23)
        starting_at = format_timestamp(current - back)
    return params.parse_report_query(
        starting_at=starting_at or None,
        ending_at=ending_at or None,
        bucket_width=bucket_width or None,
        group_by=group_by or None,
        models=(),
        api_key_ids=(),
        output_format=None,
        now=now,
    )


def overview_query(now: datetime) -> ReportQuery:
    """The last 30 UTC days, today included, by model."""
    today = params.floor_to_bucket(now, "1d")
    return usage_query(
        now, format_timestamp(today - timedelta(days=OVERVIEW_DAYS - 1)), None, "1d", "model"
    )


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: str
    name: str
    prefix: str
    status: str
    created_at: datetime
    limit_microcents: int | None
    spent_microcents: int  # in the current month, as the spend-limit check counts it
    window_start: datetime
    window_end: datetime


def keys(session: Session, account_id: str, now: datetime) -> list[KeyRow]:
    """The account's keys (revoked ones too) with this month's spend, the figure the
    pre-flight check compares with the limit."""
    start = start_of_month(now)
    end = next_month(start)
    spent = key_charges(account_id, ApiKey.id, start, end).correlate(ApiKey)
    rows = session.execute(
        select(ApiKey, spent.label("spent"))
        .where(ApiKey.account_id == account_id)
        .order_by(ApiKey.created_at, ApiKey.id)
    ).all()
    return [
        KeyRow(
            id=key.id,
            name=key.name,
            prefix=key.prefix,
            status="revoked" if key.revoked_at else "active",
            created_at=key.created_at,
            limit_microcents=key.monthly_spend_limit_microcents,
            spent_microcents=int(spent_value),
            window_start=start,
            window_end=end,
        )
        for key, spent_value in rows
    ]


def activity(session: Session, account_id: str, now: datetime) -> dict[str, Any]:
    today = params.floor_to_bucket(now, "1d")
    since = today - timedelta(days=ACTIVITY_DAYS - 1)
    found = ledger.activity(session, account_id, since, today + timedelta(days=1))
    return {**found, "since": since}


def models(session: Session, account_id: str, now: datetime) -> list[dict[str, Any]]:
    """``GET /v1/models``' cards for the account: the models it may use, at its rates (a key's
    own list may narrow them further: the Keys page shows it)."""
    return listed_models(session, None, now, account_id=account_id)


def exports(export_dir: Path, account_id: str) -> list[AccountFile]:
    # Imported here: the export files' module loads pandas and pyarrow (tens of MB), which
    # the server's other routes never need (every worker would carry them).
    from metering.exports.files import account_files

    return account_files(export_dir, account_id)


def chart_of(report: Report) -> dict[str, Any]:
    """What the chart draws: per group, per bucket, the cost in microcents (requests for an
    unbilled account). The table shows each of these numbers."""
    measure = 4 if report.billed else 0
    groups = sorted({key for bucket in report.buckets for key, _ in bucket.results})
    by_key = report.query.group_by == "api_key"
    per_bucket = [dict(bucket.results) for bucket in report.buckets]
    datasets = []
    for group in groups:
        values = []
        for results in per_bucket:
            found = results.get(group)
            values.append(found[measure] if found is not None else 0)
        label = f"{report.key_names.get(group, '')} ({group})" if by_key else group
        datasets.append({"label": label, "data": values})
    return {
        "unit": "usd" if report.billed else "requests",
        "labels": [format_timestamp(bucket.starting_at) for bucket in report.buckets],
        "datasets": datasets,
    }
