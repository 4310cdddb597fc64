"""Usage ingest for the gateway; quarantine and single-event lookup for operators."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from starlette.datastructures import State

from metering.accounts.deps import AccountKeyDep
from metering.audit.deps import AuditDep
from metering.db import Database, Kind, retry_transient
from metering.kit.pagination import PageParams
from metering.metrics import REGISTRY
from metering.usage import isolation, quarantine, service, sharded, single, support, together
from metering.usage.events import CHARGE_FIELDS
from metering.usage.schemas import EventBatch, QuarantineCode, ReprocessRequest
from metering.web.deps import AdminDep, GatewayDep, NowDep, SessionDep
from metering.web.fastlane import fast_lane
from metering.web.jsonio import MeteringRoute, json_answer

EVENTS_TOTAL = REGISTRY.counter(
    "metering_usage_events_total",
    "Usage events received by POST /v1/usage/events, by result.",
    ("status",),
)
REPROCESSED_TOTAL = REGISTRY.counter(
    "metering_quarantine_reprocessed_total",
    "Quarantined events retried, by result.",
    ("status",),
)

router = APIRouter(
    prefix="/v1", route_class=MeteringRoute, dependencies=[GatewayDep], tags=["usage ingest"]
)
admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: usage"]
)
# An account key's own requests.
requests_router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["requests"])


# A recorded or duplicate result, written by a template: the hot path's answer is one of these
# per event. request_id matched its pattern (letters, digits, . _ : -), so needs no escaping.
_CHARGED = (
    '{"index":%d,"request_id":"%s","status":"%s","charge":{'
    + ",".join(f'"{name}":%d' for name in CHARGE_FIELDS if name != "price_version_id")
    + ',"price_version_id":%s},"error":null}'
)
# A charge's values in ``CHARGE_FIELDS`` order: the counted ones, then the price version.
assert CHARGE_FIELDS[-1] == "price_version_id"


def _dumps(value: Any) -> str:
    """The ingest answer holds only integers (microcents, token counts), strings and nulls, so
    the C encoder writes it exactly (the exact encoder is written for decimal money)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def render_answer(outcome: service.BatchOutcome, counts: dict[str, int]) -> bytes:
    """``{"object": "list", "data": [result, ...], "recorded": n, ...}``."""
    quoted: dict[str | None, str] = {None: "null"}
    parts = []
    for result in outcome.results:
        charge = result.charge_values
        if charge is None or result.error is not None:
            parts.append(_dumps(result.body()))
            continue
        *counted, version = charge
        if version not in quoted:
            quoted[version] = _dumps(version)
        parts.append(
            _CHARGED % (result.index, result.request_id, result.status, *counted, quoted[version])
        )
    data = ",".join(parts)
    return (
        f'{{"object":"list","data":[{data}],"recorded":{counts[service.RECORDED]},'
        f'"duplicates":{counts[service.DUPLICATE]},"quarantined":{counts[service.QUARANTINED]},'
        f'"rejected":{counts[service.REJECTED]}}}'
    ).encode()


async def _ingest(state: State, body: EventBatch, _params: Mapping[str, str]) -> bytes:
    service.check_batch_size(body.events)
    database: Database = state.database
    now = state.clock.now()
    if len(body.events) == 1 and database.kind is Kind.POSTGRESQL:
        outcome = await together.record(body.events[0], now, _paths(state))
    elif len(body.events) == 1 and database.kind is Kind.CITUS:
        # One account's call, delegated to its worker (metering.citus): gathered, the events
        # of several accounts would be as many units of work through the coordinator.
        outcome = await _record_alone(database, body.events[0], now)
    elif database.kind is Kind.CITUS:
        # Each account's part by a call on the node that holds it (metering.usage.sharded).
        outcome = await sharded.record_batch_on_nodes(database, body.events, now)
    else:
        # SQLite: in a writer thread, which waits for the writer's turn apart from the pool.
        outcome = await database.in_writer_thread(
            _record_batch, database, body.events, now, database.kind is Kind.CITUS
        )
    counts = outcome.counts()
    for status, count in counts.items():
        if count:
            EVENTS_TOTAL.inc(status, amount=count)
    return render_answer(outcome, counts)


def _paths(state: State) -> together.Paths:
    """The ways of recording a single event on the app's database (metering.usage.together)."""
    paths: together.Paths | None = getattr(state, "single_event_paths", None)
    if paths is None:
        database: Database = state.database

        async def batch(raws: Sequence[object], now: datetime) -> service.BatchOutcome:
            return await database.in_writer_thread(_record_batch, database, list(raws), now, False)

        wait_seconds = state.settings.usage_gather_wait_ms / 1000
        paths = state.single_event_paths = together.Paths(
            partial(_record_alone, database),
            partial(single.record_gathered, database),
            batch,
            together.gathering(wait_seconds),
        )
    return paths


async def _record_alone(database: Database, raw: object, now: datetime) -> service.BatchOutcome:
    """One event: the lean path (metering.usage.single), else the batch path."""
    cluster = database.kind is Kind.CITUS  # a Citus coordinator (metering.citus)
    outcome = await single.record_one(database, raw, now, cluster)
    if outcome is None:
        outcome = await database.in_writer_thread(_record_batch, database, [raw], now, cluster)
    return outcome


def _record_batch(
    database: Database, events: list[Any], now: datetime, cluster: bool
) -> service.BatchOutcome:
    # The one commit point of the batch's unit of work, before the answer is built. The events
    # are parsed before it begins (SQLite: before this process takes the writer's turn).
    parsed = service.parse(events, now)
    if cluster:  # one unit of work per account (docs/citus.md)
        return sharded.record_batch(database, events, now, parsed)
    # A transient refusal (a deadlock, a serialization failure) tries the whole batch again,
    # never in parts (metering.db.retry_transient), from events parsed anew (recording fills
    # in the parsed results and events).
    first = [parsed]

    def once() -> service.BatchOutcome:
        fresh = first.pop() if first else service.parse(events, now)
        return _record_once(database, events, now, fresh)

    return retry_transient(once, "usage batch")


def _record_once(
    database: Database, events: list[Any], now: datetime, parsed: service.Parsed
) -> service.BatchOutcome:
    try:
        with database.unit_of_work() as session:
            outcome = service.record_events(
                session,
                events,
                now,
                # Kept before the settlement, which locks the account rows until the commit.
                before_settlement=lambda done: quarantine.keep(session, done.quarantined, now),
                parsed=parsed,
            )
            session.commit()
            return outcome
    except isolation.DATABASE_ERRORS as error:
        if not isolation.refused(error):
            raise  # transient (tried again whole) or the database out of reach (503)
        # One account's trouble (an event beyond the range, or worse) must not refuse the
        # others' events: the batch again, in parts.
        return isolation.record_apart(database, events, now, error)


@router.post("/usage/events")
@fast_lane(_ingest)
async def ingest_events(body: EventBatch, request: Request) -> Response:
    """Record 1–1000 usage events; each is recorded, a duplicate, quarantined or rejected."""
    return json_answer(await _ingest(request.app.state, body, request.path_params))


@requests_router.get("/requests/{request_id}")
def get_request(request_id: str, key: AccountKeyDep, session: SessionDep) -> dict[str, Any]:
    """What one of your account's requests cost, component by component: the rates in force,
    each component's exact and charged amount, the total, and the hold it settled."""
    return support.request_body(session, key.account_id, request_id)


@admin_router.get("/usage/events/{request_id}")
def get_usage_event(
    request_id: str, account_id: Annotated[str, Query()], session: SessionDep
) -> dict[str, Any]:
    """One recorded usage event of an account, with its charge and the price version used."""
    return support.event_body(session, account_id, request_id)


@admin_router.get("/quarantine")
def list_quarantine(
    session: SessionDep,
    paging: PageParams,
    code: QuarantineCode | None = None,
    account_id: str | None = None,
) -> dict[str, Any]:
    """Quarantined events, newest first, optionally of one code or account."""
    limit, after = paging
    return quarantine.list_entries(session, code, account_id, limit, after)


@admin_router.post("/quarantine/reprocess")
def reprocess_quarantine(
    session: SessionDep,
    now: NowDep,
    audit: AuditDep,
    body: Annotated[ReprocessRequest, Body(default_factory=ReprocessRequest)],
) -> dict[str, Any]:
    """Retry quarantined events (the ids given, or all): billable ones are recorded once."""
    ids = body.ids
    result = quarantine.reprocess(session, ids, now)
    if result["data"]:  # retrying nothing changes nothing
        changes = {
            "ids": [item["id"] for item in result["data"]],
            "recorded": result["recorded"],
            "duplicates": result["duplicates"],
            "quarantined": result["quarantined"],
        }
        audit.record(
            session, now, "quarantine.reprocess", "quarantine", "quarantine", None, changes
        )
    for status in (service.RECORDED, service.DUPLICATE, service.QUARANTINED):
        count = sum(1 for item in result["data"] if item["status"] == status)
        if count:
            REPROCESSED_TOTAL.inc(status, amount=count)
    return result
