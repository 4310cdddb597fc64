"""SQLite: the same steps as ``metering_place_holds``, in Python, inside the caller's unit of
work (BEGIN IMMEDIATE: one writer at a time)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, select, update
from sqlalchemy.sql.elements import BindParameter

from metering.ledger.placement.rows import BODY_COLUMNS, Placement, Resolved, resolved_from
from metering.ledger.service import ACCOUNTS, HOLDS, is_active
from metering.models import AccountRate, ApiKey, CatalogModel, PriceVersion, UsageRollup, table

_KEYS = table(ApiKey)
_MODELS = table(CatalogModel)
_LIST_PRICES = table(PriceVersion)
_ACCOUNT_RATES = table(AccountRate)
_ROLLUPS = table(UsageRollup)
_NOW = bindparam("now", type_=HOLDS.c.expires_at.type)
# Not "account_id": a column of the tables updated below.
_ACCOUNT_ID: BindParameter[str] = bindparam("b_account_id")
_RATES = (
    "input_microcents_per_million",
    "output_microcents_per_million",
    "cache_read_microcents_per_million",
)


def _latest(source: Any, column: str, *match: Any) -> Any:
    return (
        select(source.c[column])
        .where(*match, source.c.effective_at <= _NOW)
        .order_by(source.c.effective_at.desc())
        .limit(1)
        .scalar_subquery()
    )


# SQLite has no LATERAL: one scalar subquery per rate (in process, each is a B-tree probe).
_SQLITE_RESOLVE = (
    select(
        _KEYS.c.id,
        _KEYS.c.account_id,
        _KEYS.c.monthly_spend_limit_microcents,
        ACCOUNTS.c.billing,
        _MODELS.c.id,
        _MODELS.c.context_length,
        _MODELS.c.max_output_tokens,
        _MODELS.c.reasoning_headroom_tokens,
        _MODELS.c.deprecation_date,
        *(
            _latest(
                _ACCOUNT_RATES,
                rate,
                _ACCOUNT_RATES.c.account_id == ACCOUNTS.c.id,
                _ACCOUNT_RATES.c.model_id == _MODELS.c.id,
            )
            for rate in _RATES
        ),
        *(_latest(_LIST_PRICES, rate, _LIST_PRICES.c.model_id == _MODELS.c.id) for rate in _RATES),
    )
    .select_from(
        _KEYS.join(ACCOUNTS, ACCOUNTS.c.id == _KEYS.c.account_id).outerjoin(
            _MODELS, _MODELS.c.id_key == bindparam("model_key")
        )
    )
    .where(_KEYS.c.secret_hash == bindparam("secret_hash"), _KEYS.c.revoked_at.is_(None))
)
_SQLITE_BY_REQUEST_ID = select(*(HOLDS.c[c] for c in (*BODY_COLUMNS, "request_fingerprint"))).where(
    HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.request_id == bindparam("request_id")
)
_SQLITE_ACCOUNT = select(ACCOUNTS.c.balance_microcents, ACCOUNTS.c.held_microcents).where(
    ACCOUNTS.c.id == _ACCOUNT_ID
)
_SQLITE_RELEASE = (
    update(HOLDS)
    .where(HOLDS.c.account_id == _ACCOUNT_ID, HOLDS.c.counted, HOLDS.c.status != "active")
    .values(counted=False)
    .returning(HOLDS.c.estimate_microcents)
)
_SQLITE_EXPIRE = (
    update(HOLDS)
    .where(
        HOLDS.c.account_id == _ACCOUNT_ID,
        HOLDS.c.status == "active",
        HOLDS.c.expires_at <= _NOW,
        HOLDS.c.counted,
    )
    .values(counted=False, status="expired")
    .returning(HOLDS.c.estimate_microcents)
)
_SQLITE_KEY_COMMITTED = select(
    select(func.coalesce(func.sum(_ROLLUPS.c.cost_microcents), 0))
    .where(
        _ROLLUPS.c.account_id == _ACCOUNT_ID,
        _ROLLUPS.c.bucket_width == "1d",
        _ROLLUPS.c.grouping == "key",
        _ROLLUPS.c.bucket_start >= bindparam("month_start", type_=_ROLLUPS.c.bucket_start.type),
        _ROLLUPS.c.bucket_start < bindparam("month_end", type_=_ROLLUPS.c.bucket_start.type),
        _ROLLUPS.c.api_key_id == bindparam("api_key_id"),
    )
    .scalar_subquery()
    + select(func.coalesce(func.sum(HOLDS.c.estimate_microcents), 0))
    .where(HOLDS.c.api_key_id == bindparam("api_key_id"), is_active(_NOW))
    .scalar_subquery()
)
_SQLITE_SET_HELD = (
    update(ACCOUNTS).where(ACCOUNTS.c.id == _ACCOUNT_ID).values(held_microcents=bindparam("held"))
)
_SQLITE_VOID = (
    update(HOLDS)
    .where(HOLDS.c.id == bindparam("hold_id"), is_active(_NOW))
    .values(status="voided", closed_at=_NOW)
    .returning(*(HOLDS.c[c] for c in BODY_COLUMNS))
)
_SQLITE_BY_ID = select(*(HOLDS.c[c] for c in BODY_COLUMNS)).where(
    HOLDS.c.id == bindparam("hold_id")
)


class SqliteHolds:
    """The same steps inside the caller's unit of work (BEGIN IMMEDIATE: one writer at a time,
    so each read below is already as good as a locked one)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def resolve(
        self, secret_hash: str, model_key: str, request_id: str | None, now: datetime
    ) -> Resolved | None:
        row = self._connection.execute(
            _SQLITE_RESOLVE, {"secret_hash": secret_hash, "model_key": model_key, "now": now}
        ).first()
        if row is None:
            return None
        known = request_id is not None and self.by_request_id(row[1], request_id) is not None
        return resolved_from(row, known)

    def remembered(self, secret_hash: str, model_key: str) -> None:
        """Nothing: the resolving read runs in the same transaction as the check-and-hold,
        so a remembered resolution would save no round trip."""
        return None

    def by_request_id(self, account_id: str, request_id: str) -> dict[str, Any] | None:
        row = self._connection.execute(
            _SQLITE_BY_REQUEST_ID, {"b_account_id": account_id, "request_id": request_id}
        ).first()
        return None if row is None else dict(row._mapping)

    def place(
        self,
        values: Mapping[str, Any],
        spend_limit: int | None,
        month_start: datetime,
        month_end: datetime,
        confirm: object = None,
    ) -> Placement:
        """metering_place_holds's steps (the writer lock is already held; the request id was
        looked up under it by ``resolve``). ``confirm`` is never given here: nothing is
        remembered (see ``remembered``)."""
        assert confirm is None
        account_id, now = values["account_id"], values["created_at"]
        params = {"b_account_id": account_id, "now": now}
        balance, held = self._connection.execute(_SQLITE_ACCOUNT, params).one()
        released = sum(r[0] for r in self._connection.execute(_SQLITE_RELEASE, params))
        released += sum(r[0] for r in self._connection.execute(_SQLITE_EXPIRE, params))
        held -= released
        available = balance - held
        outcome = "granted"
        estimate = values["estimate_microcents"]
        if estimate > available:
            outcome = "insufficient_credits"
        elif spend_limit is not None:
            committed = self._connection.execute(
                _SQLITE_KEY_COMMITTED,
                {
                    **params,
                    "api_key_id": values["api_key_id"],
                    "month_start": month_start,
                    "month_end": month_end,
                },
            ).scalar_one()
            if committed + estimate > spend_limit:
                outcome = "member_spend_limit"
        if outcome == "granted":
            self._connection.execute(insert(HOLDS).values(**values, status="active", counted=True))
            held += estimate
        if outcome == "granted" or released:
            self._connection.execute(_SQLITE_SET_HELD, {"b_account_id": account_id, "held": held})
        return Placement(outcome, available)

    def insert_unbilled(self, values: Mapping[str, Any]) -> bool:
        self._connection.execute(insert(HOLDS).values(**values, status="active", counted=False))
        return True

    def void(self, hold_id: str, now: datetime) -> tuple[dict[str, Any] | None, bool]:
        params = {"hold_id": hold_id, "now": now}
        row = self._connection.execute(_SQLITE_VOID, params).first()
        if row is not None:
            return dict(row._mapping), True
        row = self._connection.execute(_SQLITE_BY_ID, params).first()
        return (None if row is None else dict(row._mapping)), False
