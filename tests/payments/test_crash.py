"""A server killed (``kill -9``) between Stripe's success and the grant: the payment stays
pending, and a real ``metering scheduler --once`` process credits it exactly once.

Real processes throughout: the server (uvicorn with the service's own factory and a file clock),
localstripe, the scheduler and ``metering verify``, on a database file (SQLite) or a server
(PostgreSQL, Citus). The portal's top-up is driven over HTTP as the browser would: the server
creates the PaymentIntent with a card that needs 3-D Secure and answers the page that hands it
to Stripe.js; the server is then killed, and the customer passes 3-D Secure at Stripe (the page
talks to Stripe, not to the server). So the money is received and nothing of it reached the
service: neither the return page nor Stripe's ``payment_intent.succeeded`` (sent to the dead
server). The server's clock stands ten minutes before the wall clock, so for the scheduler
process (the system's clock) the payment has been pending for longer than 5 minutes."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from tests.clocked import FileClock
from tests.conftest import ADMIN_TOKEN, APP_BACKENDS, migrated_database
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import stripe_settings
from tests.payments.localstripe import CARD_3DS, PUBLISHABLE_KEY, LocalStripe
from tests.servers import ServerProcess, run_cli

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
AMOUNT_CENTS = 2500


@pytest.fixture(params=APP_BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with migrated_database(request.param, tmp_path) as url:
        yield url


def _env(localstripe: LocalStripe) -> dict[str, str]:
    return {f"METERING_{k.upper()}": str(v) for k, v in stripe_settings(localstripe).items()}


def _admin(client: httpx.Client, method: str, path: str, status: int, **kw: Any) -> Any:
    response = client.request(
        method, path, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, **kw
    )
    assert response.status_code == status, response.text
    return response.json()


def _csrf(page: httpx.Response) -> str:
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found, page.text
    return found.group(1)


def _attribute(page: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]+)"', page)
    assert found, page
    return html.unescape(found.group(1))


def _state(server: ServerProcess, secret: str, payment_id: str) -> tuple[int, dict[str, Any]]:
    """The account's balance and the payment, as the account's key reads them."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        auth = {"Authorization": f"Bearer {secret}"}
        credits = client.get("/v1/credits", headers=auth)
        assert credits.status_code == 200, credits.text
        payment = client.get(f"/v1/payments/{payment_id}", headers=auth)
        assert payment.status_code == 200, payment.text
        return int(credits.json()["balance_microcents"]), payment.json()


def test_a_server_killed_before_the_grant_is_credited_once_by_the_scheduler(
    database_url: str, localstripe: LocalStripe, tmp_path: Path
) -> None:
    env = _env(localstripe)
    clock = FileClock(tmp_path / "clock", datetime.now(UTC) - timedelta(minutes=10))
    server = ServerProcess(database_url, tmp_path / "server", clock=clock, extra_env=env).start()
    try:
        base = server.base_url
        localstripe.send_webhooks_to(f"{base}/v1/stripe/webhook")
        with httpx.Client(base_url=base, timeout=30) as client:
            account = _admin(
                client,
                "POST",
                "/admin/v1/accounts",
                201,
                json={"name": "crash", "billing": "prepaid"},
            )["id"]
            key = _admin(
                client, "POST", f"/admin/v1/accounts/{account}/api-keys", 201, json={"name": "k"}
            )["key"]
            link = _admin(client, "POST", f"/admin/v1/accounts/{account}/portal-sessions", 201)
            path = str(link["url"]).removeprefix(base)
            signed = client.post(path, data={"csrf_token": _csrf(client.get(path))})
            assert signed.status_code == 303, signed.text
            # The portal's top-up: the amount, then the card page (a SetupIntent for Elements).
            form = {"csrf_token": _csrf(client.get("/billing/payments")), "amount": "2500"}
            started = client.post("/billing/payments", data=form)
            assert started.status_code == 303, started.text
            pay_path = started.headers["location"]
            payment_id = pay_path.split("/")[-2]
            pay_page = client.get(pay_path)
            assert pay_page.status_code == 200, pay_page.text
            setup_id = _attribute(pay_page.text, 'name="setup_intent" value')
            # Stripe.js sets the card up (3-D Secure passed for the set-up).
            setup_secret = _attribute(pay_page.text, "data-client-secret")
            first = localstripe.confirm_card_setup(setup_secret, CARD_3DS)
            assert first.json()["status"] == "requires_action", first.text
            passed = localstripe._request(
                "POST",
                f"/v1/setup_intents/{setup_id}/confirm",
                content=json.dumps(
                    {"key": PUBLISHABLE_KEY, "use_stripe_sdk": True, "client_secret": setup_secret}
                ),
            )
            assert passed.json()["status"] == "succeeded", passed.text
            # The server creates and confirms the PaymentIntent: the bank asks for 3-D Secure.
            confirmed = client.post(
                f"/billing/payments/{payment_id}/confirm",
                data={"csrf_token": _csrf(pay_page), "setup_intent": setup_id},
            )
            assert confirmed.status_code == 200, confirmed.text
            intent_secret = _attribute(confirmed.text, "data-client-secret")
        before, pending = _state(server, key, payment_id)
        assert before == 0
        assert (pending["status"], pending["grant_id"]) == ("pending", None)
    finally:
        server.kill()  # SIGKILL: no shutdown handler runs
    assert server.process is not None and server.process.returncode == -9

    # The customer passes 3-D Secure at Stripe: the money is received, the server is dead.
    assert localstripe.authenticate(intent_secret, True).status_code == 200
    intent_id = intent_secret.split("_secret_")[0]
    assert localstripe.get(f"/v1/payment_intents/{intent_id}")["status"] == "succeeded"

    scheduler_dir = tmp_path / "scheduler"
    scheduler_dir.mkdir()
    balances = []
    for _ in range(2):  # the second run finds nothing left to do
        ran = run_cli(database_url, scheduler_dir, "scheduler", "--once", settings=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        restarted = ServerProcess(database_url, tmp_path / "again", clock=clock, extra_env=env)
        try:
            balances.append(_state(restarted.start(), key, payment_id))
        finally:
            restarted.stop()
    (first_balance, credited), (second_balance, again) = balances
    assert first_balance == second_balance == AMOUNT_CENTS * MICROCENTS_PER_CENT
    assert credited["status"] == "succeeded" and credited["grant_id"] is not None
    assert again == credited
    verified = run_cli(database_url, scheduler_dir, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "MISMATCH" not in verified.stdout and verified.stdout.startswith("verified "), (
        verified.stdout
    )
