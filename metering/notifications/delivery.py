"""The delivery loop, run by the scheduler every second (docs/api.md#messages-and-delivery).

One pass:

1. **fan-out**: events not yet dispatched get one delivery per matching endpoint (enabled, not
   deleted, subscribed to the type; an endpoint with an account only that account's events);
2. **claim**: due deliveries are taken in a short transaction (``FOR UPDATE SKIP LOCKED`` on
   PostgreSQL, so replicas take disjoint ones), their attempt counted and their next attempt put
   a lease ahead (so a sender that dies mid-send is retried after the lease: at least once);
3. **send**: each is POSTed, signed (Standard Webhooks), with the timeout, no redirects, the
   address checked when connecting, at most ``READ_LIMIT`` bytes of the answer read;
4. **record**: delivered on a 2xx, otherwise retried on the schedule (±20% jitter) or, after the
   last, failed. A result is recorded only by the claim that made the attempt.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from metering import citus
from metering.db import Database, Kind, is_postgresql
from metering.kit.clock import Clock
from metering.metrics import REGISTRY
from metering.models import WebhookDelivery, WebhookEndpoint, WebhookEvent, table
from metering.notifications import messages, outbox
from metering.notifications.addresses import Resolver, system_resolver
from metering.notifications.secrets import SecretUnreadable
from metering.notifications.service import signing_secrets
from metering.settings import Settings
from metering.states import deliveries as delivery_states
from metering.states.deliveries import DeliveryStatus

log = logging.getLogger("metering.webhooks")

DELIVERIES = table(WebhookDelivery)
EVENTS = table(WebhookEvent)
ENDPOINTS = table(WebhookEndpoint)

# Retried after about these delays, then failed (10 attempts in all).
RETRY_SCHEDULE = (
    timedelta(seconds=5),
    timedelta(seconds=30),
    timedelta(minutes=2),
    timedelta(minutes=10),
    timedelta(hours=1),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(hours=24),
)
MAX_ATTEMPTS = len(RETRY_SCHEDULE) + 1
JITTER = 0.2
READ_LIMIT = 4096  # bytes of an answer read at most
BATCH = 50
SENDERS = 8  # attempts in flight at once per process

DELIVERIES_TOTAL = REGISTRY.counter(
    "metering_webhook_deliveries_total",
    "Webhook delivery attempts, by result (delivered, retry, failed).",
    ("result",),
)
# Each step's result on that counter: the status it leads to, but "retry" (still pending).
_RESULTS = {
    "deliver": DeliveryStatus.DELIVERED.value,
    "retry": "retry",
    "fail": DeliveryStatus.FAILED.value,
}


def retry_delay(attempts: int, rng: Callable[[], float] = random.random) -> timedelta:
    """The wait after the ``attempts``-th failed attempt, with ±20% jitter."""
    base = RETRY_SCHEDULE[attempts - 1]
    return base * (1 - JITTER + 2 * JITTER * rng())


@dataclass(frozen=True, slots=True)
class Claimed:
    delivery_id: int
    account_id: str  # as stored (metering.notifications.outbox.stored_account)
    attempt: int
    url: str
    public_id: str
    payload: bytes
    signing: list[str]


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int | None
    error: str | None

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class PassReport:
    dispatched: int = 0
    attempted: int = 0
    delivered: int = 0


class Deliverer:
    def __init__(
        self,
        database: Database,
        settings: Settings,
        clock: Clock,
        *,
        resolver: Resolver | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.database = database
        self.settings = settings
        self.clock = clock
        self.rng = rng
        self.keys = settings.secret_key
        # Longer than any attempt can take, so a live attempt is never claimed twice.
        self.lease = timedelta(seconds=3 * settings.webhook_timeout_seconds + 5)
        # Imported here: the HTTP client's modules (httpx2, httpcore2 and what they load, several
        # MB) are needed only where deliveries are sent, not in every server worker, which
        # imports this module for its /metrics.
        from metering.notifications.transport import make_client

        self.client = make_client(settings, resolver or system_resolver, BATCH)
        self.pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="webhook")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()

    def run_once(self) -> PassReport:
        report = PassReport()
        report.dispatched = self.fan_out()
        while True:
            claimed = self.claim()
            if not claimed:
                return report
            # Sent side by side (one slow receiver holds one thread, not the batch).
            outcomes = list(self.pool.map(self.send, claimed))
            self.record_all(list(zip(claimed, outcomes, strict=True)))
            report.attempted += len(claimed)
            report.delivered += sum(o.delivered for o in outcomes)
            if len(claimed) < BATCH:
                return report

    # -- 1. fan-out ------------------------------------------------------------------------------

    def fan_out(self) -> int:
        """The deliveries of undispatched events: on a Citus cluster account by account, each
        account's in a transaction on its shard (metering.citus.per_account)."""
        now = self.clock.now()
        undispatched = ~EVENTS.c.dispatched  # the partial index's predicate
        accounts = citus.per_account(
            self.database, lambda session: citus.accounts_with(session, EVENTS, undispatched)
        )
        return sum(self.fan_out_of(now, account) for account in accounts)

    def fan_out_of(self, now: datetime, account: str | None) -> int:
        with self.database.unit_of_work() as session:
            query = (
                select(EVENTS.c.id, EVENTS.c.account_id, EVENTS.c.type)
                .where(~EVENTS.c.dispatched)
                .order_by(EVENTS.c.created_at, EVENTS.c.id)
                .limit(500)
            )
            if account is not None:
                query = query.where(EVENTS.c.account_id == account)
            if is_postgresql(session):
                query = query.with_for_update(skip_locked=True)
            events = session.execute(query).all()
            if not events:
                return 0
            endpoints = session.execute(
                select(ENDPOINTS.c.id, ENDPOINTS.c.account_id, ENDPOINTS.c.event_types).where(
                    ENDPOINTS.c.deleted_at.is_(None), ENDPOINTS.c.enabled.is_(True)
                )
            ).all()
            subscribed = [(e.id, e.account_id, set(json.loads(e.event_types))) for e in endpoints]
            rows = [
                {
                    "event_id": event.id,
                    "endpoint_id": endpoint_id,
                    "account_id": event.account_id,
                    "status": DeliveryStatus.PENDING.value,
                    "attempts": 0,
                    "next_attempt_at": now,
                    "created_at": now,
                }
                for event in events
                for endpoint_id, account_id, types in subscribed
                if event.type in types
                and account_id in (None, outbox.shown_account(event.account_id))
            ]
            if rows:
                session.execute(DELIVERIES.insert(), rows)
            dispatched = update(EVENTS).where(EVENTS.c.id.in_([e.id for e in events]))
            if account is not None:
                dispatched = dispatched.where(EVENTS.c.account_id == account)
            session.execute(dispatched.values(dispatched=True))
            session.commit()
            return len(events)

    # -- 2. claim --------------------------------------------------------------------------------

    def claim(self) -> list[Claimed]:
        """Up to ``BATCH`` due deliveries: on a Citus cluster taken account by account (a row
        lock is taken in a statement of one shard only), each account's in a transaction on its
        shard."""
        now = self.clock.now()
        due = (
            delivery_states.pending(DELIVERIES),
            DELIVERIES.c.next_attempt_at <= now,
        )
        accounts = citus.per_account(
            self.database, lambda session: citus.accounts_with(session, DELIVERIES, *due)
        )
        claimed: list[Claimed] = []
        for account in accounts:
            claimed += self.claim_of(now, due, account, BATCH - len(claimed))
            if len(claimed) >= BATCH:
                break
        return claimed

    def claim_of(
        self, now: datetime, due: Sequence[Any], account: str | None, limit: int
    ) -> list[Claimed]:
        with self.database.unit_of_work() as session:
            query = (
                select(DELIVERIES.c.id)
                .join(ENDPOINTS, ENDPOINTS.c.id == DELIVERIES.c.endpoint_id)
                .where(
                    *due,
                    # A disabled endpoint's messages wait until it is enabled again.
                    ENDPOINTS.c.enabled,
                    ENDPOINTS.c.deleted_at.is_(None),
                )
                .order_by(DELIVERIES.c.next_attempt_at, DELIVERIES.c.id)
                .limit(limit)
            )
            mine = DELIVERIES.c.account_id == account
            if account is not None:
                query = query.where(mine)
            if is_postgresql(session):
                query = query.with_for_update(of=DELIVERIES, skip_locked=True)
            ids = list(session.execute(query).scalars())
            if not ids:
                return []
            taken = (
                DELIVERIES.c.id.in_(ids)
                if account is None
                else and_(mine, DELIVERIES.c.id.in_(ids))
            )
            session.execute(
                update(DELIVERIES)
                .where(taken)
                .values(
                    attempts=DELIVERIES.c.attempts + 1,
                    last_attempt_at=now,
                    next_attempt_at=now + self.lease,
                )
            )
            rows = session.execute(
                select(
                    DELIVERIES.c.id,
                    DELIVERIES.c.account_id,
                    DELIVERIES.c.attempts,
                    EVENTS.c.public_id,
                    EVENTS.c.type,
                    EVENTS.c.data,
                    EVENTS.c.created_at,
                    ENDPOINTS.c.id.label("endpoint_id"),
                    ENDPOINTS.c.url,
                    ENDPOINTS.c.secret_sealed,
                    ENDPOINTS.c.previous_secret_sealed,
                    ENDPOINTS.c.previous_until,
                )
                .join(
                    EVENTS,
                    # The account first: on Citus, a join of colocated shards.
                    and_(
                        EVENTS.c.account_id == DELIVERIES.c.account_id,
                        EVENTS.c.id == DELIVERIES.c.event_id,
                    ),
                )
                .join(ENDPOINTS, ENDPOINTS.c.id == DELIVERIES.c.endpoint_id)
                .where(taken)
                .order_by(DELIVERIES.c.id)
            ).all()
            session.commit()
        claimed = []
        for row in rows:
            endpoint = _EndpointRow(
                row.endpoint_id, row.secret_sealed, row.previous_secret_sealed, row.previous_until
            )
            try:
                signing = signing_secrets(self.keys, endpoint, now)
            except SecretUnreadable as exc:
                # Not sent (it cannot be signed); retried on the schedule, so a key put back
                # into METERING_SECRET_KEY lets it go.
                log.error("%s", exc)
                signing = []
            account_shown = outbox.shown_account(row.account_id)
            claimed.append(
                Claimed(
                    row.id,
                    row.account_id,
                    row.attempts,
                    row.url,
                    row.public_id,
                    messages.body(row.public_id, row.type, account_shown, row.data, row.created_at),
                    signing,
                )
            )
        return claimed

    # -- 3. send ---------------------------------------------------------------------------------

    def send(self, item: Claimed) -> Outcome:
        import httpx2  # loaded with the client (see __init__)

        if not item.signing:
            return Outcome(None, "not sent: no METERING_SECRET_KEY opens the endpoint's secret")
        now = self.clock.now()
        headers = messages.headers(item.public_id, item.payload, item.signing, now)
        started = time.monotonic()
        try:
            with self.client.stream("POST", item.url, content=item.payload, headers=headers) as r:
                read = 0
                for chunk in r.iter_raw():
                    read += len(chunk)
                    if read >= READ_LIMIT:
                        break
                    if time.monotonic() - started > self.settings.webhook_timeout_seconds:
                        break
                return Outcome(r.status_code, None)
        except httpx2.TimeoutException as exc:
            return Outcome(None, f"timeout: {type(exc).__name__}")
        except httpx2.HTTPError as exc:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:500])
        except Exception as exc:  # an odd URL or answer fails this attempt, not the batch
            log.exception("webhook %s: unexpected error", item.public_id)
            return Outcome(None, f"{type(exc).__name__}"[:500])

    # -- 4. record -------------------------------------------------------------------------------

    def record_all(self, results: Sequence[tuple[Claimed, Outcome]]) -> None:
        """The outcomes of one batch, in one transaction; each only if the row still carries
        the attempt that was made (a later claim's result is never overwritten)."""
        now = self.clock.now()
        rows = []
        for item, outcome in results:
            row: dict[str, Any] = {
                "b_account": item.account_id,
                "b_id": item.delivery_id,
                "b_attempt": item.attempt,
                "last_status": outcome.status,
                "last_error": outcome.error,
                "delivered_at": None,
                "next_attempt_at": None,
            }
            if outcome.delivered:
                step = "deliver"
                row["delivered_at"] = now
            elif item.attempt >= MAX_ATTEMPTS:
                step = "fail"
            else:
                step = "retry"
                row["next_attempt_at"] = now + retry_delay(item.attempt, self.rng)
            row["status"] = delivery_states.target(step)
            if outcome.error is None and not outcome.delivered:
                row["last_error"] = f"HTTP {outcome.status}"
            rows.append(row)
            DELIVERIES_TOTAL.inc(_RESULTS[step])
            if not outcome.delivered:
                log.info(
                    "webhook %s attempt %d (delivery %d): %s",
                    item.public_id,
                    item.attempt,
                    item.delivery_id,
                    row["last_error"],
                )
        # On a Citus cluster each account's in a transaction on its shard (one commit per
        # worker touched would otherwise be two-phase); elsewhere the batch's in one.
        parts = [rows]
        if self.database.kind is Kind.CITUS:
            accounts: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                accounts.setdefault(row["b_account"], []).append(row)
            parts = [accounts[account] for account in sorted(accounts)]
        for part in parts:
            with self.database.unit_of_work() as session:
                session.execute(_RECORD, part)
                session.commit()


_RECORD = (
    update(DELIVERIES)
    .where(
        DELIVERIES.c.account_id == bindparam("b_account"),
        DELIVERIES.c.id == bindparam("b_id"),
        DELIVERIES.c.attempts == bindparam("b_attempt"),  # still our claim
        delivery_states.pending(DELIVERIES),
    )
    .values(
        status=bindparam("status"),
        last_status=bindparam("last_status"),
        last_error=bindparam("last_error"),
        delivered_at=bindparam("delivered_at", type_=DELIVERIES.c.delivered_at.type),
        next_attempt_at=bindparam("next_attempt_at", type_=DELIVERIES.c.next_attempt_at.type),
    )
)


@dataclass(frozen=True, slots=True)
class _EndpointRow:
    id: str
    secret_sealed: str
    previous_secret_sealed: str | None
    previous_until: datetime | None


@REGISTRY.database_collector
def _webhook_gauges(session: Session, now: datetime) -> Iterable[Metric]:
    """From the database, so every process (API workers, schedulers) shows the same."""
    by_status: dict[str, int] = dict(
        session.execute(
            select(DELIVERIES.c.status, func.count()).group_by(DELIVERIES.c.status)
        ).all()
    )
    oldest = session.execute(
        select(func.min(DELIVERIES.c.created_at)).where(delivery_states.pending(DELIVERIES))
    ).scalar()
    age = 0.0 if oldest is None else max(0.0, (now - oldest).total_seconds())
    deliveries = GaugeMetricFamily(
        "metering_webhook_deliveries",
        "Webhook messages by state (pending, delivered, failed, dropped).",
        labels=["status"],
    )
    for status in DeliveryStatus:
        deliveries.add_metric([status.value], by_status.get(status.value, 0))
    yield deliveries
    yield GaugeMetricFamily(
        "metering_webhook_oldest_undelivered_seconds",
        "Age of the oldest undelivered webhook message (0 when none).",
        round(age, 3),
    )
