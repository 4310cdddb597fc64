"""The Billing page (payments on only): add credit by card, and the account's payments.

A top-up goes in three steps, each a page of its own so that it works with the fewest scripts:

1. ``POST /billing/payments`` (an amount: a preset or a custom one in dollars) writes the
   payment, ``pending``, before Stripe hears of it;
2. ``GET /billing/payments/{id}/pay`` shows Stripe Elements' card field (Stripe.js, loaded from
   ``METERING_STRIPE_JS_URL``: the page's only script from another origin, allowed by its
   content security policy). Stripe.js sets the card up (``confirmCardSetup`` of a SetupIntent:
   card data never reaches this service) and the form posts the SetupIntent's id to
   ``POST /billing/payments/{id}/confirm``, where the server creates and confirms the
   PaymentIntent with that card (3-D Secure, when the bank asks, is completed by Stripe.js's
   ``confirmCardPayment`` on the page that answers);
3. ``GET /billing/payments/{id}``, the return page, asks Stripe about a payment still pending
   and shows the payment, the decline if any, and the new balance.

"Add a card" (``GET``/``POST /billing/payments/card``) saves a card without paying: Stripe.js
sets it up on a page like the card page, and the SetupIntent's id posted back makes it the
account's saved card.

Reading needs a signed-in session; paying needs ``Permission.MANAGE_BILLING``.
"""

from __future__ import annotations

import contextlib
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request, Response

from metering.kit.errors import InvalidRequest, MeteringError, NotFound
from metering.ledger import service as ledger
from metering.payments import recharge
from metering.payments import service as payment_reads
from metering.payments.flows import Payments, checked_amount, create_payment, find
from metering.payments.stripe_records import Declined, StripeUnavailable
from metering.portal import pages
from metering.portal.endpoints import (
    FormDep,
    UserDep,
    auditor_of,
    check_csrf,
    current_user,
    page_of,
    require,
)
from metering.portal.roles import Permission
from metering.portal.sessions import PortalUser
from metering.settings import Settings
from metering.states.payments import IntentStatus, PaymentKind, PaymentStatus
from metering.web.deps import NowDep, SessionDep, get_clock, get_database, get_settings

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)


class ProviderUnavailable(MeteringError):
    status = 503
    type = "api_error"
    default_code = "payment_provider_unavailable"


PAGE = f"{pages.PREFIX}/payments"
PRESETS_CENTS = (1000, 2500, 5000, 10000)
DOLLARS = re.compile(r"\$?\s*(\d{1,10})(?:\.(\d{1,2}))?")
ERROR_CODE = re.compile(r"[a-z_]{1,64}")


def _on(request: Request) -> Settings:
    settings = get_settings(request)
    if not settings.payments_on:
        raise NotFound("no such page")
    return settings


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(settings: Settings) -> str:
    """The portal's policy, opened to Stripe.js (and the Stripe API it talks to) only."""
    stripe_js, api = _origin(settings.stripe_js_url), _origin(settings.stripe_api_base)
    connect = " ".join(dict.fromkeys(("'self'", stripe_js, api)))
    return pages.CONTENT_SECURITY_POLICY.replace(
        "script-src 'self'", f"script-src 'self' {stripe_js}"
    ).replace("connect-src 'self'", f"connect-src {connect}; frame-src {stripe_js}")


def _signed_in(request: Request, now: NowDep) -> PortalUser:
    """The signed-in user, read in a transaction of its own that ends here: the routes that
    call Stripe hold no transaction open meanwhile (the flows commit their own)."""
    with get_database(request).reading() as session:
        return current_user(request, session, now)


# The user of the routes that call Stripe (``UserDep`` keeps the request's transaction open).
CallerDep = Annotated[PortalUser, Depends(_signed_in)]


def _payments(request: Request) -> Payments:
    return Payments(get_database(request), get_settings(request), get_clock(request))


def cents_of(form: dict[str, str], settings: Settings) -> int:
    """The form's amount: a preset (``amount``, in cents) or ``custom_amount`` in dollars with
    at most 2 decimals; within the payments' bounds."""
    choice = form.get("amount", "")
    if choice == "custom" or (not choice and form.get("custom_amount", "").strip()):
        found = DOLLARS.fullmatch(form.get("custom_amount", "").strip())
        if found is None:
            raise InvalidRequest("enter an amount in dollars, e.g. 25 or 25.50", param="amount")
        try:
            cents = int(Decimal(f"{found.group(1)}.{found.group(2) or '0'}") * 100)
        except InvalidOperation:
            raise InvalidRequest("enter an amount in dollars", param="amount") from None
    elif choice.isdigit() and int(choice) in PRESETS_CENTS:
        cents = int(choice)
    else:
        raise InvalidRequest("choose an amount", param="amount")
    low, high = settings.topup_min_cents, settings.topup_max_cents
    if not low <= cents <= high:
        raise InvalidRequest(
            f"the amount must be between {pages.money(low * 1_000_000)} and "
            f"{pages.money(high * 1_000_000)}",
            param="amount",
        )
    return checked_amount(cents, settings)


def _dollars_in_cents(form: dict[str, str], name: str) -> int:
    """A dollar amount of the auto-recharge form (at most 2 decimals), in cents."""
    found = DOLLARS.fullmatch(form.get(name, "").strip())
    if found is None:
        raise InvalidRequest("enter an amount in dollars, e.g. 25 or 25.50", param=name)
    return int(found.group(1)) * 100 + int((found.group(2) or "0").ljust(2, "0"))


def _as_dollars(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


# What the auto-recharge form offers before it was ever saved.
RECHARGE_DEFAULTS_CENTS = {
    "threshold_cents": 1000,
    "amount_cents": 2500,
    "monthly_limit_cents": 10000,
}


def recharge_of(form: dict[str, str], settings: Settings) -> recharge.RechargeSettings:
    """The portal's auto-recharge form (dollars), checked as the admin route checks it."""
    return recharge.checked_settings(
        {
            "enabled": form.get("enabled") == "1",
            "threshold_cents": _dollars_in_cents(form, "threshold"),
            "amount_cents": _dollars_in_cents(form, "recharge_amount"),
            "monthly_limit_cents": _dollars_in_cents(form, "monthly_limit"),
        },
        settings,
    )


def _billing_page(
    request: Request, user: PortalUser, session: Any, now: Any, status_code: int = 200, **extra: Any
) -> Response:
    settings = _on(request)
    payments = payment_reads.list_payments(session, 20, None, account_id=user.account_id)
    recharged = recharge.settings_body(session, user.account_id)
    credits = ledger.credit_balance(session, user.account_id, now)
    return page_of(
        request,
        user,
        "billing.html",
        status_code=status_code,
        credits=credits,
        payments=payments["data"],
        presets=PRESETS_CENTS,
        bounds=(settings.topup_min_cents, settings.topup_max_cents),
        may_pay=user.can(Permission.MANAGE_BILLING),
        card=_payments(request).card_of(user.account_id),
        auto_recharge=recharged,
        recharge_form={
            name: _as_dollars(recharged[name] if recharged[name] is not None else default)
            for name, default in RECHARGE_DEFAULTS_CENTS.items()
        },
        **extra,
    )


@router.get("/payments")
def billing(request: Request, user: UserDep, session: SessionDep, now: NowDep) -> Response:
    return _billing_page(request, user, session, now)


@router.post("/payments")
def start_top_up(request: Request, form: FormDep, user: CallerDep, now: NowDep) -> Response:
    settings = _on(request)
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_BILLING)
    database, auditor = get_database(request), auditor_of(request, user)
    try:
        cents = cents_of(form, settings)
    except InvalidRequest as problem:
        with database.reading() as session:
            return _billing_page(request, user, session, now, 400, problem=problem.message)
    payments = _payments(request)
    saved = payments.saved_method(user.account_id) if form.get("use_saved_card") else None
    with database.unit_of_work() as session:
        row = create_payment(session, user.account_id, PaymentKind.TOP_UP, cents, now, auditor)
        session.commit()
    payment_id = str(row["id"])
    if saved is None:
        return pages.see_other(f"{PAGE}/{payment_id}/pay")
    try:
        _row, intent = payments.pay(user.account_id, payment_id, saved, auditor)
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return _after_paying(request, user, payment_id, intent, settings)


def _after_paying(
    request: Request, user: PortalUser, payment_id: str, intent: Any, settings: Settings
) -> Response:
    """The return page, or first the 3-D Secure step when the bank asks for it."""
    authenticate = intent is not None and intent.status is IntentStatus.REQUIRES_ACTION
    if intent is not None and authenticate and intent.client_secret:
        return page_of(
            request,
            user,
            "billing_pay.html",
            headers={"content-security-policy": content_security_policy(settings)},
            payment=find_payment(request, user, payment_id),
            authenticate=intent.client_secret,
            publishable_key=settings.stripe_publishable_key,
            stripe_js=settings.stripe_js_url,
        )
    return pages.see_other(f"{PAGE}/{payment_id}")


@router.post("/payments/card/remove")
def remove_card(request: Request, form: FormDep, user: CallerDep) -> Response:
    _on(request)
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_BILLING)
    try:
        _payments(request).remove_card(user.account_id, auditor_of(request, user))
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return pages.see_other(PAGE)


def _card_page(
    request: Request, user: PortalUser, settings: Settings, problem: str | None = None
) -> Response:
    """The "add a card" page: Stripe Elements' card field and a SetupIntent of the account's
    customer for it (``metadata.save_card``: Stripe's ``setup_intent.succeeded`` saves it too)."""
    try:
        setup_id, client_secret = _payments(request).setup_for(
            user.account_id, None, save_card=True
        )
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return page_of(
        request,
        user,
        "billing_card.html",
        headers={"content-security-policy": content_security_policy(settings)},
        setup_intent=setup_id,
        client_secret=client_secret,
        publishable_key=settings.stripe_publishable_key,
        stripe_js=settings.stripe_js_url,
        problem=problem,
    )


@router.get("/payments/card")
def add_card_page(request: Request, user: CallerDep) -> Response:
    """The "add a card" page: a card set up in Stripe Elements, saved without paying."""
    settings = _on(request)
    require(user, Permission.MANAGE_BILLING)
    return _card_page(request, user, settings)


@router.post("/payments/card")
def add_card(request: Request, form: FormDep, user: CallerDep) -> Response:
    """The card Stripe.js set up becomes the account's saved card (the one before, if any, is
    detached in Stripe); a card that could not be set up is shown on a new card page."""
    settings = _on(request)
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_BILLING)
    payments = _payments(request)
    setup_intent = form.get("setup_intent", "")
    if not re.fullmatch(r"seti_[A-Za-z0-9_]{1,200}", setup_intent):
        raise InvalidRequest("the card's set-up is missing: reload the page", param="setup_intent")
    try:
        method = payments.method_of_setup(user.account_id, setup_intent)
        if isinstance(method, Declined):
            message = form.get("error_message", "").strip()[:300] or method.message
            return _card_page(request, user, settings, problem=message)
        payments.save_card(user.account_id, method, auditor_of(request, user))
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return pages.see_other(PAGE)


@router.post("/payments/auto-recharge")
def set_auto_recharge(request: Request, form: FormDep, user: CallerDep, now: NowDep) -> Response:
    settings = _on(request)
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_BILLING)
    database = get_database(request)
    try:
        wanted = recharge_of(form, settings)
        with database.unit_of_work() as session:
            recharge.put_settings(session, user.account_id, wanted, now, auditor_of(request, user))
            session.commit()
    except InvalidRequest as problem:
        with database.reading() as session:
            return _billing_page(request, user, session, now, 400, recharge_problem=problem.message)
    return pages.see_other(PAGE)


@router.get("/payments/{payment_id}/pay")
def pay_page(payment_id: str, request: Request, user: CallerDep) -> Response:
    settings = _on(request)
    require(user, Permission.MANAGE_BILLING)
    payment = find_payment(request, user, payment_id)
    if payment["status"] != PaymentStatus.PENDING or payment["stripe_payment_intent_id"]:
        return pages.see_other(f"{PAGE}/{payment_id}")
    try:
        setup_id, client_secret = _payments(request).setup_for(user.account_id, payment_id)
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return page_of(
        request,
        user,
        "billing_pay.html",
        headers={"content-security-policy": content_security_policy(settings)},
        payment=payment,
        setup_intent=setup_id,
        client_secret=client_secret,
        publishable_key=settings.stripe_publishable_key,
        stripe_js=settings.stripe_js_url,
    )


@router.post("/payments/{payment_id}/confirm")
def confirm(payment_id: str, request: Request, form: FormDep, user: CallerDep) -> Response:
    settings = _on(request)
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_BILLING)
    payments, auditor = _payments(request), auditor_of(request, user)
    setup_intent = form.get("setup_intent", "")
    if not re.fullmatch(r"seti_[A-Za-z0-9_]{1,200}", setup_intent):
        raise InvalidRequest("the card's set-up is missing: reload the page", param="setup_intent")
    try:
        method = payments.method_of_setup(user.account_id, setup_intent)
        if isinstance(method, Declined):
            code = form.get("error_code", "")
            message = form.get("error_message", "").strip()[:300] or method.message
            code = code if ERROR_CODE.fullmatch(code) else method.code
            payments.fail_unpaid(user.account_id, payment_id, code, message, auditor)
            return pages.see_other(f"{PAGE}/{payment_id}")
        if form.get("save_card") == "on":
            payments.save_card(user.account_id, method, auditor)
        _row, intent = payments.pay(user.account_id, payment_id, method, auditor)
    except StripeUnavailable:
        raise ProviderUnavailable("Stripe could not be reached: try again shortly") from None
    return _after_paying(request, user, payment_id, intent, settings)


def find_payment(request: Request, user: PortalUser, payment_id: str) -> Any:
    with get_database(request).reading() as session:
        return find(session, user.account_id, payment_id)


@router.get("/payments/{payment_id}")
def return_page(payment_id: str, request: Request, user: CallerDep) -> Response:
    _on(request)
    payment = find_payment(request, user, payment_id)
    if payment["status"] == PaymentStatus.PENDING and payment["stripe_payment_intent_id"]:
        # Stripe out of reach: shown as pending; Stripe's event or the scheduler settles it.
        with contextlib.suppress(StripeUnavailable):
            payment = _payments(request).learn(
                user.account_id, payment_id, auditor_of(request, user)
            )
    # Read after the payment was settled (a snapshot of its own, not the request's).
    with get_database(request).reading() as session:
        credits = ledger.credit_balance(session, user.account_id, get_clock(request).now())
    return page_of(request, user, "billing_payment.html", payment=payment, credits=credits)
