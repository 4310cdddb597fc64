"""The authorization's resolution: what a client's key and a model name resolve to at an instant
— the live key, its account's billing and the key's spend limit, the model's limits, and the
rates in force for the account — as one SQL statement (``RESOLUTION``) with named columns.

The same definition is read by the authorization (a fresh read), and confirmed by the
check-and-hold when an API process remembered it, or the hold is not placed:

* on one PostgreSQL server by its **stamp** (``Stamp``): the generations of its account and its
  model, which the database moves whenever a row the resolution reads changes (triggers on each
  of its inputs, ``inputs()``: migration 0015), and the instants between which its price stays the
  one in force (metering.catalog.prices.price_window). Unchanged generations and a hold's instant
  within those bounds mean every input is as it was read;
* on a Citus cluster (no triggers on shards) by its JSON text (``resolution_text_apart``),
  recomputed at the hold's instant. For an account whose projects and members have no spend
  limit and no model list (neither of the account's marks set, read with its locked row), the
  recomputation reads neither: they could change nothing, and any change that could is made
  with a mark in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import date, datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Date,
    Select,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.sql import visitors

from metering import programs as p
from metering.accounts.access import account_sees, key_allows, project_allows
from metering.accounts.keys import ACCOUNTS, KEYS, live_key
from metering.catalog.prices import RATE_COLUMNS, price_in_force, price_window
from metering.citus.apart import read_apart
from metering.models import CatalogModel, Member, Project, table
from metering.models.base import UTCDateTime
from metering.pricing import ModelLimits, Rates
from metering.programs import json_row

MODELS = table(CatalogModel)
PROJECTS = table(Project)
MEMBERS = table(Member)


@dataclass(frozen=True, slots=True)
class Resolution:
    """A resolving row, by name (``RESOLUTION``'s columns). ``model_id`` is None for a model
    name the catalog does not know; ``price_version_id`` None when no price is in force."""

    api_key_id: str
    account_id: str
    billing: str
    spend_limit_microcents: int | None
    spend_limit_window: str
    # The key's project and member (null: a service key), and their spend limits.
    project_id: str | None
    member_id: str | None
    project_spend_limit_microcents: int | None
    project_spend_limit_window: str | None
    member_spend_limit_microcents: int | None
    member_spend_limit_window: str | None
    max_concurrent_requests: int | None
    model_id: str | None
    context_length: int | None
    max_output_tokens: int | None
    reasoning_headroom_tokens: int | None
    deprecation_date: date | None
    price_version_id: str | None
    account_sees: bool  # the account may use the model (else: as if unknown)
    key_allows: bool  # the key's own list lets it use the model
    project_allows: bool  # the key's project's list lets it use the model
    rates: Rates | None  # the price's RATE_COLUMNS, when one is in force

    @property
    def limits(self) -> ModelLimits:
        assert self.context_length is not None and self.reasoning_headroom_tokens is not None
        return ModelLimits(
            context_length=self.context_length,
            max_output_tokens=self.max_output_tokens,
            reasoning_headroom_tokens=self.reasoning_headroom_tokens,
        )

    @classmethod
    def from_mapping(cls, row: Any) -> Resolution:
        """A resolving row (``NAMES``' columns) as a resolution."""
        values = {name: row[name] for name in NAMES}
        rates = {name: values.pop(name) for name in RATE_COLUMNS}
        priced = values["price_version_id"] is not None
        for name in _BOOLEAN_COLUMNS:  # SQLite's json_array writes them as 1 and 0
            values[name] = bool(values[name])
        return cls(**values, rates=Rates(**rates) if priced else None)

    @classmethod
    def from_text(cls, text: str) -> Resolution:
        """A resolution from its JSON text (``as_text``): values by column, dates
        decoded from their ISO text."""
        values = dict(zip(NAMES, json.loads(text), strict=True))
        for name in _DATE_COLUMNS:
            if values[name] is not None:
                values[name] = date.fromisoformat(values[name])
        return cls.from_mapping(values)


# The resolving statement's columns: the record's fields, the price's rates by their names.
NAMES = (*(f.name for f in fields(Resolution) if f.name != "rates"), *RATE_COLUMNS)


def _limit_window(owner: Any) -> Any:
    """A project's or a member's spend-limit window, null while it has no limit (so a scope
    without a limit reads the same whether its row is read or not)."""
    return case((owner.c.spend_limit_microcents.is_(None), None), else_=owner.c.spend_limit_window)


def _parts(
    secret_hash: Any, model_key: Any, at: Any, *, scoped: bool = True
) -> tuple[dict[str, Any], Any, Any]:
    """The resolving statement's columns, FROM clause and condition. ``scoped=False``: the form
    for an account none of whose projects and members has a spend limit or a model list (the
    account's two marks, metering.models.accounts), which reads neither: their columns are what
    such rows give (no limits; the project allows every model the key may use)."""
    models = MODELS.alias("model")
    price = price_in_force(KEYS.c.account_id, models.c.id, at)
    no_limit, no_window = cast(null(), BigInteger), cast(null(), String)
    scopes = {
        "project_spend_limit_microcents": PROJECTS.c.spend_limit_microcents,
        "project_spend_limit_window": _limit_window(PROJECTS),
        "member_spend_limit_microcents": MEMBERS.c.spend_limit_microcents,
        "member_spend_limit_window": _limit_window(MEMBERS),
    }
    if not scoped:
        scopes = {name: no_window if name.endswith("window") else no_limit for name in scopes}
    project_allowed = project_allows(
        KEYS.c.account_id, KEYS.c.project_id, PROJECTS.c.restricts_models, models.c.id
    )
    columns = {
        "api_key_id": KEYS.c.id,
        "account_id": KEYS.c.account_id,
        "billing": ACCOUNTS.c.billing,
        "spend_limit_microcents": KEYS.c.monthly_spend_limit_microcents,
        "spend_limit_window": KEYS.c.spend_limit_window,
        "project_id": KEYS.c.project_id,
        "member_id": KEYS.c.member_id,
        **scopes,
        "max_concurrent_requests": ACCOUNTS.c.max_concurrent_requests,
        "model_id": models.c.id,
        "context_length": models.c.context_length,
        "max_output_tokens": models.c.max_output_tokens,
        "reasoning_headroom_tokens": models.c.reasoning_headroom_tokens,
        "deprecation_date": models.c.deprecation_date,
        "price_version_id": price.version_id,
        "account_sees": account_sees(KEYS.c.account_id, ACCOUNTS.c.restricts_models, models.c.id),
        "key_allows": key_allows(
            KEYS.c.account_id, KEYS.c.id, KEYS.c.restricts_models, models.c.id
        ),
        "project_allows": project_allowed if scoped else true(),
        **{name: price.rate(name) for name in RATE_COLUMNS},
    }
    assert tuple(columns) == NAMES
    base = KEYS.join(ACCOUNTS, ACCOUNTS.c.id == KEYS.c.account_id)
    if scoped:
        base = base.outerjoin(
            PROJECTS,
            and_(PROJECTS.c.account_id == KEYS.c.account_id, PROJECTS.c.id == KEYS.c.project_id),
        ).outerjoin(
            MEMBERS,
            and_(MEMBERS.c.account_id == KEYS.c.account_id, MEMBERS.c.id == KEYS.c.member_id),
        )
    base = base.outerjoin(models, models.c.id_key == model_key)
    return columns, price.join(base), live_key(KEYS, secret_hash)


def resolution(secret_hash: Any, model_key: Any, at: Any, *, scoped: bool = True) -> Select[Any]:
    """The resolving statement: one row for a live key (the model's columns null when the
    model name is unknown, the price's when none is in force at ``at``), none otherwise.
    ``scoped=False``: without the key's project and member (``_parts``)."""
    columns, source, where = _parts(secret_hash, model_key, at, scoped=scoped)
    return (
        select(*(column.label(name) for name, column in columns.items()))
        .select_from(source)
        .where(where)
    )


def resolution_text_apart(
    secret_hash: Any, model_key: Any, at: Any, into: p.Var, *, scoped: bool = True
) -> tuple[p.Step, ...]:
    """The resolution's JSON text (``as_text`` of the resolving statement's row; null for no
    live key) into ``into`` on a Citus shard: the same statement's row read by statements of one
    table each, which Citus plans once where it plans the join twice at every call
    (metering.citus.apart), then written as the same text: what a remembered one is compared
    with there."""
    read = read_apart(*_parts(secret_hash, model_key, at, scoped=scoped), prefix="r")
    return (*read.steps, p.Assign(into, case((read.found, text_of(read.columns)))))


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a remembered resolution rests on (one PostgreSQL server): its account's and its
    model's ``resolution_generation`` when it was read, and the bounds of its price's time
    (``valid_from`` inclusive, ``valid_until`` exclusive; None: unbounded)."""

    generation: int
    model_generation: int
    valid_from: datetime | None
    valid_until: datetime | None


STAMP_NAMES = tuple(f.name for f in fields(Stamp))


def stamp_of(found: Any, at: Any) -> tuple[Any, ...]:
    """A resolution subquery's stamp (``STAMP_NAMES``' columns), read in the same statement."""
    since, until = price_window(found.c.account_id, found.c.model_id, at)
    return (
        _generation(ACCOUNTS, found.c.account_id),
        _generation(MODELS, found.c.model_id),
        since,
        until,
    )


def _generation(owner: Any, owner_id: Any) -> Any:
    """The ``resolution_generation`` of the account or the model (``owner``) ``owner_id``."""
    return select(owner.c.resolution_generation).where(owner.c.id == owner_id).scalar_subquery()


def stamp_broken(
    stamp: Mapping[str, Any], generation: Any, model_id: Any, at: Any
) -> ColumnElement[bool]:
    """Whether a hold's stamp (``stamp``: its ``STAMP_NAMES`` values) no longer holds at ``at``,
    the account's generation read as ``generation`` under its lock: a generation moved, or the
    instant is out of the price's bounds. Null (not broken) when the hold has no stamp."""
    return and_(
        stamp["generation"].isnot(None),
        or_(
            stamp["generation"] != generation,
            stamp["model_generation"].is_distinct_from(_generation(MODELS, model_id)),
            at < stamp["valid_from"],
            at >= stamp["valid_until"],
        ),
    )


def as_text(found: Any) -> Any:
    """A resolution subquery's row as its JSON text (the one form both readers write)."""
    return text_of(found.c)


def text_of(values: Any) -> Any:
    """A resolution's values (by ``NAMES``) as its JSON text."""
    return cast(json_row(*(values[name] for name in NAMES)), Text)


# The fresh read's parameters.
SECRET_HASH = bindparam("secret_hash", type_=String)
MODEL_KEY = bindparam("model_key", type_=String)
AT = bindparam("now", type_=UTCDateTime)


_DATE_COLUMNS = tuple(
    name
    for name, column in _parts(SECRET_HASH, MODEL_KEY, AT)[0].items()
    if isinstance(column.type, Date)
)
_BOOLEAN_COLUMNS = ("account_sees", "key_allows", "project_allows")


def _columns_read(statement: Any) -> dict[str, frozenset[str]]:
    """Each table a statement reads (through any alias) and the columns of it it names."""
    read: dict[str, set[str]] = {}
    for element in visitors.iterate(statement):
        if isinstance(element, Column) and element.table is not None:
            source = element.table
            while not isinstance(source, Table):
                source = source.element
            read.setdefault(source.name, set()).add(element.name)
    return {name: frozenset(columns) for name, columns in sorted(read.items())}


@cache
def inputs() -> dict[str, frozenset[str]]:
    """The resolution's inputs: each table it reads and the columns of it that it names (the
    price's bounds read nothing more). On one PostgreSQL server a change of any of them moves a
    generation (``generation_owner``); tests/ledger/test_resolution_generations.py holds the
    database's triggers equal to this. Walked when first asked for, not at start-up."""
    return _columns_read(resolution(SECRET_HASH, MODEL_KEY, AT))


_OWNERS = {ACCOUNTS.name: "account_id", MODELS.name: "model_id"}


def generation_owner(table_name: str) -> tuple[str, str | None]:
    """Whose generation a change of the table's row moves: the table of its owner, and the
    row's column that names it (None: an owner's own row moves its own)."""
    if table_name in _OWNERS:
        return table_name, None
    columns = inputs()[table_name]
    for owner, column in _OWNERS.items():
        if column in columns:
            return owner, column
    raise AssertionError(f"{table_name}: a resolution's input with no account and no model")
