"""A server killed (``kill -9``) between Stripe's success and the grant: the payment stays
pending, and a real ``metering scheduler --once`` process credits it exactly once (a second run
credits nothing; ``metering verify`` is clean).

Real processes throughout: the server (uvicorn with the service's own factory and a file clock),
localstripe, the scheduler and ``metering verify``, on a database file (SQLite) or a server
(PostgreSQL, Citus). The portal's top-up is driven over HTTP as the browser would: the server
creates the PaymentIntent with a card that needs 3-D Secure and answers the page that hands it
to Stripe.js, which passes 3-D Secure with Stripe (not with the server). The kill, two ways:

- before Stripe's success: nothing of it reaches the service (Stripe's event finds the server
  dead, the return page is never asked for);
- mid-request (PostgreSQL, Citus): the event and the return page both reached the server, which
  retrieved the succeeded PaymentIntent and waits for the account's row lock, held by the test
  (seen waiting in ``pg_stat_activity``), to grant.

The server's clock stands ten minutes before the wall clock, so for the scheduler process (the
system's clock) the payment has been pending for longer than 5 minutes."""

from __future__ import annotations

import contextlib
import html
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.clocked import FileClock
from tests.conftest import (
    ADMIN_TOKEN,
    APP_BACKENDS,
    SERVER_BACKENDS,
    migrated_database,
    server_database,
)
from tests.oracle import MICROCENTS_PER_CENT
from tests.payments.conftest import stripe_settings
from tests.payments.localstripe import CARD_3DS, CARD_OK, PUBLISHABLE_KEY, LocalStripe
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


@dataclass
class Pending:
    """A portal top-up waiting for 3-D Secure: the server made its PaymentIntent."""

    account: str
    key: str
    payment_id: str
    intent_secret: str
    cookies: httpx.Cookies


def _portal_top_up(
    server: ServerProcess, localstripe: LocalStripe, card: str
) -> tuple[Pending, httpx.Response]:
    """An account, signed in to the portal, whose $25 top-up with ``card`` the server confirmed
    (the PaymentIntent's secret not yet known): the pending top-up and the server's answer."""
    base = server.base_url
    with httpx.Client(base_url=base, timeout=30) as client:
        body = {"name": "crash", "billing": "prepaid"}
        account = _admin(client, "POST", "/admin/v1/accounts", 201, json=body)["id"]
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
        # Stripe.js sets the card up (3-D Secure passed for the set-up if the card asks).
        setup_secret = _attribute(pay_page.text, "data-client-secret")
        first = localstripe.confirm_card_setup(setup_secret, card)
        if first.json()["status"] == "requires_action":
            passed = localstripe._request(
                "POST",
                f"/v1/setup_intents/{setup_id}/confirm",
                content=json.dumps(
                    {"key": PUBLISHABLE_KEY, "use_stripe_sdk": True, "client_secret": setup_secret}
                ),
            )
            assert passed.json()["status"] == "succeeded", passed.text
        # The server creates and confirms the PaymentIntent.
        confirmed = client.post(
            f"/billing/payments/{payment_id}/confirm",
            data={"csrf_token": _csrf(pay_page), "setup_intent": setup_id},
        )
        return Pending(account, key, payment_id, "", client.cookies), confirmed


def _top_up_to_3ds(server: ServerProcess, localstripe: LocalStripe) -> Pending:
    """An account, signed in to the portal, whose $25 top-up with a card that needs 3-D Secure
    the server confirmed: the page that hands the PaymentIntent to Stripe.js is answered."""
    pending, confirmed = _portal_top_up(server, localstripe, CARD_3DS)
    # The bank asks for 3-D Secure.
    assert confirmed.status_code == 200, confirmed.text
    pending.intent_secret = _attribute(confirmed.text, "data-client-secret")
    before, payment = _state(server, pending.key, pending.payment_id)
    assert before == 0
    assert (payment["status"], payment["grant_id"]) == ("pending", None)
    return pending


def _authenticated_at_stripe(localstripe: LocalStripe, pending: Pending) -> None:
    """The customer passes 3-D Secure (Stripe.js talks to Stripe): the money is received."""
    assert localstripe.authenticate(pending.intent_secret, True).status_code == 200
    intent_id = pending.intent_secret.split("_secret_")[0]
    assert localstripe.get(f"/v1/payment_intents/{intent_id}")["status"] == "succeeded"


def _scheduled_twice(
    database_url: str, pending: Pending, env: dict[str, str], clock: FileClock, tmp_path: Path
) -> list[tuple[int, dict[str, Any]]]:
    """``metering scheduler --once`` run twice (the second finds nothing left to do), the
    account's balance and the payment read after each; ``metering verify`` is clean."""
    scheduler_dir = tmp_path / "scheduler"
    scheduler_dir.mkdir()
    seen = []
    for _ in range(2):
        ran = run_cli(database_url, scheduler_dir, "scheduler", "--once", settings=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        restarted = ServerProcess(database_url, tmp_path / "again", clock=clock, extra_env=env)
        try:
            seen.append(_state(restarted.start(), pending.key, pending.payment_id))
        finally:
            restarted.stop()
    verified = run_cli(database_url, scheduler_dir, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "MISMATCH" not in verified.stdout and verified.stdout.startswith("verified "), (
        verified.stdout
    )
    return seen


def _credited_once_by_the_scheduler(
    database_url: str, pending: Pending, env: dict[str, str], clock: FileClock, tmp_path: Path
) -> None:
    """``metering scheduler --once`` credits the payment: the amount exactly, one grant; a
    second run changes nothing; ``metering verify`` is clean."""
    seen = _scheduled_twice(database_url, pending, env, clock, tmp_path)
    (first_balance, credited), (second_balance, again) = seen
    assert first_balance == second_balance == AMOUNT_CENTS * MICROCENTS_PER_CENT
    assert credited["status"] == "succeeded" and credited["grant_id"] is not None
    assert again == credited


def _server(database_url: str, localstripe: LocalStripe, tmp_path: Path) -> ServerProcess:
    """The server, its clock ten minutes behind the wall clock, localstripe's events sent to it."""
    clock = FileClock(tmp_path / "clock", datetime.now(UTC) - timedelta(minutes=10))
    server = ServerProcess(
        database_url, tmp_path / "server", clock=clock, extra_env=_env(localstripe)
    ).start()
    localstripe.send_webhooks_to(f"{server.base_url}/v1/stripe/webhook")
    return server


def test_a_server_killed_before_the_grant_is_credited_once_by_the_scheduler(
    database_url: str, localstripe: LocalStripe, tmp_path: Path
) -> None:
    """Killed before Stripe's success: nothing of it reaches the service (Stripe's event finds
    the server dead)."""
    server = _server(database_url, localstripe, tmp_path)
    try:
        pending = _top_up_to_3ds(server, localstripe)
    finally:
        server.kill()  # SIGKILL: no shutdown handler runs
    assert server.process is not None and server.process.returncode == -9
    _authenticated_at_stripe(localstripe, pending)
    assert server.clock is not None
    _credited_once_by_the_scheduler(
        database_url, pending, _env(localstripe), server.clock, tmp_path
    )


def _lock_waiters(backend: str, url: str) -> int:
    """Statements of this database waiting for a row lock, on every node (a Citus worker runs
    the account's statements)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            nodes = [url]
            if backend == "citus":
                ports = connection.execute(
                    text("SELECT nodeport FROM pg_dist_node WHERE groupid <> 0")
                ).scalars()
                nodes += [make_url(url).set(port=port).render_as_string(False) for port in ports]
    finally:
        engine.dispose()
    waiting = 0
    for node in nodes:
        engine = create_engine(node)
        try:
            with engine.connect() as connection:
                waiting += int(
                    connection.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock'"
                        )
                    ).scalar_one()
                )
        finally:
            engine.dispose()
    return waiting


@pytest.fixture(params=SERVER_BACKENDS)
def server_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    with server_database(request.param, tmp_path) as url:
        yield request.param, url


def test_a_server_killed_while_granting_is_credited_once_by_the_scheduler(
    server_url: tuple[str, str], localstripe: LocalStripe, tmp_path: Path
) -> None:
    """Killed mid-request: Stripe's ``payment_intent.succeeded`` and the return page both
    reached the server, which retrieved the succeeded PaymentIntent and waits for the
    account's row lock (held by the test) to grant; ``kill -9`` then. Nothing was granted."""
    backend, url = server_url
    server = _server(url, localstripe, tmp_path)
    holder = create_engine(url)
    answers: list[object] = []
    try:
        pending = _top_up_to_3ds(server, localstripe)
        with holder.connect() as lock:
            lock.execute(
                text("SELECT id FROM accounts WHERE id = :a FOR NO KEY UPDATE"),
                {"a": pending.account},
            )
            _authenticated_at_stripe(localstripe, pending)  # its event comes a second later

            def return_page() -> None:
                cookies = pending.cookies
                with httpx.Client(base_url=server.base_url, cookies=cookies, timeout=60) as c:
                    try:
                        answers.append(c.get(f"/billing/payments/{pending.payment_id}"))
                    except httpx.TransportError as error:
                        answers.append(error)

            browser = threading.Thread(target=return_page)
            browser.start()
            deadline = time.monotonic() + 60
            while _lock_waiters(backend, url) < 2:  # the event's and the return page's
                assert time.monotonic() < deadline, "the server never waited to grant"
                time.sleep(0.1)
            server.kill()
            lock.rollback()
        browser.join(60)
    finally:
        server.kill()
        holder.dispose()
    assert server.process is not None and server.process.returncode == -9
    [answer] = answers
    assert isinstance(answer, httpx.TransportError), answer  # no answer: the server died
    # Nothing granted: the killed server's statements ended with their connections.
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            deadline = time.monotonic() + 30
            while _lock_waiters(backend, url):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            status = connection.execute(
                text("SELECT status, grant_id FROM payments WHERE account_id = :a AND id = :p"),
                {"a": pending.account, "p": pending.payment_id},
            ).one()
    finally:
        engine.dispose()
    assert tuple(status) == ("pending", None)
    assert server.clock is not None
    _credited_once_by_the_scheduler(url, pending, _env(localstripe), server.clock, tmp_path)


# -- a refund whose server died in Stripe's call ------------------------------------------------

REFUND_CENTS = 900


class _Stall:
    """A relay between the server and localstripe that passes everything until ``hold`` is
    set; from then on no answer goes back to the server, and its requests go on to localstripe
    (``forward``: Stripe makes the refund) or nowhere (the request never reaches Stripe)."""

    def __init__(self, upstream: str) -> None:
        url = httpx.URL(upstream)
        self._upstream = (url.host, url.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.hold = False
        self.forward = True
        self.asked = threading.Event()  # a request arrived while held
        self.answered = threading.Event()  # localstripe answered one while held (kept back)
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                server, _ = self._listener.accept()
            except OSError:
                return
            stripe = socket.create_connection(self._upstream)
            self._sockets += [server, stripe]
            for source, sink, asking in ((server, stripe, True), (stripe, server, False)):
                threading.Thread(
                    target=self._pump, args=(source, sink, asking), daemon=True
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, asking: bool) -> None:
        while True:
            try:
                chunk = source.recv(65536)
            except OSError:
                return
            if not chunk:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            if self.hold:
                (self.asked if asking else self.answered).set()
                if not (asking and self.forward):
                    continue
            try:
                sink.sendall(chunk)
            except OSError:
                return

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def _rows(database_url: str, account: str) -> tuple[Any, Any, Any]:
    """The account's refund, its payment's refunded cents and intent, and its refund entries
    (how many, their sum), as stored."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            refund = connection.execute(
                text(
                    "SELECT id, status, stripe_refund_id, amount_cents FROM payment_refunds "
                    "WHERE account_id = :a"
                ),
                {"a": account},
            ).one()
            payment = connection.execute(
                text(
                    "SELECT refunded_cents, stripe_payment_intent_id FROM payments "
                    "WHERE account_id = :a"
                ),
                {"a": account},
            ).one()
            entries = connection.execute(
                text(
                    "SELECT count(*), coalesce(sum(amount_microcents), 0) FROM ledger_entries "
                    "WHERE account_id = :a AND kind = 'refund'"
                ),
                {"a": account},
            ).one()
    finally:
        engine.dispose()
    return refund, payment, (int(entries[0]), int(entries[1]))


@pytest.mark.parametrize("reached_stripe", [True, False], ids=["refunded", "never-sent"])
def test_a_refund_whose_server_died_in_stripes_call_is_settled_once_by_the_scheduler(
    database_url: str, localstripe: LocalStripe, tmp_path: Path, reached_stripe: bool
) -> None:
    """An operator's refund whose server is killed while it waits for Stripe's answer (Stripe
    made the refund, or never received the request) stays ``pending``, its amount reserved;
    ``metering scheduler --once`` applies it once if Stripe made it, or fails it and frees its
    amount; a second run changes nothing; ``metering verify`` is clean."""
    stall = _Stall(localstripe.base)
    env = _env(localstripe)
    clock = FileClock(tmp_path / "clock", datetime.now(UTC) - timedelta(minutes=10))
    server = ServerProcess(
        database_url,
        tmp_path / "server",
        clock=clock,
        extra_env={**env, "METERING_STRIPE_API_BASE": stall.base},
    ).start()
    answers: list[object] = []
    try:
        pending, confirmed = _portal_top_up(server, localstripe, CARD_OK)
        assert confirmed.status_code in (200, 303), confirmed.text
        balance, payment = _state(server, pending.key, pending.payment_id)
        assert (balance, payment["status"]) == (AMOUNT_CENTS * MICROCENTS_PER_CENT, "succeeded")
        stall.forward = reached_stripe
        stall.hold = True

        def refund() -> None:
            with httpx.Client(base_url=server.base_url, timeout=60) as client:
                try:
                    answers.append(
                        client.post(
                            f"/admin/v1/payments/{pending.payment_id}/refund",
                            json={"amount_cents": REFUND_CENTS, "reason": "crash"},
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                        )
                    )
                except httpx.TransportError as error:
                    answers.append(error)

        operator = threading.Thread(target=refund)
        operator.start()
        waited = stall.answered if reached_stripe else stall.asked
        assert waited.wait(60), "the server never asked Stripe for the refund"
        server.kill()
        operator.join(60)
    finally:
        server.kill()
        stall.close()
    assert server.process is not None and server.process.returncode == -9
    [answer] = answers
    assert isinstance(answer, httpx.TransportError), answer  # no answer: the server died
    refund_row, (refunded, intent), entries = _rows(database_url, pending.account)
    assert (refund_row.status, refund_row.stripe_refund_id, refunded) == ("pending", None, 0)
    assert entries == (0, 0)
    made = localstripe.get(f"/v1/refunds?payment_intent={intent}")["data"]
    assert [(r["amount"], r["metadata"]["refund_id"]) for r in made] == (
        [(REFUND_CENTS, refund_row.id)] if reached_stripe else []
    )

    seen = _scheduled_twice(database_url, pending, env, clock, tmp_path)

    (first_balance, first), (second_balance, second) = seen
    assert (second_balance, second) == (first_balance, first)
    refund_row, (refunded, _), entries = _rows(database_url, pending.account)
    # Nothing was sent to Stripe again.
    assert localstripe.get(f"/v1/refunds?payment_intent={intent}")["data"] == made
    if reached_stripe:
        assert first_balance == (AMOUNT_CENTS - REFUND_CENTS) * MICROCENTS_PER_CENT
        assert (refund_row.status, refund_row.stripe_refund_id) == ("succeeded", made[0]["id"])
        assert refunded == first["refunded_cents"] == REFUND_CENTS
        assert entries == (1, -REFUND_CENTS * MICROCENTS_PER_CENT)
        return
    assert first_balance == AMOUNT_CENTS * MICROCENTS_PER_CENT
    assert (refund_row.status, refund_row.stripe_refund_id) == ("failed", None)
    assert refunded == first["refunded_cents"] == 0
    assert entries == (0, 0)
    # Its amount is free again: the whole payment may be refunded.
    again = ServerProcess(database_url, tmp_path / "after", clock=clock, extra_env=env)
    try:
        with httpx.Client(base_url=again.start().base_url, timeout=30) as client:
            whole = _admin(client, "POST", f"/admin/v1/payments/{pending.payment_id}/refund", 201)
    finally:
        again.stop()
    assert (whole["amount_cents"], whole["status"]) == (AMOUNT_CENTS, "succeeded")
