"""One usage event on the event loop, in two statements (PostgreSQL).

A request of one event is the gateway's most frequent shape. When that event is billable now
and new, it is recorded in two autocommit statements on the request's own event loop: the
lookup (the batch path's statement; then, only for an account with project or member spend
limits, their limits: metering.usage.repository ``with_scopes``), then the program
``RECORD_USAGE`` (metering.usage.recording), which inserts it and, only if it was new, settles
its charge and adds it to its rollups, as one transaction. The checks, the pricing and the
rollup rows are the batch path's own functions. The lookup a process read last for the event's
key and model is remembered (``_Lookups``): the next such event is priced from it, and its call
is made only if the rows that lookup was made of still read the same, in the call's own
statement (``repository.confirming``): one round trip (decision 0025).

On a Citus cluster (docs/citus.md#what-runs-on-a-cluster), the same in calls that each run
whole on the worker holding the account (sent there by the service, metering.nodes, or
delegated there by the node it reached, a call outside a transaction block), each event's
transaction that worker's alone: the lookup this process remembers of the event's pair, confirmed
by the record's call (``RECORD_USAGE_CONFIRMED_OF_ACCOUNT``: one call); else the key's account
(``api_keys``, a reference table) unless this process read it before (``_KEY_ACCOUNTS``), that
account's lookup of the pair with the text of what it is made of (``LOOKUP_OF_ACCOUNT``, the
lookup read one table at a time: metering.usage.lookup_apart), kept, then
``RECORD_USAGE_OF_ACCOUNT``.

Several events that arrived together at one process (metering.usage.together, PostgreSQL):
priced from the lookups this process remembers of each of their pairs, when it has them all,
and the program ``RECORD_GATHERED`` called only if each still holds, in the call's own statement
(``repository.confirming_all``): one round trip. Otherwise one lookup for all of them, which
reads each pair's text too (``repository.PG_LOOKUP_WITH_TEXTS``) and keeps each pair's part,
then the call.

Anything else (an event not billable now, a request_id already taken, an event the database
refuses) answers None, and the
caller takes the general path (``service.record_events``), which classifies it: nothing was
written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, cast

import psycopg

from metering.db import Database, Steps
from metering.kit.kept import Kept
from metering.metrics import REGISTRY
from metering.nodes import Executes
from metering.notifications import spend_limits
from metering.programs import POSTGRESQL, Positional, positional
from metering.usage import recording, repository, rollups, service
from metering.usage.events import ChargeValues, Content, Event, is_keyed, parse_event
from metering.usage.lookup_apart import (
    KEY_ID,
    LOOKUP_OF_ACCOUNT,
    MODEL_KEY,
    RECORD_USAGE_CONFIRMED_OF_ACCOUNT,
)
from metering.usage.prices import PriceBook
from metering.usage.repository import Lookup


async def record_one(
    database: Database, raw: object, now: datetime, cluster: bool = False
) -> service.BatchOutcome | None:
    """The outcome of recording ``raw``, or None when it needs the general path. ``cluster``:
    the database is a Citus coordinator."""
    if not is_keyed(raw):
        return None
    assert isinstance(raw, Mapping)
    event = parse_event(0, raw, now)
    if event.problem is not None:
        return None
    statements = OneAccount if cluster else _Statements
    return await database.run(_steps(event, now), postgresql=statements, sqlite=None)


async def record_gathered(
    database: Database, raws: Sequence[object], now: datetime
) -> list[service.Result | None] | None:
    """Several single events that arrived together (metering.usage.together), as one
    transaction on a PostgreSQL server: each one's result (index 0) when it was recorded, None
    for each whose request id was taken (the caller asks the general path about it: nothing of
    it was written); None for all when any needs the general path before (not billable now, two
    of one request id) or when the database refused them (nothing was written)."""
    if not all(is_keyed(raw) for raw in raws):
        return None
    events = [parse_event(0, cast(Mapping[str, Any], raw), now) for raw in raws]
    if any(event.problem is not None for event in events):
        return None
    if len({event.request_id for event in events}) < len(events):
        return None
    new = await database.run(_gathered(events, now), postgresql=_Statements, sqlite=None)
    if new is None:
        return None
    return [
        service.Result(0, event.request_id, service.RECORDED, event.charge_values())
        if event.request_id in new
        else None
        for event in events
    ]


def _priced(events: list[Event], remembered: bool = False, together: bool = False) -> Steps[bool]:
    """The events' keys, models and prices looked up (their project and member limits too,
    for accounts that have any), and the events priced: whether all of them are billable now.
    ``remembered``: one event, whose record confirms a lookup this process remembers;
    ``together``: events that arrived together, whose record confirms the lookups this process
    remembers of all their pairs, when it remembers each."""
    pairs = service.lookup_pairs(events)
    keys, book = yield lambda db: db.lookup(pairs, remembered, together)
    limited = repository.scope_pairs(keys, pairs)
    if limited:
        # An account with project or member limits: theirs, by a statement of its own.
        found = yield lambda db: db.scope_limits(limited, keys[limited[0][0]].account_id)
        keys = repository.with_scopes(keys, found)
    return len(service.price_events(events, keys, book)) == len(events)


def _steps(event: Event, now: datetime) -> Steps[service.BatchOutcome | None]:
    if not (yield from _priced([event], remembered=True)):
        return None
    new_id = yield lambda db: db.record(event, now)
    if new_id is STALE:
        # The lookup remembered no longer holds (nothing was written, and it was forgotten):
        # read afresh, and kept for the next.
        if not (yield from _priced([event], remembered=True)):
            return None
        new_id = yield lambda db: db.record(event, now)
    if new_id is None or new_id is STALE:
        return None
    result = service.Result(0, event.request_id, service.RECORDED, event.charge_values())
    return service.BatchOutcome([result])


def _gathered(events: list[Event], now: datetime) -> Steps[set[str] | None]:
    if not (yield from _priced(events, together=True)):
        return None
    new = yield lambda db: db.record_gathered(events, now)
    if new is STALE:
        # A lookup remembered no longer holds (nothing was written, and the pairs' lookups
        # were forgotten): read afresh, and kept for the next.
        if not (yield from _priced(events, together=True)):
            return None
        new = yield lambda db: db.record_gathered(events, now)
    return None if new is STALE else new


class _Stale(Enum):
    STALE = "stale"


# A single event's record not made: the lookup it confirmed had changed.
STALE = _Stale.STALE


def _stale(pairs: Sequence[tuple[str, str]]) -> _Stale:
    """A record not made: the lookups it confirmed of ``pairs`` had changed, and are forgotten
    (each is read afresh by the next event of its pair)."""
    LOOKUPS.inc("stale", amount=len(pairs))
    for pair in pairs:
        _LOOKUPS.forget(pair)
    return STALE


LOOKUPS = REGISTRY.counter(
    "metering_usage_single_lookups_total",
    "PostgreSQL and Citus: how single usage events looked up the key, model and prices of "
    "each (key, model) pair: read (a lookup), remembered (priced from the lookup this process "
    "read before), stale (a remembered one the record found changed; it was then read "
    "afresh).",
    ("source",),
)


@dataclass(frozen=True, slots=True)
class _Found:
    keys: dict[str, repository.KeyInfo]  # the lookup's rows, read (repository.read_lookup)
    book: PriceBook
    text: str  # what it is made of, as text (repository.confirming): the record confirms it
    confirm: str  # the pair and its text, as events gathered confirm it (repository.confirm_pair)

    @classmethod
    def of(
        cls, pair: tuple[str, str], keys: dict[str, repository.KeyInfo], book: PriceBook, text: str
    ) -> _Found:
        return cls(keys, book, text, repository.confirm_pair(pair, text))


class _Lookups:
    """The lookup this process last read for each (key, model lower-cased) of a single event,
    for the next one to be priced from without the lookup's round trip. Nothing is decided on
    it: the event's record is made only if the lookup's rows are still the same, in the same
    statement (``repository.confirming``); one that no longer holds is read afresh (and
    replaced). Only a known key's, of an account without project or member limits (theirs are
    read by a statement of their own). Bounded (metering.kit.kept): when full, it starts again
    empty (a miss costs one round trip)."""

    def __init__(self) -> None:
        self._found: Kept[tuple[str, str], _Found] = Kept()

    def get(self, pair: tuple[str, str]) -> _Found | None:
        return self._found.get(pair)

    def forget(self, pair: tuple[str, str]) -> None:
        self._found.forget(pair)

    def keep(self, pair: tuple[str, str], found: _Found) -> None:
        if len(found.keys) != 1 or repository.scope_pairs(found.keys, [pair]):
            self.forget(pair)
            return
        self._found.keep(pair, found)


_LOOKUPS = _Lookups()


def _keep(
    pairs: Sequence[tuple[str, str]],
    keys: dict[str, repository.KeyInfo],
    book: PriceBook,
    texts: Mapping[tuple[str, str], str],
) -> None:
    """Each pair's part of a lookup read with the text of what each pair's is made of
    (``texts``), kept for the pair's next event; a pair whose key or text was not read is
    forgotten."""
    LOOKUPS.inc("read", amount=len(pairs))
    for pair in pairs:
        key_id, model_key = pair
        key, text = keys.get(key_id), texts.get(pair)
        if key is None or text is None:
            _LOOKUPS.forget(pair)
            continue
        part = book.part(model_key, key.account_id)
        _LOOKUPS.keep(pair, _Found.of(pair, {key_id: key}, part, text))


class _Statements:
    """The two statements, on an autocommit connection: each its own transaction. A single
    event's lookup remembered (or every pair's of events gathered), one: its record, made only
    if the lookups still hold."""

    RECORD = recording.RECORD_USAGE.call_sql
    # Longer than psycopg caches the conversion of: sent as it is, by a raw cursor.
    RECORD_CONFIRMED = positional(repository.confirming(recording.RECORD_USAGE.call_sql))
    RECORD_GATHERED = recording.RECORD_GATHERED.call_sql
    RECORD_GATHERED_CONFIRMED = positional(
        repository.confirming_all(recording.RECORD_GATHERED.call_sql)
    )

    def __init__(self, connection: Executes) -> None:
        self._connection = connection
        # The remembered lookups the next record confirms (one event's pair, or every pair of
        # events gathered): the pairs and the confirmation's parameters.
        self._confirming: tuple[list[tuple[str, str]], dict[str, Any]] | None = None

    async def lookup(
        self, pairs: list[tuple[str, str]], remembered: bool = False, together: bool = False
    ) -> Lookup:
        """The lookup's keys and price book; ``remembered`` (one pair, whose record confirms
        them): those this process read before, when it has them, else read with their text and
        kept; ``together`` (events gathered, whose record confirms them): the same of every
        pair, when this process has them all."""
        self._confirming = None
        if not (remembered or together):
            params = repository.lookup_params(pairs, POSTGRESQL)
            cursor = await self._connection.execute(repository.PG_LOOKUP, params)
            return repository.read_lookup(await cursor.fetchall())
        found = [_LOOKUPS.get(pair) for pair in pairs]
        if not all(each is not None for each in found):
            return await self._read_and_keep(pairs)
        kept = cast(list[_Found], found)
        LOOKUPS.inc("remembered", amount=len(pairs))
        if together:
            confirm = {"confirm_pairs": f"[{','.join(each.confirm for each in kept)}]"}
        else:
            [pair], [one] = pairs, kept
            confirm = repository.confirm_params(pair, one.text)
        self._confirming = (pairs, confirm)
        if len(kept) == 1:
            return kept[0].keys, kept[0].book
        keys = {k: v for each in kept for k, v in each.keys.items()}
        return keys, PriceBook.merged(each.book for each in kept)

    async def _read_and_keep(self, pairs: list[tuple[str, str]]) -> Lookup:
        """The lookup of ``pairs``, read with each pair's text, and each pair's part of it kept
        for the next event of that pair."""
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.PG_LOOKUP_WITH_TEXTS, params)
        read = await cursor.fetchall()
        texts = {(row[1], row[2]): row[-1] for row in read if row[0] == repository.TEXT_KIND}
        keys, book = repository.read_lookup(
            [row[:-1] for row in read if row[0] != repository.TEXT_KIND]
        )
        _keep(pairs, keys, book, texts)
        return keys, book

    async def scope_limits(self, pairs: list[tuple[str, str]], account_id: str) -> list[Any]:
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.PG_SCOPE_LIMITS, params)
        return await cursor.fetchall()

    async def record(self, event: Event, now: datetime) -> int | _Stale | None:
        """The new event's id; None when its request id is taken, or when the database refused
        it (a charge beyond the range, metering.kit.ranges): the general path then decides,
        nothing having been written (the program is one transaction). ``STALE``: the lookup
        remembered had changed, nothing was written."""
        try:
            return await self._record(event, now)
        except psycopg.DatabaseError:
            return None

    async def _record(self, event: Event, now: datetime) -> int | _Stale | None:
        params = self._params(event, now)
        if self._confirming is None:
            cursor = await self._connection.execute(self.RECORD, params)
            row = await cursor.fetchone()
            return None if row is None else row[0]
        (pairs, confirm), self._confirming = self._confirming, None
        row = await self._record_confirmed({**params, **confirm})
        return _stale(pairs) if row is None else row[0]

    async def _record_confirmed(self, params: dict[str, Any]) -> Any:
        """The one row of the record confirming the lookup remembered (None: it no longer
        holds, nothing was written)."""
        return await self._confirmed(self.RECORD_CONFIRMED, params)

    async def record_gathered(self, events: list[Event], now: datetime) -> set[str] | _Stale | None:
        """The request ids of those of ``events`` that were new (recorded); None when the
        database refused them (nothing was written, the program being one transaction).
        ``STALE``: a lookup remembered had changed, nothing was written."""
        confirming, self._confirming = self._confirming, None
        try:
            if confirming is None:
                return await self.record_new(events, now)
            pairs, confirm = confirming
            params = {**self._gathered_params(events, now), **confirm}
            row = await self._confirmed(self.RECORD_GATHERED_CONFIRMED, params)
        except psycopg.DatabaseError:
            return None
        return _stale(pairs) if row is None else set(row[0] or ())

    async def record_new(self, events: list[Event], now: datetime) -> set[str]:
        """The request ids of those of ``events`` that were new (recorded), by one call of
        ``RECORD_GATHERED`` (of its account, on a cluster); a refusal of the database raised
        (nothing was written, the program being one transaction)."""
        cursor = await self._connection.execute(
            self.RECORD_GATHERED, self._gathered_params(events, now)
        )
        row = await cursor.fetchone()
        assert row is not None
        return set(row[0] or ())

    @staticmethod
    def _encode_gathered(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {recording.GATHERED_IN.name: recording.ENCODE_GATHERED(rows)}

    def _gathered_params(self, events: list[Event], now: datetime) -> dict[str, Any]:
        return {
            "p_now": now,
            # Each event's rollup row alone and its row name some columns alike (its key, its
            # model, its output and reasoning tokens), of the same value: one event's.
            **self._encode_gathered(
                [
                    {**rollups.rows([(0, event)])[0], **event.row(), "prepaid": event.prepaid}
                    for event in events
                ]
            ),
            **spend_limits.limit_params(service.spend_limited(events), now, POSTGRESQL),
        }

    async def _confirmed(self, statement: Positional, params: dict[str, Any]) -> Any:
        """The one row of a record made only if the lookups it confirms still hold (None when
        they do not): sent as it is, by a raw cursor."""
        assert isinstance(self._connection, psycopg.AsyncConnection)  # one server's
        cursor = psycopg.AsyncRawCursor(self._connection)
        await cursor.execute(statement.text, statement.params(params))
        return await cursor.fetchone()

    def _params(self, event: Event, now: datetime) -> dict[str, Any]:
        return {
            "p_now": now,
            "p_events": repository.ENCODE_EVENTS([event.row()]),
            "p_prepaid": event.prepaid,
            # last_event_id is the new id, set by the program.
            "p_rollups": rollups.ENCODE(rollups.rows([(0, event)])),
            **spend_limits.limit_params(service.spend_limited([event]), now, POSTGRESQL),
        }


# The account of each key this process read it for (a Citus cluster), for the next event of the
# key to go straight to its account's lookup, on its account's node, without reading
# ``api_keys`` first. Nothing is decided on it: the lookup reads the key itself, and is used only
# when the key it read is that account's (a key never changes account; one deleted reads as
# none, and is then looked for afresh).
_KEY_ACCOUNTS: Kept[str, str] = Kept()


class OneAccount(_Statements):
    """On a Citus cluster: the lookup remembered of the event's pair, confirmed by the record's
    call; else the key's account (remembered, or read first), then the lookup of the event's
    pair read apart and the program, of that account alone (each a call to the node that holds
    it: metering.nodes; or delegated there); an account's project and member limits by a
    statement routed to its shard."""

    RECORD = recording.RECORD_USAGE_OF_ACCOUNT.call_sql
    RECORD_CONFIRMED_OF_ACCOUNT = RECORD_USAGE_CONFIRMED_OF_ACCOUNT.call_sql
    RECORD_GATHERED = recording.RECORD_GATHERED_OF_ACCOUNT.call_sql
    # The event's one pair read one table at a time, a call delegated to the account's worker.
    LOOKUP = LOOKUP_OF_ACCOUNT.call_sql
    # Several pairs of the account (its part of a batch: metering.usage.sharded).
    LOOKUP_PAIRS = repository.LOOKUP_PAIRS_OF_ACCOUNT.call_sql

    async def lookup(
        self, pairs: list[tuple[str, str]], remembered: bool = False, together: bool = False
    ) -> Lookup:
        """``remembered`` (one pair, whose record confirms it): the lookup this process read
        before, when it has it; else read, with the text of what it is made of, and kept
        (``together`` is not used on a cluster). Read of the account this process read the
        key's for before, when the key it reads is still that account's; otherwise the key's
        account read first."""
        self._confirming = None
        [pair] = pairs
        found = _LOOKUPS.get(pair) if remembered else None
        if found is not None:
            LOOKUPS.inc("remembered")
            self._confirming = (pairs, repository.confirm_params(pair, found.text))
            return found.keys, found.book
        key_id, model_key = pair
        account_id = _KEY_ACCOUNTS.get(key_id)
        if account_id is not None:
            keys, book = await self._lookup_of(key_id, model_key, account_id, remembered)
            key = keys.get(key_id)
            if key is not None and key.account_id == account_id:
                return keys, book
            _KEY_ACCOUNTS.forget(key_id)
        account_id = (await self.key_accounts(pairs)).get(key_id)
        if account_id is None:
            return {}, PriceBook()  # an unknown key: the general path quarantines it
        _KEY_ACCOUNTS.keep(key_id, account_id)
        return await self._lookup_of(key_id, model_key, account_id, remembered)

    async def _lookup_of(
        self, key_id: str, model_key: str, account_id: str, keep: bool = False
    ) -> Lookup:
        """The account's lookup of the pair; ``keep``: kept for the pair's next event, with the
        text of what it is made of (when the key is the account's)."""
        params = repository.of_account({KEY_ID.name: key_id, MODEL_KEY.name: model_key}, account_id)
        cursor = await self._connection.execute(self.LOOKUP, params)
        rows = await cursor.fetchall()
        keys, book = repository.read_lookup(rows)
        if keep:
            account_keys = {k: v for k, v in keys.items() if v.account_id == account_id}
            _keep([(key_id, model_key)], account_keys, book, repository.lookup_texts(rows))
        return keys, book

    async def _record_confirmed(self, params: dict[str, Any]) -> Any:
        cursor = await self._connection.execute(self.RECORD_CONFIRMED_OF_ACCOUNT, params)
        return await cursor.fetchone()

    async def scope_limits(self, pairs: list[tuple[str, str]], account_id: str) -> list[Any]:
        params = repository.of_account(repository.lookup_params(pairs, POSTGRESQL), account_id)
        cursor = await self._connection.execute(repository.CITUS_SCOPE_LIMITS, params)
        return await cursor.fetchall()

    async def key_accounts(self, pairs: list[tuple[str, str]]) -> dict[str, str]:
        """The account of each known key of ``pairs`` (``api_keys``, a reference table: read on
        whichever node)."""
        params = repository.lookup_params(pairs, POSTGRESQL)
        cursor = await self._connection.execute(repository.KEY_ACCOUNTS, params)
        return dict(await cursor.fetchall())

    async def lookup_of_account(self, pairs: list[tuple[str, str]], account_id: str) -> Lookup:
        """The lookup of ``pairs`` (the keys of ``account_id``: a key of another account is not
        found), by a call on the account's node."""
        params = repository.of_account(repository.lookup_params(pairs, POSTGRESQL), account_id)
        cursor = await self._connection.execute(self.LOOKUP_PAIRS, params)
        return repository.read_lookup(await cursor.fetchall())

    async def stored(
        self, keys: list[repository.EventKey], account_id: str
    ) -> dict[repository.EventKey, tuple[Content, ChargeValues]]:
        """The content and charge of the stored event of each key (all ``account_id``'s)."""
        params = repository.of_account(repository.stored_params(keys, POSTGRESQL), account_id)
        cursor = await self._connection.execute(repository.CITUS_STORED, params)
        return repository.read_stored(await cursor.fetchall())

    def _params(self, event: Event, now: datetime) -> dict[str, Any]:
        assert event.account_id is not None
        return repository.of_account(super()._params(event, now), event.account_id)

    @staticmethod
    def _encode_gathered(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return recording.ENCODE_GATHERED_BY_COLUMN(rows)

    def _gathered_params(self, events: list[Event], now: datetime) -> dict[str, Any]:
        # Events of one account (an account's part of a batch: metering.usage.sharded).
        [account_id] = {event.account_id for event in events}
        assert account_id is not None
        return repository.of_account(super()._gathered_params(events, now), account_id)
