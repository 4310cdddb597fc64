"""The hot path resolves the price in force in its one SQL statement; it must give the same answer
as ``catalog.service.price_in_force`` (the rule's reference implementation) at every instant."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from metering.catalog.service import price_in_force
from tests.conftest import NOW, Api
from tests.factories import add_price, authorize, put_model
from tests.ledger.helpers import expected_estimate, prepaid


def add_rate(api: Api, account: str, model: str, at: datetime, rates: Any) -> None:
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/rates",
        json={
            "model": model,
            "effective_at": at.isoformat(),
            "input_microcents_per_million": rates[0],
            "output_microcents_per_million": rates[1],
            "cache_read_microcents_per_million": rates[2],
        },
    )
    assert response.status_code == 201, response.text


def test_the_hot_path_agrees_with_price_in_force(api: Api) -> None:
    hour = timedelta(hours=1)
    setup = prepaid(api, 10**6)  # list price (GLM) since yesterday
    add_price(api, setup.model, NOW + 2 * hour, (3_000_000, 5_000_000, 0))
    add_rate(api, setup.account, setup.model, NOW + hour, (1_000_000, 2_000_000, 0))
    add_rate(api, setup.account, setup.model, NOW + 3 * hour, (None, None, None))
    add_rate(api, setup.account, setup.model, NOW + 5 * hour, (7_000_000, 11_000_000, 0))
    other = prepaid(api, 10**6)  # no override: list prices only
    instants = [
        NOW + k * hour + delta
        for k in range(7)
        for delta in (timedelta(0), -timedelta(microseconds=1))
    ]
    seen = set()
    for at in instants:
        api.clock.set(at)
        for who in (setup, other):
            with api.database.unit_of_work() as session:
                price = price_in_force(session, setup.model, at, who.account)
            assert price is not None
            rates = (
                price.rates.input_microcents_per_million,
                price.rates.output_microcents_per_million,
                0,
            )
            response = authorize(api, who.key, setup.model, prompt_tokens=1000, max_tokens=10)
            assert response.status_code == 200, (at, response.text)
            assert response.json()["estimate_microcents"] == expected_estimate(1000, 10, rates), at
            seen.add(rates)
    # GLM, then the override, the new list price (for the other account, then for this one
    # once its override ends), and the second override.
    assert len(seen) == 4


def test_a_model_without_a_price_in_force(api: Api) -> None:
    setup = prepaid(api, 1)
    model = put_model(api)
    add_price(api, model, NOW + timedelta(minutes=1))
    with api.database.unit_of_work() as session:
        assert price_in_force(session, model, NOW, setup.account) is None
    assert authorize(api, setup.key, model).status_code == 404
    api.clock.set(NOW + timedelta(minutes=1))
    assert authorize(api, setup.key, model).status_code == 200
