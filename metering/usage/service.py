"""Recording a batch of usage events: keyed, checked, priced at request time, deduplicated,
charged, settled against holds and aggregated, all in the caller's one transaction.

Set-based: a fixed number of statements per batch whatever its size, no round trip per event:
one lookup (keys, models, prices, overrides), one insert of the events, a read-back only when an
event collided with a stored one, the settlement (ledger entries, balances, holds), and one
upsert of the report aggregates. Every read comes first, and the per-event work (checks,
pricing, the aggregates' sums and encoding) before the writes that take contended locks: the
rows every concurrent batch (and every authorization) of an account also writes, its account
row and its rollup rows, are written last, so their locks are held only until the commit (the
longer they are held, the more the ingest of one account serialises). Every multi-row write is
sorted by its key, so concurrent batches lock rows in the same order and cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy.orm import Session

from metering.kit.errors import InvalidRequest
from metering.ledger.settlement import ChargeToSettle
from metering.notifications.spend_limits import ScopeLimit
from metering.pricing import Charge, NormalizedUsage, price_usage
from metering.usage import recording, repository, rollups
from metering.usage.events import (
    CHARGE_FIELDS,
    ChargeValues,
    Content,
    Event,
    Problem,
    is_keyed,
    parse_event,
    reject_reason,
)
from metering.usage.prices import PriceBook
from metering.usage.repository import EventKey
from metering.usage.schemas import MAX_BATCH

RECORDED, DUPLICATE, QUARANTINED, REJECTED = "recorded", "duplicate", "quarantined", "rejected"
STATUSES = (RECORDED, DUPLICATE, QUARANTINED, REJECTED)

_UNKNOWN_KEY = Problem("unknown_api_key", "api_key_id does not name an API key", "api_key_id")
_UNKNOWN_MODEL = Problem("model_not_found", "model is not in the catalog", "model")
_NO_PRICE = Problem(
    "price_not_found", "no price of this model was in force at occurred_at", "occurred_at"
)
_CONFLICT = Problem(
    "idempotency_conflict",
    "this request_id was recorded with different content; the original stands",
    "request_id",
)


def charge_body(values: ChargeValues) -> dict[str, Any]:
    """A result's ``charge`` (docs/api.md#post-v1usageevents)."""
    return dict(zip(CHARGE_FIELDS, values, strict=True))


def stored_charge_body(row: Any) -> dict[str, Any]:
    """The ``charge`` of a stored event (a ``UsageEvent``)."""
    return charge_body(ChargeValues.of_stored(vars(row)))


@dataclass(slots=True)
class Result:
    index: int
    request_id: str | None
    status: str
    charge_values: ChargeValues | None = None
    error: Problem | None = None

    @property
    def charge(self) -> dict[str, Any] | None:
        return None if self.charge_values is None else charge_body(self.charge_values)

    def body(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "request_id": self.request_id,
            "status": self.status,
            "charge": self.charge,
            "error": None if self.error is None else self.error.body(),
        }


@dataclass
class BatchOutcome:
    results: list[Result]
    # Keyed events that are not billable now (problem set), for the caller to keep.
    quarantined: list[Event] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            counts[result.status] += 1
        return counts


def check_batch_size(events: Sequence[object]) -> None:
    if not events:
        raise InvalidRequest("events must hold at least one event", param="events")
    if len(events) > MAX_BATCH:
        raise InvalidRequest(
            f"a batch holds at most {MAX_BATCH} events; this one has {len(events)}",
            code="batch_too_large",
            param="events",
        )


# The results known without the database (the rejected events), and the keyed events parsed.
Parsed = tuple[list["Result | None"], list[Event]]


def parse(raws: Sequence[object], now: datetime) -> Parsed:
    """Pure: each raw event rejected (its result) or parsed (an ``Event``, with the problems
    that need no database: timestamp, api, outcome, usage)."""
    results: list[Result | None] = [None] * len(raws)
    events: list[Event] = []
    for index, raw in enumerate(raws):
        if is_keyed(raw):  # a Mapping (the assertion, an ABC's check, cost more per event)
            events.append(parse_event(index, cast(Mapping[str, Any], raw), now))
            continue
        request_id = raw.get("request_id") if isinstance(raw, Mapping) else None
        results[index] = Result(
            index,
            request_id if isinstance(request_id, str) else None,
            REJECTED,
            error=reject_reason(raw),
        )
    return results, events


# On a Citus cluster: the account of each key a batch names (repository.key_accounts).
Accounts = Mapping[str, str]


def record_events(
    session: Session,
    raws: Sequence[object],
    now: datetime,
    *,
    before_settlement: Callable[[BatchOutcome], None] | None = None,
    parsed: Parsed | None = None,
    accounts: Accounts | None = None,
) -> BatchOutcome:
    """Record every billable event of ``raws`` exactly once; the rest are returned classified.

    ``before_settlement`` runs once every result is known, before the ledger and the account
    balances are touched: the caller's own writes (keeping the quarantined events) then happen
    before the account rows are locked, not while they are held. ``parsed``: ``parse(raws,
    now)``, done by the caller before its transaction began (it needs no database), so that
    the writer's turn (SQLite) is not spent on it. ``accounts``: on a Citus cluster, the
    account of each key the events name (``repository.key_accounts``): the events are then
    recorded account by account, in byte order of account, every statement that account's
    alone (routed to its shard), all in the caller's transaction; an event whose key has no
    account there is an unknown key (not given on a cluster: asked here)."""
    results, events = parsed if parsed is not None else parse(raws, now)
    if accounts is None:  # on a cluster, asked here when the caller did not
        accounts = repository.accounts_on_cluster(session, lookup_pairs(events))
    recorded = [
        (account_id, _record(session, results, part, now, account_id))
        for account_id, part in _parts(events, accounts)
    ]
    quarantined = quarantine_results(results, events)
    assert all(r is not None for r in results)
    outcome = BatchOutcome([r for r in results if r is not None], quarantined)

    if before_settlement is not None:
        before_settlement(outcome)
    for account_id, part in recorded:
        if not part:
            continue
        part.sort(key=lambda item: item[0])
        recording.settle_usage(
            session,
            [_to_settle(event, event_id) for event_id, event in part],
            rollups.rows(part),
            now,
            spend_limited(event for _, event in part),
            account_id=account_id,
        )
    return outcome


def _parts(events: list[Event], accounts: Accounts | None) -> list[tuple[str | None, list[Event]]]:
    """The events recorded together: all of them (one server), or each account's, in byte order
    of account (a cluster: ``accounts``), those whose key names no account being an unknown key
    at once."""
    if accounts is None:
        return [(None, events)]
    parts: dict[str, list[Event]] = {}
    unknown = []
    for event in events:
        account_id = accounts.get(event.api_key_id) if event.api_key_id else None
        if account_id is None:
            unknown.append(event)
        else:
            parts.setdefault(account_id, []).append(event)
    price_events(unknown, {}, PriceBook())
    return sorted(parts.items())


def _record(
    session: Session,
    results: list[Result | None],
    events: list[Event],
    now: datetime,
    account_id: str | None,
) -> list[tuple[int, Event]]:
    """Price and insert ``events`` (``account_id``: all that account's, on a cluster); the
    results of those recorded and of duplicates are set, a conflict is the event's problem.
    The events recorded, with their new ids."""
    priced = price_for(session, events, account_id)
    first = first_of_each(priced)
    ids = repository.record(session, [first[key] for key in sorted(first)], now, account_id)
    stored = repository.stored(session, sorted(key for key in first if key not in ids), account_id)
    return classify(results, priced, first, ids, stored)


def first_of_each(priced: Sequence[Event]) -> dict[EventKey, Event]:
    """The first of the priced events of each key (account, request id): the one inserted."""
    first: dict[EventKey, Event] = {}
    for event in priced:
        first.setdefault((event.account_id or "", event.request_id), event)
    return first


def classify(
    results: list[Result | None],
    priced: Sequence[Event],
    first: Mapping[EventKey, Event],
    ids: Mapping[EventKey, int],
    stored: Mapping[EventKey, tuple[Content, ChargeValues]],
) -> list[tuple[int, Event]]:
    """Pure: the results of the priced events, once their keys' first events were inserted
    (``ids``: the new ids of those that were new) and the stored events of the others read
    (``stored``): recorded, a duplicate (the same content as the event recorded before, in this
    batch or earlier: its charge), or a conflict (``problem`` set: quarantined). The events
    recorded, with their new ids."""
    recorded: list[tuple[int, Event]] = []
    for event in priced:
        key = (event.account_id or "", event.request_id)
        original = first[key]
        event_id = ids.get(key)
        if event_id is not None and original is event:
            recorded.append((event_id, event))
            results[event.index] = Result(
                event.index, event.request_id, RECORDED, event.charge_values()
            )
            continue
        if event_id is not None:  # recorded by this batch, from an earlier event
            content, charge = original.content(), original.charge_values()
        else:
            content, charge = stored[key]
        if event.content() == content:
            results[event.index] = Result(event.index, event.request_id, DUPLICATE, charge)
        else:
            event.problem = _CONFLICT
    return recorded


def quarantine_results(results: list[Result | None], events: Sequence[Event]) -> list[Event]:
    """The events not billable now (``problem`` set), each with its result in ``results``."""
    quarantined = [e for e in events if e.problem is not None]
    for event in quarantined:
        results[event.index] = Result(
            event.index, event.request_id, QUARANTINED, error=event.problem
        )
    return quarantined


def price_for(session: Session, events: list[Event], account_id: str | None = None) -> list[Event]:
    """Key, model and price of every event (one lookup for the batch); sets ``problem`` on those
    not billable now, in the order: key, timestamp, usage, model, price. The billable ones,
    priced, in batch order. ``account_id``: on a cluster, the account whose keys they name."""
    if not events:
        return []
    keys, book = repository.lookup(session, lookup_pairs(events), account_id)
    return price_events(events, keys, book)


def resolve(session: Session, events: list[Event], accounts: Accounts | None = None) -> None:
    """``price_for`` the events, account by account on a cluster (``accounts``)."""
    for account_id, part in _parts(events, accounts):
        price_for(session, part, account_id)


def lookup_pairs(events: Sequence[Event]) -> list[tuple[str, str]]:
    """The (key id, lower-case model) pairs the lookup for ``events`` asks for."""
    return sorted({(e.api_key_id, (e.model or "").lower()) for e in events if e.api_key_id})


def price_events(
    events: Sequence[Event], keys: Mapping[str, repository.KeyInfo], book: PriceBook
) -> list[Event]:
    """Pure: each event's account, model and price from the lookup's answer; ``problem`` set
    on those not billable now, in the order: key, timestamp, usage, model, price. The billable
    ones, priced, in batch order."""
    models, price_of = book.models, book.price
    priced: list[Event] = []
    for event in events:
        key = keys.get(event.api_key_id) if event.api_key_id else None
        if key is None:
            # The account cannot be known: the key outranks every other reason.
            event.problem = _UNKNOWN_KEY
            continue
        event.account_id, event.prepaid = key.account_id, key.prepaid
        event.scopes = key.scopes
        if event.problem is not None:
            continue
        model_id = models.get(event.model.lower()) if event.model else None
        if model_id is None:
            event.problem = _UNKNOWN_MODEL
            continue
        event.model_id = model_id
        usage, at = event.usage, event.occurred_at
        assert usage is not None and at is not None
        if not event.prepaid:
            # Unbilled accounts record usage with a zero charge, whatever the prices.
            event.charge = _zero_charge(usage)
        else:
            price = price_of(key[0], model_id, at)
            if price is None:
                event.problem = _NO_PRICE
                continue
            event.charge = price_usage(usage, price.rates)
            event.price_version_id = price.version_id
        priced.append(event)
    return priced


def _zero_charge(usage: NormalizedUsage) -> Charge:
    return Charge(
        usage.uncached_input_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        usage.reasoning_tokens,
        0,
        0,
        0,
    )


def _to_settle(event: Event, event_id: int) -> ChargeToSettle:
    assert event.charge is not None
    # Positionally (a batch makes one per event; by name costs twice as much): the fields'
    # order is asserted below.
    return ChargeToSettle(
        event.account_id or "",
        event.api_key_id or "",
        event.request_id,
        event_id,
        event.charge.total_microcents,
        event.authorization_id,
        event.prepaid,
    )


assert ChargeToSettle._fields == (
    "account_id",
    "api_key_id",
    "request_id",
    "usage_event_id",
    "charge_microcents",
    "authorization_id",
    "prepaid",
)


def spend_limited(events: Iterable[Event]) -> list[ScopeLimit]:
    """The spend limits whose thresholds recorded ``events``' charges may reach: those set on
    their keys, projects or members, of prepaid accounts (the only ones limits apply to)."""
    return [
        limit
        for e in events
        if e.prepaid and e.scopes.limits
        for limit in e.scopes.of_charge(e.account_id or "", e.api_key_id or "")
    ]
