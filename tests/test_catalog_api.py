"""The catalog and prices (docs/api.md#catalog) through the real app, on both backends: the public
model list, model metadata, effective-dated list prices and account rate overrides."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from metering.kit.timeutil import format_timestamp
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    assert_error,
    card_of,
    create_account,
    create_key,
    expect,
    priced_model,
    put_model,
    unique,
)

MICROSECOND = timedelta(microseconds=1)
OTHER_RATES = (30_000_000, 400_000_000, 20_000_000)
OVERRIDE_RATES = (11_000_000, 150_000_000, 8_875_000)


def rates_of(card: dict[str, Any] | None) -> tuple[int, int, int]:
    """The exact rates a card shows (microcents where given, else its whole cents)."""
    assert card is not None, "model not listed"
    pricing = card["wafer"]["pricing"]
    return (
        pricing.get("input_microcents_per_million", pricing["input_cents_per_million"] * 10**6),
        pricing.get("output_microcents_per_million", pricing["output_cents_per_million"] * 10**6),
        pricing["cache_read_microcents_per_million"],
    )


def price_body(at: datetime | str, rates: tuple[Any, Any, Any] = GLM_RATES) -> dict[str, Any]:
    return {
        "effective_at": at if isinstance(at, str) else format_timestamp(at),
        "input_microcents_per_million": rates[0],
        "output_microcents_per_million": rates[1],
        "cache_read_microcents_per_million": rates[2],
    }


def post_price(api: Api, model_id: str, at: datetime | str, rates: Any = GLM_RATES) -> Any:
    return api.admin("POST", f"/admin/v1/models/{model_id}/prices", json=price_body(at, rates))


def post_rate(
    api: Api, account_id: str, model_id: str, at: datetime | str, rates: Any = OVERRIDE_RATES
) -> Any:
    body = {"model": model_id, **price_body(at, rates)}
    return api.admin("POST", f"/admin/v1/accounts/{account_id}/rates", json=body)


def price_history(api: Api, model_id: str) -> list[tuple[str, int, int, int]]:
    response = api.admin("GET", f"/admin/v1/models/{model_id}")
    assert response.status_code == 200, response.text
    return [
        (
            v["effective_at"],
            v["input_microcents_per_million"],
            v["output_microcents_per_million"],
            v["cache_read_microcents_per_million"],
        )
        for v in response.json()["prices"]
    ]


class TestModelList:
    def test_exact_listing(self, fresh_api: Api) -> None:
        api = fresh_api
        month_ago = NOW - timedelta(days=30)
        priced_model(
            api,
            month_ago,
            model_id="alpha",
            display_name="Alpha",
            context_length=1_048_576,
            owned_by="zai",
        )
        priced_model(
            api,
            month_ago,
            (2_500_000, 1_499_999, 500_000),
            model_id="Beta",
            context_length=131_072,
            max_output_tokens=8192,
            reasoning_headroom_tokens=4096,
            deprecation_date="2026-11-30",
        )
        priced_model(api, month_ago, model_id="gamma-hidden", hidden=True)
        priced_model(api, month_ago, model_id="delta-retired", deprecation_date="2026-11-29")
        put_model(api, "epsilon-unpriced")
        priced_model(api, NOW + timedelta(hours=1), model_id="zeta-future")

        response = api.client.get("/v1/models")
        assert response.status_code == 200, response.text
        created = int(NOW.timestamp())
        assert response.json() == {
            "object": "list",
            "data": [
                {
                    "id": "Beta",
                    "object": "model",
                    "created": created,
                    "owned_by": "metering",
                    "max_model_len": 131_072,
                    "wafer": {
                        "display_name": "Beta",
                        "context_length": 131_072,
                        "max_output_tokens": 8192,
                        "deprecation_date": "2026-11-30",
                        "pricing": {
                            "currency": "usd",
                            "input_cents_per_million": 3,
                            "output_cents_per_million": 1,
                            "cache_read_cents_per_million": 1,
                            "cache_read_microcents_per_million": 500_000,
                            "input_microcents_per_million": 2_500_000,
                            "output_microcents_per_million": 1_499_999,
                        },
                    },
                },
                {
                    "id": "alpha",
                    "object": "model",
                    "created": created,
                    "owned_by": "zai",
                    "max_model_len": 1_048_576,
                    "wafer": {
                        "display_name": "Alpha",
                        "context_length": 1_048_576,
                        "max_output_tokens": None,
                        "pricing": {
                            "currency": "usd",
                            "input_cents_per_million": 22,
                            "output_cents_per_million": 339,
                            "cache_read_cents_per_million": 18,
                            "cache_read_microcents_per_million": 17_750_000,
                        },
                    },
                },
            ],
        }

        # The operators' list has every model, hidden, retired and unpriced ones included.
        admin = api.admin("GET", "/admin/v1/models", params={"limit": 4}).json()
        assert admin["has_more"] is True
        rest = api.admin("GET", "/admin/v1/models", params={"after": admin["next_cursor"]}).json()
        assert rest["has_more"] is False
        assert [m["id"] for m in admin["data"] + rest["data"]] == [
            "Beta",
            "alpha",
            "delta-retired",
            "epsilon-unpriced",
            "gamma-hidden",
            "zeta-future",
        ]

        # With a key and no override, the same list prices.
        key = create_key(api, create_account(api))
        assert api.as_key(key.secret, "GET", "/v1/models").json() == response.json()

    def test_created_is_now(self, api: Api) -> None:
        model_id = priced_model(api, NOW)
        api.clock.set(NOW + timedelta(days=2, seconds=1, microseconds=700_000))
        card = card_of(api, model_id)
        assert card is not None and card["created"] == int(NOW.timestamp()) + 2 * 86400 + 1

    @pytest.mark.parametrize(
        ("rate", "cents"),
        [
            (0, 0),
            (1, 0),
            (499_999, 0),
            (500_000, 1),
            (1_000_000, 1),
            (1_499_999, 1),
            (1_500_000, 2),
            (17_750_000, 18),
            (22_000_000, 22),
            (999_999_500_000, 1_000_000),
            (10**12, 1_000_000),
        ],
    )
    def test_cents_are_rounded_half_up(self, api: Api, rate: int, cents: int) -> None:
        model_id = priced_model(api, NOW, (rate, rate, rate))
        card = card_of(api, model_id)
        assert card is not None
        pricing = card["wafer"]["pricing"]
        assert pricing["input_cents_per_million"] == cents
        assert pricing["output_cents_per_million"] == cents
        assert pricing["cache_read_cents_per_million"] == cents
        assert pricing["cache_read_microcents_per_million"] == rate
        whole = rate % 1_000_000 == 0
        for field in ("input_microcents_per_million", "output_microcents_per_million"):
            assert (field in pricing) is not whole
            if not whole:
                assert pricing[field] == rate

    def test_hidden_models_are_not_listed(self, api: Api) -> None:
        model_id = priced_model(api, NOW, hidden=True)
        key = create_key(api, create_account(api))
        assert post_rate(api, key.account_id, model_id, NOW).status_code == 201
        assert card_of(api, model_id) is None
        assert card_of(api, model_id, key.secret) is None
        assert api.admin("GET", f"/admin/v1/models/{model_id}").json()["hidden"] is True
        put_model(api, model_id, hidden=False)
        assert card_of(api, model_id) is not None

    def test_retired_from_the_start_of_the_deprecation_date(self, api: Api) -> None:
        model_id = priced_model(api, NOW, deprecation_date="2026-12-01")
        card = card_of(api, model_id)
        assert card is not None and card["wafer"]["deprecation_date"] == "2026-12-01"
        api.clock.set(datetime.fromisoformat("2026-12-01T00:00:00+00:00") - MICROSECOND)
        assert card_of(api, model_id) is not None
        api.clock.set(datetime.fromisoformat("2026-12-01T00:00:00+00:00"))
        assert card_of(api, model_id) is None
        # Still in the operators' catalog.
        assert api.admin("GET", f"/admin/v1/models/{model_id}").status_code == 200

    def test_deprecation_date_only_when_set(self, api: Api) -> None:
        card = card_of(api, priced_model(api, NOW))
        assert card is not None and "deprecation_date" not in card["wafer"]

    def test_invalid_key_is_401(self, api: Api) -> None:
        assert_error(api.as_key("mk_nope", "GET", "/v1/models"), 401, "invalid_api_key")
        key = create_key(api, create_account(api))
        expect(api.admin("DELETE", f"/admin/v1/api-keys/{key.id}"), 200)
        assert_error(api.as_key(key.secret, "GET", "/v1/models"), 401, "invalid_api_key")
        response = api.client.get("/v1/models", headers={"x-api-key": key.secret})
        assert_error(response, 401, "invalid_api_key")

    @pytest.mark.parametrize(
        "headers",
        [
            {"Authorization": "Bearer "},
            {"Authorization": "Basic dXNlcjpwYXNz"},
            {"Authorization": ""},
            {"x-api-key": " "},
        ],
    )
    def test_a_credential_header_without_a_usable_key_is_401_not_list_prices(
        self, api: Api, headers: dict[str, str]
    ) -> None:
        assert_error(api.client.get("/v1/models", headers=headers), 401, "invalid_api_key")
        assert api.client.get("/v1/models").status_code == 200  # no header at all: list prices


class TestListPriceVersions:
    def test_version_in_force_on_half_open_interval(self, api: Api) -> None:
        model_id = put_model(api)
        day = NOW + timedelta(days=1)
        assert post_price(api, model_id, NOW).status_code == 201
        assert post_price(api, model_id, day, OTHER_RATES).status_code == 201

        api.clock.set(NOW - MICROSECOND)
        assert card_of(api, model_id) is None  # no price in force yet
        api.clock.set(NOW)
        assert rates_of(card_of(api, model_id)) == GLM_RATES
        api.clock.set(day - MICROSECOND)
        assert rates_of(card_of(api, model_id)) == GLM_RATES
        api.clock.set(day)
        assert rates_of(card_of(api, model_id)) == OTHER_RATES

        assert price_history(api, model_id) == [
            (format_timestamp(NOW), *GLM_RATES),
            (format_timestamp(day), *OTHER_RATES),
        ]

    def test_created_version_body(self, api: Api) -> None:
        model_id = put_model(api, unique("Case-Model"))
        response = post_price(api, model_id.upper(), "2026-11-30T01:00:00+01:00")
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["id"].startswith("price_")
        assert body == {
            "id": body["id"],
            "object": "price_version",
            "model": model_id,
            "effective_at": "2026-11-30T00:00:00Z",
            "input_microcents_per_million": GLM_RATES[0],
            "output_microcents_per_million": GLM_RATES[1],
            "cache_read_microcents_per_million": GLM_RATES[2],
            "created_at": "2026-11-29T12:00:00Z",
        }

    @pytest.mark.parametrize(
        "effective_at",
        [
            pytest.param(NOW - MICROSECOND, id="a-microsecond-ago"),
            pytest.param(NOW - timedelta(days=400), id="last-year"),
            pytest.param("2026-11-29T12:59:59+01:00", id="past-with-offset"),
        ],
    )
    def test_past_is_immutable(self, api: Api, effective_at: Any) -> None:
        model_id = priced_model(api, NOW - timedelta(days=10))
        before = price_history(api, model_id)
        response = post_price(api, model_id, effective_at, OTHER_RATES)
        assert_error(response, 409, "price_history_immutable", param="effective_at")
        assert price_history(api, model_id) == before

    def test_now_exactly_is_allowed(self, api: Api) -> None:
        model_id = put_model(api)
        assert post_price(api, model_id, "2026-11-29T13:00:00+01:00").status_code == 201
        assert rates_of(card_of(api, model_id)) == GLM_RATES

    def test_must_follow_the_newest_version(self, api: Api) -> None:
        model_id = put_model(api)
        newest = NOW + timedelta(days=7)
        assert post_price(api, model_id, newest).status_code == 201
        for at in (newest, newest - MICROSECOND, NOW + timedelta(days=1)):
            response = post_price(api, model_id, at, OTHER_RATES)
            assert_error(response, 409, "price_history_immutable", param="effective_at")
        assert post_price(api, model_id, newest + MICROSECOND, OTHER_RATES).status_code == 201
        assert [v[0] for v in price_history(api, model_id)] == [
            format_timestamp(newest),
            format_timestamp(newest + MICROSECOND),
        ]

    def test_unknown_model_is_404(self, api: Api) -> None:
        response = post_price(api, unique("no-such-model"), NOW)
        assert_error(response, 404, "model_not_found", param="model")

    @pytest.mark.parametrize(
        ("field", "value", "code"),
        [
            ("input_microcents_per_million", -1, "invalid_parameter"),
            ("output_microcents_per_million", 1.5, "invalid_parameter"),
            ("output_microcents_per_million", 2.0, "invalid_parameter"),
            ("cache_read_microcents_per_million", 10**12 + 1, "invalid_parameter"),
            ("cache_read_microcents_per_million", 2**63, "invalid_parameter"),
            ("input_microcents_per_million", "5", "invalid_parameter"),
            ("input_microcents_per_million", True, "invalid_parameter"),
            ("input_microcents_per_million", None, "invalid_parameter"),
            ("input_microcents_per_million", ..., "missing_parameter"),
            ("effective_at", ..., "missing_parameter"),
            ("effective_at", "yesterday", "invalid_timestamp"),
            ("effective_at", "2026-12-01T00:00:00", "invalid_timestamp"),
            ("effective_at", "2026-12-01", "invalid_timestamp"),
            ("effective_at", "2026-13-01T00:00:00Z", "invalid_timestamp"),
            ("effective_at", 1795953600, "invalid_parameter"),
            ("currency", "usd", "invalid_parameter"),
        ],
    )
    def test_validation(self, api: Api, field: str, value: Any, code: str) -> None:
        model_id = put_model(api)
        body = price_body(NOW + timedelta(hours=1))
        if value is ...:
            del body[field]
        else:
            body[field] = value
        response = api.admin("POST", f"/admin/v1/models/{model_id}/prices", json=body)
        assert_error(response, 400, code, param=field)
        assert price_history(api, model_id) == []

    def test_rate_bounds_accepted(self, api: Api) -> None:
        model_id = put_model(api)
        assert post_price(api, model_id, NOW, (0, 10**12, 0)).status_code == 201
        assert rates_of(card_of(api, model_id)) == (0, 10**12, 0)


class TestAccountRates:
    def test_override_applies_to_that_account_only(self, api: Api) -> None:
        model_id = priced_model(api, NOW - timedelta(days=1))
        untouched = priced_model(api, NOW - timedelta(days=1))
        mine, theirs = create_key(api, create_account(api)), create_key(api, create_account(api))
        colleague = create_key(api, mine.account_id)

        response = post_rate(api, mine.account_id, model_id.lower(), NOW)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["id"].startswith("rate_")
        assert body == {
            "id": body["id"],
            "object": "account_rate",
            "account_id": mine.account_id,
            "model": model_id,
            "effective_at": "2026-11-29T12:00:00Z",
            "input_microcents_per_million": OVERRIDE_RATES[0],
            "output_microcents_per_million": OVERRIDE_RATES[1],
            "cache_read_microcents_per_million": OVERRIDE_RATES[2],
            "created_at": "2026-11-29T12:00:00Z",
        }

        assert rates_of(card_of(api, model_id, mine.secret)) == OVERRIDE_RATES
        assert rates_of(card_of(api, model_id, colleague.secret)) == OVERRIDE_RATES
        assert rates_of(card_of(api, model_id, theirs.secret)) == GLM_RATES
        assert rates_of(card_of(api, model_id)) == GLM_RATES
        assert rates_of(card_of(api, untouched, mine.secret)) == GLM_RATES
        card = card_of(api, model_id, mine.secret)
        assert card is not None
        assert card["wafer"]["pricing"]["input_cents_per_million"] == 11
        assert card["wafer"]["pricing"]["cache_read_cents_per_million"] == 9  # 8.875 → 9

    def test_override_versions_and_all_null_end(self, api: Api) -> None:
        model_id = priced_model(api, NOW - timedelta(days=1))
        key = create_key(api, create_account(api))
        start, end = NOW + timedelta(hours=1), NOW + timedelta(hours=2)
        assert post_rate(api, key.account_id, model_id, start).status_code == 201
        ended = post_rate(api, key.account_id, model_id, end, (None, None, None))
        assert ended.status_code == 201, ended.text
        assert ended.json()["input_microcents_per_million"] is None
        # The list price changes while the override is in force.
        assert (
            post_price(api, model_id, start + timedelta(minutes=30), OTHER_RATES).status_code == 201
        )

        for at, expected in [
            (start - MICROSECOND, GLM_RATES),
            (start, OVERRIDE_RATES),
            (end - MICROSECOND, OVERRIDE_RATES),
            (end, OTHER_RATES),  # list prices again, as they now stand
            (end + timedelta(days=30), OTHER_RATES),
        ]:
            api.clock.set(at)
            assert rates_of(card_of(api, model_id, key.secret)) == expected, at
            assert rates_of(card_of(api, model_id)) == (
                GLM_RATES if at < start + timedelta(minutes=30) else OTHER_RATES
            )

        # A new override after the end applies again.
        api.clock.set(end + timedelta(days=1))
        assert post_rate(api, key.account_id, model_id, api.clock.now()).status_code == 201
        assert rates_of(card_of(api, model_id, key.secret)) == OVERRIDE_RATES

    @pytest.mark.parametrize(
        ("rates", "param"),
        [
            ((None, 1, 1), "output_microcents_per_million"),
            ((1, None, 1), "output_microcents_per_million"),
            ((1, 1, None), "cache_read_microcents_per_million"),
            ((None, None, 1), "cache_read_microcents_per_million"),
        ],
    )
    def test_partial_nulls_are_400(self, api: Api, rates: Any, param: str) -> None:
        model_id = priced_model(api, NOW)
        key = create_key(api, create_account(api))
        response = post_rate(api, key.account_id, model_id, NOW, rates)
        assert_error(response, 400, "invalid_parameter", param=param)
        assert rates_of(card_of(api, model_id, key.secret)) == GLM_RATES

    def test_history_is_immutable(self, api: Api) -> None:
        model_id = priced_model(api, NOW - timedelta(days=1))
        key = create_key(api, create_account(api))
        response = post_rate(api, key.account_id, model_id, NOW - MICROSECOND)
        assert_error(response, 409, "price_history_immutable", param="effective_at")
        newest = NOW + timedelta(days=3)
        assert post_rate(api, key.account_id, model_id, newest).status_code == 201
        for at in (newest, newest - timedelta(hours=1)):
            response = post_rate(api, key.account_id, model_id, at, (None, None, None))
            assert_error(response, 409, "price_history_immutable", param="effective_at")
        # Versions are per account: another account may start earlier.
        other = create_account(api)
        assert post_rate(api, other, model_id, NOW).status_code == 201

    def test_unknown_account_and_model(self, api: Api) -> None:
        model_id = priced_model(api, NOW)
        response = post_rate(api, "acct_nope", model_id, NOW)
        assert_error(response, 404, "not_found", param="account_id")
        response = post_rate(api, create_account(api), unique("no-such-model"), NOW)
        assert_error(response, 404, "model_not_found", param="model")

    @pytest.mark.parametrize(
        ("field", "value", "code"),
        [
            ("model", ..., "missing_parameter"),
            ("model", "", "invalid_parameter"),
            ("effective_at", "soon", "invalid_timestamp"),
            ("input_microcents_per_million", -5, "invalid_parameter"),
            ("output_microcents_per_million", 0.5, "invalid_parameter"),
            ("account_id", "acct_x", "invalid_parameter"),
        ],
    )
    def test_validation(self, api: Api, field: str, value: Any, code: str) -> None:
        model_id = priced_model(api, NOW)
        account_id = create_account(api)
        body = {"model": model_id, **price_body(NOW, OVERRIDE_RATES)}
        if value is ...:
            del body[field]
        else:
            body[field] = value
        response = api.admin("POST", f"/admin/v1/accounts/{account_id}/rates", json=body)
        assert_error(response, 400, code, param=field)


class TestPutModel:
    def test_create_then_replace(self, api: Api) -> None:
        model_id = unique("Mixed-Case")
        spec = {
            "display_name": "Mixed",
            "owned_by": "acme",
            "context_length": 200_000,
            "max_output_tokens": 200_000,
            "reasoning_headroom_tokens": 8192,
            "hidden": True,
            "deprecation_date": "2027-03-01",
        }
        created = api.admin("PUT", f"/admin/v1/models/{model_id}", json=spec)
        assert created.status_code == 201, created.text
        assert created.json() == {
            "id": model_id,
            "object": "model",
            **spec,
            "created_at": "2026-11-29T12:00:00Z",
            "updated_at": "2026-11-29T12:00:00Z",
        }

        # Another spelling names the same model: replaced (200), catalog spelling kept. A PUT is
        # the whole metadata, so omitted fields take their defaults.
        api.clock.advance(hours=1)
        replaced = api.admin(
            "PUT",
            f"/admin/v1/models/{model_id.upper()}",
            json={"display_name": "Renamed", "context_length": 100_000},
        )
        assert replaced.status_code == 200, replaced.text
        assert replaced.json() == {
            "id": model_id,
            "object": "model",
            "display_name": "Renamed",
            "owned_by": "metering",
            "context_length": 100_000,
            "max_output_tokens": None,
            "reasoning_headroom_tokens": 0,
            "hidden": False,
            "deprecation_date": None,
            "created_at": "2026-11-29T12:00:00Z",
            "updated_at": "2026-11-29T13:00:00Z",
        }
        fetched = api.admin("GET", f"/admin/v1/models/{model_id.lower()}")
        assert fetched.status_code == 200 and fetched.json()["id"] == model_id
        assert post_price(api, model_id.lower(), api.clock.now()).status_code == 201
        card = card_of(api, model_id)
        assert card is not None and card["wafer"]["display_name"] == "Renamed"

    @pytest.mark.parametrize(
        ("model_id", "body", "code", "param"),
        [
            ("{new}", {"max_output_tokens": 131_073}, "invalid_parameter", "max_output_tokens"),
            ("unavailable", {}, "invalid_parameter", "model_id"),
            ("UnAvailable", {}, "invalid_parameter", "model_id"),
            ("bad id", {}, "invalid_parameter", "model_id"),
            ("a*b", {}, "invalid_parameter", "model_id"),
            ("-leading-dash", {}, "invalid_parameter", "model_id"),
            ("é-accent", {}, "invalid_parameter", "model_id"),
            ("x" * 101, {}, "invalid_parameter", "model_id"),
            ("{new}", {"context_length": 0}, "invalid_parameter", "context_length"),
            ("{new}", {"context_length": "5"}, "invalid_parameter", "context_length"),
            ("{new}", {"context_length": 2**31}, "invalid_parameter", "context_length"),
            ("{new}", {"context_length": ...}, "missing_parameter", "context_length"),
            ("{new}", {"display_name": ...}, "missing_parameter", "display_name"),
            ("{new}", {"max_output_tokens": 0}, "invalid_parameter", "max_output_tokens"),
            (
                "{new}",
                {"reasoning_headroom_tokens": -1},
                "invalid_parameter",
                "reasoning_headroom_tokens",
            ),
            ("{new}", {"hidden": "yes"}, "invalid_parameter", "hidden"),
            ("{new}", {"deprecation_date": "soon"}, "invalid_parameter", "deprecation_date"),
            ("{new}", {"prices": []}, "invalid_parameter", "prices"),
        ],
    )
    def test_validation(
        self, api: Api, model_id: str, body: dict[str, Any], code: str, param: str
    ) -> None:
        model_id = unique("new") if model_id == "{new}" else model_id
        spec = {"display_name": "x", "context_length": 131_072, **body}
        spec = {name: value for name, value in spec.items() if value is not ...}
        response = api.admin("PUT", f"/admin/v1/models/{model_id}", json=spec)
        assert_error(response, 400, code, param=param)
        response = api.admin("GET", f"/admin/v1/models/{model_id}")
        assert_error(response, 404, "model_not_found", param="model")  # nothing was created

    def test_output_limit_may_equal_the_context(self, api: Api) -> None:
        model_id = unique("eq")
        spec = {"display_name": "x", "context_length": 4096, "max_output_tokens": 4096}
        response = api.admin("PUT", f"/admin/v1/models/{model_id}", json=spec)
        assert response.status_code == 201, response.text
        stored = api.admin("GET", f"/admin/v1/models/{model_id}")
        assert stored.status_code == 200, stored.text
        for body in (response.json(), stored.json()):
            assert (body["context_length"], body["max_output_tokens"]) == (4096, 4096), body

    def test_unknown_model_is_404(self, api: Api) -> None:
        response = api.admin("GET", f"/admin/v1/models/{unique('nope')}")
        assert_error(response, 404, "model_not_found", param="model")


def test_catalog_admin_routes_need_the_admin_token(api: Api) -> None:
    model_id = priced_model(api, NOW)
    account_id = create_account(api)
    key = create_key(api, account_id)
    calls = [
        ("PUT", f"/admin/v1/models/{model_id}", {"display_name": "x", "context_length": 8}),
        ("GET", "/admin/v1/models", None),
        ("GET", f"/admin/v1/models/{model_id}", None),
        ("POST", f"/admin/v1/models/{model_id}/prices", price_body(NOW + timedelta(days=1))),
        ("POST", f"/admin/v1/accounts/{account_id}/rates", {"model": model_id, **price_body(NOW)}),
    ]
    for method, path, body in calls:
        assert_error(api.client.request(method, path, json=body), 401, "missing_api_key")
        for token in ("nope", key.secret, api.gateway_headers["Authorization"].split()[1]):
            assert_error(api.as_key(token, method, path, json=body), 401, "invalid_api_key")
    assert price_history(api, model_id) == [(format_timestamp(NOW), *GLM_RATES)]
    assert rates_of(card_of(api, model_id, key.secret)) == GLM_RATES
    assert api.admin("GET", f"/admin/v1/models/{model_id}").json()["context_length"] == 131_072
