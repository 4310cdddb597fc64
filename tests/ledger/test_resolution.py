"""The hot path resolves the price in force in its one SQL statement: list prices, an account's
effective-dated rates and the end of an override, each from its instant on (rates written out
here, per instant, from docs/api.md#catalog)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.conftest import NOW, Api
from tests.factories import GLM_RATES, add_price, assert_error, authorize, put_model
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


GLM = GLM_RATES[:2]
LIST_LATER = (3_000_000, 5_000_000)  # the list price from NOW + 2 h
OVERRIDE = (1_000_000, 2_000_000)  # the account's rate from NOW + 1 h, ended at NOW + 3 h
SECOND = (7_000_000, 11_000_000)  # its next rate, from NOW + 5 h
# Hours after NOW -> the (input, output) rates in force for the account with the overrides
# and for one without, each at the start of that hour; the instant before it has the previous
# row's rates (for hour 0: the list price since yesterday).
IN_FORCE = [
    (0, GLM, GLM),
    (1, OVERRIDE, GLM),
    (2, OVERRIDE, LIST_LATER),
    (3, LIST_LATER, LIST_LATER),  # the override ended: list prices again
    (4, LIST_LATER, LIST_LATER),
    (5, SECOND, LIST_LATER),
    (6, SECOND, LIST_LATER),
]


def test_the_hot_path_uses_the_price_in_force_at_every_instant(api: Api) -> None:
    hour = timedelta(hours=1)
    setup = prepaid(api, 10**6)  # list price (GLM) since yesterday
    add_price(api, setup.model, NOW + 2 * hour, (*LIST_LATER, 0))
    add_rate(api, setup.account, setup.model, NOW + hour, (*OVERRIDE, 0))
    add_rate(api, setup.account, setup.model, NOW + 3 * hour, (None, None, None))
    add_rate(api, setup.account, setup.model, NOW + 5 * hour, (*SECOND, 0))
    other = prepaid(api, 10**6)  # no override: list prices only
    expected: list[tuple[datetime, Any, tuple[int, int]]] = []
    before = (GLM, GLM)
    for hours, own, others in IN_FORCE:
        at = NOW + hours * hour
        expected += [(at - timedelta(microseconds=1), setup, before[0])]
        expected += [(at - timedelta(microseconds=1), other, before[1])]
        expected += [(at, setup, own), (at, other, others)]
        before = (own, others)
    for at, who, (input_rate, output_rate) in expected:
        api.clock.set(at)
        response = authorize(api, who.key, setup.model, prompt_tokens=1000, max_tokens=10)
        assert response.status_code == 200, (at, response.text)
        estimate = expected_estimate(1000, 10, (input_rate, output_rate, 0))
        assert response.json()["estimate_microcents"] == estimate, (at, who.account)


def test_a_model_without_a_price_in_force(api: Api) -> None:
    setup = prepaid(api, 1)
    model = put_model(api)
    add_price(api, model, NOW + timedelta(minutes=1))
    assert_error(authorize(api, setup.key, model), 404, "model_not_found", param="model")
    api.clock.set(NOW + timedelta(minutes=1))
    assert authorize(api, setup.key, model).status_code == 200
