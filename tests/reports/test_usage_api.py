"""``GET /v1/usage`` through the real app on SQLite and PostgreSQL, with usage recorded through
the real ingest route; every expected report is summed here from the events sent."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import Api
from tests.factories import (
    GLM_RATES,
    Key,
    assert_error,
    create_account,
    create_key,
    priced_model,
    put_model,
    unique,
)
from tests.reports.golden import (
    DAY,
    HOUR,
    PRICED_FROM,
    Pricing,
    Sent,
    expected_report,
    get_report,
    parse_exact,
    send_batch,
    send_usage,
    utc,
)

MICRO = timedelta(microseconds=1)


@dataclass
class Tenant:
    """An account with two keys and three models whose ids sort differently by bytes than
    case-insensitively (upper case sorts before lower case in ``COLLATE "C"``)."""

    account_id: str
    ci: Key
    prod: Key
    models: list[str]  # in byte order
    pricing: Pricing

    @property
    def key_names(self) -> dict[str, str]:
        return {self.ci.id: "ci", self.prod.id: "prod"}


def tenant(api: Api, billing: str = "prepaid") -> Tenant:
    tag = unique("m").removeprefix("m-")
    account_id = create_account(api, billing)
    ci = create_key(api, account_id, name="ci")
    prod = create_key(api, account_id, name="prod")
    rates = {
        f"Zeta-{tag}": GLM_RATES,
        f"alpha-{tag}": (1_000_000, 2_000_000, 100_000),
        f"beta-{tag}": (333_333, 777_777, 33_333),
    }
    models = [priced_model(api, PRICED_FROM, r, model_id=m) for m, r in rates.items()]
    assert models == sorted(models, key=str.encode) != sorted(models, key=str.lower)
    return Tenant(account_id, ci, prod, models, Pricing(rates, billed=billing == "prepaid"))


def scattered_usage(api: Api, t: Tenant, day: datetime) -> list[Sent]:
    """Usage over three days around ``day``, on both keys and all models, with events exactly on
    the edges of the days and hours."""
    zeta, alpha, beta = t.models
    specs = [
        (t.ci, zeta, day - MICRO, 5, 0, 5),  # the previous day's last instant
        (t.ci, zeta, day, 1200, 1000, 37),  # exactly on the boundary: this day
        (t.prod, zeta, day, 17, 6, 3),  # 6 × 17.75 = 106.5 µ¢: a half, rounded up
        (t.ci, alpha, day + timedelta(hours=1) - MICRO, 999, 998, 1),
        (t.prod, alpha, day + timedelta(hours=1), 4508, 4352, 20),
        (t.prod, beta, day + timedelta(hours=7, minutes=13), 3, 1, 1),
        (t.ci, beta, day + DAY - MICRO, 123_457, 0, 65_536),
        (t.ci, alpha, day + DAY, 2, 0, 0),  # the next day
        (t.prod, zeta, day + DAY + timedelta(hours=23), 1, 1, 1),
    ]
    sent = send_batch(api, t.pricing, specs)
    # zero tokens and a failed stream are requests too; other APIs normalise the same way
    sent.append(send_usage(api, t.pricing, t.prod, beta, day + timedelta(hours=2), 0, 0, 0))
    sent.append(
        send_usage(
            api, t.pricing, t.ci, zeta, day + timedelta(hours=3), 50, 40, 9, outcome="failed"
        )
    )
    sent.append(
        send_usage(
            api,
            t.pricing,
            t.ci,
            alpha,
            day + timedelta(hours=4),
            800,
            600,
            70,
            reasoning=60,
            api_name="messages",
        )
    )
    sent.append(
        send_usage(
            api,
            t.pricing,
            t.prod,
            alpha,
            day + timedelta(hours=4),
            80,
            60,
            7,
            reasoning=6,
            api_name="responses",
            model_as_sent=alpha.upper(),
        )
    )
    return sent


DAY0 = utc(2026, 11, 20)


class TestGoldenReports:
    @pytest.mark.parametrize("group_by", ["model", "api_key"])
    def test_daily(self, api: Api, group_by: str) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        start, end = DAY0 - DAY, DAY0 + 3 * DAY
        body = get_report(
            api,
            t.ci,
            starting_at="2026-11-19",
            ending_at="2026-11-23T00:00:00Z",
            group_by=group_by,
        )
        assert body == expected_report(sent, start, end, group_by=group_by, key_names=t.key_names)
        assert len(body["data"]) == 4 and body["data"][0]["requests"] == 1
        assert body["totals"]["requests"] == len(sent)

    @pytest.mark.parametrize("group_by", ["model", "api_key"])
    def test_hourly(self, api: Api, group_by: str) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        start, end = DAY0 - 2 * HOUR, DAY0 + 22 * HOUR
        body = get_report(
            api,
            t.prod,
            starting_at="2026-11-19T22:00:00Z",
            ending_at="2026-11-20T22:00:00Z",
            bucket_width="1h",
            group_by=group_by,
        )
        expected = expected_report(
            sent, start, end, bucket_width="1h", group_by=group_by, key_names=t.key_names
        )
        assert body == expected
        # an event at 01:00 is in the 01:00 bucket, one a microsecond earlier in the 00:00 one
        assert [b["requests"] for b in body["data"][:7]] == [0, 1, 3, 1, 1, 1, 2]

    def test_defaults_are_daily_by_model(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        body = get_report(api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22")
        assert body == expected_report(sent, DAY0, DAY0 + 2 * DAY)

    def test_money_is_written_exactly(self, api: Api) -> None:
        t = tenant(api)
        # 1 prompt token at 333,333 µ¢ per million is 0.333333 µ¢, rounded to 0; 3 output tokens
        # at 777,777 are 2.333331 µ¢, rounded to 2; plus the docs' GLM-5.3 example, 87,460 µ¢
        sent = [
            send_usage(api, t.pricing, t.ci, t.models[2], DAY0, 1, 0, 3),
            send_usage(api, t.pricing, t.ci, t.models[0], DAY0, 4508, 4352, 20, reasoning=16),
        ]
        assert [s.cost_microcents for s in sent] == [2, 87_460]
        response = api.as_key(
            t.ci.secret,
            "GET",
            "/v1/usage",
            params={"starting_at": "2026-11-20", "ending_at": "2026-11-21"},
        )
        text = response.text
        assert '"cost_usd":0.00087462,"cost_microcents":87462' in text  # totals, plain notation
        assert '"cost_usd":0.0008746,"cost_microcents":87460' in text
        assert '"cost_usd":0.00000002,"cost_microcents":2' in text
        assert parse_exact(text)["totals"]["cost_usd"] == Decimal("0.00087462")


class TestWindows:
    def test_a_window_without_usage_has_every_bucket(self, api: Api) -> None:
        t = tenant(api)
        scattered_usage(api, t, DAY0)
        body = get_report(api, t.ci, starting_at="2026-06-01", ending_at="2026-09-02")
        assert len(body["data"]) == 93
        assert body == expected_report([], utc(2026, 6, 1), utc(2026, 9, 2))
        zero = {"requests": 0, "input_tokens": 0, "cache_read_tokens": 0, "output_tokens": 0}
        assert body["totals"] == {**zero, "cost_usd": 0, "cost_microcents": 0}
        assert all(b["results"] == [] for b in body["data"])

    def test_93_daily_buckets_but_not_94(self, api: Api) -> None:
        t = tenant(api)
        first, last = utc(2026, 8, 1), utc(2026, 8, 1) + 92 * DAY
        sent = [send_usage(api, t.pricing, t.ci, t.models[0], at) for at in (first, last)]
        body = get_report(api, t.ci, starting_at="2026-08-01", ending_at="2026-11-02")
        assert body == expected_report(sent, first, last + DAY)
        assert body["data"][0]["requests"] == body["data"][92]["requests"] == 1
        response = api.as_key(
            t.ci.secret,
            "GET",
            "/v1/usage",
            params={"starting_at": "2026-08-01", "ending_at": "2026-11-03"},
        )
        assert_error(response, 400, "too_many_buckets", param="ending_at")

    def test_168_hourly_buckets_but_not_169(self, api: Api) -> None:
        t = tenant(api)
        first = utc(2026, 11, 1)
        sent = [
            send_usage(api, t.pricing, t.ci, t.models[0], at) for at in (first, first + 167 * HOUR)
        ]
        params = {"starting_at": "2026-11-01", "bucket_width": "1h", "group_by": "api_key"}
        body = get_report(api, t.ci, ending_at="2026-11-08", **params)
        assert len(body["data"]) == 168
        assert body == expected_report(
            sent,
            first,
            first + 168 * HOUR,
            bucket_width="1h",
            group_by="api_key",
            key_names=t.key_names,
        )
        response = api.as_key(
            t.ci.secret, "GET", "/v1/usage", params={**params, "ending_at": "2026-11-08T01:00:00Z"}
        )
        assert_error(response, 400, "too_many_buckets", param="ending_at")

    def test_offset_landing_on_a_boundary(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        body = get_report(
            api,
            t.ci,
            starting_at="2026-11-20T01:00:00+01:00",  # = 2026-11-20T00:00:00Z
            ending_at="2026-11-21T19:00:00-05:00",  # = 2026-11-22T00:00:00Z
        )
        assert body == expected_report(sent, DAY0, DAY0 + 2 * DAY)
        assert body["data"][0]["starting_at"] == "2026-11-20T00:00:00Z"
        response = api.as_key(
            t.ci.secret,
            "GET",
            "/v1/usage",
            params={"starting_at": "2026-11-20T00:00:00+01:00"},
        )
        assert_error(response, 400, "unaligned_timestamp", param="starting_at")

    def test_default_ending_at_is_the_end_of_the_current_bucket(self, api: Api) -> None:
        t = tenant(api)
        api.clock.set(utc(2026, 11, 25, 12, 34, 56))
        sent = [
            send_usage(api, t.pricing, t.ci, t.models[0], utc(2026, 11, 25, 12, 30)),
            send_usage(
                api, t.pricing, t.ci, t.models[0], utc(2026, 11, 25, 12, 38)
            ),  # 3 min ahead: fine
        ]
        hourly = get_report(api, t.ci, starting_at="2026-11-25T00:00:00Z", bucket_width="1h")
        assert hourly == expected_report(
            sent, utc(2026, 11, 25), utc(2026, 11, 25, 13), bucket_width="1h"
        )
        daily = get_report(api, t.ci, starting_at="2026-11-24")
        assert daily == expected_report(sent, utc(2026, 11, 24), utc(2026, 11, 26))

        api.clock.set(utc(2026, 11, 26))  # exactly on a boundary: a new bucket begins
        assert len(get_report(api, t.ci, starting_at="2026-11-24")["data"]) == 3
        hourly = get_report(api, t.ci, starting_at="2026-11-25T12:00:00Z", bucket_width="1h")
        assert hourly["data"][-1]["ending_at"] == "2026-11-26T01:00:00Z"
        assert len(hourly["data"]) == 13

        # the bucket limit applies to the default end too
        get_report(api, t.ci, starting_at="2026-08-26")
        response = api.as_key(t.ci.secret, "GET", "/v1/usage", params={"starting_at": "2026-08-25"})
        assert_error(response, 400, "too_many_buckets", param="starting_at")
        response = api.as_key(t.ci.secret, "GET", "/v1/usage", params={"starting_at": "2026-11-27"})
        assert_error(response, 400, "invalid_window", param="starting_at")


class TestFilters:
    def test_models_case_insensitive_and_repeatable(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        zeta, alpha, _ = t.models
        wanted = [s for s in sent if s.model in (zeta, alpha)]
        for group_by in ("model", "api_key"):  # 'model' rows, then 'key_model' rows
            body = get_report(
                api,
                t.ci,
                starting_at="2026-11-19",
                ending_at="2026-11-23",
                group_by=group_by,
                models=[zeta.lower(), alpha.upper(), "no-such-model"],
            )
            assert body == expected_report(
                wanted, DAY0 - DAY, DAY0 + 3 * DAY, group_by=group_by, key_names=t.key_names
            )

    def test_api_key_ids(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        wanted = [s for s in sent if s.key == t.prod]
        for group_by in ("api_key", "model"):  # 'key' rows, then 'key_model' rows
            body = get_report(
                api,
                t.ci,
                starting_at="2026-11-20T00:00:00Z",
                ending_at="2026-11-20T08:00:00Z",
                bucket_width="1h",
                group_by=group_by,
                api_key_ids=[t.prod.id, "key_doesnotexist"],
            )
            assert body == expected_report(
                wanted,
                DAY0,
                DAY0 + 8 * HOUR,
                bucket_width="1h",
                group_by=group_by,
                key_names=t.key_names,
            )

    def test_both_filters(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        wanted = [s for s in sent if s.key == t.ci and s.model == t.models[1]]
        for group_by in ("api_key", "model"):
            body = get_report(
                api,
                t.prod,
                starting_at="2026-11-20",
                ending_at="2026-11-22",
                group_by=group_by,
                api_key_ids=[t.ci.id],
                models=[t.models[1]],
            )
            assert body == expected_report(
                wanted, DAY0, DAY0 + 2 * DAY, group_by=group_by, key_names=t.key_names
            )
            assert body["totals"]["requests"] == 3

    def test_values_matching_nothing(self, api: Api) -> None:
        t = tenant(api)
        scattered_usage(api, t, DAY0)
        other = tenant(api)
        send_usage(api, other.pricing, other.ci, other.models[0], DAY0)
        for params in (
            {"models": ["no-such-model"]},
            {"models": [other.models[1]]},  # a real model this account never used
            {"api_key_ids": [other.ci.id]},  # another account's key
            {"api_key_ids": ["", "KEY_" + t.ci.id.removeprefix("key_")]},  # key ids are exact
            {"models": [""], "group_by": "api_key"},
        ):
            body = get_report(api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22", **params)
            assert body == expected_report(
                [], DAY0, DAY0 + 2 * DAY, group_by=params.get("group_by", "model")
            )


class TestHiddenModels:
    def test_hidden_models_are_merged_under_unavailable(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        zeta, alpha, beta = t.models
        for model in (zeta, beta):
            put_model(api, model, hidden=True)
        try:
            body = get_report(api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22")
            assert body == expected_report(sent, DAY0, DAY0 + 2 * DAY, hidden={zeta, beta})
            day = body["data"][0]["results"]
            assert [r["model"] for r in day] == [alpha, "unavailable"]
            raw = api.as_key(
                t.ci.secret,
                "GET",
                "/v1/usage",
                params={"starting_at": "2026-11-20", "ending_at": "2026-11-22"},
            ).text
            assert zeta not in raw and beta not in raw

            # the filter speaks the report's names: "unavailable" selects the hidden models
            filtered = get_report(
                api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22", models=["UNAVAILABLE"]
            )
            hidden_sent = [s for s in sent if s.model in (zeta, beta)]
            assert filtered == expected_report(
                hidden_sent, DAY0, DAY0 + 2 * DAY, hidden={zeta, beta}
            )
            by_key = get_report(
                api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22", group_by="api_key"
            )
            assert by_key == expected_report(
                sent, DAY0, DAY0 + 2 * DAY, group_by="api_key", key_names=t.key_names
            )
            # merged the same way from the key × model rows a key filter reads
            one_key = get_report(
                api,
                t.ci,
                starting_at="2026-11-20T00:00:00Z",
                ending_at="2026-11-21T00:00:00Z",
                bucket_width="1h",
                api_key_ids=[t.ci.id],
            )
            ci_sent = [s for s in sent if s.key == t.ci]
            assert one_key == expected_report(
                ci_sent, DAY0, DAY0 + DAY, bucket_width="1h", hidden={zeta, beta}
            )
        finally:
            for model in (zeta, beta):
                put_model(api, model, hidden=False)
        # "as the catalog says now": shown again once visible
        body = get_report(api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22")
        assert body == expected_report(sent, DAY0, DAY0 + 2 * DAY)


class TestBilling:
    @pytest.mark.parametrize("group_by", ["model", "api_key"])
    def test_unbilled_accounts_have_no_cost(self, api: Api, group_by: str) -> None:
        t = tenant(api, billing="unbilled")
        sent = scattered_usage(api, t, DAY0)
        assert all(s.cost_microcents == 0 for s in sent)
        body = get_report(
            api, t.ci, starting_at="2026-11-20", ending_at="2026-11-22", group_by=group_by
        )
        assert body["cost_status"] == "not_applicable"
        assert body == expected_report(
            sent, DAY0, DAY0 + 2 * DAY, group_by=group_by, billed=False, key_names=t.key_names
        )
        assert body["totals"]["cost_usd"] is None and body["totals"]["cost_microcents"] is None

    def test_totals_equal_buckets_equal_per_event_charges(self, api: Api) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        charges = sum(s.cost_microcents for s in sent)
        assert charges > 0
        for width, start, end in (
            ("1d", "2026-11-19", "2026-11-23"),
            ("1h", "2026-11-19T23:00:00Z", "2026-11-22T00:00:00Z"),
        ):
            for group_by in ("model", "api_key"):
                body = get_report(
                    api,
                    t.ci,
                    starting_at=start,
                    ending_at=end,
                    bucket_width=width,
                    group_by=group_by,
                )
                totals = body["totals"]
                assert totals["cost_microcents"] == charges
                assert totals["cost_usd"] == Decimal(charges) / 100_000_000
                assert sum(b["cost_microcents"] for b in body["data"]) == charges
                assert sum(b["cost_usd"] for b in body["data"]) == totals["cost_usd"]
                for bucket in body["data"]:
                    parts = bucket["results"]
                    assert sum(r["cost_microcents"] for r in parts) == bucket["cost_microcents"]
                    for measure in ("requests", "input_tokens", "output_tokens"):
                        assert sum(r[measure] for r in parts) == bucket[measure]
                assert totals["requests"] == len(sent)

    def test_revoked_keys_usage_is_still_reported(self, api: Api) -> None:
        t = tenant(api)
        sent = [send_usage(api, t.pricing, t.prod, t.models[0], DAY0)]
        assert api.admin("DELETE", f"/admin/v1/api-keys/{t.prod.id}").status_code == 200
        body = get_report(
            api, t.ci, starting_at="2026-11-20", ending_at="2026-11-21", group_by="api_key"
        )
        assert body == expected_report(
            sent, DAY0, DAY0 + DAY, group_by="api_key", key_names=t.key_names
        )
        response = api.as_key(
            t.prod.secret, "GET", "/v1/usage", params={"starting_at": "2026-11-20"}
        )
        assert_error(response, 401, "invalid_api_key")


class TestIsolation:
    def test_each_account_sees_only_its_own_usage(self, api: Api) -> None:
        a, b = tenant(api), tenant(api)
        sent_a = scattered_usage(api, a, DAY0)
        sent_b = scattered_usage(api, b, DAY0)
        for t, sent in ((a, sent_a), (b, sent_b)):
            for key in (t.ci, t.prod):
                for group_by in ("model", "api_key"):
                    for width, start, end in (
                        ("1d", DAY0 - DAY, DAY0 + 2 * DAY),
                        ("1h", DAY0, DAY0 + 24 * HOUR),
                    ):
                        body = get_report(
                            api,
                            key,
                            starting_at=start.isoformat(),
                            ending_at=end.isoformat(),
                            bucket_width=width,
                            group_by=group_by,
                        )
                        assert body == expected_report(
                            sent,
                            start,
                            end,
                            bucket_width=width,
                            group_by=group_by,
                            key_names=t.key_names,
                        )
        # a filter naming the other account's keys or models finds nothing
        body = get_report(
            api,
            a.ci,
            starting_at="2026-11-20",
            ending_at="2026-11-22",
            api_key_ids=[b.ci.id, b.prod.id],
        )
        assert body["totals"]["requests"] == 0


class TestCsv:
    @pytest.mark.parametrize("group_by", ["model", "api_key"])
    def test_csv_is_the_same_report(self, api: Api, group_by: str) -> None:
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        params = {
            "starting_at": "2026-11-19",
            "ending_at": "2026-11-23",
            "group_by": group_by,
        }
        response = api.as_key(t.ci.secret, "GET", "/v1/usage", params={**params, "format": "csv"})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "text/csv; charset=utf-8"
        assert "attachment" in response.headers["content-disposition"]
        rows = list(csv.DictReader(io.StringIO(response.text, newline="")))
        expected = expected_report(
            sent, DAY0 - DAY, DAY0 + 3 * DAY, group_by=group_by, key_names=t.key_names
        )
        wanted: list[dict[str, Any]] = []
        for bucket in expected["data"]:
            span = {"starting_at": bucket["starting_at"], "ending_at": bucket["ending_at"]}
            for result in bucket["results"] or [None]:
                row: dict[str, Any] = dict(span)
                if group_by == "model":
                    row["model"] = result["model"] if result else ""
                else:
                    row["api_key"] = result["api_key"] if result else ""
                    row["api_key_name"] = result["api_key_name"] if result else ""
                for measure in ("requests", "input_tokens", "cache_read_tokens", "output_tokens"):
                    row[measure] = str(result[measure]) if result else "0"
                cost = result["cost_microcents"] if result else 0
                usd = f"{Decimal(cost).scaleb(-8):f}".rstrip("0").rstrip(".") if cost else "0"
                row["cost_usd"] = usd if group_by == "model" else ""
                row["cost_microcents"] = str(cost)
                wanted.append(row)
        assert rows == wanted
        assert sum(int(r["cost_microcents"]) for r in rows) == sum(s.cost_microcents for s in sent)

    def test_csv_of_an_unbilled_account(self, api: Api) -> None:
        t = tenant(api, billing="unbilled")
        send_usage(api, t.pricing, t.ci, t.models[0], DAY0)
        response = api.as_key(
            t.ci.secret,
            "GET",
            "/v1/usage",
            params={"starting_at": "2026-11-20", "ending_at": "2026-11-21", "format": "csv"},
        )
        rows = list(csv.DictReader(io.StringIO(response.text, newline="")))
        assert len(rows) == 1
        assert (rows[0]["requests"], rows[0]["cost_usd"], rows[0]["cost_microcents"]) == (
            "1",
            "",
            "",
        )


BAD_PARAMETERS = [
    ({}, "missing_parameter", "starting_at"),
    ({"starting_at": ""}, "invalid_timestamp", "starting_at"),
    ({"starting_at": "last week"}, "invalid_timestamp", "starting_at"),
    ({"starting_at": "2026-11-31"}, "invalid_timestamp", "starting_at"),
    ({"starting_at": "2026-11-20T00:00:00"}, "invalid_timestamp", "starting_at"),
    ({"ending_at": "tomorrow"}, "invalid_timestamp", "ending_at"),
    ({"ending_at": "2026-11-21T00:00:00+25:00"}, "invalid_timestamp", "ending_at"),
    ({"bucket_width": "1w"}, "unsupported_value", "bucket_width"),
    ({"bucket_width": "1m"}, "unsupported_value", "bucket_width"),
    ({"group_by": "key"}, "unsupported_value", "group_by"),
    ({"group_by": "model,api_key"}, "unsupported_value", "group_by"),
    ({"format": "parquet"}, "unsupported_value", "format"),
    ({"starting_at": "2026-11-20T06:00:00Z"}, "unaligned_timestamp", "starting_at"),
    ({"ending_at": "2026-11-21T06:00:00Z"}, "unaligned_timestamp", "ending_at"),
    (
        {"bucket_width": "1h", "ending_at": "2026-11-20T06:30:00Z"},
        "unaligned_timestamp",
        "ending_at",
    ),
    ({"ending_at": "2026-11-20"}, "invalid_window", "ending_at"),
    ({"ending_at": "2026-11-19"}, "invalid_window", "ending_at"),
    ({"starting_at": "2026-01-01", "ending_at": "2026-12-01"}, "too_many_buckets", "ending_at"),
    ({"api_key_id": "key_x"}, "invalid_parameter", "api_key_id"),
    ({"model": "GLM-5.3"}, "invalid_parameter", "model"),
]


class TestErrors:
    @pytest.mark.parametrize(("params", "code", "param"), BAD_PARAMETERS)
    def test_bad_parameters(self, api: Api, params: dict[str, str], code: str, param: str) -> None:
        key = create_key(api, create_account(api))
        query = {"starting_at": "2026-11-20", **params} if params else {}
        response = api.as_key(key.secret, "GET", "/v1/usage", params=query)
        assert_error(response, 400, code, param=param)

    def test_repeated_single_parameter(self, api: Api) -> None:
        key = create_key(api, create_account(api))
        response = api.as_key(
            key.secret,
            "GET",
            "/v1/usage?starting_at=2026-11-20&starting_at=2026-11-21",
        )
        assert_error(response, 400, "invalid_parameter", param="starting_at")

    def test_credentials(self, api: Api) -> None:
        params = {"starting_at": "2026-11-20"}
        assert_error(api.client.get("/v1/usage", params=params), 401, "missing_api_key")
        assert_error(api.gateway("GET", "/v1/usage", params=params), 401, "invalid_api_key")
        assert_error(api.admin("GET", "/v1/usage", params=params), 401, "invalid_api_key")
        assert_error(
            api.as_key("mk_nope", "GET", "/v1/usage", params=params), 401, "invalid_api_key"
        )
        # credentials are checked before parameters: nothing is revealed to a stranger
        assert_error(api.client.get("/v1/usage"), 401, "missing_api_key")

    def test_x_api_key_header(self, api: Api) -> None:
        """The same report as with ``Authorization: Bearer``: the key's account, all its keys."""
        t = tenant(api)
        sent = scattered_usage(api, t, DAY0)
        params = {"starting_at": "2026-11-20", "ending_at": "2026-11-22"}
        response = api.client.get("/v1/usage", params=params, headers={"x-api-key": t.prod.secret})
        assert response.status_code == 200, response.text
        assert parse_exact(response.text) == expected_report(sent, DAY0, DAY0 + 2 * DAY)
