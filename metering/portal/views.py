"""What each page shows, taken from the services behind the JSON routes (never a second
computation): ``/v1/credits``' balance and grants, ``/v1/usage``'s report, ``/v1/models``' cards,
``/v1/api-keys``' keys and spend, ``/v1/webhook-endpoints``' endpoints and deliveries, the
ledger, and the export manifests and roll-forward files."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.accounts import service as accounts
from metering.catalog.service import listed_models
from metering.kit.timeutil import format_timestamp
from metering.ledger import credit_grants
from metering.ledger import service as ledger
from metering.models import ApiKey
from metering.notifications import outbox
from metering.notifications import service as webhooks
from metering.notifications.service import Scope
from metering.reports import params, service
from metering.reports.params import ReportQuery
from metering.reports.service import Report
from metering.states.grants import GrantStatus

if TYPE_CHECKING:
    from metering.exports.files import AccountFile
    from metering.exports.rollforward import AccountRollForward

OVERVIEW_DAYS = 30
ACTIVITY_DAYS = 31
ROLLFORWARD_DAYS = 31  # the Exports page's days of credit roll-forward rows
PAST_GRANTS = 100  # the newest grants read for the Overview's spent, expired and voided ones
ENDPOINTS_SHOWN = 100  # a page of webhook endpoints; an account with more sees the first 100
DELIVERIES_SHOWN = 10  # recent deliveries per endpoint


def credits(session: Session, account_id: str, now: datetime) -> dict[str, Any]:
    """Exactly ``GET /v1/credits``."""
    return ledger.credit_balance(session, account_id, now)


@dataclass(frozen=True, slots=True)
class Grants:
    """The Overview's grants: the live ones in spending order (``GET /v1/credits``' list),
    each as ``GET /admin/v1/grants/{id}`` shows it (priority, status), and those of the newest
    ``PAST_GRANTS`` that are spent, expired or voided, as the account's grant listing shows
    them; and the account's low-balance threshold (as ``GET /admin/v1/accounts/{id}``)."""

    live: list[dict[str, Any]]
    past: list[dict[str, Any]]
    low_balance_threshold_microcents: int | None


def grants(session: Session, account_id: str, credit: dict[str, Any], now: datetime) -> Grants:
    live_ids = [grant["id"] for grant in credit["grants"]]
    bodies = credit_grants.grant_bodies(session, account_id, live_ids, now)
    newest = credit_grants.list_grants(session, account_id, PAST_GRANTS, None, now)["data"]
    account = accounts.account_body(session, accounts.get_account(session, account_id))
    return Grants(
        live=[bodies[grant_id] for grant_id in live_ids],
        past=[grant for grant in newest if grant["status"] != GrantStatus.ACTIVE],
        low_balance_threshold_microcents=account["low_balance_threshold_microcents"],
    )


def report(session: Session, account_id: str, billing: str, query: ReportQuery) -> Report:
    """Exactly ``GET /v1/usage``'s report for the same query."""
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
    """A key as ``GET /v1/api-keys`` shows it (``body``), with its prefix and its limit in
    microcents from the key itself (the body's limit is in cents)."""

    body: dict[str, Any]
    prefix: str
    limit_microcents: int | None

    @property
    def id(self) -> str:
        return str(self.body["id"])

    @property
    def status(self) -> str:
        return "revoked" if self.body["revoked_at"] else "active"


def keys(session: Session, account_id: str, now: datetime) -> list[KeyRow]:
    """The account's keys (revoked ones too), oldest first, each with its spend in its
    current window: ``GET /v1/api-keys``' bodies, the figure the pre-flight check compares
    with the limit."""
    rows = list(
        session.execute(
            select(ApiKey)
            .where(ApiKey.account_id == account_id)
            .order_by(ApiKey.created_at, ApiKey.id)
        ).scalars()
    )
    bodies = accounts.own_key_bodies(session, rows, now)
    return [
        KeyRow(body, key.prefix, key.monthly_spend_limit_microcents)
        for key, body in zip(rows, bodies, strict=True)
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


def rollforward(export_dir: Path, account_id: str) -> list[AccountRollForward]:
    """The account's rows of the daily credit roll-forward files, newest day first."""
    from metering.exports.rollforward import account_rollforward  # pandas: see exports()

    return account_rollforward(export_dir, account_id, ROLLFORWARD_DAYS)


@dataclass(frozen=True, slots=True)
class EndpointRow:
    body: dict[str, Any]  # as ``GET /v1/webhook-endpoints`` shows it
    deliveries: list[dict[str, Any]]  # as ``GET /v1/webhook-endpoints/{id}/deliveries``


def notifications(session: Session, account_id: str) -> list[EndpointRow]:
    """The account's webhook endpoints, oldest first, each with its newest deliveries."""
    scope = Scope(account_id)
    listed = webhooks.list_endpoints(session, scope, ENDPOINTS_SHOWN, None)["data"]
    return [
        EndpointRow(
            body,
            webhooks.list_deliveries(session, scope, body["id"], DELIVERIES_SHOWN, None)["data"],
        )
        for body in listed
    ]


def account_event_types() -> list[str]:
    """The event types an account's endpoint may receive (not the operator-only ones)."""
    return sorted(outbox.EVENT_TYPES - outbox.OPERATOR_ONLY, key=str.encode)


def chart_of(report: Report) -> dict[str, Any]:
    """What the chart draws: per group, per bucket, the cost in microcents (requests for an
    unbilled account). The table shows each of these numbers."""
    measure = "cost_microcents" if report.billed else "requests"
    groups = sorted({key for bucket in report.buckets for key in bucket.groups})
    by_key = report.query.group_by == "api_key"
    per_bucket = [dict(zip(b.groups, b.columns[measure], strict=True)) for b in report.buckets]
    datasets = []
    for group in groups:
        values = [measured.get(group, 0) for measured in per_bucket]
        label = f"{report.key_names.get(group, '')} ({group})" if by_key else group
        datasets.append({"label": label, "data": values})
    return {
        "unit": "usd" if report.billed else "requests",
        "labels": [format_timestamp(bucket.starting_at) for bucket in report.buckets],
        "datasets": datasets,
    }
