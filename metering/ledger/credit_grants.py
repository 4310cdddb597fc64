"""Credit grants (docs/api.md#credit-ledger): creating them (a grant, or a positive adjustment),
voiding them, reading them, and the balance as the clock sees it.

Every write here takes the account's row lock first and writes the account's due expiries
(metering.ledger.spending, the program every debit runs), so the books move in one order.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, func, insert, literal, select, update
from sqlalchemy.orm import Session

from metering import citus
from metering import programs as p
from metering.db import is_cluster
from metering.kit.errors import NotFound
from metering.kit.ids import new_id
from metering.kit.money import cents
from metering.kit.pagination import newest_first_by_time
from metering.kit.timeutil import format_timestamp
from metering.ledger import grants as rules
from metering.ledger.spending import add_allocations, pending_forfeits, recharge_due, spend
from metering.models import Account, CreditGrant, LedgerEntry, table
from metering.models.base import UTCDateTime
from metering.notifications import outbox
from metering.states import grants as grant_states
from metering.states.grants import GrantStatus, is_live

ACCOUNTS = table(Account)
GRANTS = table(CreditGrant)
ENTRIES = table(LedgerEntry)


def write_due_expiries(session: Session, account_id: str, now: datetime) -> None:
    """The account's expiries due at ``now``, written (a debit of 0)."""
    spend(session, {account_id: 0}, now)


def create_grant(
    session: Session,
    account_id: str,
    entry_id: int,
    category: str,
    priority: int,
    amount: int,
    expires_at: datetime | None,
    note: str | None,
    now: datetime,
) -> str:
    """A new grant of ``amount`` for the ledger entry ``entry_id`` (already appended, the
    balance already moved by it, the account locked): it first pays off the deficit; the rest
    is its remainder. Returns the grant's id."""
    deficit, next_expiry = session.execute(
        select(ACCOUNTS.c.deficit_microcents, ACCOUNTS.c.next_expiry_at).where(
            ACCOUNTS.c.id == account_id
        )
    ).one()
    paid, remaining = rules.pay_off(int(deficit), amount)
    grant_id = new_id("grant")
    session.execute(
        insert(GRANTS).values(
            id=grant_id,
            account_id=account_id,
            entry_id=entry_id,
            category=category,
            priority=priority,
            amount_microcents=amount,
            remaining_microcents=remaining,
            expires_at=expires_at,
            status=GrantStatus.ACTIVE.value,
            created_at=now,
            note=note,
        )
    )
    session.execute(
        update(ENTRIES)
        .where(ENTRIES.c.account_id == account_id, ENTRIES.c.id == entry_id)
        .values(grant_id=grant_id)
    )
    values: dict[str, Any] = {}
    if paid:
        values["deficit_microcents"] = ACCOUNTS.c.deficit_microcents - paid
        on = p.backend(session.get_bind().dialect.name)
        payoff = {
            "account_id": account_id,
            "allocation_date": on.utc_date(literal(now, UTCDateTime())),
            "kind": "payoff",
            "grant_id": grant_id,
            "amount_microcents": paid,
        }
        session.execute(add_allocations(on, payoff))
    if remaining and expires_at is not None and (next_expiry is None or expires_at < next_expiry):
        values["next_expiry_at"] = expires_at
    if values:
        session.execute(update(ACCOUNTS).where(ACCOUNTS.c.id == account_id).values(values))
    return grant_id


def grant_for_entry(session: Session, entry_id: int) -> Any:
    return session.execute(select(GRANTS).where(GRANTS.c.entry_id == entry_id)).first()


def void_grant(
    session: Session, grant_id: str, reason: str | None, now: datetime
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Forfeit an active grant's remainder at once (a ``void`` entry); a grant no longer
    active is returned as it stands. Returns the grant and the entry written (or None)."""
    found = session.execute(select(GRANTS.c.account_id).where(GRANTS.c.id == grant_id)).first()
    if found is None:
        raise NotFound(f"no grant {grant_id}", param="grant_id")
    account_id = found.account_id
    session.execute(
        select(ACCOUNTS.c.id).where(ACCOUNTS.c.id == account_id).with_for_update(key_share=True)
    )
    write_due_expiries(session, account_id, now)
    grant = session.execute(
        select(GRANTS).where(GRANTS.c.id == grant_id, GRANTS.c.account_id == account_id)
    ).one()
    if not is_live(grant.status, grant.remaining_microcents, grant.expires_at, now):
        return grant_body(grant._mapping, now), None
    forfeit = int(grant.remaining_microcents)
    entry = {
        "account_id": account_id,
        "kind": "void",
        "amount_microcents": -forfeit,
        "note": reason,
        "grant_id": grant_id,
        "created_at": now,
    }
    entry_id = session.execute(insert(ENTRIES).values(entry).returning(ENTRIES.c.id)).scalar_one()
    session.execute(
        update(GRANTS)
        .where(GRANTS.c.account_id == account_id, GRANTS.c.id == grant_id)
        .values(remaining_microcents=0, status=grant_states.target("void"))
    )
    after = session.execute(
        update(ACCOUNTS)
        .where(ACCOUNTS.c.id == account_id)
        .values(
            balance_microcents=ACCOUNTS.c.balance_microcents - forfeit,
            recharge_due_at=recharge_due(
                ACCOUNTS.c.balance_microcents - forfeit, literal(now, UTCDateTime())
            ),
        )
        .returning(ACCOUNTS.c.balance_microcents)
    ).scalar_one()
    # The balance thresholds the void crosses, under the account's row lock (taken above).
    outbox.note_balance_move(session, account_id, int(after) + forfeit, int(after), now)
    grant = session.execute(
        select(GRANTS).where(GRANTS.c.account_id == account_id, GRANTS.c.id == grant_id)
    ).one()
    return grant_body(grant._mapping, now), {**entry, "id": entry_id}


def live_remainder(session: Session, account_id: str, grant_id: str, now: datetime) -> int:
    """What the grant still holds at ``now`` (0 unless it is live)."""
    grant = session.execute(
        select(GRANTS.c.status, GRANTS.c.remaining_microcents, GRANTS.c.expires_at).where(
            GRANTS.c.account_id == account_id, GRANTS.c.id == grant_id
        )
    ).one()
    remaining = int(grant.remaining_microcents)
    return remaining if is_live(grant.status, remaining, grant.expires_at, now) else 0


def refund_grant(
    session: Session, account_id: str, grant_id: str, amount: int, note: str | None, now: datetime
) -> tuple[int, int]:
    """Take ``amount`` (> 0) of money refunded out of the grant it bought, at once: a ``refund``
    entry of ``-amount`` naming the grant; the grant loses what it still holds of it, and the
    rest (what the customer had spent) becomes deficit, recorded as a ``refund`` allocation of
    the grant. The caller holds the account's row lock. Returns (the entry's id, the part taken
    as deficit)."""
    assert amount > 0
    write_due_expiries(session, account_id, now)
    taken = min(live_remainder(session, account_id, grant_id, now), amount)
    short = amount - taken
    entry = {
        "account_id": account_id,
        "kind": "refund",
        "amount_microcents": -amount,
        "note": note,
        "grant_id": grant_id,
        "created_at": now,
    }
    entry_id = session.execute(insert(ENTRIES).values(entry).returning(ENTRIES.c.id)).scalar_one()
    if taken:
        session.execute(
            update(GRANTS)
            .where(GRANTS.c.account_id == account_id, GRANTS.c.id == grant_id)
            .values(remaining_microcents=GRANTS.c.remaining_microcents - taken)
        )
    after = session.execute(
        update(ACCOUNTS)
        .where(ACCOUNTS.c.id == account_id)
        .values(
            balance_microcents=ACCOUNTS.c.balance_microcents - amount,
            deficit_microcents=ACCOUNTS.c.deficit_microcents + short,
            recharge_due_at=recharge_due(
                ACCOUNTS.c.balance_microcents - amount, literal(now, UTCDateTime())
            ),
        )
        .returning(ACCOUNTS.c.balance_microcents)
    ).scalar_one()
    if short:
        on = p.backend(session.get_bind().dialect.name)
        session.execute(
            add_allocations(
                on,
                {
                    "account_id": account_id,
                    "allocation_date": on.utc_date(literal(now, UTCDateTime())),
                    "kind": "refund",
                    "grant_id": grant_id,
                    "amount_microcents": short,
                },
            )
        )
    # The balance thresholds the refund crosses, under the account's row lock.
    outbox.note_balance_move(session, account_id, int(after) + amount, int(after), now)
    return int(entry_id), short


def grant_body(grant: Any, now: datetime) -> dict[str, Any]:
    status = grant_states.reads_as(
        grant["status"], int(grant["remaining_microcents"]), grant["expires_at"], now
    )
    forfeited = status in (GrantStatus.EXPIRED, GrantStatus.VOIDED)
    remaining = 0 if forfeited else int(grant["remaining_microcents"])
    amount = int(grant["amount_microcents"])
    expires_at = grant["expires_at"]
    return {
        "id": grant["id"],
        "object": "credit_grant",
        "account_id": grant["account_id"],
        "category": grant["category"],
        "priority": grant["priority"],
        "amount_cents": cents(amount),
        "amount_microcents": amount,
        "remaining_cents": cents(remaining),
        "remaining_microcents": remaining,
        "expires_at": format_timestamp(expires_at) if expires_at is not None else None,
        "status": status.value,
        "created_at": format_timestamp(grant["created_at"]),
        "note": grant["note"],
    }


def get_grant(session: Session, grant_id: str, now: datetime) -> dict[str, Any]:
    row = session.execute(select(GRANTS).where(GRANTS.c.id == grant_id)).first()
    if row is None:
        raise NotFound(f"no grant {grant_id}", param="grant_id")
    return grant_body(row._mapping, now)


def grant_bodies(
    session: Session, account_id: str, grant_ids: list[str], now: datetime
) -> dict[str, dict[str, Any]]:
    """The account's grants of ``grant_ids`` as ``get_grant`` shows them, by id (the portal's
    Overview: priority and status beside ``GET /v1/credits``' list)."""
    if not grant_ids:
        return {}
    rows = session.execute(
        select(GRANTS).where(GRANTS.c.account_id == account_id, GRANTS.c.id.in_(grant_ids))
    )
    return {row.id: grant_body(row._mapping, now) for row in rows}


def list_grants(
    session: Session, account_id: str, limit: int, after: str | None, now: datetime
) -> dict[str, Any]:
    """An account's grants, newest first (by creation, then by their entry's id)."""
    if session.execute(select(ACCOUNTS.c.id).where(ACCOUNTS.c.id == account_id)).first() is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    return newest_first_by_time(
        session,
        select(GRANTS).where(GRANTS.c.account_id == account_id),
        GRANTS.c.created_at,
        GRANTS.c.entry_id,
        limit,
        after,
        lambda row: grant_body(row, now),
    )


_LIVE = (
    select(GRANTS.c.id, GRANTS.c.category, GRANTS.c.remaining_microcents, GRANTS.c.expires_at)
    .where(
        GRANTS.c.account_id == bindparam("account_id"),
        grant_states.live_sql(GRANTS, bindparam("now", type_=GRANTS.c.expires_at.type)),
    )
    .order_by(*rules.order_by(GRANTS))
    .limit(100)
)


def credit_fields(session: Session, account_id: str, now: datetime) -> tuple[int, dict[str, Any]]:
    """What ``GET /v1/credits`` adds: the pending forfeits to leave out of the written
    balance, and the fields ``grants``, ``deficit_cents`` and ``deficit_microcents``."""
    row = session.execute(
        select(
            ACCOUNTS.c.deficit_microcents,
            # The account by its value, not by correlation: routed to its shard on Citus.
            pending_forfeits(
                bindparam("account_id"), bindparam("now", type_=GRANTS.c.expires_at.type)
            ),
        ).where(ACCOUNTS.c.id == bindparam("account_id")),
        {"account_id": account_id, "now": now},
    ).one()
    deficit, pending = int(row[0]), int(row[1])
    live = [
        {
            "id": grant.id,
            "category": grant.category,
            "remaining_cents": cents(int(grant.remaining_microcents)),
            "remaining_microcents": int(grant.remaining_microcents),
            "expires_at": (
                format_timestamp(grant.expires_at) if grant.expires_at is not None else None
            ),
        }
        for grant in session.execute(_LIVE, {"account_id": account_id, "now": now})
    ]
    return pending, {
        "grants": live,
        "deficit_cents": cents(deficit),
        "deficit_microcents": deficit,
    }


def pending_expiries(session: Session, now: datetime) -> dict[str, int]:
    """Per account, the remainders of grants expired at ``now`` whose forfeit is not written."""
    return {
        account_id: int(total)
        for account_id, total in session.execute(
            select(GRANTS.c.account_id, func.sum(GRANTS.c.remaining_microcents))
            .where(grant_states.pending_sql(GRANTS, now))
            .group_by(GRANTS.c.account_id)
        )
    }


def accounts_with_due_expiries(session: Session, now: datetime) -> list[str]:
    """Accounts whose ``next_expiry_at`` has passed (the scheduler writes their expiries)."""
    return list(
        session.execute(
            select(ACCOUNTS.c.id).where(ACCOUNTS.c.next_expiry_at <= now).order_by(ACCOUNTS.c.id)
        ).scalars()
    )


def _to_notice(grants: Any, now: datetime, notice: timedelta) -> Any:
    # The partial index's predicate, as written there.
    return and_(
        grants.c.expires_at.is_not(None),
        ~grants.c.expiring_noticed,
        grants.c.expires_at <= now + notice,
    )


def expiring_accounts(session: Session, now: datetime, notice: timedelta) -> list[str]:
    """On a Citus cluster, the accounts ``notice_expiring`` has grants to look at."""
    return citus.accounts_with(session, GRANTS, _to_notice(GRANTS, now, notice))


def notice_expiring(
    session: Session,
    now: datetime,
    notice: timedelta,
    limit: int = 1000,
    account_id: str | None = None,
) -> int:
    """``credit.grant_expiring`` {grant_id, remaining_microcents, expires_at}: once per grant
    with a remainder that expires within ``notice`` (the scheduler's, in its transaction);
    grants due with nothing left, voided or expired are marked without one. Returns how many
    were written. On PostgreSQL, grants locked meanwhile (being spent) wait for the next tick.
    ``account_id`` (a Citus cluster, ``expiring_accounts``): that account's grants only;
    without it on a cluster, each account's in turn, in the session's transaction."""
    if account_id is None and is_cluster(session):
        accounts = expiring_accounts(session, now, notice)
        return sum(notice_expiring(session, now, notice, limit, account) for account in accounts)
    query = (
        select(
            GRANTS.c.id,
            GRANTS.c.account_id,
            GRANTS.c.status,
            GRANTS.c.remaining_microcents,
            GRANTS.c.expires_at,
        )
        .where(_to_notice(GRANTS, now, notice))
        .order_by(GRANTS.c.expires_at, GRANTS.c.id)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    rows: Sequence[Any]
    if account_id is None:
        rows = session.execute(query).all()
    else:
        rows = citus.execute_of_account(session, query, account_id).all()
    written = 0
    for row in rows:
        remaining = int(row.remaining_microcents)
        if not is_live(row.status, remaining, row.expires_at, now):
            continue
        data = {
            "grant_id": row.id,
            "remaining_microcents": remaining,
            "expires_at": format_timestamp(row.expires_at),
        }
        outbox.emit(session, outbox.GRANT_EXPIRING, row.account_id, data, now)
        written += 1
    if rows:
        noticed = (
            update(GRANTS)
            .where(GRANTS.c.id.in_([r.id for r in rows]))
            .values(expiring_noticed=True)
        )
        if account_id is None:
            session.execute(noticed)
        else:
            citus.execute_of_account(session, noticed, account_id)
    return written
