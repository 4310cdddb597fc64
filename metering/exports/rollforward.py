"""The daily credit roll-forward (of the grants of docs/api.md#credit-ledger): finance's
deferred-revenue report of one UTC day, one row per account × category (``paid``,
``promotional``, ``adjustment``, ``deficit``) with integer columns
``opening, granted, spent, expired, voided, refunded, closing`` (microcents).

Computed from the books in one statement: every movement of credit as a (account, category,
before the day or within it, column, amount) row — a grant's full amount (``granted``), what
each grant paid of a debit or of a deficit (``spent``, from the allocation days: one row per
account, UTC day, kind and grant, so the opening sums days, not debits), expiries (``expired``,
at their ``effective_at``), voids (``voided``), refunds of paid credit (``refunded``: what the
grant still held of the money refunded); for the ``deficit`` row, what charges ran beyond the
grants (``spent``), what later credit paid off (``granted``) and what refunds took beyond what
their grants held (``refunded``) — summed before the day (opening) and within it. So for every
row closing = opening + granted − spent − expired − voided − refunded, and an account's closing
rows sum to its balance at the end of the day (the ledger sum by ``effective_at``). The
``deficit`` row carries the deficit as a negative amount.

The roll-forward starts on the day the schema was made (``credit_rollforward.start_date``, written
by the baseline migration); earlier days are not written.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import astuple, dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import (
    BigInteger,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.orm import Session

from metering.db import is_cluster
from metering.exports.files import day_directories, read_manifest_entries
from metering.kit.timeutil import start_of_day
from metering.models import CreditAllocationDay, CreditGrant, LedgerEntry, table
from metering.models.base import UTCDateTime

GRANTS = table(CreditGrant)
ALLOCATIONS = table(CreditAllocationDay)
ENTRIES = table(LedgerEntry)

CSV_NAME, PARQUET_NAME = "credits.csv", "credits.parquet"
KIND = "credit_rollforward"  # the manifest's ``kind`` of the roll-forward files
CATEGORIES = ("adjustment", "deficit", "paid", "promotional")  # byte order
MOVEMENTS = ("granted", "spent", "expired", "voided", "refunded")
COLUMNS = (
    "date",
    "account_id",
    "category",
    "opening_microcents",
    "granted_microcents",
    "spent_microcents",
    "expired_microcents",
    "voided_microcents",
    "refunded_microcents",
    "closing_microcents",
)
PARQUET_SCHEMA = pa.schema(
    [
        pa.field("date", pa.string(), nullable=False),
        pa.field("account_id", pa.string(), nullable=False),
        pa.field("category", pa.string(), nullable=False),
        *(pa.field(name, pa.int64(), nullable=False) for name in COLUMNS[3:]),
    ]
)


@dataclass(frozen=True, slots=True)
class Row:
    date: str
    account_id: str
    category: str
    opening_microcents: int
    granted_microcents: int
    spent_microcents: int
    expired_microcents: int
    voided_microcents: int
    refunded_microcents: int
    closing_microcents: int


def _movements(start: datetime, colocated: bool = False) -> object:
    """Every movement before the day that begins at ``start`` ends: (account_id, category,
    ``opening`` 1 when before the day (0: on it), movement, amount >= 0). Debits are read from
    their allocation days (one row per account, day, kind and grant), the grants' entries one by
    one. ``colocated`` (a Citus cluster): each join also on the account, as Citus joins sharded
    tables on their shard key (the same rows: a grant's entries are its account's)."""
    day, end = start.date(), start + timedelta(days=1)

    def of_grant(rows: Any) -> Any:
        on = GRANTS.c.id == rows.c.grant_id
        return and_(on, GRANTS.c.account_id == rows.c.account_id) if colocated else on

    at = type_coerce(func.coalesce(ENTRIES.c.effective_at, ENTRIES.c.created_at), UTCDateTime())
    by_entry = (
        select(
            ENTRIES.c.account_id,
            GRANTS.c.category,
            case((at < start, 1), else_=0).label("opening"),
            case(
                (ENTRIES.c.kind == "expiry", "expired"),
                (ENTRIES.c.kind == "void", "voided"),
                (ENTRIES.c.kind == "refund", "refunded"),
                else_="granted",
            ).label("movement"),
            func.abs(ENTRIES.c.amount_microcents).label("amount"),
        )
        .join(GRANTS, of_grant(ENTRIES))
        .where(ENTRIES.c.grant_id.isnot(None), at < end)
    )
    before = case((ALLOCATIONS.c.allocation_date < day, 1), else_=0).label("opening")
    # A refund's entry counts its whole amount against its grant; the part the grant no longer
    # held (its ``refund`` allocation) is the deficit's, so it is given back to the grant here.
    is_refund = ALLOCATIONS.c.kind == "refund"
    by_grant_allocation = (
        select(
            ALLOCATIONS.c.account_id,
            GRANTS.c.category,
            before,
            case((is_refund, "refunded"), else_="spent").label("movement"),
            case(
                (is_refund, -ALLOCATIONS.c.amount_microcents),
                else_=ALLOCATIONS.c.amount_microcents,
            ).label("amount"),
        )
        .join(GRANTS, of_grant(ALLOCATIONS))
        .where(ALLOCATIONS.c.allocation_date <= day)
    )
    by_deficit = select(
        ALLOCATIONS.c.account_id,
        literal("deficit", String()).label("category"),
        before,
        case(
            (ALLOCATIONS.c.kind == "payoff", "granted"),
            (ALLOCATIONS.c.kind == "refund", "refunded"),
            else_="spent",
        ).label("movement"),
        ALLOCATIONS.c.amount_microcents.label("amount"),
    ).where(
        ALLOCATIONS.c.kind.in_(("payoff", "deficit", "refund")),
        ALLOCATIONS.c.allocation_date <= day,
    )
    return union_all(by_entry, by_grant_allocation, by_deficit).subquery("moves")


def rows_of_day(session: Session, day: date) -> list[Row]:
    """The day's roll-forward rows, ordered by account then category (byte order)."""
    moves = _movements(start_of_day(day), is_cluster(session))
    m = moves.c  # type: ignore[attr-defined]
    signed = case((m.movement == "granted", m.amount), else_=-m.amount)
    within = m.opening == 0
    statement = select(
        m.account_id,
        m.category,
        cast(func.coalesce(func.sum(case((m.opening == 1, signed), else_=0)), 0), BigInteger).label(
            "opening"
        ),
        *(
            cast(
                func.coalesce(
                    func.sum(case((within & (m.movement == name), m.amount), else_=0)), 0
                ),
                BigInteger,
            ).label(name)
            for name in MOVEMENTS
        ),
    ).group_by(m.account_id, m.category)
    rows = []
    for account_id, category, opening, *moved in session.execute(statement):
        values = [int(v) for v in (opening, *moved)]
        closing = values[0] + values[1] - sum(values[2:])
        if any(values) or closing:
            rows.append(
                Row(
                    day.isoformat(),
                    account_id,
                    category,
                    opening_microcents=values[0],
                    granted_microcents=values[1],
                    spent_microcents=values[2],
                    expired_microcents=values[3],
                    voided_microcents=values[4],
                    refunded_microcents=values[5],
                    closing_microcents=closing,
                )
            )
    return sorted(rows, key=lambda row: (row.account_id.encode(), row.category.encode()))


def _frame(rows: list[Row]) -> pd.DataFrame:
    values = [astuple(row) for row in rows]
    columns: dict[str, object] = {}
    for index, name in enumerate(COLUMNS):
        dtype = "str" if index < 3 else "int64"
        columns[name] = pd.array([v[index] for v in values], dtype=dtype)
    return pd.DataFrame(columns, columns=list(COLUMNS))


def csv_bytes(rows: list[Row]) -> bytes:
    return _frame(rows).to_csv(index=False, lineterminator="\n").encode("utf-8")


def parquet_bytes(rows: list[Row]) -> bytes:
    data = pa.Table.from_pandas(_frame(rows), schema=PARQUET_SCHEMA, preserve_index=False)
    data = data.replace_schema_metadata(None)
    out = io.BytesIO()
    pq.write_table(
        data,
        out,
        compression="zstd",
        compression_level=3,
        use_dictionary=True,
        write_statistics=True,
        row_group_size=max(1, data.num_rows),
    )
    return out.getvalue()


def manifest_entry(
    name: str, file_format: str, content: bytes, rows: list[Row]
) -> dict[str, object]:
    return {
        "file": name,
        "format": file_format,
        "kind": KIND,
        "rows": len(rows),
        "accounts": len({row.account_id for row in rows}),
        "closing_microcents": sum(row.closing_microcents for row in rows),
        "bytes": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
    }


def is_due(
    start: date | None, day: date, exported_at: datetime | None, late: datetime | None
) -> bool:
    """A day gets its roll-forward once it has ended (from the start day on), and again when
    an expiry dated in it or before it (``late``: the latest written such) was written after its
    last roll-forward."""
    if start is None or day < start:
        return False
    return exported_at is None or (late is not None and late > exported_at)


# -- one account's rows, as written (the portal's Exports page) ---------------------------------


@dataclass(frozen=True, slots=True)
class AccountRollForward:
    """One account's rows of a day's ``credits.csv``, and those rows as a CSV of their own
    (the same columns and rendering), which is what the account may download."""

    day: date
    rows: tuple[Row, ...]
    content: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


def read_csv_rows(content: bytes, account_id: str) -> list[Row]:
    """The rows of ``account_id`` in a ``credits.csv`` (integers read back as integers)."""
    reader = csv.DictReader(io.StringIO(content.decode("utf-8"), newline=""))
    return [
        Row(
            line["date"],
            line["account_id"],
            line["category"],
            *(int(line[name]) for name in COLUMNS[3:]),
        )
        for line in reader
        if line["account_id"] == account_id
    ]


def account_rollforward(
    export_dir: Path, account_id: str, limit_days: int
) -> list[AccountRollForward]:
    """The account's roll-forward rows of the newest ``limit_days`` days whose manifest lists a
    ``credits.csv``, newest first (days where the account has no row are left out)."""
    found: list[AccountRollForward] = []
    for directory in day_directories(export_dir):
        if limit_days <= 0:
            break
        listed = any(
            entry.get("file") == CSV_NAME and entry.get("kind") == KIND
            for entry in read_manifest_entries(directory)
        )
        if not listed:
            continue
        limit_days -= 1
        try:
            content = (directory / CSV_NAME).read_bytes()
        except FileNotFoundError:
            continue
        rows = read_csv_rows(content, account_id)
        if rows:
            day = date.fromisoformat(directory.name)
            found.append(AccountRollForward(day, tuple(rows), csv_bytes(rows)))
    return found
