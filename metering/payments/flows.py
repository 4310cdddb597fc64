"""Payments: made before Stripe is called, credited once whatever tells us of the money.

Four signals say a payment may have succeeded: Stripe's ``payment_intent.succeeded`` event (the
webhook), the portal's return page, the answer to a server-side confirmation, and the scheduler's
reconciliation of payments still pending. Every one of them retrieves the PaymentIntent from
Stripe and hands it to ``converge``, the one place a payment's status changes: under the
account's row lock and the payment's, it checks the intent against the row (its
``metadata.payment_id``, amount, currency, and the intent id recorded), and a payment not yet
succeeded whose intent has is credited with one paid grant (priority 50,
``METERING_TOPUP_EXPIRY_DAYS``) in the same transaction that marks it succeeded. Any number of
signals, concurrent or repeated, find it succeeded and change nothing.

Stripe is never called with a database transaction open: each flow commits what it knows, calls
Stripe, then converges in a transaction of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from metering.audit.service import Auditor
from metering.db import Database
from metering.kit.clock import Clock
from metering.kit.errors import Conflict, InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.money import cents
from metering.kit.timeutil import format_timestamp
from metering.ledger import service as ledger
from metering.metrics import REGISTRY
from metering.models import Payment, PaymentProfile, StripeEvent, table
from metering.notifications import outbox
from metering.payments.stripe_records import Card, Declined, Intent, StripeUnavailable
from metering.settings import Settings
from metering.states import payments as states
from metering.states.payments import UNPAID, IntentStatus, PaymentKind, PaymentStatus

log = logging.getLogger("metering.payments")

# A payment's row as read (``Result.first()._mapping``).
Row = Any
PAYMENTS = table(Payment)
PROFILES = table(PaymentProfile)
STRIPE_EVENTS = table(StripeEvent)
MICROCENTS_PER_CENT = 1_000_000
# The scheduler asks Stripe about payments pending this long, and gives up on them after a day.
RECONCILE_AFTER = timedelta(minutes=5)
ABANDON_AFTER = timedelta(hours=24)

PAYMENTS_TOTAL = REGISTRY.counter(
    "metering_payments_total", "Payments that ended, by kind and result.", ("kind", "result")
)
CREDITED_MICROCENTS = REGISTRY.counter(
    "metering_payment_credit_microcents_total",
    "Credit granted from payments (microcents), by kind.",
    ("kind",),
)
MISMATCHES = REGISTRY.counter(
    "metering_payment_mismatches_total",
    "PaymentIntents that did not match their payment (nothing credited), by kind.",
    ("kind",),
)


# -- amounts and bodies --------------------------------------------------------------------------


def checked_amount(value: Any, settings: Settings, param: str = "amount_cents") -> int:
    """A payment's amount: whole cents (a JSON integer) within the configured bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{param} must be a whole number of cents", param=param)
    low, high = settings.topup_min_cents, settings.topup_max_cents
    if not low <= value <= high:
        raise InvalidRequest(
            f"{param} must be between {low} and {high} cents", param=param, code="invalid_parameter"
        )
    return value


def payment_body(row: Row, operator: bool = False) -> dict[str, Any]:
    body = {
        "id": row["id"],
        "object": "payment",
        "account_id": row["account_id"],
        "kind": row["kind"],
        "amount_cents": int(row["amount_cents"]),
        "status": row["status"],
        "refunded_cents": int(row["refunded_cents"]),
        "grant_id": row["grant_id"],
        "failure_code": row["failure_code"],
        "failure_message": row["failure_message"],
        "receipt_url": row["receipt_url"],
        "created_at": format_timestamp(row["created_at"]),
        "succeeded_at": (
            format_timestamp(row["succeeded_at"]) if row["succeeded_at"] is not None else None
        ),
    }
    if operator:
        body["stripe_payment_intent_id"] = row["stripe_payment_intent_id"]
    return body


# -- rows ----------------------------------------------------------------------------------------


def find(session: Session, account_id: str, payment_id: str) -> Row:
    """The account's payment (404 ``not_found`` when it has none of that id)."""
    row = session.execute(
        select(PAYMENTS).where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
    ).first()
    if row is None:
        raise NotFound(f"no payment {payment_id}", param="payment_id")
    return row._mapping


def locked(session: Session, account_id: str, payment_id: str) -> Row:
    row = session.execute(
        select(PAYMENTS)
        .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
        .with_for_update()
    ).first()
    if row is None:
        raise NotFound(f"no payment {payment_id}", param="payment_id")
    return row._mapping


def create_payment(
    session: Session,
    account_id: str,
    kind: PaymentKind,
    amount_cents: int,
    now: datetime,
    auditor: Auditor,
) -> Row:
    """A new pending payment (before Stripe hears of it: its id is the idempotency key)."""
    ledger.lock_account(session, account_id)
    payment_id = new_id("pay")
    session.execute(
        insert(PAYMENTS).values(
            id=payment_id,
            account_id=account_id,
            kind=kind.value,
            amount_cents=amount_cents,
            status=PaymentStatus.PENDING.value,
            refunded_cents=0,
            created_at=now,
            updated_at=now,
        )
    )
    auditor.record(
        session,
        now,
        "payment.create",
        "payment",
        payment_id,
        account_id,
        {"kind": kind.value, "amount_cents": amount_cents},
    )
    return find(session, account_id, payment_id)


def _record_intent(session: Session, account_id: str, payment_id: str, intent_id: str) -> str:
    """The payment's PaymentIntent: ``intent_id`` unless another was recorded first (two
    requests paying one payment at once), under the payment's row lock. Returns the one kept."""
    ledger.lock_account(session, account_id)
    recorded = locked(session, account_id, payment_id)["stripe_payment_intent_id"]
    if recorded is not None:
        return str(recorded)
    session.execute(
        update(PAYMENTS)
        .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
        .values(stripe_payment_intent_id=intent_id)
    )
    return intent_id


def mismatch(payment: Row, intent: Intent) -> str | None:
    """Why ``intent`` is not this payment's PaymentIntent (None: it is)."""
    if intent.metadata.get("payment_id") != payment["id"]:
        return f"metadata.payment_id is {intent.metadata.get('payment_id')!r}"
    recorded = payment["stripe_payment_intent_id"]
    if recorded is not None and recorded != intent.id:
        return f"the payment's PaymentIntent is {recorded}, not {intent.id}"
    if intent.amount != int(payment["amount_cents"]):
        return f"amount {intent.amount} cents, the payment's is {payment['amount_cents']}"
    if intent.currency.lower() != "usd":
        return f"currency {intent.currency!r}"
    return None


def converge(
    session: Session,
    account_id: str,
    payment_id: str,
    intent: Intent,
    now: datetime,
    auditor: Auditor,
    settings: Settings,
) -> Row:
    """The one place a payment's status moves, from a PaymentIntent just retrieved from Stripe:
    succeeded (one paid grant, in this transaction), failed, or unchanged. Returns the row."""
    ledger.lock_account(session, account_id)
    payment = locked(session, account_id, payment_id)
    if payment["status"] == PaymentStatus.SUCCEEDED:
        return payment
    problem = mismatch(payment, intent)
    if problem is not None:
        log.warning(
            "payment %s: PaymentIntent %s does not match: %s", payment_id, intent.id, problem
        )
        MISMATCHES.inc(payment["kind"])
        return payment
    if intent.status is IntentStatus.SUCCEEDED:
        return _succeed(session, payment, intent, now, auditor, settings)
    if intent.status is IntentStatus.CANCELED or (intent.status in UNPAID and intent.error_code):
        code = intent.error_code or "canceled"
        return fail(
            session,
            payment,
            code,
            intent.error_message or "The payment was canceled.",
            now,
            auditor,
        )
    return payment


def _succeed(
    session: Session,
    payment: Row,
    intent: Intent,
    now: datetime,
    auditor: Auditor,
    settings: Settings,
) -> Row:
    account_id, payment_id = payment["account_id"], payment["id"]
    target = states.target("succeed", payment["status"])
    amount = int(payment["amount_cents"]) * MICROCENTS_PER_CENT
    expires_at = None
    if settings.topup_expiry_days is not None:
        expires_at = now + timedelta(days=settings.topup_expiry_days)
    grant, _created = ledger.add_entry(
        session,
        account_id,
        "grant",
        amount,
        f"payment:{payment_id}",
        f"payment {payment_id}",
        now,
        ledger.GrantTerms("paid", 50, expires_at),
    )
    session.execute(
        update(PAYMENTS)
        .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
        .values(
            status=target.value,
            grant_id=grant["id"],
            stripe_payment_intent_id=intent.id,
            receipt_url=intent.receipt_url,
            failure_code=None,
            failure_message=None,
            succeeded_at=now,
            updated_at=now,
        )
    )
    outbox.emit(
        session,
        outbox.PAYMENT_SUCCEEDED,
        account_id,
        {
            "payment_id": payment_id,
            "kind": payment["kind"],
            "amount_microcents": amount,
            "grant_id": grant["id"],
        },
        now,
    )
    auditor.record(
        session,
        now,
        "payment.succeed",
        "payment",
        payment_id,
        account_id,
        {"status": target.value, "grant_id": grant["id"], "amount_cents": cents(amount)},
    )

    def count() -> None:
        PAYMENTS_TOTAL.inc(payment["kind"], "succeeded")
        CREDITED_MICROCENTS.inc(payment["kind"], amount=amount)

    session.info.setdefault("after_commit", []).append(count)
    return find(session, account_id, payment_id)


def fail(
    session: Session,
    payment: Row,
    code: str,
    message: str,
    now: datetime,
    auditor: Auditor,
) -> Row:
    """A pending payment marked failed (one ``payment.failed`` event); any other as it is."""
    account_id, payment_id = payment["account_id"], payment["id"]
    if not states.may("fail", payment["status"]):
        return payment
    target = states.target("fail", payment["status"])
    code, message = code[:64], message[:500]
    session.execute(
        update(PAYMENTS)
        .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
        .values(status=target.value, failure_code=code, failure_message=message, updated_at=now)
    )
    outbox.emit(
        session,
        outbox.PAYMENT_FAILED,
        account_id,
        {
            "payment_id": payment_id,
            "kind": payment["kind"],
            "amount_microcents": int(payment["amount_cents"]) * MICROCENTS_PER_CENT,
            "failure_code": code,
        },
        now,
    )
    auditor.record(
        session,
        now,
        "payment.fail",
        "payment",
        payment_id,
        account_id,
        {"status": target.value, "failure_code": code},
    )
    session.info.setdefault("after_commit", []).append(
        lambda: PAYMENTS_TOTAL.inc(payment["kind"], "failed")
    )
    return find(session, account_id, payment_id)


def counted(session: Session) -> None:
    for count in session.info.pop("after_commit", []):
        count()


# -- the flows -----------------------------------------------------------------------------------


def settle_stale(
    payments: Payments,
    pending: Select[Any],
    created_at: ColumnElement[datetime],
    limit: int,
    what: str,
    settle: Callable[[Any], int],
) -> int:
    """The scheduler's reconciliation of rows left pending ``RECONCILE_AFTER`` or longer (their
    process died during or right after Stripe's call): the oldest ``limit`` rows of ``pending``
    (a select of rows with an ``id``, by ``created_at``), each given to ``settle`` (how many it
    moved); one that raises is logged and retried on the next tick. Returns how many moved."""
    now = payments.clock.now()
    with payments.database.reading() as session:
        rows = session.execute(
            pending.where(created_at <= now - RECONCILE_AFTER).order_by(created_at).limit(limit)
        ).all()
    moved = 0
    for row in rows:
        try:
            moved += settle(row)
        except Exception:
            log.exception("settling %s %s failed (retried on the next tick)", what, row.id)
    return moved


class Payments:
    """The flows that call Stripe between units of work (one instance per use is fine: it keeps
    nothing a decision depends on)."""

    def __init__(self, database: Database, settings: Settings, clock: Clock) -> None:
        self.database = database
        self.settings = settings
        self.clock = clock
        # Imported here, on the first payment of a process, not with the routes: the library and
        # the HTTP clients it brings weigh about 18 MB in every process, payments on or off.
        from metering.payments.stripe_api import Stripe

        self.stripe: Stripe = Stripe(settings)

    def _converge(self, account_id: str, payment_id: str, intent: Intent, auditor: Auditor) -> Row:
        with self.database.unit_of_work() as session:
            row = converge(
                session, account_id, payment_id, intent, self.clock.now(), auditor, self.settings
            )
            session.commit()
            counted(session)
        return row

    def _fail(
        self, account_id: str, payment_id: str, code: str, message: str, auditor: Auditor
    ) -> Row:
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            row = fail(
                session,
                locked(session, account_id, payment_id),
                code,
                message,
                self.clock.now(),
                auditor,
            )
            session.commit()
            counted(session)
        return row

    # -- customers and cards --------------------------------------------------------------------

    def customer_of(self, account_id: str) -> str:
        """The account's Stripe customer, made on first need (its id kept)."""
        with self.database.reading() as session:
            found = session.execute(
                select(PROFILES.c.stripe_customer_id).where(PROFILES.c.account_id == account_id)
            ).scalar()
        if found:
            return str(found)
        customer = self.stripe.create_customer(account_id)
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            kept = session.execute(
                select(PROFILES.c.stripe_customer_id)
                .where(PROFILES.c.account_id == account_id)
                .with_for_update()
            ).first()
            if kept is None:
                session.execute(
                    insert(PROFILES).values(
                        account_id=account_id,
                        stripe_customer_id=customer,
                        updated_at=self.clock.now(),
                    )
                )
            elif kept.stripe_customer_id is None:
                session.execute(
                    update(PROFILES)
                    .where(PROFILES.c.account_id == account_id)
                    .values(stripe_customer_id=customer, updated_at=self.clock.now())
                )
            else:
                customer = str(kept.stripe_customer_id)  # another request made one first
            session.commit()
        return customer

    def saved_method(self, account_id: str) -> str | None:
        """The id of the account's saved card (None: it has none)."""
        with self.database.reading() as session:
            found = session.execute(
                select(PROFILES.c.card_payment_method_id).where(PROFILES.c.account_id == account_id)
            ).scalar()
        return str(found) if found else None

    def save_card(self, account_id: str, payment_method: str, auditor: Auditor) -> Card:
        """The account's saved card becomes ``payment_method`` (set up for off-session charges
        by a SetupIntent of its customer); a card saved before is detached from Stripe."""
        card = self.stripe.claim_card(payment_method, account_id)
        self.customer_of(account_id)  # the profile row exists from here
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            before = session.execute(
                select(PROFILES.c.card_payment_method_id)
                .where(PROFILES.c.account_id == account_id)
                .with_for_update()
            ).scalar()
            if before == payment_method:
                return card
            session.execute(
                update(PROFILES)
                .where(PROFILES.c.account_id == account_id)
                .values(
                    card_payment_method_id=payment_method,
                    card_brand=card.brand[:32],
                    card_last4=card.last4[:4],
                    card_exp_month=card.exp_month,
                    card_exp_year=card.exp_year,
                    updated_at=now,
                )
            )
            auditor.record(
                session,
                now,
                "card.save",
                "account",
                account_id,
                account_id,
                {"brand": card.brand, "last4": card.last4},
            )
            session.commit()
        if before:
            try:
                self.stripe.detach_payment_method(str(before))
            except StripeUnavailable:
                log.warning("account %s: the card it replaced could not be detached", account_id)
        return card

    def forget_card(self, account_id: str, payment_method: str | None, auditor: Auditor) -> bool:
        """The saved card removed (``payment_method``: only if it is that one, as when Stripe
        says it was detached). Returns whether one was removed."""
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            saved = session.execute(
                select(PROFILES.c.card_payment_method_id)
                .where(PROFILES.c.account_id == account_id)
                .with_for_update()
            ).scalar()
            if not saved or (payment_method is not None and saved != payment_method):
                return False
            session.execute(
                update(PROFILES)
                .where(PROFILES.c.account_id == account_id)
                .values(
                    card_payment_method_id=None,
                    card_brand=None,
                    card_last4=None,
                    card_exp_month=None,
                    card_exp_year=None,
                    updated_at=now,
                )
            )
            auditor.record(session, now, "card.remove", "account", account_id, account_id, {})
            session.commit()
        return True

    def remove_card(self, account_id: str, auditor: Auditor) -> bool:
        """The portal's "remove": detached in Stripe, then forgotten here."""
        method = self.saved_method(account_id)
        if method is None:
            return False
        self.stripe.detach_payment_method(method)
        return self.forget_card(account_id, method, auditor)

    # -- an operator's off-session top-up -------------------------------------------------------

    def top_up(
        self, account_id: str, amount_cents: int, idempotency_key: str, auditor: Auditor
    ) -> tuple[Row, bool]:
        """Charge the saved card off-session (idempotent on ``idempotency_key``: the same key
        and amount give the same payment, carried on if it is still pending). Returns the
        payment and whether this request created it."""
        fingerprint = ledger.fingerprint({"amount_cents": amount_cents})
        now = self.clock.now()
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            existing = session.execute(
                select(PAYMENTS).where(
                    PAYMENTS.c.account_id == account_id,
                    PAYMENTS.c.idempotency_key == idempotency_key,
                )
            ).first()
            created = existing is None
            if existing is not None:
                if existing.request_fingerprint != fingerprint:
                    raise Conflict(
                        f"idempotency_key {idempotency_key!r} was already used for another "
                        "top-up of this account",
                        code="idempotency_conflict",
                        param="idempotency_key",
                    )
                payment_id = str(existing.id)
            else:
                if self.saved_method(account_id) is None:
                    raise InvalidRequest(
                        "the account has no saved card",
                        code="payment_method_required",
                        param=None,
                    )
                row = create_payment(
                    session, account_id, PaymentKind.TOP_UP, amount_cents, now, auditor
                )
                payment_id = str(row["id"])
                session.execute(
                    update(PAYMENTS)
                    .where(PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id)
                    .values(idempotency_key=idempotency_key, request_fingerprint=fingerprint)
                )
            session.commit()
        method = self.saved_method(account_id)
        if method is None:  # removed since: the payment stays as it is
            with self.database.reading() as session:
                return find(session, account_id, payment_id), created
        row, _ = self.pay(account_id, payment_id, method, auditor, off_session=True)
        return row, created

    def card_of(self, account_id: str) -> Card | None:
        with self.database.reading() as session:
            row = session.execute(
                select(PROFILES).where(PROFILES.c.account_id == account_id)
            ).first()
        if row is None or row.card_payment_method_id is None:
            return None
        return Card(
            row.card_brand or "card",
            row.card_last4 or "",
            row.card_exp_month or 0,
            row.card_exp_year or 0,
        )

    # -- paying ---------------------------------------------------------------------------------

    def setup_for(
        self, account_id: str, payment_id: str | None, save_card: bool = False
    ) -> tuple[str, str]:
        """A SetupIntent for a new card (Stripe.js confirms it in the page): its id and client
        secret. ``payment_id``: the payment it is for (its metadata says so)."""
        customer = self.customer_of(account_id)
        metadata = {"account_id": account_id}
        if payment_id is not None:
            metadata["payment_id"] = payment_id
        if save_card:
            metadata["save_card"] = "true"
        setup = self.stripe.create_setup_intent(customer, metadata)
        assert setup.client_secret is not None
        return setup.id, setup.client_secret

    def method_of_setup(self, account_id: str, setup_intent_id: str) -> str | Declined:
        """The payment method a SetupIntent of this account set up; a ``Declined`` when it did
        not succeed."""
        setup = self.stripe.retrieve_setup_intent(setup_intent_id)
        customer = self.customer_of(account_id)
        if setup.customer != customer or setup.metadata.get("account_id") != account_id:
            raise InvalidRequest("that card setup is not this account's", param="setup_intent")
        if setup.status != IntentStatus.SUCCEEDED or setup.payment_method is None:
            return Declined("card_declined", "The card could not be set up: it was declined.")
        return setup.payment_method

    def pay(
        self,
        account_id: str,
        payment_id: str,
        payment_method: str,
        auditor: Auditor,
        off_session: bool = False,
    ) -> tuple[Row, Intent | None]:
        """Charge the payment with ``payment_method``: its PaymentIntent created (the payment's
        id the idempotency key), recorded, confirmed, and the answer converged. Returns the
        payment and the intent (whose ``requires_action`` asks Stripe.js for 3-D Secure)."""
        with self.database.reading() as session:
            payment = find(session, account_id, payment_id)
        if payment["status"] != PaymentStatus.PENDING:
            return payment, None
        customer = self.customer_of(account_id)
        intent_id = payment["stripe_payment_intent_id"]
        try:
            if intent_id is None:
                intent = self.stripe.create_payment_intent(
                    payment_id, account_id, int(payment["amount_cents"]), customer, payment_method
                )
                with self.database.unit_of_work() as session:
                    kept = _record_intent(session, account_id, payment_id, intent.id)
                    session.commit()
                if kept != intent.id:
                    # Another request paying this payment recorded its intent first (Stripe's
                    # idempotency key returns that one; a server that ignores keys made a
                    # second): ours is canceled unconfirmed, theirs carries on.
                    self.stripe.cancel_payment_intent(intent.id)
                    intent = self.stripe.retrieve_payment_intent(kept)
            else:
                intent = self.stripe.retrieve_payment_intent(intent_id)
            if intent.status is IntentStatus.REQUIRES_CONFIRMATION:
                intent = self.stripe.confirm_payment_intent(payment_id, intent.id)
            if off_session and intent.status is IntentStatus.REQUIRES_ACTION:
                # Nobody is there to pass 3-D Secure: a failure, the intent canceled.
                self.stripe.cancel_payment_intent(intent.id)
                message = "The card needs authentication, which an off-session charge cannot ask."
                raise Declined("authentication_required", message)
        except Declined as declined:
            return self._fail(
                account_id, payment_id, declined.code, declined.message, auditor
            ), None
        return self._converge(account_id, payment_id, intent, auditor), intent

    def learn(self, account_id: str, payment_id: str, auditor: Auditor) -> Row:
        """What Stripe says of a pending payment's PaymentIntent, converged (the return page,
        the scheduler)."""
        with self.database.reading() as session:
            payment = find(session, account_id, payment_id)
        intent_id = payment["stripe_payment_intent_id"]
        if payment["status"] == PaymentStatus.SUCCEEDED or intent_id is None:
            return payment
        return self._converge(
            account_id, payment_id, self.stripe.retrieve_payment_intent(intent_id), auditor
        )

    def fail_unpaid(
        self, account_id: str, payment_id: str, code: str, message: str, auditor: Auditor
    ) -> Row:
        """A pending payment that never reached a PaymentIntent (its card was declined while
        being set up) marked failed; one with an intent is left to what Stripe says of it."""
        with self.database.reading() as session:
            payment = find(session, account_id, payment_id)
        if payment["stripe_payment_intent_id"] is not None:
            return self.learn(account_id, payment_id, auditor)
        return self._fail(account_id, payment_id, code, message, auditor)

    # -- the scheduler --------------------------------------------------------------------------

    def reconcile(self, limit: int = 100) -> int:
        """Payments pending for 5 minutes or more, asked of Stripe and converged; those pending
        a day that Stripe confirms unpaid are failed (``abandoned``). Returns how many moved."""
        now = self.clock.now()
        auditor = Auditor("scheduler")
        return settle_stale(
            self,
            select(
                PAYMENTS.c.id,
                PAYMENTS.c.account_id,
                PAYMENTS.c.created_at,
                PAYMENTS.c.stripe_payment_intent_id,
            ).where(PAYMENTS.c.status == PaymentStatus.PENDING.value),
            PAYMENTS.c.created_at,
            limit,
            "payment",
            lambda row: self._reconcile_one(row, now, auditor),
        )

    def _reconcile_one(self, row: Any, now: datetime, auditor: Auditor) -> int:
        abandoned = row.created_at <= now - ABANDON_AFTER
        if row.stripe_payment_intent_id is None:
            if not abandoned:
                return 0
            # Never confirmed: nothing can have been paid (an intent is confirmed only after
            # its id is recorded).
            after = self._fail(
                row.account_id, row.id, "abandoned", "The payment was not completed.", auditor
            )
            return int(after["status"] != PaymentStatus.PENDING)
        intent = self.stripe.retrieve_payment_intent(row.stripe_payment_intent_id)
        if abandoned and intent.status in UNPAID:
            intent = self.stripe.cancel_payment_intent(intent.id)
            if intent.status is IntentStatus.CANCELED:
                after = self._fail(
                    row.account_id, row.id, "abandoned", "The payment was not completed.", auditor
                )
                return int(after["status"] != PaymentStatus.PENDING)
        after = self._converge(row.account_id, row.id, intent, auditor)
        return int(after["status"] != PaymentStatus.PENDING)

    # -- Stripe's events ------------------------------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> str:
        """A verified event of a payment or a card, processed once. Returns what was done (for
        the log); types it does not handle are ignored."""
        kind = str(event.get("type"))
        obj = (event.get("data") or {}).get("object") or {}
        if kind in ("payment_intent.succeeded", "payment_intent.payment_failed"):
            return self._on_intent_event(str(event.get("id")), kind, obj)
        if kind == "setup_intent.succeeded":
            return self._on_setup(str(event.get("id")), kind, obj)
        if kind == "payment_method.detached":
            return self._on_detached(str(event.get("id")), kind, obj)
        return "ignored"

    def _seen(self, account_id: str, event_id: str) -> bool:
        with self.database.reading() as session:
            return (
                session.execute(
                    select(STRIPE_EVENTS.c.id).where(
                        STRIPE_EVENTS.c.account_id == account_id, STRIPE_EVENTS.c.id == event_id
                    )
                ).first()
                is not None
            )

    def record_event(self, session: Session, account_id: str, event_id: str, kind: str) -> bool:
        """Stripe's event recorded as processed, in ``session``'s transaction: False when it
        already was (the event's effect is then not to be had again)."""
        try:
            with session.begin_nested():
                session.execute(
                    insert(STRIPE_EVENTS).values(
                        id=event_id,
                        account_id=account_id,
                        type=kind,
                        processed_at=self.clock.now(),
                    )
                )
        except IntegrityError:
            return False
        return True

    def _processed(self, account_id: str, event_id: str, kind: str) -> None:
        """An event whose effect is idempotent, recorded once it had it."""
        with self.database.unit_of_work() as session:
            if not self.record_event(session, account_id, event_id, kind):
                return
            session.commit()

    def _on_setup(self, event_id: str, kind: str, obj: Row) -> str:
        """A card set up by the portal's "add a card" (``metadata.save_card``) is saved."""
        metadata = obj.get("metadata") or {}
        account_id = metadata.get("account_id")
        if not isinstance(account_id, str) or metadata.get("save_card") != "true":
            return "not a card to save"
        if self._account_of_customer(account_id) is None or self._seen(account_id, event_id):
            return "already processed"
        method = self.method_of_setup(account_id, str(obj.get("id")))
        if isinstance(method, Declined):
            return "not set up"
        self.save_card(account_id, method, Auditor("stripe"))
        self._processed(account_id, event_id, kind)
        return "processed"

    def _account_of_customer(self, account_id: str) -> str | None:
        with self.database.reading() as session:
            found = session.execute(
                select(PROFILES.c.stripe_customer_id).where(PROFILES.c.account_id == account_id)
            ).scalar()
        return str(found) if found else None

    def _on_detached(self, event_id: str, kind: str, obj: Row) -> str:
        """A saved card detached in Stripe is no longer the account's card. The event names no
        customer; the card's ``metadata.account_id`` (set when it was saved) names the account,
        whose rows alone are read: the card must still be that account's saved card."""
        method = obj.get("id")
        account_id = (obj.get("metadata") or {}).get("account_id")
        if not isinstance(method, str) or not isinstance(account_id, str):
            return "not ours"
        if self.saved_method(account_id) != method or self._seen(account_id, event_id):
            return "not ours"
        self.forget_card(account_id, method, Auditor("stripe"))
        self._processed(account_id, event_id, kind)
        return "processed"

    def _on_intent_event(self, event_id: str, kind: str, obj: Row) -> str:
        metadata = obj.get("metadata") or {}
        account_id, payment_id = metadata.get("account_id"), metadata.get("payment_id")
        if not isinstance(account_id, str) or not isinstance(payment_id, str):
            return "not ours"
        with self.database.reading() as session:
            payment = session.execute(
                select(PAYMENTS.c.id, PAYMENTS.c.stripe_payment_intent_id).where(
                    PAYMENTS.c.account_id == account_id, PAYMENTS.c.id == payment_id
                )
            ).first()
            seen = session.execute(
                select(STRIPE_EVENTS.c.id).where(
                    STRIPE_EVENTS.c.account_id == account_id, STRIPE_EVENTS.c.id == event_id
                )
            ).first()
        if payment is None:
            return "no such payment"
        if seen is not None:
            return "already processed"
        # What the event says is a hint; the PaymentIntent as Stripe has it now decides.
        intent = self.stripe.retrieve_payment_intent(str(obj.get("id")))
        auditor = Auditor("stripe")
        with self.database.unit_of_work() as session:
            ledger.lock_account(session, account_id)
            if not self.record_event(session, account_id, event_id, kind):
                return "already processed"
            converge(
                session, account_id, payment_id, intent, self.clock.now(), auditor, self.settings
            )
            session.commit()
            counted(session)
        return "processed"
