"""Auto-recharge: the saved card charged off-session when the balance falls below a threshold.

Its settings are the account's ``auto_recharges`` row; while it is enabled the threshold is also
on the account (``recharge_threshold_microcents``), beside the balance, so that the debit taking
the balance below it marks the account's ``recharge_due_at`` in the balance's own update
(metering.ledger.spending.recharge_due): never a call to Stripe on the gateway's path.

The scheduler's loop (``Recharger.run_once``, every few seconds) claims each due account under
its row lock and decides from the database alone, so replicas never charge the same recharge
twice: the balance back at the threshold clears the mark; a recharge still in flight (a pending
``auto_recharge`` payment: at most one per account, a unique index says so), a failed one less
than an hour old, or this UTC month's succeeded recharges plus the amount passing the monthly
limit (``auto_recharge.limit_reached``, once a month) leave it due; otherwise the pending payment
is written and committed before Stripe is asked (its id the idempotency key), then charged
off-session (metering.payments.flows.Payments.pay). After three failed recharges in a row
auto-recharge is disabled (``auto_recharge.disabled``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from metering.audit.service import Auditor
from metering.db import Database
from metering.kit.clock import Clock
from metering.kit.errors import InvalidRequest, NotFound
from metering.ledger import service as ledger
from metering.models import Account, AutoRecharge, table
from metering.notifications import outbox
from metering.payments.flows import (
    MICROCENTS_PER_CENT,
    PAYMENTS,
    PROFILES,
    Payments,
    checked_amount,
    create_payment,
)
from metering.settings import Settings
from metering.states.payments import PaymentKind, PaymentStatus

log = logging.getLogger("metering.payments")

ACCOUNTS = table(Account)
RECHARGES = table(AutoRecharge)
BACK_OFF = timedelta(hours=1)  # no recharge within an hour of a failed one
FAILURES_IN_A_ROW = 3  # then auto-recharge is disabled
RESUME_AFTER = timedelta(minutes=5)  # a claim Stripe never heard of, taken over after this
MAX_CENTS = 10**12  # thresholds and limits: far beyond any account, far within BIGINT µ¢


@dataclass(frozen=True, slots=True)
class RechargeSettings:
    enabled: bool
    threshold_cents: int
    amount_cents: int
    monthly_limit_cents: int


def _cents(value: Any, param: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{param} must be a whole number of cents", param=param)
    if not low <= value <= MAX_CENTS:
        raise InvalidRequest(
            f"{param} must be between {low} and {MAX_CENTS} cents",
            param=param,
            code="invalid_parameter",
        )
    return value


def checked_settings(body: Any, settings: Settings) -> RechargeSettings:
    """The settings a ``PUT`` or the portal's form gives (all four fields), checked."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param=None)
    known = {"enabled", "threshold_cents", "amount_cents", "monthly_limit_cents"}
    for name in body:
        if name not in known:
            raise InvalidRequest(f"unknown field {name}", param=str(name))
    for name in sorted(known):
        if name not in body:
            raise InvalidRequest(f"{name} is required", param=name, code="missing_parameter")
    enabled = body["enabled"]
    if not isinstance(enabled, bool):
        raise InvalidRequest("enabled must be true or false", param="enabled")
    threshold = _cents(body["threshold_cents"], "threshold_cents", 0)
    amount = checked_amount(body["amount_cents"], settings)
    limit = _cents(body["monthly_limit_cents"], "monthly_limit_cents", 0)
    if limit < amount:
        raise InvalidRequest(
            "monthly_limit_cents must be at least amount_cents",
            param="monthly_limit_cents",
            code="invalid_parameter",
        )
    return RechargeSettings(enabled, threshold, amount, limit)


def settings_body(session: Session, account_id: str) -> dict[str, Any]:
    """``GET /admin/v1/accounts/{id}/auto-recharge`` (never set: disabled, amounts null)."""
    if session.execute(select(ACCOUNTS.c.id).where(ACCOUNTS.c.id == account_id)).first() is None:
        raise NotFound(f"no account {account_id}", param="account_id")
    row = session.execute(select(RECHARGES).where(RECHARGES.c.account_id == account_id)).first()
    body: dict[str, Any] = {"object": "auto_recharge", "account_id": account_id}
    if row is None:
        return body | {
            "enabled": False,
            "threshold_cents": None,
            "amount_cents": None,
            "monthly_limit_cents": None,
        }
    return body | {
        "enabled": bool(row.enabled),
        "threshold_cents": int(row.threshold_cents),
        "amount_cents": int(row.amount_cents),
        "monthly_limit_cents": int(row.monthly_limit_cents),
    }


def _has_card(session: Session, account_id: str) -> bool:
    return (
        session.execute(
            select(PROFILES.c.card_payment_method_id).where(PROFILES.c.account_id == account_id)
        ).scalar()
        is not None
    )


def _arm(session: Session, account_id: str, threshold_cents: int | None, now: datetime) -> None:
    """The account's threshold (None: off), and the due mark as the balance now says."""
    threshold = None if threshold_cents is None else threshold_cents * MICROCENTS_PER_CENT
    balance = ACCOUNTS.c.balance_microcents
    due = (
        None
        if threshold is None
        else select(func.coalesce(ACCOUNTS.c.recharge_due_at, now))
        .where(ACCOUNTS.c.id == account_id, balance < threshold)
        .scalar_subquery()
    )
    session.execute(
        update(ACCOUNTS)
        .where(ACCOUNTS.c.id == account_id)
        .values(recharge_threshold_microcents=threshold, recharge_due_at=due)
    )


def put_settings(
    session: Session, account_id: str, wanted: RechargeSettings, now: datetime, auditor: Auditor
) -> dict[str, Any]:
    """The account's settings replaced (enabling needs a saved card: 400
    ``payment_method_required``), in the session's transaction."""
    ledger.lock_account(session, account_id)
    if wanted.enabled and not _has_card(session, account_id):
        raise InvalidRequest(
            "auto-recharge charges the saved card: the account has none",
            code="payment_method_required",
            param="enabled",
        )
    values = {
        "enabled": wanted.enabled,
        "threshold_cents": wanted.threshold_cents,
        "amount_cents": wanted.amount_cents,
        "monthly_limit_cents": wanted.monthly_limit_cents,
        "updated_at": now,
    }
    exists = session.execute(
        select(RECHARGES.c.account_id).where(RECHARGES.c.account_id == account_id)
    ).first()
    if exists is not None:
        session.execute(
            update(RECHARGES).where(RECHARGES.c.account_id == account_id).values(**values)
        )
    else:
        session.execute(insert(RECHARGES).values(account_id=account_id, **values))
    _arm(session, account_id, wanted.threshold_cents if wanted.enabled else None, now)
    auditor.record(
        session,
        now,
        "auto_recharge.update",
        "account",
        account_id,
        account_id,
        {k: v for k, v in values.items() if k != "updated_at"},
    )
    return settings_body(session, account_id)


def disable(session: Session, account_id: str, reason: str, now: datetime) -> None:
    """Auto-recharge turned off by the service (``auto_recharge.disabled`` {reason})."""
    session.execute(
        update(RECHARGES)
        .where(RECHARGES.c.account_id == account_id)
        .values(enabled=False, updated_at=now)
    )
    _arm(session, account_id, None, now)
    outbox.emit(session, outbox.AUTO_RECHARGE_DISABLED, account_id, {"reason": reason}, now)
    Auditor("scheduler").record(
        session, now, "auto_recharge.disable", "account", account_id, account_id, {"reason": reason}
    )


def _month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _failed_in_a_row(session: Session, account_id: str) -> Sequence[Any]:
    """The account's latest recharges (newest first), as many as count toward disabling."""
    return session.execute(
        select(PAYMENTS.c.status, PAYMENTS.c.updated_at)
        .where(
            PAYMENTS.c.account_id == account_id,
            PAYMENTS.c.kind == PaymentKind.AUTO_RECHARGE.value,
        )
        .order_by(PAYMENTS.c.created_at.desc(), PAYMENTS.c.id.desc())
        .limit(FAILURES_IN_A_ROW)
    ).all()


class Recharger:
    """The scheduler's auto-recharge loop (keeps nothing a decision depends on)."""

    def __init__(self, database: Database, settings: Settings, clock: Clock) -> None:
        self.database = database
        self.settings = settings
        self.clock = clock
        self.auditor = Auditor("scheduler")

    def run_once(self, limit: int = 100) -> int:
        """Every account a recharge is due for, decided and charged. Returns how many were
        charged (succeeded or failed)."""
        with self.database.reading() as session:
            due = (
                session.execute(
                    select(ACCOUNTS.c.id)
                    .where(ACCOUNTS.c.recharge_due_at.is_not(None))
                    .order_by(ACCOUNTS.c.recharge_due_at)
                    .limit(limit)
                )
                .scalars()
                .all()
            )
        charged = 0
        for account_id in due:
            try:
                charged += self.recharge(str(account_id))
            except Exception:
                log.exception("auto-recharge of %s failed (retried on the next pass)", account_id)
        return charged

    def recharge(self, account_id: str) -> int:
        """One account's due recharge: claimed (a pending payment written and committed), then
        charged off-session. Returns 1 when a charge was made, else 0."""
        claimed = self._claim(account_id)
        if claimed is None:
            return 0
        payment_id, method = claimed
        payments = Payments(self.database, self.settings, self.clock)
        row, _ = payments.pay(account_id, payment_id, method, self.auditor, off_session=True)
        if row["status"] == PaymentStatus.FAILED:
            with self.database.unit_of_work() as session:
                ledger.lock_account(session, account_id)
                self._disable_after_failures(session, account_id, self.clock.now())
                session.commit()
        return 1

    def _disable_after_failures(self, session: Session, account_id: str, now: datetime) -> bool:
        latest = _failed_in_a_row(session, account_id)
        failed = [r for r in latest if r.status == PaymentStatus.FAILED.value]
        if len(latest) < FAILURES_IN_A_ROW or len(failed) < FAILURES_IN_A_ROW:
            return False
        enabled = session.execute(
            select(RECHARGES.c.enabled).where(RECHARGES.c.account_id == account_id)
        ).scalar()
        if enabled:
            disable(session, account_id, f"{FAILURES_IN_A_ROW}_failures_in_a_row", now)
        return True

    def _claim(self, account_id: str) -> tuple[str, str] | None:
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            decided = self._decide(session, account_id, now)
            if decided is None:
                session.commit()
                return None
            amount, method = decided
            if isinstance(amount, str):  # a stale claim taken over
                session.commit()
                return amount, method
            try:
                with session.begin_nested():
                    row = create_payment(
                        session, account_id, PaymentKind.AUTO_RECHARGE, amount, now, self.auditor
                    )
            except IntegrityError:  # another in flight (the unique index)
                return None
            session.commit()
        return str(row["id"]), method

    def _decide(
        self, session: Session, account_id: str, now: datetime
    ) -> tuple[int | str, str] | None:
        """Under the account's lock: the amount to charge (or the id of a stale claim to take
        over) and the card, or None (the due mark cleared when no recharge is wanted any
        more)."""
        account = session.execute(
            select(
                ACCOUNTS.c.balance_microcents,
                ACCOUNTS.c.recharge_threshold_microcents,
                ACCOUNTS.c.recharge_due_at,
            ).where(ACCOUNTS.c.id == account_id)
        ).one()
        if account.recharge_due_at is None:
            return None
        wanted = session.execute(
            select(RECHARGES).where(RECHARGES.c.account_id == account_id)
        ).first()
        threshold = account.recharge_threshold_microcents
        if (
            wanted is None
            or not wanted.enabled
            or threshold is None
            or account.balance_microcents >= threshold
        ):
            session.execute(
                update(ACCOUNTS).where(ACCOUNTS.c.id == account_id).values(recharge_due_at=None)
            )
            return None
        in_flight = session.execute(
            select(PAYMENTS.c.id, PAYMENTS.c.updated_at, PAYMENTS.c.stripe_payment_intent_id).where(
                PAYMENTS.c.account_id == account_id,
                PAYMENTS.c.kind == PaymentKind.AUTO_RECHARGE.value,
                PAYMENTS.c.status == PaymentStatus.PENDING.value,
            )
        ).first()
        if in_flight is not None:
            # A claim whose scheduler died before Stripe heard of it is taken over (the payment's
            # id stays the idempotency key); one Stripe knows of is left to the reconciliation.
            if (
                in_flight.stripe_payment_intent_id is None
                and in_flight.updated_at <= now - RESUME_AFTER
            ):
                session.execute(
                    update(PAYMENTS)
                    .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == in_flight.id)
                    .values(updated_at=now)
                )
                method = self._card(session, account_id)
                if method is not None:
                    return str(in_flight.id), method
            return None
        if self._disable_after_failures(session, account_id, now):
            return None
        latest = _failed_in_a_row(session, account_id)
        if (
            latest
            and latest[0].status == PaymentStatus.FAILED.value
            and latest[0].updated_at > now - BACK_OFF
        ):
            return None
        month = _month_start(now)
        recharged = int(
            session.execute(
                select(func.coalesce(func.sum(PAYMENTS.c.amount_cents), 0)).where(
                    PAYMENTS.c.account_id == account_id,
                    PAYMENTS.c.kind == PaymentKind.AUTO_RECHARGE.value,
                    PAYMENTS.c.status == PaymentStatus.SUCCEEDED.value,
                    PAYMENTS.c.succeeded_at >= month,
                )
            ).scalar()
            or 0
        )
        amount, limit = int(wanted.amount_cents), int(wanted.monthly_limit_cents)
        if recharged + amount > limit:
            label = month.strftime("%Y-%m")
            if wanted.limit_noticed_month != label:
                session.execute(
                    update(RECHARGES)
                    .where(RECHARGES.c.account_id == account_id)
                    .values(limit_noticed_month=label)
                )
                outbox.emit(
                    session,
                    outbox.AUTO_RECHARGE_LIMIT_REACHED,
                    account_id,
                    {
                        "monthly_limit_microcents": limit * MICROCENTS_PER_CENT,
                        "recharged_microcents": recharged * MICROCENTS_PER_CENT,
                    },
                    now,
                )
            return None
        method = self._card(session, account_id)
        if method is None:
            disable(session, account_id, "payment_method_removed", now)
            return None
        return amount, method

    @staticmethod
    def _card(session: Session, account_id: str) -> str | None:
        method = session.execute(
            select(PROFILES.c.card_payment_method_id).where(PROFILES.c.account_id == account_id)
        ).scalar()
        return None if method is None else str(method)
