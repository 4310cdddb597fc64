"""A single event's lookup on a Citus shard, read one table at a time; its record confirming
the lookup remembered.

On a cluster a single event's keys' lookup (metering.usage.repository ``_lookup``: a union of
the pair's key, model and price points, joined to the pairs) was one statement routed to the
account's shard, which the worker planned in full at every request. ``LOOKUP_OF_ACCOUNT``
answers the same rows for the event's one pair, built from the lookup's own parts
(``keyed_joins``, ``keyed_columns``, ``instant_sources``, the rows' shapes and
``price_in_force``): the key, its account and the model each read by its unique key
(metering.citus.apart), then, for a known model of a prepaid account, each instant where the
price may change (a list price's version, an override of the account's) and the price in force
from it, read apart too. A call delegated to the worker that holds the account, whose every
statement is of one table, the shape Citus plans cheapest.

Two differences from the join, neither in what it answers: an instant that is both a list
version's and an override's comes twice (the same price both times: a price book's timeline is
the same), and each statement reads its own snapshot (READ COMMITTED), where the join read one;
a fact that changes meanwhile is seen or not, as a change committed just after the join would
have been. One server keeps the join (one statement, planned once by PostgreSQL, and several
pairs at once); so does a batch on the cluster.

The lookup answers first the text of the rows it is made of (``repository.inputs_text``, read
before its other rows: a change committed meanwhile makes the text the older, never the rows),
for the process to remember it with the lookup (metering.usage.single). The next event of the
pair is priced from what was remembered and recorded by ``RECORD_USAGE_CONFIRMED_OF_ACCOUNT``:
``RECORD_USAGE``, made only if those rows still read as that text, in the same call: one call
on the account's node where there were two, as one server confirms a lookup in its record's
statement (``repository.confirming``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, String, select

from metering import programs as p
from metering.catalog.prices import price_in_force
from metering.citus.apart import read_apart
from metering.citus.one_account import of_account
from metering.models.base import UTCDateTime
from metering.usage import repository
from metering.usage.recording import NEWEST, RECORD_USAGE, record_usage_steps
from metering.usage.repository import (
    LOOKUP_COLUMNS,
    has_model,
    inputs_text,
    instant_sources,
    key_row,
    keyed_columns,
    keyed_joins,
    model_row,
    price_row,
    priced,
    text_row,
)

KEY_ID = p.Var("p_api_key_id", String())
MODEL_KEY = p.Var("p_model_key", String())
_AT = p.Var("v_l_at", UTCDateTime())


def _lookup_apart(on: p.Backend) -> list[p.Step]:
    joins = keyed_joins(KEY_ID.ref, MODEL_KEY.ref)
    (first, where, _), *rest = joins
    source: Any = first
    for table, condition, outer in rest:
        source = source.join(table, condition, isouter=outer)
    keyed = read_apart(keyed_columns(MODEL_KEY.ref), source, where, prefix="l")
    k = keyed.columns
    price = price_in_force(k["account_id"], k["model_id"], _AT.ref)
    in_force = read_apart({c.name: c for c in price.labelled()}, *price.apart(), prefix="p")
    point = p.Emit(price_row(k["account_id"], k["model_id"], _AT.ref, [*in_force.columns.values()]))
    points = tuple(
        p.ForEach(
            select(table.c.effective_at).where(condition),
            into=(_AT,),
            steps=(*in_force.steps, point),
        )
        for table, condition in instant_sources(k["account_id"], k["model_id"])
    )
    return [
        # First: a change committed while the rest is read leaves the text the older one.
        p.Emit(text_row(KEY_ID.ref, MODEL_KEY.ref, inputs_text(KEY_ID.ref, MODEL_KEY.ref))),
        *keyed.steps,
        p.When(
            keyed.found,
            (
                p.Emit(key_row(k)),
                p.When(has_model(k), (p.Emit(model_row(k)),)),
                p.When(priced(k), points),
            ),
        ),
    ]


# Only its one-account form is a function: one server reads the join.
LOOKUP_OF_ACCOUNT = of_account(
    p.Program(
        "metering_lookup", params=(KEY_ID, MODEL_KEY), build=_lookup_apart, returns=LOOKUP_COLUMNS
    )
)


# The pair whose lookup a single event's record confirms, and the text of the rows that lookup
# was made of when it was read (its 'text' row): ``repository.confirm_params``.
LOOKUP_KEY_ID = p.Var(repository.LOOKUP_KEY_ID, String())
LOOKUP_MODEL_KEY = p.Var(repository.LOOKUP_MODEL_KEY, String())
LOOKUP_TEXT = p.Var(repository.LOOKUP_TEXT, String())


def _record_usage_confirmed(on: p.Backend) -> list[p.Step]:
    holds = inputs_text(LOOKUP_KEY_ID.ref, LOOKUP_MODEL_KEY.ref) == LOOKUP_TEXT.ref
    return [p.When(holds, (*record_usage_steps(on), p.Emit((NEWEST.ref,))))]


# A single event priced from a lookup remembered: no row when that lookup no longer holds
# (nothing written); else one, the new event's id (None: its request id was taken). Only its
# one-account form is a function, with RECORD_USAGE's settings.
RECORD_USAGE_CONFIRMED_OF_ACCOUNT = of_account(
    p.Program(
        "metering_record_usage_confirmed",
        params=(*RECORD_USAGE.params, LOOKUP_KEY_ID, LOOKUP_MODEL_KEY, LOOKUP_TEXT),
        build=_record_usage_confirmed,
        returns=(("usage_event_id", BigInteger()),),
        settings=RECORD_USAGE.settings,
    )
)
