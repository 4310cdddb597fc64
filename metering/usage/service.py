"""Recording a batch of usage events: keyed, checked, priced at request time, deduplicated,
charged, settled against holds and aggregated, all in the caller's one transaction.

Set-based: a fixed number of statements per batch whatever its size; no round trip per event.
Every multi-row write is sorted by its key so concurrent batches lock rows in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from metering.kit.errors import InvalidRequest
from metering.ledger.settlement import ChargeToSettle, settle_charges
from metering.models import Account, AccountRate, ApiKey, UsageEvent, table
from metering.pricing import Charge, NormalizedUsage, price_usage
from metering.usage.events import Content, Event, Problem, parse_event, reject_reason
from metering.usage.prices import PriceBook
from metering.usage.rollups import RecordedUsage, add_to_rollups
from metering.usage.schemas import MAX_BATCH
from metering.usage.sql import insert_rows

EVENTS = table(UsageEvent)

RECORDED, DUPLICATE, QUARANTINED, REJECTED = "recorded", "duplicate", "quarantined", "rejected"
STATUSES = (RECORDED, DUPLICATE, QUARANTINED, REJECTED)


def charge_body(
    usage: NormalizedUsage,
    input_microcents: int,
    cache_read_microcents: int,
    output_microcents: int,
    price_version_id: str | None,
) -> dict[str, Any]:
    """A result's ``charge`` (§5)."""
    return {
        "uncached_input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "input_microcents": input_microcents,
        "cache_read_microcents": cache_read_microcents,
        "output_microcents": output_microcents,
        "total_microcents": input_microcents + cache_read_microcents + output_microcents,
        "price_version_id": price_version_id,
    }


def stored_usage(row: Any) -> NormalizedUsage:
    return NormalizedUsage(
        row.prompt_tokens, row.cached_tokens, row.output_tokens, row.reasoning_tokens
    )


def stored_charge_body(row: Any) -> dict[str, Any]:
    return charge_body(
        stored_usage(row),
        row.input_microcents,
        row.cache_read_microcents,
        row.output_microcents,
        row.price_version_id,
    )


def stored_content(row: Any) -> Content:
    return Content(
        row.api_key_id, row.model_id, row.api, stored_usage(row), row.occurred_at, row.outcome
    )


@dataclass(slots=True)
class Result:
    index: int
    request_id: str | None
    status: str
    charge: dict[str, Any] | None = None
    error: Problem | None = None

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


@dataclass(slots=True)
class _Priced:
    event: Event
    charge: Charge
    price_version_id: str | None


def check_batch_size(events: Sequence[object]) -> None:
    if not events:
        raise InvalidRequest("events must hold at least one event", param="events")
    if len(events) > MAX_BATCH:
        raise InvalidRequest(
            f"a batch holds at most {MAX_BATCH} events; this one has {len(events)}",
            code="batch_too_large",
            param="events",
        )


def record_events(session: Session, raws: Sequence[object], now: datetime) -> BatchOutcome:
    """Record every billable event of ``raws`` exactly once; the rest are returned classified."""
    results: list[Result | None] = [None] * len(raws)
    events: list[Event] = []
    for index, raw in enumerate(raws):
        reason = reject_reason(raw)
        if reason is not None:
            request_id = raw.get("request_id") if isinstance(raw, Mapping) else None
            results[index] = Result(
                index, request_id if isinstance(request_id, str) else None, REJECTED, error=reason
            )
        else:
            assert isinstance(raw, Mapping)
            events.append(parse_event(index, raw, now))

    priced = _resolve(session, events)
    recorded, duplicates = _insert(session, priced, now)

    for item in recorded.values():
        event = item[0].event
        results[event.index] = Result(
            event.index, event.request_id, RECORDED, charge=_priced_charge_body(item[0])
        )
    for event, charge in duplicates:
        results[event.index] = Result(event.index, event.request_id, DUPLICATE, charge=charge)
    quarantined = [e for e in events if e.problem is not None]
    for event in quarantined:
        results[event.index] = Result(
            event.index, event.request_id, QUARANTINED, error=event.problem
        )

    if recorded:
        ordered = sorted(recorded.values(), key=lambda item: item[1])
        settle_charges(
            session,
            [
                ChargeToSettle(
                    account_id=p.event.account_id or "",
                    api_key_id=p.event.api_key_id or "",
                    request_id=p.event.request_id,
                    usage_event_id=event_id,
                    charge_microcents=p.charge.total_microcents,
                    authorization_id=p.event.authorization_id,
                    billed=p.event.billed,
                )
                for p, event_id in ordered
            ],
            now,
        )
        add_to_rollups(session, (_recorded_usage(p, event_id) for p, event_id in ordered))
    assert all(r is not None for r in results)
    return BatchOutcome([r for r in results if r is not None], quarantined)


def _resolve(session: Session, events: list[Event]) -> list[_Priced]:
    """Key, model and price of every event (two queries for the batch; a third when an account
    has rate overrides); sets ``problem`` on those not billable now, in the order: key,
    timestamp, usage, model, price."""
    keys: dict[str, tuple[str, str, bool]] = {}
    key_ids = sorted({e.api_key_id for e in events if e.api_key_id})
    if key_ids:
        has_rates = (
            select(AccountRate.id).where(AccountRate.account_id == Account.id).limit(1).exists()
        )
        for row in session.connection().execute(
            select(ApiKey.id, ApiKey.account_id, Account.billing, has_rates.label("has_rates"))
            .join(Account, Account.id == ApiKey.account_id)
            .where(ApiKey.id.in_(key_ids))
        ):
            keys[row.id] = (row.account_id, row.billing, bool(row.has_rates))
    book = PriceBook.load(
        session,
        {e.model.lower() for e in events if e.model},
        {account for account, billing, rates in keys.values() if rates and billing == "prepaid"},
    )

    candidates: list[Event] = []
    for event in events:
        key = keys.get(event.api_key_id) if event.api_key_id else None
        if key is None:
            # The account cannot be known: the key outranks every other reason.
            event.problem = Problem(
                "unknown_api_key", "api_key_id does not name an API key", "api_key_id"
            )
            continue
        event.account_id = key[0]
        event.billed = key[1] == "prepaid"
        if event.problem is not None:
            continue
        model_id = book.models.get(event.model.lower()) if event.model else None
        if model_id is None:
            event.problem = Problem("model_not_found", "model is not in the catalog", "model")
            continue
        event.model_id = model_id
        candidates.append(event)

    priced: list[_Priced] = []
    for event in candidates:
        assert event.usage is not None and event.occurred_at is not None
        if not event.billed:
            # Unbilled accounts record usage with a zero charge, whatever the prices.
            zero = Charge(
                event.usage.uncached_input_tokens,
                event.usage.cached_tokens,
                event.usage.output_tokens,
                event.usage.reasoning_tokens,
                0,
                0,
                0,
            )
            priced.append(_Priced(event, zero, None))
            continue
        assert event.account_id and event.model_id
        price = book.price(event.account_id, event.model_id, event.occurred_at)
        if price is None:
            event.problem = Problem(
                "price_not_found",
                "no price of this model was in force at occurred_at",
                "occurred_at",
            )
            continue
        priced.append(_Priced(event, price_usage(event.usage, price.rates), price.version_id))
    return priced


def _priced_charge_body(p: _Priced) -> dict[str, Any]:
    assert p.event.usage is not None
    return charge_body(
        p.event.usage,
        p.charge.input_microcents,
        p.charge.cache_read_microcents,
        p.charge.output_microcents,
        p.price_version_id,
    )


_Key = tuple[str, str]  # (account_id, request_id): the dedup key


def _insert(
    session: Session, priced: list[_Priced], now: datetime
) -> tuple[dict[_Key, tuple[_Priced, int]], list[tuple[Event, dict[str, Any]]]]:
    """Insert the first of each key (``ON CONFLICT DO NOTHING``, so a concurrent batch's row
    wins cleanly), then classify every event against the row that stands for its key.

    Returns the recorded events (by key, with their new ids) and the duplicates with the
    original charge; conflicts get their ``problem``."""
    first: dict[_Key, _Priced] = {}
    for p in priced:
        first.setdefault((p.event.account_id or "", p.event.request_id), p)
    recorded: dict[_Key, tuple[_Priced, int]] = {}
    if first:
        inserted = insert_rows(
            session,
            EVENTS,
            _EVENT_COLUMNS,
            [_event_row(first[key], now) for key in sorted(first)],
            conflict=("account_id", "request_id"),
            returning=("id", "account_id", "request_id"),
        )
        for row in inserted:
            key = (row.account_id, row.request_id)
            recorded[key] = (first[key], row.id)
    existing: dict[_Key, Any] = {}
    missing = sorted(key for key in first if key not in recorded)
    if missing:
        for row in session.connection().execute(
            select(EVENTS).where(tuple_(EVENTS.c.account_id, EVENTS.c.request_id).in_(missing))
        ):
            existing[(row.account_id, row.request_id)] = row

    duplicates: list[tuple[Event, dict[str, Any]]] = []
    for p in priced:
        event = p.event
        key = (event.account_id or "", event.request_id)
        mine = recorded.get(key)
        if mine is not None and mine[0] is p:
            continue
        if mine is not None:
            original_content = mine[0].event.content()
            original_charge = _priced_charge_body(mine[0])
        else:
            row = existing[key]
            original_content = stored_content(row)
            original_charge = stored_charge_body(row)
        if event.content() == original_content:
            duplicates.append((event, original_charge))
        else:
            event.problem = Problem(
                "idempotency_conflict",
                "this request_id was recorded with different content; the original stands",
                "request_id",
            )
    return recorded, duplicates


_EVENT_COLUMNS = (
    "account_id",
    "request_id",
    "api_key_id",
    "model_id",
    "api",
    "outcome",
    "occurred_at",
    "recorded_at",
    "authorization_id",
    "prompt_tokens",
    "cached_tokens",
    "output_tokens",
    "reasoning_tokens",
    "input_microcents",
    "cache_read_microcents",
    "output_microcents",
    "total_microcents",
    "price_version_id",
)


def _event_row(p: _Priced, now: datetime) -> tuple[Any, ...]:
    event, charge, usage = p.event, p.charge, p.event.usage
    assert usage is not None
    return (
        event.account_id,
        event.request_id,
        event.api_key_id,
        event.model_id,
        event.api,
        event.outcome,
        event.occurred_at,
        now,
        event.authorization_id,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        usage.reasoning_tokens,
        charge.input_microcents,
        charge.cache_read_microcents,
        charge.output_microcents,
        charge.total_microcents,
        p.price_version_id,
    )


def _recorded_usage(p: _Priced, event_id: int) -> RecordedUsage:
    event = p.event
    assert event.usage is not None and event.occurred_at is not None
    return RecordedUsage(
        event_id=event_id,
        account_id=event.account_id or "",
        api_key_id=event.api_key_id or "",
        model_id=event.model_id or "",
        occurred_at=event.occurred_at,
        prompt_tokens=event.usage.prompt_tokens,
        cached_tokens=event.usage.cached_tokens,
        output_tokens=event.usage.output_tokens,
        reasoning_tokens=event.usage.reasoning_tokens,
        cost_microcents=p.charge.total_microcents,
    )
