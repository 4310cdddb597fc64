"""Operator-wide work on a cluster: account by account.

Citus locks rows (FOR UPDATE, SKIP LOCKED) only in a statement it sends whole to one shard, and
a transaction that writes the shards of several workers commits in two phases. So a scan over
every account (the scheduler's tidy-up and notices) is, on a cluster, first a read of the
accounts that have work (across the shards, no lock), then each account's own transaction of
the same statements limited to its rows (``execute_of_account``): each routed to one shard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import CursorResult, Table, select, text
from sqlalchemy.orm import Session

from metering.citus.one_account import ACCOUNT, compiled_of_account
from metering.citus.placement import SCOPE
from metering.db import Database, Kind, is_cluster


def per_account(database: Database, accounts: Callable[[Session], list[str]]) -> list[str | None]:
    """Each transaction of an operator-wide job: on a cluster one per account having work
    (``accounts``, read across the shards without a lock), elsewhere one for every account
    (None). The job limits its statements to the account it is given."""
    if database.kind is not Kind.CITUS:
        return [None]
    with database.reading() as session:
        return list(accounts(session))


def accounts_with(session: Session, table: Table, *where: Any) -> list[str]:
    """The accounts having rows of a sharded ``table`` that match ``where`` (in byte order)."""
    column = table.c[SCOPE[table.name]]
    query = select(column).where(*where).distinct().order_by(column)
    return [str(account) for account in session.execute(query).scalars()]


def execute_of_account(
    session: Session, statement: Any, account_id: str, params: Mapping[str, Any] | None = None
) -> CursorResult[Any]:
    """Run a Core statement for one account's rows (as ``text_of_account`` compiles it: every
    sharded table limited to the account) in the session's transaction: rows by column name."""
    compiled = compiled_of_account(statement)
    values = {**compiled.params, **(params or {}), ACCOUNT.name: account_id}
    return session.connection().exec_driver_sql(str(compiled), values)


def one_snapshot(session: Session) -> None:
    """On a cluster, at the start of a REPEATABLE READ transaction that reads across the shards
    (``metering verify``): one connection per worker for the whole transaction, so that each
    worker answers every query from one snapshot. Each account's rows sit on one worker and
    each account's writes are single-node transactions, so every account is read whole, as of
    one instant of its worker. (Citus otherwise may open several connections to a worker for
    one query, each with a snapshot of its own.)"""
    if is_cluster(session):
        session.execute(text("SET LOCAL citus.max_adaptive_executor_pool_size = 1"))


# Advisory lock namespaces (the first of the two keys; the second is the object's).
EXPORT_DAY_LOCK = 0x6D657864  # "mexd": a day's export (metering.exports.repository.lock_day)
# "mqrp": the quarantine's reprocess (metering.usage.quarantine.reprocess), one at a time.
QUARANTINE_REPROCESS_LOCK = 0x6D717270
# "mmal": an address's sign-in mails (metering.portal.mail), counted and recorded one at a time.
SIGN_IN_MAIL_LOCK = 0x6D6D616C


def lock(session: Session, namespace: int, key: int, *, wait: bool) -> bool:
    """Take a transaction's advisory lock on the coordinator (every service process and
    scheduler connects there), in place of a row lock of a reference table: on the cluster,
    ``FOR UPDATE SKIP LOCKED`` on the day's ``export_days`` row let a second scheduler take a
    day being exported (tests/exports/test_coordination.py). False when another transaction
    holds it and ``wait`` is False."""
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    taken = session.execute(
        text(f"SELECT {function}(:namespace, :key)::text"), {"namespace": namespace, "key": key}
    ).scalar()
    return wait or taken == "true"


def by_account(*groups: Sequence[Any]) -> dict[str, tuple[list[Any], ...]]:
    """Each account's part of every sequence of ``groups`` (its items' ``account_id``, an
    attribute or a key), the accounts in byte order, as each runs on its own shard."""
    parts: dict[str, tuple[list[Any], ...]] = {}
    for index, items in enumerate(groups):
        for item in items:
            account = item["account_id"] if isinstance(item, Mapping) else item.account_id
            parts.setdefault(str(account), tuple([] for _ in groups))[index].append(item)
    return dict(sorted(parts.items()))
