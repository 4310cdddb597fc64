"""The ingest's statements: the batch's one lookup, recording its events, and reading back the
stored events a batch collided with.

Each is one statement whatever the batch size, defined once as Core (the rows travel as one JSON
document, metering.programs.Records; the events, on PostgreSQL, as one array per column,
``Records.by_column``), in the form the session's database runs (metering.forms):
on PostgreSQL text built once at import, on the session's driver connection; on SQLite through
SQLAlchemy Core.

On a Citus cluster (docs/citus.md#what-stays-exact) each runs for one account's rows
(``account_id``): the same statement compiled by ``metering.citus.text_of_account``, every sharded
table it reads or writes limited to the account, so the coordinator sends it whole to the shard that
holds the account. Which account a key belongs to is asked first, of ``api_keys`` alone (a reference
table, on every node): ``key_accounts``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    String,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    func,
    literal,
    literal_column,
    null,
    select,
    union,
    union_all,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.orm import Session
from sqlalchemy.sql.base import ReadOnlyColumnCollection
from sqlalchemy.types import TypeEngine

from metering import programs as p
from metering.accounts.keys import ACCOUNTS, KEYS
from metering.catalog.prices import RATE_COLUMNS, price_in_force, price_of
from metering.citus import ACCOUNT, one_account
from metering.db import driver_connection, is_cluster
from metering.forms import Forms
from metering.models import AccountRate, CatalogModel, Member, PriceVersion, Project, table
from metering.models.base import UTCDateTime
from metering.notifications.spend_limits import KeyScopes
from metering.pricing import NormalizedUsage
from metering.usage.events import ROW_ATTRIBUTES, ChargeValues, Content, Event
from metering.usage.prices import PriceBook
from metering.usage.recording import (
    EVENT_COLUMNS,
    EVENT_VERBATIM,
    EVENTS,
    EVENTS_IN,
    NEW_KEYS,
    NOW,
    insert_events,
)

MODELS, PRICES, RATES = table(CatalogModel), table(PriceVersion), table(AccountRate)
PROJECTS, MEMBERS = table(Project), table(Member)

EventKey = tuple[str, str]  # (account_id, request_id): the dedup key


class KeyInfo(NamedTuple):
    """What the lookup tells of a key id: its account, whether it is prepaid, its project and
    member with the spend limits its charges count against (``scopes``: the key's own from the
    lookup, ``key_limit``; its project's and member's added by ``with_scopes`` when its account
    has such limits, ``scope_limited``)."""

    account_id: str
    prepaid: bool
    scopes: KeyScopes
    key_limit: tuple[int | None, str | None]
    scope_limited: bool


# A lookup read: its keys by id, and the price book of the models its pairs name.
Lookup = tuple[dict[str, KeyInfo], PriceBook]


# -- The lookup: keys, models, and the price timelines of the batch's (key, model) pairs. --------

PAIRS_IN = p.Records("p_pairs", (("api_key_id", String()), ("model_key", String())))
# The key's project, member, spend limit and window, and whether its account has project or
# member limits (only on 'key' rows).
_LIMIT_COLUMNS = ("project_id", "member_id", "spend_limit", "spend_window", "scope_limits")
_KINDS = ("kind", "a", "b", "c", "at", "price_version_id", *RATE_COLUMNS, *_LIMIT_COLUMNS)


def keyed_joins(key_id: Any, model_key: Any) -> list[tuple[Table, Any, bool]]:
    """What a (key id, model) pair's 'key' and 'model' rows are read from: each table with its
    condition (the first's compares the key id) and whether its join is outer."""
    return [
        (KEYS, KEYS.c.id == key_id, False),
        (ACCOUNTS, ACCOUNTS.c.id == KEYS.c.account_id, False),
        (MODELS, MODELS.c.id_key == model_key, True),
    ]


def keyed_columns(model_key: Any) -> dict[str, ColumnElement[Any]]:
    """A pair's key, its account and its model, by name: what the lookup's rows are made of."""
    return {
        "api_key_id": KEYS.c.id,
        "account_id": KEYS.c.account_id,
        "billing": ACCOUNTS.c.billing,
        "project_id": KEYS.c.project_id,
        "member_id": KEYS.c.member_id,
        "spend_limit": KEYS.c.monthly_spend_limit_microcents,
        "spend_window": KEYS.c.spend_limit_window,
        "scope_limits": ACCOUNTS.c.scope_limits,
        "model_key": model_key,
        "model_id": MODELS.c.id,
    }


# ``keyed_columns``' names and what they are in a statement: the expressions themselves, or the
# columns of a CTE that selected them.
Keyed = Mapping[str, Any] | ReadOnlyColumnCollection[str, Any]


def has_model(keyed: Keyed) -> ColumnElement[bool]:
    """A pair whose model is known: it has a 'model' row."""
    return keyed["model_id"].isnot(None)


def priced(keyed: Keyed) -> ColumnElement[bool]:
    """A pair whose prices are read: a known model of a prepaid account."""
    return and_(keyed["billing"] == "prepaid", has_model(keyed))


def instant_sources(account_id: Any, model_id: Any) -> tuple[tuple[Table, Any], ...]:
    """Where the instants at which an account's price of a model may change are read: the list
    prices' versions and the account's own rates (each table with its condition)."""
    return (
        (PRICES, PRICES.c.model_id == model_id),
        (
            RATES,
            and_(RATES.c.account_id == account_id, RATES.c.model_id == model_id),
        ),
    )


_NO_TEXT, _NO_TIME = cast(null(), String), cast(null(), UTCDateTime)
_NO_PRICE: tuple[ColumnElement[Any], ...] = (
    cast(null(), String),
    *(cast(null(), BigInteger) for _ in RATE_COLUMNS),
)
_NO_LIMIT: tuple[ColumnElement[Any], ...] = tuple(
    cast(null(), keyed_columns(None)[name].type) for name in _LIMIT_COLUMNS
)

# The lookup's columns and their types (a function's result: metering.usage.lookup_apart).
LOOKUP_COLUMNS: tuple[tuple[str, TypeEngine[Any]], ...] = tuple(
    zip(
        _KINDS,
        (
            *(String() for _ in ("kind", "a", "b", "c")),
            UTCDateTime(),
            String(),
            *(BigInteger() for _ in RATE_COLUMNS),
            *(keyed_columns(None)[name].type for name in _LIMIT_COLUMNS),
        ),
        strict=True,
    )
)


def key_row(keyed: Keyed) -> tuple[Any, ...]:
    """The 'key' row of ``_KINDS`` of a pair's ``keyed_columns``."""
    return (
        literal("key", String),
        keyed["api_key_id"],
        keyed["account_id"],
        keyed["billing"],
        _NO_TIME,
        *_NO_PRICE,
        *(keyed[name] for name in _LIMIT_COLUMNS),
    )


def model_row(keyed: Keyed) -> tuple[Any, ...]:
    """The 'model' row of a pair's ``keyed_columns``."""
    return (
        literal("model", String),
        keyed["model_key"],
        keyed["model_id"],
        _NO_TEXT,
        _NO_TIME,
        *_NO_PRICE,
        *_NO_LIMIT,
    )


def price_row(account_id: Any, model_id: Any, at: Any, price: Sequence[Any]) -> tuple[Any, ...]:
    """A 'price' row: the price in force (``PriceColumns.labelled()``' columns) from ``at``."""
    return (literal("price", String), account_id, model_id, _NO_TEXT, at, *price, *_NO_LIMIT)


def _keyed(found: Any, model_key: Any) -> Any:
    """The CTE ``keyed``: ``keyed_columns`` by name, of the rows ``found`` (a SELECT of the
    joined tables, without its columns yet)."""
    return found.add_columns(
        *(
            column if getattr(column, "name", None) == name else column.label(name)
            for name, column in keyed_columns(model_key).items()
        )
    ).cte("keyed")


def _lookup(on: p.Backend) -> Any:
    """Rows of ``_KINDS``: 'key' (key id, account id, billing, project, member, spend limit and
    window, whether the account has project or member limits), 'model'
    (id_key, catalog id) and 'price' (account id, model id, an instant where its price may
    change, and the price in force from then: metering.usage.prices)."""
    pairs = on.records(PAIRS_IN, "pair")
    joined: Any = pairs
    for joined_table, condition, outer in keyed_joins(pairs.c.api_key_id, pairs.c.model_key):
        joined = joined.join(joined_table, condition, isouter=outer)
    keyed = _keyed(select().select_from(joined), pairs.c.model_key)
    kind, *rest = key_row(keyed.c)
    keys = select(kind.label("kind"), *rest).distinct()
    models = select(*model_row(keyed.c)).where(has_model(keyed.c)).distinct()
    prepaid = (
        select(keyed.c.account_id, keyed.c.model_id)
        .where(priced(keyed.c))
        .distinct()
        .subquery("prepaid")
    )
    instants = union(
        *(
            select(prepaid.c.account_id, prepaid.c.model_id, source.c.effective_at).select_from(
                prepaid.join(source, condition)
            )
            for source, condition in instant_sources(prepaid.c.account_id, prepaid.c.model_id)
        )
    ).subquery("instant")
    price = price_in_force(instants.c.account_id, instants.c.model_id, instants.c.effective_at)
    prices = select(
        *price_row(
            instants.c.account_id,
            instants.c.model_id,
            instants.c.effective_at,
            price.labelled(),
        )
    ).select_from(price.join(instants))
    return union_all(keys, models, prices)


_LOOKUP = Forms.of_statement(_lookup)
PG_LOOKUP = _LOOKUP.postgresql


# -- A lookup remembered (metering.usage.single): the rows it is made of, as one text. ----------
#
# A pair's lookup is a function of the rows it reads: the key's (``keyed_joins``: the key, its
# account, the model of that id_key) and the rows the instants and prices in force of that
# account and model are read from (``instant_sources``, which ``price_in_force`` reads within).
# While those rows read the same, so does the lookup: a remembered one is confirmed by them, read
# by index from the pair's two values, not by the lookup again (its union, distinct rows and
# price timelines). A superset: a change to such a row that the lookup does not see (a price
# version of a postpaid account's model) makes it read afresh, never the reverse.

# The parameters of a confirmation: the pair, and the text of the rows its lookup was made of
# (one server's ``confirming`` statement, a cluster's confirmed record: metering.usage
# .lookup_apart).
LOOKUP_KEY_ID, LOOKUP_MODEL_KEY = "p_lookup_key_id", "p_lookup_model_key"
LOOKUP_TEXT = "p_lookup_text"


def _inputs_text(key_id: Any = None, model_key: Any = None) -> Any:
    """The text of the rows a pair's lookup reads (the pair: ``LOOKUP_KEY_ID`` and
    ``LOOKUP_MODEL_KEY``, or the columns ``key_id`` and ``model_key`` of an enclosing
    statement's rows): each with its table's name, in a fixed order, as one text."""
    if key_id is None:
        key_id = bindparam(LOOKUP_KEY_ID, type_=String)
        model_key = bindparam(LOOKUP_MODEL_KEY, type_=String)
    (first, where, _outer), *joins = keyed_joins(key_id, model_key)
    joined: Any = first
    for joined_table, condition, outer in joins:
        joined = joined.join(joined_table, condition, isouter=outer)
    keyed = _keyed(select().select_from(joined).where(where), model_key)
    rows = union_all(
        select(
            literal("keyed", String).label("source"), _row_text(keyed.name).label("row")
        ).select_from(keyed),
        *(
            select(literal(source.name, String), _row_text(source.name)).select_from(
                keyed.join(source, condition)
            )
            for source, condition in instant_sources(keyed.c.account_id, keyed.c.model_id)
        ),
    ).subquery("every")
    every: ColumnElement[Any] = literal_column("every")
    ordered = aggregate_order_by(cast(every, Text), cast(every, Text))
    return select(cast(func.array_agg(ordered), Text)).select_from(rows)


def _row_text(name: str) -> ColumnElement[str]:
    """The whole row of the table (or CTE) ``name``, as text."""
    return cast(literal_column(name), Text)


# The rows a pair's lookup is made of now, as one text (``_inputs_text``).
_PG_INPUTS_TEXT = p.psycopg_text(_inputs_text())


def inputs_text(key_id: Any, model_key: Any) -> Any:
    """The text of the rows the lookup of the pair (``key_id``, ``model_key``: a program's
    variables) is made of now, as a value: what a Citus cluster's single event reads with its
    lookup, and its record confirms (metering.usage.lookup_apart)."""
    return _inputs_text(key_id, model_key).scalar_subquery()


def text_row(key_id: Any, model_key: Any, text: Any) -> tuple[Any, ...]:
    """A 'text' row of ``_KINDS`` (``TEXT_KIND``): a pair and the text of the rows its lookup
    is made of (``inputs_text``)."""
    return (literal(TEXT_KIND, String), key_id, model_key, text, _NO_TIME, *_NO_PRICE, *_NO_LIMIT)


def lookup_texts(rows: Sequence[Any]) -> dict[tuple[str, str], str]:
    """The 'text' rows (``text_row``) of a lookup's rows, by pair."""
    found = {}
    for row in rows:
        named = dict(zip(_KINDS, row, strict=True))
        if named["kind"] == TEXT_KIND and named["c"] is not None:
            found[(named["a"], named["b"])] = named["c"]
    return found


# One server (metering.usage.single): the lookup's rows, then a 'text' row for each pair (its
# key id, its model as 'a' and 'b', the text of the rows its lookup is made of last), read in
# the same statement: what a lookup remembered is confirmed by.
_PAIR_TEXT = p.psycopg_text(
    _inputs_text(literal_column("pair.api_key_id"), literal_column("pair.model_key"))
)
_PAIRS = p.psycopg_text(select(p.POSTGRESQL.records(PAIRS_IN, "pair")))
PG_LOOKUP_WITH_TEXTS = (
    f"WITH found AS ({PG_LOOKUP}) SELECT found.*, NULL AS lookup_text FROM found UNION ALL "
    f"SELECT 'text', pair.api_key_id, pair.model_key, {', '.join(['NULL'] * (len(_KINDS) - 3))}, "
    f"({_PAIR_TEXT}) FROM ({_PAIRS}) AS pair"
)
TEXT_KIND = "text"


def confirming_all(call: str) -> str:
    """``call`` made only if the rows the lookup of each pair of ``confirm_pairs`` (a JSON
    array of ``confirm_pair``'s objects) is made of still read as that pair's text
    (``PG_LOOKUP_WITH_TEXTS``'), in one statement: no row when any does not (nothing was
    written)."""
    return (
        f"{call} WHERE NOT EXISTS (SELECT FROM json_to_recordset(%(confirm_pairs)s::json) "
        "AS pair(api_key_id text, model_key text, lookup_text text) "
        f"WHERE ({_PAIR_TEXT}) IS DISTINCT FROM pair.lookup_text)"
    )


def confirm_pair(pair: tuple[str, str], text: str) -> str:
    """One pair's object in ``confirming_all``'s ``confirm_pairs``, as JSON."""
    key_id, model_key = pair
    return json.dumps({"api_key_id": key_id, "model_key": model_key, "lookup_text": text})


def confirm_params(pair: tuple[str, str], text: str) -> dict[str, str]:
    """The parameters confirming the lookup of ``pair`` (key id, lower-case model) whose rows
    read as ``text`` when it was read."""
    key_id, model_key = pair
    return {LOOKUP_KEY_ID: key_id, LOOKUP_MODEL_KEY: model_key, LOOKUP_TEXT: text}


def confirming(call: str) -> str:
    """``call`` (a program's ``SELECT f(…)``) made only if the rows the lookup of a pair is
    made of still read as the text given (``confirm_params``; ``PG_LOOKUP_WITH_TEXTS``'), in
    one statement: no row when they do not (nothing was written), the call's one row when they
    do."""
    return f"{call} WHERE ({_PG_INPUTS_TEXT}) = %({LOOKUP_TEXT})s"


# One account's part of it on a Citus cluster: its pairs, its billing and its rate overrides.
CITUS_LOOKUP = _LOOKUP.citus


def _lookup_rows(on: p.Backend) -> list[p.Step]:
    into = tuple(p.Var(f"v_lookup_{name}", kind) for name, kind in LOOKUP_COLUMNS)
    return [p.ForEach(_lookup(on), into=into, steps=(p.Emit(tuple(v.ref for v in into)),))]


# One account's part of it on a Citus cluster (an account's part of a batch: metering.usage
# .sharded), as a call on the node that holds the account, whose shard form reads the shard's
# own tables by a statement planned once per backend there (metering.citus.shard_forms), where
# the statement routed to the shard was planned by Citus, then again by its local execution, at
# every call. Only its one-account form is a function: one server runs the statement.
LOOKUP_PAIRS_OF_ACCOUNT = one_account.of_account(
    p.Program(
        "metering_lookup_pairs",
        params=(PAIRS_IN,),
        build=_lookup_rows,
        returns=LOOKUP_COLUMNS,
    ),
    # Its shard form's plan made once per backend, whatever the pairs.
    shard_settings={"plan_cache_mode": "force_generic_plan"},
)


def _key_accounts(on: p.Backend) -> Any:
    """The account of each key the pairs name (unknown keys have no row): ``api_keys`` only."""
    pairs = on.records(PAIRS_IN, "pair")
    return (
        select(KEYS.c.id, KEYS.c.account_id)
        .select_from(pairs.join(KEYS, KEYS.c.id == pairs.c.api_key_id))
        .distinct()
    )


KEY_ACCOUNTS = p.psycopg_text(_key_accounts(p.POSTGRESQL))


def of_account(params: dict[str, Any], account_id: str) -> dict[str, Any]:
    """A statement's parameters for its one-account form (``text_of_account``)."""
    return {**params, ACCOUNT.name: account_id}


def lookup_params(pairs: Sequence[tuple[str, str]], on: p.Backend) -> dict[str, str]:
    """The lookup's parameter for (key id, lower-case model) pairs."""
    rows = [{"api_key_id": key, "model_key": model} for key, model in pairs]
    return {"p_pairs": p.records_json(PAIRS_IN, rows, on)}


def key_accounts(session: Session, pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The account of each known key of the pairs (PostgreSQL: a Citus cluster's first read)."""
    params = lookup_params(pairs, p.POSTGRESQL)
    return dict(driver_connection(session).execute(KEY_ACCOUNTS, params).fetchall())


def accounts_on_cluster(
    session: Session, pairs: Sequence[tuple[str, str]]
) -> dict[str, str] | None:
    """On a Citus cluster the pairs' ``key_accounts``, None elsewhere (for callers that have a
    session and not the database: the operators' reprocessing)."""
    if is_cluster(session):
        return key_accounts(session, pairs)
    return None


def lookup(
    session: Session, pairs: Sequence[tuple[str, str]], account_id: str | None = None
) -> Lookup:
    """The batch's keys (``KeyInfo``, with their project's and member's limits when their
    account has such limits: a second statement) and a price book of the models its (key,
    model) pairs name. ``account_id`` (a Citus cluster): the pairs' keys are that account's,
    and a key of another account is not found."""
    keys, book = read_lookup(_LOOKUP.rows(session, lambda on: lookup_params(pairs, on), account_id))
    limited = scope_pairs(keys, pairs)
    if limited:
        rows = _SCOPE_LIMITS.rows(session, lambda on: lookup_params(limited, on), account_id)
        keys = with_scopes(keys, rows)
    return keys, book


def read_lookup(rows: Sequence[Any]) -> Lookup:
    """The lookup's rows as keys (``KeyInfo``) and a price book ('text' rows left out)."""
    keys: dict[str, KeyInfo] = {}
    models: dict[str, str] = {}
    points = []
    for row in rows:
        named = dict(zip(_KINDS, row, strict=True))
        kind, a, b = named["kind"], named["a"], named["b"]
        if kind == "key":
            own = (named["spend_limit"], named["spend_window"])
            scopes = KeyScopes.of(a, named["project_id"], named["member_id"], {"key": own})
            keys[a] = KeyInfo(b, named["c"] == "prepaid", scopes, own, bool(named["scope_limits"]))
        elif kind == "model":
            models[a] = b
        elif kind != TEXT_KIND:
            points.append((a, b, named["at"], price_of(named)))
    return keys, PriceBook.from_breakpoints(models, points)


# -- Project and member limits: read only for the keys of accounts that have them. -------------


def _scope_limits(on: p.Backend) -> Any:
    """Each key of the pairs with its project's and its member's spend limit and window (null
    for none): what ``with_scopes`` adds to the lookup's keys. Apart from the lookup, so that
    the lookup (planned anew for each batch) joins no more tables for them."""
    pairs = on.records(PAIRS_IN, "pair")
    return (
        select(
            KEYS.c.id,
            PROJECTS.c.spend_limit_microcents,
            PROJECTS.c.spend_limit_window,
            MEMBERS.c.spend_limit_microcents,
            MEMBERS.c.spend_limit_window,
        )
        .select_from(
            pairs.join(KEYS, KEYS.c.id == pairs.c.api_key_id)
            .outerjoin(
                PROJECTS,
                and_(
                    PROJECTS.c.account_id == KEYS.c.account_id,
                    PROJECTS.c.id == KEYS.c.project_id,
                ),
            )
            .outerjoin(
                MEMBERS,
                and_(MEMBERS.c.account_id == KEYS.c.account_id, MEMBERS.c.id == KEYS.c.member_id),
            )
        )
        .distinct()
    )


_SCOPE_LIMITS = Forms.of_statement(_scope_limits)
PG_SCOPE_LIMITS = _SCOPE_LIMITS.postgresql
CITUS_SCOPE_LIMITS = _SCOPE_LIMITS.citus


def scope_pairs(
    keys: Mapping[str, KeyInfo], pairs: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The pairs whose keys' project and member limits are to be read: those of prepaid
    accounts that have such limits (none: no statement)."""
    return [
        pair for pair in pairs if (key := keys.get(pair[0])) and key.prepaid and key.scope_limited
    ]


def with_scopes(keys: dict[str, KeyInfo], rows: Sequence[Any]) -> dict[str, KeyInfo]:
    """``keys`` with their project's and member's limits (``_scope_limits``' rows) added."""
    for key_id, project_limit, project_window, member_limit, member_window in rows:
        key = keys[key_id]
        limits = {
            "project": (project_limit, project_window),
            "member": (member_limit, member_window),
            "key": key.key_limit,
        }
        scopes = KeyScopes.of(key_id, key.scopes.project_id, key.scopes.member_id, limits)
        keys[key_id] = key._replace(scopes=scopes)
    return keys


# -- Recording events (first of each key, sorted by key). ---------------------------------------

# A batch's events from one array per column on PostgreSQL (``Records.by_column``).
EVENTS_BY_COLUMN = replace(EVENTS_IN, by_column=True)
_RECORD = Forms.of_statement(
    lambda on: insert_events(on, on.records(EVENTS_BY_COLUMN, "e"), returned=NEW_KEYS)
)
ENCODE_EVENTS = p.records_encoder(EVENTS_IN, p.POSTGRESQL, verbatim=EVENT_VERBATIM)
_ENCODE_SQLITE_EVENTS = p.records_encoder(EVENTS_IN, p.SQLITE, verbatim=EVENT_VERBATIM)
# On PostgreSQL each column is read from the events themselves (``Event.row``'s attributes).
_EVENT_ARRAYS = p.arrays_encoder(EVENTS_BY_COLUMN, ROW_ATTRIBUTES)
assert tuple(ROW_ATTRIBUTES) == EVENTS_IN.names


def _sqlite_events(events: Sequence[Event]) -> dict[str, str]:
    """The events' parameter on SQLite (which reads their JSON document)."""
    return {EVENTS_IN.name: _ENCODE_SQLITE_EVENTS([event.row() for event in events])}


def record(
    session: Session, events: Sequence[Event], now: datetime, account_id: str | None = None
) -> dict[EventKey, int]:
    """Insert ``events`` (priced, one per key, sorted by key); the new ids by key: the events
    that conflicted with a stored one are not among them. ``account_id`` (a Citus cluster):
    the events are all that account's."""
    if not events:
        return {}

    def params(on: p.Backend) -> dict[str, Any]:
        # The rows live only while they are written: not during the round trip, beside the text.
        encode = on.choose(postgresql=_EVENT_ARRAYS, sqlite=_sqlite_events)
        return {**encode(events), NOW.name: now}

    inserted = _RECORD.rows(session, params, account_id)
    return {(account, request): event_id for event_id, account, request in inserted}


# -- Stored events a batch collided with: what "same content" is compared against. -------------

# What "same content" and the charge are read from: the recorded columns but the hold.
_STORED_COLUMNS = tuple(name for name in EVENT_COLUMNS if name != "authorization_id")
_KEYS_IN = p.Records("p_keys", (("account_id", String()), ("request_id", String())))


def _stored(on: p.Backend) -> Any:
    wanted = on.records(_KEYS_IN, "wanted")
    return select(*(EVENTS.c[name] for name in _STORED_COLUMNS)).select_from(
        wanted.join(
            EVENTS,
            and_(
                EVENTS.c.account_id == wanted.c.account_id,
                EVENTS.c.request_id == wanted.c.request_id,
            ),
        )
    )


_STORED = Forms.of_statement(_stored)
CITUS_STORED = _STORED.citus


def stored_params(keys: Sequence[EventKey], on: p.Backend) -> dict[str, Any]:
    """The parameter of ``stored``'s statement for ``keys``."""
    wanted = [{"account_id": a, "request_id": r} for a, r in keys]
    return {_KEYS_IN.name: p.records_json(_KEYS_IN, wanted, on)}


def stored(
    session: Session, keys: Sequence[EventKey], account_id: str | None = None
) -> dict[EventKey, tuple[Content, ChargeValues]]:
    """The content and charge of the stored event of each key (each has one, committed).
    ``account_id`` (a Citus cluster): the keys are all that account's."""
    if not keys:
        return {}
    return read_stored(_STORED.rows(session, lambda on: stored_params(keys, on), account_id))


def read_stored(rows: Sequence[Any]) -> dict[EventKey, tuple[Content, ChargeValues]]:
    """``stored``'s rows: the content and charge of each key's stored event."""
    found: dict[EventKey, tuple[Content, ChargeValues]] = {}
    for row in rows:
        e = dict(zip(_STORED_COLUMNS, row, strict=True))
        usage = NormalizedUsage(
            e["prompt_tokens"], e["cached_tokens"], e["output_tokens"], e["reasoning_tokens"]
        )
        content = Content(
            e["api_key_id"], e["model_id"], e["api"], usage, e["occurred_at"], e["outcome"]
        )
        found[(e["account_id"], e["request_id"])] = (content, ChargeValues.of_stored(e))
    return found
