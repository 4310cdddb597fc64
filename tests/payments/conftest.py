"""Fixtures of the payment tests: localstripe as its own process, and the app per backend with
payments on and its Stripe API base pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from metering.audit.service import Auditor
from metering.payments.flows import Payments
from metering.states.payments import PaymentKind
from metering.usage.verify import verify
from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database, running_api
from tests.payments.localstripe import (
    PUBLISHABLE_KEY,
    SECRET_KEY,
    WEBHOOK_SECRET,
    LocalStripe,
    running_localstripe,
)


@pytest.fixture(scope="session")
def localstripe() -> Iterator[LocalStripe]:
    with running_localstripe() as server:
        yield server


def stripe_settings(server: LocalStripe) -> dict[str, Any]:
    return {
        "stripe_secret_key": SECRET_KEY,
        "stripe_publishable_key": PUBLISHABLE_KEY,
        "stripe_webhook_secret": WEBHOOK_SECRET,
        "stripe_api_base": server.base,
        "stripe_js_url": server.js_url,
    }


@dataclass
class Shop:
    """The app with payments on, localstripe, and the flows on the app's database and clock."""

    api: Api
    stripe: LocalStripe

    @property
    def payments(self) -> Payments:
        return Payments(self.api.database, self.api.settings, self.api.clock)

    def start(self, account_id: str, amount_cents: int) -> str:
        """A pending top-up of the account (as the portal starts one)."""
        from metering.payments.flows import create_payment

        with self.api.database.unit_of_work() as session:
            row = create_payment(
                session,
                account_id,
                PaymentKind.TOP_UP,
                amount_cents,
                self.api.clock.now(),
                Auditor(f"portal:{account_id}"),
            )
            session.commit()
        return str(row["id"])

    def new_card(self, account_id: str, payment_id: str, number: str) -> Any:
        """A card set up as Stripe.js would in the page: the SetupIntent's answer."""
        setup_id, client_secret = self.payments.setup_for(account_id, payment_id)
        return setup_id, self.stripe.confirm_card_setup(client_secret, number)


@pytest.fixture(scope="module", params=APP_BACKENDS)
def _shop_app(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    localstripe: LocalStripe,
) -> Iterator[Api]:
    tmp: Path = tmp_path_factory.mktemp("payments")
    with (
        migrated_database(request.param, tmp) as url,
        running_api(request.param, url, tmp, **stripe_settings(localstripe)) as api,
    ):
        yield api


def assert_verified(api: Api) -> None:
    """``metering verify``'s reconciliation finds nothing wrong (payments and grants included)."""
    with api.database.reading() as session:
        report = verify(session, api.clock.now())
    assert report.ok, report.mismatches


@pytest.fixture
def shop(_shop_app: Api, localstripe: LocalStripe) -> Iterator[Shop]:
    _shop_app.clock.set(NOW)
    yield Shop(_shop_app, localstripe)
    assert_verified(_shop_app)
    _shop_app.clock.set(NOW)
