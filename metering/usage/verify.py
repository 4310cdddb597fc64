"""``metering verify``: reconcile what is stored twice.

* every account's balance equals the sum of its ledger entries;
* every account's charge entries add up to its recorded events' charges;
* every ``usage_rollups`` row equals the sum of its events, recomputed here in SQL from
  ``usage_events`` for all six row kinds, both ways (a row missing, a row that should not exist);
* every row that names an account, API key (of its account) or model without a foreign key
  names one that exists (metering.models.base.Names: usage events, holds, ledger entries,
  allocation days, rollups);
* every account's held counter equals the sum of the holds it counts (metering.ledger);
* every account's credit grants: the remainders of its active grants less its deficit
  equal its balance; remainders of grants already expired at the clock whose ``expiry`` entry
  is not yet written are **pending** (counted and reported, not a mismatch): the balance as the
  clock sees it is the written balance less them; its deficit equals its allocation days'
  ``deficit`` and ``refund`` amounts less its ``payoff`` amounts;
* every payment (metering.payments): a succeeded one names a paid grant of its account of
  exactly its amount (cents × 1,000,000), no other names one, and no grant is named twice; its
  ``refunded_cents`` (× 1,000,000) is what its grant's ``refund`` entries took.

Read in one snapshot (REPEATABLE READ on PostgreSQL; on a Citus cluster one per worker,
``citus.one_snapshot``), so it may run beside live ingest. Every sum is exact: PostgreSQL sums
64-bit integers as ``numeric``; SQLite's ``sum()`` refuses a total that leaves the 64-bit range
on the way, even one whose end fits (an account near the range, metering.kit.ranges), so on
SQLite the sums are ``exact_sum``'s, an aggregate of Python integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, case, func, literal, or_, select, type_coerce
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import Label

from metering import citus
from metering.db import exact_sum, is_postgresql
from metering.kit.timeutil import format_timestamp
from metering.ledger.service import held_counter_mismatches
from metering.models import (
    Account,
    Base,
    CreditAllocationDay,
    CreditGrant,
    LedgerEntry,
    Payment,
    UsageEvent,
    UsageRollup,
    table,
)
from metering.models.base import UTCDateTime, named_rows
from metering.states.grants import pending_sql, stored_active
from metering.states.payments import PaymentStatus
from metering.usage.rollups import COUNTERS, GROUPINGS, LAST_EVENT, WIDTHS, RollupKey

EVENTS = table(UsageEvent)
ROLLUPS = table(UsageRollup)
_FIELDS = (*COUNTERS, LAST_EVENT)


@dataclass
class Report:
    accounts: int = 0
    rollup_rows: int = 0
    mismatches: list[str] | None = None
    pending_expiries: int = 0  # grants expired at the clock, their forfeits not yet written
    pending_microcents: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _bucket(session: Session, width: str) -> ColumnElement[Any]:
    column = EVENTS.c.occurred_at
    if is_postgresql(session):
        expr = func.date_trunc("hour" if width == "1h" else "day", column, "UTC")
    else:
        # SQLite keeps UTC text 'YYYY-MM-DD HH:MM:SS.ffffff' (see UTCDateTime).
        pattern = "%Y-%m-%d %H:00:00.000000" if width == "1h" else "%Y-%m-%d 00:00:00.000000"
        expr = func.strftime(pattern, column)
    return type_coerce(expr, UTCDateTime)


def _expected_rollups(session: Session) -> dict[RollupKey, dict[str, int]]:
    """Every rollup row as the events add up to: its counters and newest event's id, by name."""
    expected: dict[RollupKey, dict[str, int]] = {}
    sums = {
        "requests": func.count(),
        "input_tokens": exact_sum(session, EVENTS.c.prompt_tokens),
        "cache_read_tokens": exact_sum(session, EVENTS.c.cached_tokens),
        "output_tokens": exact_sum(session, EVENTS.c.output_tokens),
        "reasoning_tokens": exact_sum(session, EVENTS.c.reasoning_tokens),
        "cost_microcents": exact_sum(session, EVENTS.c.total_microcents),
        LAST_EVENT: func.max(EVENTS.c.id),
    }
    assert tuple(sums) == _FIELDS
    for width in WIDTHS:
        bucket = _bucket(session, width).label("bucket_start")
        for grouping in GROUPINGS:
            key_column = EVENTS.c.api_key_id if grouping != "model" else None
            model_column = EVENTS.c.model_id if grouping != "key" else None
            group = [EVENTS.c.account_id, bucket]
            group += [c for c in (key_column, model_column) if c is not None]
            query = select(
                EVENTS.c.account_id,
                bucket,
                (key_column if key_column is not None else literal("")).label("api_key_id"),
                (model_column if model_column is not None else literal("")).label("model_id"),
                *(value.label(name) for name, value in sums.items()),
            ).group_by(*group)
            for row in session.execute(query).mappings():
                key = RollupKey(
                    account_id=row["account_id"],
                    bucket_width=width,
                    grouping=grouping,
                    bucket_start=row["bucket_start"],
                    api_key_id=row["api_key_id"],
                    model_id=row["model_id"],
                )
                expected[key] = {name: int(row[name]) for name in _FIELDS}
    return expected


def _describe(key: RollupKey) -> str:
    return (
        f"rollup {key.account_id} {key.bucket_width} {key.grouping} "
        f"{format_timestamp(key.bucket_start)} "
        f"key={key.api_key_id or '-'} model={key.model_id or '-'}"
    )


def _check_rollups(session: Session, mismatches: list[str]) -> int:
    expected = _expected_rollups(session)
    seen = 0
    for row in session.execute(select(ROLLUPS)).mappings():
        seen += 1
        key = RollupKey(**{name: row[name] for name in RollupKey._fields})
        stored = {name: int(row[name]) for name in _FIELDS}
        wanted = expected.pop(key, None)
        if wanted is None:
            mismatches.append(f"{_describe(key)}: stored, but no event counts in it")
        elif stored != wanted:
            diffs = ", ".join(
                f"{name} {stored[name]} (events say {wanted[name]})"
                for name in _FIELDS
                if stored[name] != wanted[name]
            )
            mismatches.append(f"{_describe(key)}: {diffs}")
    for key in sorted(expected):
        count = expected[key]["requests"]
        mismatches.append(f"{_describe(key)}: missing ({count} events count in it)")
    return seen


def _check_balances(session: Session, mismatches: list[str]) -> int:
    ledger = (
        select(
            LedgerEntry.account_id,
            exact_sum(session, LedgerEntry.amount_microcents).label("total"),
            exact_sum(session, LedgerEntry.amount_microcents)
            .filter(LedgerEntry.kind == "charge")
            .label("charges"),
        )
        .group_by(LedgerEntry.account_id)
        .subquery()
    )
    charged = (
        select(
            UsageEvent.account_id, exact_sum(session, UsageEvent.total_microcents).label("total")
        )
        .group_by(UsageEvent.account_id)
        .subquery()
    )
    rows = session.execute(
        select(
            Account.id,
            Account.balance_microcents,
            func.coalesce(ledger.c.total, 0),
            func.coalesce(ledger.c.charges, 0),
            func.coalesce(charged.c.total, 0),
        )
        .outerjoin(ledger, ledger.c.account_id == Account.id)
        .outerjoin(charged, charged.c.account_id == Account.id)
        .order_by(Account.id)
    ).all()
    for account_id, balance, ledger_sum, charges, event_charges in rows:
        if int(balance) != int(ledger_sum):
            mismatches.append(
                f"account {account_id}: balance {balance} microcents, ledger sum {ledger_sum}"
            )
        if -int(charges) != int(event_charges):
            mismatches.append(
                f"account {account_id}: charge entries total {-int(charges)} microcents, "
                f"recorded events {event_charges}"
            )
    return len(rows)


def _check_references(session: Session, mismatches: list[str]) -> None:
    """Every row that names an account, key or model without a foreign key (``Names``): the row
    it names exists (a key, in the row's own account). Each missing one is named by its table,
    its row's key and account."""
    for each, named in named_rows(Base.metadata):
        joined: Any = each
        missing: list[tuple[str, Label[bool]]] = []  # what the row names, whether it is gone
        for column, names in named:
            target = Base.metadata.tables[names.table].alias()
            condition = target.c[names.column] == column
            if names.within is not None:
                condition &= target.c[names.within] == each.c[names.within]
            joined = joined.outerjoin(target, condition)
            missing.append(
                (names.what, target.c[names.column].is_(None).label(f"no_{column.name}"))
            )
        key = list(each.primary_key.columns)
        query = (
            select(*key, each.c.account_id.label("of_account"), *(gone for _, gone in missing))
            .select_from(joined)
            .where(or_(*(gone for _, gone in missing)))
            .order_by(*key)
        )
        for found in session.execute(query).mappings():
            row_key = "/".join(str(found[column]) for column in key)
            whats = [what for what, gone in missing if found[gone.name]]
            mismatches.append(
                f"{each.name} {row_key} ({found['of_account']}): no such {', '.join(whats)}"
            )


def _check_grants(session: Session, now: datetime, mismatches: list[str], report: Report) -> None:
    grants = table(CreditGrant)
    held = (
        select(
            grants.c.account_id,
            exact_sum(session, grants.c.remaining_microcents).label("held"),
        )
        .where(stored_active(grants))
        .group_by(grants.c.account_id)
        .subquery()
    )
    ledger = (
        select(
            LedgerEntry.account_id, exact_sum(session, LedgerEntry.amount_microcents).label("total")
        )
        .group_by(LedgerEntry.account_id)
        .subquery()
    )
    days = table(CreditAllocationDay)
    allocated = (
        select(
            days.c.account_id,
            exact_sum(
                session,
                case(
                    (days.c.kind == "payoff", -days.c.amount_microcents),
                    else_=days.c.amount_microcents,
                ),
            ).label("owed"),
        )
        .where(days.c.kind.in_(("deficit", "payoff", "refund")))
        .group_by(days.c.account_id)
        .subquery()
    )
    rows = session.execute(
        select(
            Account.id,
            func.coalesce(ledger.c.total, 0),
            Account.deficit_microcents,
            func.coalesce(held.c.held, 0),
            func.coalesce(allocated.c.owed, 0),
        )
        .outerjoin(held, held.c.account_id == Account.id)
        .outerjoin(ledger, ledger.c.account_id == Account.id)
        .outerjoin(allocated, allocated.c.account_id == Account.id)
        .order_by(Account.id)
    )
    # Against the ledger (the balance is checked against it above), so each tampering is
    # named once.
    for account_id, ledger_sum, deficit, remainders, owed in rows:
        if int(remainders) - int(deficit) != int(ledger_sum):
            mismatches.append(
                f"account {account_id}: ledger sum {ledger_sum} microcents, grants' "
                f"remainders {remainders} less deficit {deficit}"
            )
        if int(owed) != int(deficit):
            mismatches.append(
                f"account {account_id}: deficit {deficit} microcents, its allocation days' "
                f"deficits and refunds less payoffs {owed}"
            )
        if int(deficit) < 0:
            mismatches.append(f"account {account_id}: negative deficit {deficit}")
    count, total = session.execute(
        select(
            func.count(), func.coalesce(exact_sum(session, grants.c.remaining_microcents), 0)
        ).where(pending_sql(grants, now))
    ).one()
    report.pending_expiries, report.pending_microcents = int(count), int(total)


def _check_payments(session: Session, mismatches: list[str]) -> None:
    payments, grants, entries = table(Payment), table(CreditGrant), table(LedgerEntry)
    refunded = (
        select(
            entries.c.account_id,
            entries.c.grant_id,
            exact_sum(session, -entries.c.amount_microcents).label("total"),
        )
        .where(entries.c.kind == "refund")
        .group_by(entries.c.account_id, entries.c.grant_id)
        .subquery()
    )
    query = (
        select(
            payments.c.id,
            payments.c.status,
            payments.c.amount_cents,
            payments.c.refunded_cents,
            payments.c.grant_id,
            grants.c.id.label("found"),
            grants.c.category,
            grants.c.amount_microcents,
            func.coalesce(refunded.c.total, 0).label("refunded"),
        )
        .select_from(
            payments.outerjoin(
                grants,
                (grants.c.account_id == payments.c.account_id)
                & (grants.c.id == payments.c.grant_id),
            ).outerjoin(
                refunded,
                (refunded.c.account_id == payments.c.account_id)
                & (refunded.c.grant_id == payments.c.grant_id),
            )
        )
        .order_by(payments.c.id)
    )
    named: set[str] = set()
    for row in session.execute(query):
        if row.status != PaymentStatus.SUCCEEDED:
            if row.grant_id is not None:
                mismatches.append(f"payment {row.id} is {row.status} yet names a grant")
            continue
        expected = int(row.amount_cents) * 1_000_000
        if row.found is None:
            mismatches.append(f"payment {row.id} succeeded without a grant of its account")
        elif row.category != "paid" or int(row.amount_microcents) != expected:
            mismatches.append(
                f"payment {row.id}: its grant {row.found} is {row.category} of "
                f"{row.amount_microcents} microcents, not paid of {expected}"
            )
        elif row.found in named:
            mismatches.append(f"payment {row.id}: its grant {row.found} is another's too")
        named.add(row.found or "")
        if int(row.refunded) != int(row.refunded_cents) * 1_000_000:
            mismatches.append(
                f"payment {row.id}: refunded {row.refunded_cents} cents, its grant's refund "
                f"entries {row.refunded} microcents"
            )


def verify(session: Session, now: datetime | None = None) -> Report:
    if is_postgresql(session):
        # One snapshot for every query, so concurrent ingest cannot show up half-counted.
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        citus.one_snapshot(session)
    mismatches: list[str] = []
    report = Report()
    report.accounts = _check_balances(session, mismatches)
    report.rollup_rows = _check_rollups(session, mismatches)
    _check_references(session, mismatches)
    mismatches += held_counter_mismatches(session)
    _check_grants(session, now or datetime.now(UTC), mismatches, report)
    _check_payments(session, mismatches)
    report.mismatches = mismatches
    return report
