"""The ingest's statements: the batch's one lookup, recording its events, and reading back the
stored events a batch collided with.

Each is one statement whatever the batch size. On PostgreSQL they run on the session's driver
connection (``metering.db.driver_connection``) as text built once at import; on SQLite through
SQLAlchemy Core.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    any_,
    bindparam,
    cast,
    literal_column,
    null,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import CompoundSelect

from metering.db import driver_connection, is_postgresql
from metering.models import (
    Account,
    AccountRate,
    ApiKey,
    CatalogModel,
    PriceVersion,
    UsageEvent,
    table,
)
from metering.models.base import UTCDateTime
from metering.pricing import NormalizedUsage
from metering.usage.events import ChargeValues, Content, Event
from metering.usage.prices import PriceBook, PriceRow
from metering.usage.sql import Upsert, postgresql_text

KEYS, ACCOUNTS = table(ApiKey), table(Account)
MODELS, PRICES, RATES = table(CatalogModel), table(PriceVersion), table(AccountRate)
EVENTS = table(UsageEvent)

EventKey = tuple[str, str]  # (account_id, request_id): the dedup key
# A key id's account and whether it is billed (prepaid).
KeyInfo = tuple[str, bool]


# -- The lookup: keys, models with their prices, and the accounts' overrides, in one statement.

_RATE_COLUMNS = (
    "input_microcents_per_million",
    "output_microcents_per_million",
    "cache_read_microcents_per_million",
)


def _lookup(member: Callable[[ColumnElement[Any], str], ColumnElement[bool]]) -> CompoundSelect:
    """Rows (kind, a, b, c, at, input, output, cache read): 'key' (key id, account id, billing),
    'price' (model id_key, model id, version id or null; one row per version) and 'rate'
    (account id, model id, rate id) for the batch's ``key_ids`` and ``model_keys``."""
    no_time = cast(null(), UTCDateTime)
    no_rate = cast(null(), BigInteger)
    keys = (
        select(
            literal_column("'key'", String).label("kind"),
            KEYS.c.id.label("a"),
            KEYS.c.account_id.label("b"),
            ACCOUNTS.c.billing.label("c"),
            no_time.label("at"),
            *(no_rate.label(name) for name in _RATE_COLUMNS),
        )
        .select_from(KEYS.join(ACCOUNTS, ACCOUNTS.c.id == KEYS.c.account_id))
        .where(member(KEYS.c.id, "key_ids"))
    )
    prices = (
        select(
            literal_column("'price'", String),
            MODELS.c.id_key,
            MODELS.c.id,
            PRICES.c.id,
            PRICES.c.effective_at,
            *(PRICES.c[name] for name in _RATE_COLUMNS),
        )
        .select_from(MODELS.outerjoin(PRICES, PRICES.c.model_id == MODELS.c.id))
        .where(member(MODELS.c.id_key, "model_keys"))
    )
    rates = select(
        literal_column("'rate'", String),
        RATES.c.account_id,
        RATES.c.model_id,
        RATES.c.id,
        RATES.c.effective_at,
        *(RATES.c[name] for name in _RATE_COLUMNS),
    ).where(
        RATES.c.account_id.in_(select(KEYS.c.account_id).where(member(KEYS.c.id, "key_ids"))),
        RATES.c.model_id.in_(select(MODELS.c.id).where(member(MODELS.c.id_key, "model_keys"))),
    )
    return union_all(keys, prices, rates)


_PG_ARRAYS = {name: bindparam(name, type_=ARRAY(String)) for name in ("key_ids", "model_keys")}
_SQLITE_LISTS: dict[str, Any] = {
    name: bindparam(name, expanding=True) for name in ("key_ids", "model_keys")
}
PG_LOOKUP = postgresql_text(_lookup(lambda column, name: column == any_(_PG_ARRAYS[name])))
_SQLITE_LOOKUP = _lookup(lambda column, name: column.in_(_SQLITE_LISTS[name]))


def lookup(
    session: Session, key_ids: list[str], model_keys: list[str]
) -> tuple[dict[str, KeyInfo], PriceBook]:
    """The batch's keys (with their account and whether it is billed) and a price book of the
    models it names, with the overrides its accounts have for them."""
    params = lookup_params(key_ids, model_keys)
    if is_postgresql(session):
        rows: Sequence[Any] = driver_connection(session).execute(PG_LOOKUP, params).fetchall()
    else:
        rows = session.connection().execute(_SQLITE_LOOKUP, params).all()
    return read_lookup(rows)


def lookup_params(key_ids: list[str], model_keys: list[str]) -> dict[str, list[str]]:
    return {"key_ids": key_ids, "model_keys": model_keys}


def read_lookup(rows: Sequence[Any]) -> tuple[dict[str, KeyInfo], PriceBook]:
    """The lookup's rows as keys (their account and billing) and a price book."""
    keys: dict[str, KeyInfo] = {}
    prices: list[PriceRow] = []
    overrides: list[PriceRow] = []
    for kind, a, b, c, at, input_rate, output_rate, cache_rate in rows:
        if kind == "key":
            keys[a] = (b, c == "prepaid")
        else:
            row = (a, b, c, at, input_rate, output_rate, cache_rate)
            (prices if kind == "price" else overrides).append(row)
    return keys, PriceBook.from_rows(prices, overrides)


# -- Recording events (first of each key, sorted by key) with their aggregates.

# The insert's columns with their PostgreSQL types, in the order of a row; recorded_at is the
# statement's ``now``.
_EVENT_FIELDS = (
    ("account_id", "text"),
    ("request_id", "text"),
    ("api_key_id", "text"),
    ("model_id", "text"),
    ("api", "text"),
    ("outcome", "text"),
    ("occurred_at", "timestamptz"),
    ("authorization_id", "text"),
    ("prompt_tokens", "integer"),
    ("cached_tokens", "integer"),
    ("output_tokens", "integer"),
    ("reasoning_tokens", "integer"),
    ("input_microcents", "bigint"),
    ("cache_read_microcents", "bigint"),
    ("output_microcents", "bigint"),
    ("total_microcents", "bigint"),
    ("price_version_id", "text"),
)
_EVENT_COLUMNS = tuple(name for name, _ in _EVENT_FIELDS)
# The rows travel as one JSON document, written by a template: request_id is checked against
# its pattern, api and outcome against their lists, and a timestamp's ISO text needs no
# escaping; every other string is JSON-encoded (once per distinct value, see _Quoted).
_ROW = (
    '{"account_id":%s,"request_id":"%s","api_key_id":%s,"model_id":%s,"api":"%s","outcome":"%s",'
    '"occurred_at":"%s","authorization_id":%s,"prompt_tokens":%d,"cached_tokens":%d,'
    '"output_tokens":%d,"reasoning_tokens":%d,"input_microcents":%d,"cache_read_microcents":%d,'
    '"output_microcents":%d,"total_microcents":%d,"price_version_id":%s}'
)
_PG_RECORD = (
    f"INSERT INTO usage_events ({', '.join(_EVENT_COLUMNS)}, recorded_at) "
    f"SELECT {', '.join(f't.{name}' for name in _EVENT_COLUMNS)}, %(now)s "
    "FROM json_to_recordset(%(rows)s::json) AS t ("
    + ", ".join(f"{name} {kind}" for name, kind in _EVENT_FIELDS)
    + ") ON CONFLICT (account_id, request_id) DO NOTHING RETURNING id, account_id, request_id"
)

_SQLITE_RECORD = Upsert(
    EVENTS,
    (*_EVENT_COLUMNS, "recorded_at"),
    conflict=("account_id", "request_id"),
    returning=("id", "account_id", "request_id"),
)


class _Quoted(dict[str | None, str]):
    """JSON text of a string (or null), encoded once per distinct value of a batch."""

    def __missing__(self, value: str | None) -> str:
        quoted = self[value] = json.dumps(value)
        return quoted


def events_json(events: Sequence[Event]) -> str:
    quoted = _Quoted()
    rows = []
    for e in events:
        usage, charge = e.usage, e.charge
        assert usage is not None and charge is not None and e.occurred_at is not None
        rows.append(
            _ROW
            % (
                quoted[e.account_id],
                e.request_id,
                quoted[e.api_key_id],
                quoted[e.model_id],
                e.api,
                e.outcome,
                e.occurred_at.isoformat(),
                quoted[e.authorization_id],
                usage.prompt_tokens,
                usage.cached_tokens,
                usage.output_tokens,
                usage.reasoning_tokens,
                charge.input_microcents,
                charge.cache_read_microcents,
                charge.output_microcents,
                charge.total_microcents,
                quoted[e.price_version_id],
            )
        )
    return "[" + ",".join(rows) + "]"


def _event_row(e: Event) -> tuple[Any, ...]:
    usage, charge = e.usage, e.charge
    assert usage is not None and charge is not None
    return (
        e.account_id,
        e.request_id,
        e.api_key_id,
        e.model_id,
        e.api,
        e.outcome,
        e.occurred_at,
        e.authorization_id,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        usage.reasoning_tokens,
        charge.input_microcents,
        charge.cache_read_microcents,
        charge.output_microcents,
        charge.total_microcents,
        e.price_version_id,
    )


def record(session: Session, events: Sequence[Event], now: datetime) -> dict[EventKey, int]:
    """Insert ``events`` (priced, one per key, sorted by key) with ``ON CONFLICT DO NOTHING``,
    so a row that already stands, or that a concurrent batch is inserting, wins cleanly. The
    new ids by key: the events that conflicted are not among them."""
    if not events:
        return {}
    inserted: Sequence[Any]
    if is_postgresql(session):
        params = {"rows": events_json(events), "now": now}
        inserted = driver_connection(session).execute(_PG_RECORD, params).fetchall()
    else:
        inserted = _SQLITE_RECORD.run(session, [(*_event_row(e), now) for e in events])
    return {(account_id, request_id): event_id for event_id, account_id, request_id in inserted}


# -- Stored events a batch collided with: what "same content" is compared against.

# What "same content" and the charge are read from: the recorded columns but the hold.
_STORED_COLUMNS = tuple(name for name in _EVENT_COLUMNS if name != "authorization_id")
_PG_STORED = (
    f"SELECT {', '.join(f'e.{name}' for name in _STORED_COLUMNS)} FROM usage_events AS e "
    "JOIN unnest(%(accounts)s::text[], %(requests)s::text[]) AS t (account_id, request_id) "
    "ON e.account_id = t.account_id AND e.request_id = t.request_id"
)
_SQLITE_STORED = select(*(EVENTS.c[name] for name in _STORED_COLUMNS))


def stored(
    session: Session, keys: Sequence[EventKey]
) -> dict[EventKey, tuple[Content, ChargeValues]]:
    """The content and charge of the stored event of each key (each has one, committed)."""
    if not keys:
        return {}
    if is_postgresql(session):
        params = {"accounts": [a for a, _ in keys], "requests": [r for _, r in keys]}
        rows: Sequence[Any] = driver_connection(session).execute(_PG_STORED, params).fetchall()
    else:
        query = _SQLITE_STORED.where(
            tuple_(EVENTS.c.account_id, EVENTS.c.request_id).in_(list(keys))
        )
        rows = session.connection().execute(query).all()
    found: dict[EventKey, tuple[Content, ChargeValues]] = {}
    for (
        account_id,
        request_id,
        api_key_id,
        model_id,
        api,
        outcome,
        occurred_at,
        prompt,
        cached,
        output,
        reasoning,
        input_mc,
        cache_read_mc,
        output_mc,
        total_mc,
        price_version_id,
    ) in rows:
        usage = NormalizedUsage(prompt, cached, output, reasoning)
        content = Content(api_key_id, model_id, api, usage, occurred_at, outcome)
        charge = (
            prompt - cached,
            cached,
            output,
            reasoning,
            input_mc,
            cache_read_mc,
            output_mc,
            total_mc,
            price_version_id,
        )
        found[(account_id, request_id)] = (content, charge)
    return found
