"""``localstripe`` (a stateful Stripe-compatible server) as its own process, for the payment tests.

The service talks to it through the ``stripe`` library exactly as to Stripe: only the API base
differs. The tests do here what Stripe.js and Stripe's dashboard would do against it (confirm a
SetupIntent with a card's details; send an event built from its real objects, signed as Stripe
signs).

localstripe 1.15.10 writes its whole store to ``/tmp/localstripe.pickle`` after every change and
reads it back at start unless ``--from-scratch``; several test sessions at once would share that
file. Its process here starts from scratch and keeps its store in memory only (the store's
``dump_to_disk`` made a no-op before the server starts).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx

from tests.servers import free_port

PUBLISHABLE_KEY = "pk_test_metering"
SECRET_KEY = "sk_test_metering"
WEBHOOK_SECRET = "whsec_test_metering_payments"

_SERVER = """
import sys
import localstripe.resources
localstripe.resources.Store.dump_to_disk = lambda self: None  # in memory only
sys.argv = ["localstripe", "--port", sys.argv[1], "--from-scratch"]
from localstripe.server import start
start()
"""

# Stripe's test cards (localstripe knows the same numbers).
CARD_OK = "4242424242424242"
CARD_DECLINED = "4000000000000002"  # declined when it is set up
CARD_DECLINED_ON_CHARGE = "4000000000000341"  # set up fine, every charge declined
CARD_3DS = "4000002760003184"  # needs 3-D Secure for every payment


@dataclass
class LocalStripe:
    base: str
    process: subprocess.Popen[bytes]

    @property
    def js_url(self) -> str:
        return f"{self.base}/js.stripe.com/v3/"

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = httpx.request(method, self.base + path, timeout=30, **kwargs)
        assert response.status_code < 500, response.text
        return response

    def get(self, path: str) -> dict[str, Any]:
        """An object as Stripe's API answers it (the secret key's view)."""
        response = self._request("GET", path, headers={"Authorization": f"Bearer {SECRET_KEY}"})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def every(self, path: str) -> list[dict[str, Any]]:
        """Every object of a list (``/v1/payment_intents``...), page by page: the server is
        shared by a worker's tests, so one page of 100 need not hold a test's own."""
        found: list[dict[str, Any]] = []
        after = ""
        while True:
            page = self.get(f"{path}?limit=100{after}")
            found += page["data"]
            if not page["has_more"]:
                return found
            after = f"&starting_after={page['data'][-1]['id']}"

    def confirm_card_setup(self, client_secret: str, number: str) -> httpx.Response:
        """What Stripe.js's ``confirmCardSetup`` sends with the card typed into Elements."""
        setup_intent = client_secret.split("_secret_")[0]
        body = {
            "key": PUBLISHABLE_KEY,
            "use_stripe_sdk": True,
            "client_secret": client_secret,
            "payment_method_data": {
                "type": "card",
                "card": {"number": number, "exp_month": "12", "exp_year": "2031", "cvc": "123"},
            },
        }
        return self._request(
            "POST", f"/v1/setup_intents/{setup_intent}/confirm", content=json.dumps(body)
        )

    def authenticate(self, client_secret: str, success: bool) -> httpx.Response:
        """What Stripe.js's ``confirmCardPayment`` sends once the customer passed (or failed)
        3-D Secure."""
        intent = client_secret.split("_secret_")[0]
        body = {"key": PUBLISHABLE_KEY, "client_secret": client_secret}
        return self._request(
            "POST",
            f"/v1/payment_intents/{intent}/_authenticate?success={str(success).lower()}",
            content=json.dumps(body),
        )

    def send_webhooks_to(self, url: str, secret: str = WEBHOOK_SECRET) -> None:
        """localstripe's own events (``payment_intent.*``) posted to ``url``, signed."""
        response = self._request(
            "POST",
            "/_config/webhooks/metering",
            data={"url": url, "secret": secret},
            headers={"Authorization": f"Bearer {SECRET_KEY}"},
        )
        assert response.status_code == 200, response.text


@contextmanager
def running_localstripe() -> Iterator[LocalStripe]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/js.stripe.com/v3/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("localstripe did not start") from None
                time.sleep(0.1)
        yield LocalStripe(base, process)
    finally:
        process.kill()
        process.wait(10)


def event(event_type: str, obj: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    """A Stripe event as Stripe sends it (the object as the API shows it)."""
    return {
        "id": event_id or f"evt_test_{time.monotonic_ns()}",
        "object": "event",
        "api_version": "2020-08-27",
        "created": int(time.time()),
        "livemode": False,
        "type": event_type,
        "data": {"object": obj},
    }


def sign(payload: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    """A ``Stripe-Signature`` header as Stripe writes it."""
    timestamp = int(time.time()) if at is None else at
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"
