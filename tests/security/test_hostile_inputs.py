"""Hand-written hostile input, on both backends: what a fuzzer rarely composes on its own.

Integers past 64 bits, NaN and infinities, NUL characters and lone surrogates (legal in JSON,
unstorable in PostgreSQL, unencodable as UTF-8), nesting as deep as the parser takes, 10 MB and
oversized bodies, invalid UTF-8, absurd years, SQL metacharacters and unicode in ids, duplicate
keys, wrong content types. Each answer keeps the conventions (no 5xx, the error body), nothing
is half-written, and the books still reconcile. The NUL, surrogate, cursor, reprocess-id and
nesting cases are regression tests of 500s this suite found.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from metering.models import Account, QuarantinedEvent
from tests import oracle
from tests.conftest import NOW, Api
from tests.factories import (
    GLM_RATES,
    assert_error,
    authorization_request,
    chat_usage,
    create_account,
    create_key,
    credits_of,
    grant,
    ingest,
    priced_model,
    put_model,
    unique,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile, assert_contract_response

NUL = "\\u0000"  # as JSON text
SURROGATE = "\\ud800"
HUGE = 2**64 + 1
MIB = 1024 * 1024


def post_json(api: Api, path: str, text: str | bytes, headers: dict[str, str]) -> Any:
    """A raw JSON body (so NaN, duplicate keys and escapes arrive exactly as written)."""
    content = text.encode() if isinstance(text, str) else text
    return api.client.post(
        path, content=content, headers={**headers, "Content-Type": "application/json"}
    )


def account_count(api: Api) -> int:
    with api.database.unit_of_work() as session:
        return int(session.execute(select(func.count()).select_from(Account)).scalar_one())


@pytest.fixture
def setup(api: Api) -> dict[str, Any]:
    """A prepaid account with credit, a key and a priced model."""
    account = create_account(api)
    key = create_key(api, account)
    grant(api, account, 10_000)
    model = priced_model(api, NOW - timedelta(days=30))
    return {"account": account, "key": key, "model": model}


class TestUnstorableText:
    """NUL and lone surrogates: 400 naming the field where they would be stored or looked up."""

    @pytest.mark.parametrize("bad", [NUL, SURROGATE])
    @pytest.mark.parametrize(
        ("path", "template", "param"),
        [
            ("/admin/v1/accounts", '{"name": "a%sb"}', "name"),
            ("/admin/v1/accounts/{account}/api-keys", '{"name": "k%s"}', "name"),
            (
                "/admin/v1/accounts/{account}/grants",
                '{"amount_cents": 1, "idempotency_key": "g%s"}',
                "idempotency_key",
            ),
            (
                "/admin/v1/accounts/{account}/grants",
                '{"amount_cents": 1, "idempotency_key": "n1", "note": "%s"}',
                "note",
            ),
            (
                "/admin/v1/accounts/{account}/adjustments",
                '{"amount_cents": 1, "idempotency_key": "r1", "reason": "x%s"}',
                "reason",
            ),
            (
                "/admin/v1/accounts/{account}/rates",
                '{"model": "m%s", "effective_at": "2027-01-01T00:00:00Z", '
                '"input_microcents_per_million": 1, "output_microcents_per_million": 1, '
                '"cache_read_microcents_per_million": 1}',
                "model",
            ),
        ],
    )
    def test_admin_bodies(
        self, api: Api, setup: dict[str, Any], path: str, template: str, param: str, bad: str
    ) -> None:
        before = account_count(api)
        response = post_json(
            api, path.format(account=setup["account"]), template % bad, api.admin_headers
        )
        assert_error(response, 400, "invalid_parameter", param=param)
        assert account_count(api) == before
        assert credits_of(api, setup["key"])["balance_microcents"] == 10_000 * 1_000_000

    @pytest.mark.parametrize("bad", [NUL, SURROGATE])
    def test_model_metadata(self, api: Api, bad: str) -> None:
        for field in ("display_name", "owned_by"):
            body = f'{{"display_name": "d", "context_length": 10, "{field}": "x{bad}"}}'
            response = api.client.put(
                f"/admin/v1/models/{unique('M')}",
                content=body.encode(),
                headers={**api.admin_headers, "Content-Type": "application/json"},
            )
            assert_error(response, 400, "invalid_parameter", param=field)

    def test_key_rename(self, api: Api, setup: dict[str, Any]) -> None:
        response = api.client.patch(
            f"/admin/v1/api-keys/{setup['key'].id}",
            content=f'{{"name": "x{NUL}"}}'.encode(),
            headers={**api.admin_headers, "Content-Type": "application/json"},
        )
        assert_error(response, 400, "invalid_parameter", param="name")

    def test_authorization_model(self, api: Api, setup: dict[str, Any]) -> None:
        body = json.dumps(authorization_request(setup["key"], setup["model"]))
        response = post_json(
            api, "/v1/authorizations", body.replace(setup["model"], "m" + NUL), api.gateway_headers
        )
        assert_error(response, 400, "invalid_parameter", param="model")

    @pytest.mark.parametrize("bad", [NUL, SURROGATE])
    def test_a_client_key_that_is_no_text_is_just_an_invalid_key(
        self, api: Api, setup: dict[str, Any], bad: str
    ) -> None:
        body = json.dumps(authorization_request(setup["key"], setup["model"]))
        body = body.replace(setup["key"].secret, setup["key"].secret + bad)
        response = post_json(api, "/v1/authorizations", body, api.gateway_headers)
        assert_error(response, 401, "invalid_api_key", param="api_key")

    @pytest.mark.parametrize(
        ("method", "path", "param"),
        [
            ("GET", "/admin/v1/accounts/acct%00x", "account_id"),
            ("GET", "/admin/v1/accounts/acct%00x/ledger", "account_id"),
            ("GET", "/admin/v1/accounts/acct%00x/credits", "account_id"),
            ("GET", "/admin/v1/accounts/acct%00x/api-keys", "account_id"),
            ("DELETE", "/admin/v1/api-keys/key%00x", "key_id"),
            ("GET", "/admin/v1/models/m%00", "model_id"),
            ("GET", "/admin/v1/usage/events/r%00?account_id=a", "request_id"),
            ("GET", "/admin/v1/usage/events/r?account_id=a%00", "account_id"),
            ("GET", "/admin/v1/quarantine?account_id=%00", "account_id"),
            ("GET", "/admin/v1/authorizations?account_id=a%00b", "account_id"),
        ],
    )
    def test_admin_path_and_query(self, api: Api, method: str, path: str, param: str) -> None:
        assert_error(api.admin(method, path), 400, "invalid_parameter", param=param)

    def test_gateway_path(self, api: Api) -> None:
        response = api.gateway("DELETE", "/v1/authorizations/auth_%00")
        assert_error(response, 400, "invalid_parameter", param="authorization_id")

    @pytest.mark.parametrize("query", ["models=a%00", "api_key_ids=key_%00", "group_by=%00"])
    def test_report_filters(self, api: Api, setup: dict[str, Any], query: str) -> None:
        response = api.as_key(
            setup["key"].secret, "GET", f"/v1/usage?starting_at=2026-11-01&{query}"
        )
        assert_error(response, 400, "invalid_parameter", param=query.split("=")[0])

    @pytest.mark.parametrize("bad", [NUL, SURROGATE])
    def test_ingest_keeps_the_batch_and_every_event(
        self, api: Api, setup: dict[str, Any], bad: str
    ) -> None:
        """One event's unstorable ids never fail its batch: a key or model that is no text names
        nothing (quarantined, kept verbatim), a hold reference that is no text names no hold."""
        key, model = setup["key"], setup["model"]
        at = NOW - timedelta(minutes=5)
        events = [
            usage_event(key, model, at, api_key_id="PLACEHOLDER"),
            usage_event(key, "PLACEHOLDER", at),
            usage_event(key, model, at, authorization_id="PLACEHOLDER"),
            usage_event(key, model, at),
        ]
        text = json.dumps({"events": events}).replace("PLACEHOLDER", "x" + bad)
        response = post_json(api, "/v1/usage/events", text, api.gateway_headers)
        assert response.status_code == 200, response.text
        results = response.json()["data"]
        assert [r["status"] for r in results] == [
            "quarantined",
            "quarantined",
            "recorded",
            "recorded",
        ]
        assert [r["error"]["code"] for r in results[:2]] == ["unknown_api_key", "model_not_found"]
        for result in results[:2]:
            listed = api.admin(
                "GET", f"/admin/v1/quarantine?code={result['error']['code']}&limit=1000"
            )
            assert listed.status_code == 200, listed.text
            mine = [e for e in listed.json()["data"] if e["request_id"] == result["request_id"]]
            assert len(mine) == 1
            # Kept as sent, escape and all.
            assert "x" + json.loads(f'"{bad}"') in mine[0]["event"].values()
        # The two recorded events at the oracle's charge each (GLM-5.3's rates).
        charge = oracle.event_charge(events[3], GLM_RATES).total_microcents
        assert results[3]["charge"]["total_microcents"] == charge
        charged = credits_of(api, key)["balance_microcents"]
        assert charged == 10_000 * 1_000_000 - 2 * charge


class TestCursorsAndIds:
    """Pagination cursors and quarantine ids are client input too."""

    @staticmethod
    def cursor(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    @pytest.mark.parametrize(
        "path",
        [
            "/admin/v1/accounts",
            "/admin/v1/models",
            "/admin/v1/quarantine",
            "/admin/v1/authorizations",
            "/admin/v1/accounts/{account}/ledger",
            "/admin/v1/accounts/{account}/api-keys",
        ],
    )
    @pytest.mark.parametrize(
        "payload",
        [
            f"[{HUGE}]",
            f"[-{HUGE}]",
            f'["2026-11-29T12:00:00Z", {HUGE}]',
            '["a\\u0000"]',
            '["2026-11-29T12:00:00Z", "\\ud800"]',
            '["2026-11-29T12:00:00Z", "acct\\u0000"]',
            "[1.5]",
            "[true]",
            '[{"a": 1}]',
            "[null, null]",
        ],
    )
    def test_forged_cursors_are_400(
        self, api: Api, setup: dict[str, Any], path: str, payload: str
    ) -> None:
        response = api.admin(
            "GET", path.format(account=setup["account"]) + "?after=" + self.cursor(payload)
        )
        assert_error(response, 400, "invalid_parameter", param="after")

    def test_reprocess_ids_beyond_64_bits_are_unknown_ids(self, api: Api) -> None:
        for ids in ([HUGE], [-HUGE, 0, 2**63], [2**63 - 1]):
            response = api.admin("POST", "/admin/v1/quarantine/reprocess", json={"ids": ids})
            assert response.status_code == 200, response.text
            assert response.json()["data"] == []


def _in_fresh_thread(work: Any) -> Any:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result()


class TestNesting:
    @staticmethod
    def nested(depth: int) -> str:
        return '{"a": ' * depth + "1" + "}" * depth

    def test_the_deepest_event_the_parser_takes_can_be_listed_and_reprocessed(
        self, api: Api
    ) -> None:
        """Regression: listing re-parsed and re-encoded each stored event, recursing twice per
        level, so an event nested ~500 deep was stored fine and then broke the listing (500)
        for every page that held it. Stored events are now written verbatim."""
        request_id = unique("deep")
        accepted = None
        for depth in (960, 900, 800, 600):
            event = f'{{"request_id": "{request_id}-{depth}", "api_key_id": "key_none", "usage": '
            raw = f'{{"events": [{event}{self.nested(depth)}}}]}}'
            response = post_json(api, "/v1/usage/events", raw, api.gateway_headers)
            assert_contract_response(response)
            if response.status_code == 200:
                accepted = depth
                break
            assert_error(response, 400, "invalid_json_request")
        assert accepted is not None and accepted >= 600
        listed = api.admin("GET", "/admin/v1/quarantine?code=unknown_api_key&limit=1000")
        assert listed.status_code == 200, listed.text[:300]
        # The event comes back verbatim, as deep as it went in: deeper than this test's own
        # parser reaches from inside pytest's stack, so it reads the listing in a fresh thread.
        data = _in_fresh_thread(lambda: listed.json()["data"])
        (entry,) = [e for e in data if e["request_id"].startswith(request_id)]
        reprocessed = api.admin(
            "POST", "/admin/v1/quarantine/reprocess", json={"ids": [entry["id"]]}
        )
        assert reprocessed.status_code == 200, reprocessed.text[:300]
        assert reprocessed.json()["quarantined"] == 1

    def test_nesting_past_the_parser_is_a_json_error(self, api: Api) -> None:
        for path, headers in (
            ("/v1/usage/events", api.gateway_headers),
            ("/admin/v1/accounts", api.admin_headers),
        ):
            response = post_json(api, path, f'{{"x": {self.nested(100_000)}}}', headers)
            assert_error(response, 400, "invalid_json_request")


class TestHugeNumbers:
    @pytest.mark.parametrize(
        "number", [str(HUGE), str(-HUGE), "1e400", "-1e400", "NaN", "Infinity", "-Infinity"]
    )
    def test_money_inputs(self, api: Api, setup: dict[str, Any], number: str) -> None:
        account = setup["account"]
        for path, extra in (
            (f"/admin/v1/accounts/{account}/grants", ""),
            (f"/admin/v1/accounts/{account}/adjustments", ', "reason": "r"'),
        ):
            raw = f'{{"amount_cents": {number}, "idempotency_key": "{unique("h")}"{extra}}}'
            response = post_json(api, path, raw, api.admin_headers)
            assert_error(response, 400, "invalid_parameter", param="amount_cents")
        raw = f'{{"name": "k", "monthly_spend_limit_cents": {number}}}'
        response = post_json(api, f"/admin/v1/accounts/{account}/api-keys", raw, api.admin_headers)
        assert_error(response, 400, "invalid_parameter", param="monthly_spend_limit_cents")
        assert credits_of(api, setup["key"])["balance_microcents"] == 10_000 * 1_000_000

    @pytest.mark.parametrize("field", ["prompt_tokens", "max_tokens", "n"])
    @pytest.mark.parametrize("number", [str(HUGE), str(-HUGE), "NaN", "Infinity", "1e30"])
    def test_authorization_counts(
        self, api: Api, setup: dict[str, Any], field: str, number: str
    ) -> None:
        body = authorization_request(setup["key"], setup["model"], **{field: 7777777})
        raw = json.dumps(body).replace("7777777", number)
        response = post_json(api, "/v1/authorizations", raw, api.gateway_headers)
        assert_error(response, 400, "invalid_parameter", param=field)
        assert credits_of(api, setup["key"])["held_microcents"] == 0

    @pytest.mark.parametrize("number", [str(HUGE), str(-HUGE), "NaN", "-Infinity", "1e2", "1.5"])
    def test_usage_token_counts_are_invalid_usage(
        self, api: Api, setup: dict[str, Any], number: str
    ) -> None:
        event = usage_event(setup["key"], setup["model"], NOW, chat_usage(7777777, 1))
        raw = json.dumps({"events": [event]}).replace("7777777", number)
        response = post_json(api, "/v1/usage/events", raw, api.gateway_headers)
        assert response.status_code == 200, response.text
        (result,) = response.json()["data"]
        assert (result["status"], result["error"]["code"]) == ("quarantined", "invalid_usage")
        assert result["error"]["param"] == "usage.prompt_tokens"

    @pytest.mark.parametrize(
        ("path", "body", "param"),
        [
            (
                "/admin/v1/models/{model}/prices",
                {
                    "effective_at": "2027-01-01T00:00:00Z",
                    "input_microcents_per_million": HUGE,
                    "output_microcents_per_million": 1,
                    "cache_read_microcents_per_million": 1,
                },
                "input_microcents_per_million",
            ),
            (
                "/admin/v1/quarantine/reprocess",
                {"ids": [1.5]},
                "ids[0]",
            ),
        ],
    )
    def test_other_integers(
        self, api: Api, setup: dict[str, Any], path: str, body: dict[str, Any], param: str
    ) -> None:
        response = api.admin("POST", path.format(model=setup["model"]), json=body)
        assert_error(response, 400, "invalid_parameter", param=param)

    def test_model_limits_and_page_sizes(self, api: Api) -> None:
        response = api.admin(
            "PUT",
            f"/admin/v1/models/{unique('M')}",
            json={"display_name": "d", "context_length": HUGE},
        )
        assert_error(response, 400, "invalid_parameter", param="context_length")
        assert_error(
            api.admin("GET", f"/admin/v1/accounts?limit={HUGE}"),
            400,
            "invalid_parameter",
            param="limit",
        )


class TestBodies:
    def test_a_10_mb_batch_under_the_limit_is_recorded(
        self, api: Api, setup: dict[str, Any]
    ) -> None:
        """Unknown usage fields are ignored, however large: the event is billed."""
        event = usage_event(setup["key"], setup["model"], NOW)
        event["usage"]["padding"] = "x" * (10 * MIB)
        raw = json.dumps({"events": [event]}).encode()
        assert 10 * MIB < len(raw) < 16 * MIB
        response = post_json(api, "/v1/usage/events", raw, api.gateway_headers)
        assert response.status_code == 200, response.text[:300]
        assert response.json()["recorded"] == 1

    def test_a_10_mb_admin_body_is_refused_by_field(self, api: Api) -> None:
        before = account_count(api)
        raw = json.dumps({"name": "n" * (10 * MIB)})
        response = post_json(api, "/admin/v1/accounts", raw, api.admin_headers)
        assert_error(response, 400, "invalid_parameter", param="name")
        assert account_count(api) == before

    def test_over_16_mib_is_413_declared_or_chunked(self, api: Api, setup: dict[str, Any]) -> None:
        event = usage_event(setup["key"], setup["model"], NOW)
        event["usage"]["padding"] = "x" * (16 * MIB)
        raw = json.dumps({"events": [event]}).encode()
        declared = post_json(api, "/v1/usage/events", raw, api.gateway_headers)
        error = assert_error(declared, 413, "request_body_too_large")
        assert error["limit_bytes"] == 16 * MIB

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(raw), MIB):
                yield raw[start : start + MIB]

        chunked = api.client.post(
            "/v1/usage/events",
            content=chunks(),
            headers={**api.gateway_headers, "Content-Type": "application/json"},
        )
        assert_error(chunked, 413, "request_body_too_large")
        # Neither was recorded.
        assert credits_of(api, setup["key"])["balance_microcents"] == 10_000 * 1_000_000

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"name": "\xff\xfe"}',
            b'{"name": "\xc3\x28"}',
            b'{"name": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8: not UTF-8
            b"\xef\xbb\xbf" + b'{"name": "bom"}',
        ],
    )
    def test_invalid_utf8_is_a_json_error(self, api: Api, raw: bytes) -> None:
        before = account_count(api)
        assert_error(
            post_json(api, "/admin/v1/accounts", raw, api.admin_headers),
            400,
            "invalid_json_request",
        )
        assert account_count(api) == before

    @pytest.mark.parametrize(
        ("content_type", "body"),
        [
            ("text/plain", b'{"name": "typed"}'),
            ("application/x-www-form-urlencoded", b"name=typed"),
            (
                "multipart/form-data; boundary=x",
                b'--x\r\nContent-Disposition: form-data; name="name"\r\n\r\ntyped\r\n--x--\r\n',
            ),
            ("application/xml", b"<name>typed</name>"),
        ],
    )
    def test_wrong_content_types_create_nothing(
        self, api: Api, content_type: str, body: bytes
    ) -> None:
        before = account_count(api)
        response = api.client.post(
            "/admin/v1/accounts",
            content=body,
            headers={**api.admin_headers, "Content-Type": content_type},
        )
        assert_error(response, 400, "invalid_json_request")
        assert account_count(api) == before

    def test_duplicate_keys_the_last_one_wins_consistently(
        self, api: Api, setup: dict[str, Any]
    ) -> None:
        """Documented choice: as in every mainstream JSON parser, the last duplicate wins; the
        idempotency fingerprint sees the same value the ledger does."""
        account, key = setup["account"], setup["key"]
        path = f"/admin/v1/accounts/{account}/grants"
        first = post_json(
            api,
            path,
            '{"amount_cents": 5, "idempotency_key": "dup", "amount_cents": 7}',
            api.admin_headers,
        )
        assert first.status_code == 201, first.text
        assert first.json()["amount_microcents"] == 7_000_000
        again = post_json(
            api,
            path,
            '{"amount_cents": 7, "idempotency_key": "dup", "amount_cents": 7}',
            api.admin_headers,
        )
        assert again.status_code == 200, again.text
        swapped = post_json(
            api,
            path,
            '{"amount_cents": 7, "idempotency_key": "dup", "amount_cents": 5}',
            api.admin_headers,
        )
        assert_error(swapped, 409, "idempotency_conflict", param="idempotency_key")
        assert credits_of(api, key)["balance_microcents"] == (10_000 + 7) * 1_000_000


class TestTimestamps:
    @pytest.mark.parametrize(
        "occurred_at",
        [
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00+00:01",  # before year 1 in UTC
            "9999-12-31T23:59:59-00:01",  # after year 9999 in UTC
            "0000-01-01T00:00:00Z",
            "10000-01-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T12:00:00+24:00",
            "2026-11-29T12:00:00",
        ],
    )
    def test_absurd_occurred_at_is_quarantined(
        self, api: Api, setup: dict[str, Any], occurred_at: str
    ) -> None:
        event = {**usage_event(setup["key"], setup["model"], NOW), "occurred_at": occurred_at}
        (result,) = ingest(api, event)["data"]
        assert (result["status"], result["error"]["code"]) == ("quarantined", "invalid_timestamp")

    def test_year_one_is_billed_at_no_price_and_reported_for_unbilled(self, api: Api) -> None:
        model = put_model(api)
        prepaid = create_key(api, create_account(api))
        unbilled = create_key(api, create_account(api, billing="unbilled"))
        at = "0001-01-01T00:00:00Z"
        results = ingest(
            api,
            {**usage_event(prepaid, model, NOW), "occurred_at": at},
            {**usage_event(unbilled, model, NOW), "occurred_at": at},
        )["data"]
        assert results[0]["error"]["code"] == "price_not_found"
        assert results[1]["status"] == "recorded"
        report = api.as_key(
            unbilled.secret, "GET", "/v1/usage?starting_at=0001-01-01&ending_at=0001-01-03"
        )
        assert report.status_code == 200, report.text
        assert report.json()["totals"]["requests"] == 1
        csv = api.as_key(
            unbilled.secret,
            "GET",
            "/v1/usage?starting_at=0001-01-01&ending_at=0001-01-02&format=csv",
        )
        assert csv.status_code == 200 and "0001-01-01T00:00:00Z" in csv.text

    @pytest.mark.parametrize(
        ("query", "bucket"),
        [
            ("starting_at=9999-12-30&ending_at=9999-12-31", "9999-12-30T00:00:00Z"),
            (
                "starting_at=9999-12-31T22:00:00Z&ending_at=9999-12-31T23:00:00Z&bucket_width=1h",
                "9999-12-31T22:00:00Z",
            ),
            ("starting_at=0001-01-01&ending_at=0001-01-02", "0001-01-01T00:00:00Z"),
        ],
    )
    def test_report_windows_at_the_edges_of_time(
        self, api: Api, setup: dict[str, Any], query: str, bucket: str
    ) -> None:
        response = api.as_key(setup["key"].secret, "GET", f"/v1/usage?{query}")
        assert_contract_response(response)
        assert response.status_code == 200, response.text
        body = response.json()
        assert [b["starting_at"] for b in body["data"]] == [bucket]
        assert body["totals"]["requests"] == 0

    @pytest.mark.parametrize(
        ("query", "code"),
        [
            # ending_at defaults to the end of the day of now (NOW: 2026-11-29)
            ("starting_at=0001-01-01", "too_many_buckets"),
            ("starting_at=9999-12-31", "invalid_window"),
            ("starting_at=0000-01-01", "invalid_timestamp"),  # there is no year 0
            ("starting_at=2026-11-01T00:00:00%2B99:00", "invalid_timestamp"),
            # finer than the microsecond instants the service keeps
            ("starting_at=2026-11-01T00:00:00.0000000001Z", "invalid_timestamp"),
        ],
    )
    def test_report_windows_beyond_the_edges_of_time(
        self, api: Api, setup: dict[str, Any], query: str, code: str
    ) -> None:
        response = api.as_key(setup["key"].secret, "GET", f"/v1/usage?{query}")
        assert_error(response, 400, code, param="starting_at")

    def test_a_price_at_the_end_of_time(self, api: Api) -> None:
        model = put_model(api)
        body = {
            "effective_at": "9999-12-31T23:59:59.999999Z",
            "input_microcents_per_million": 1,
            "output_microcents_per_million": 1,
            "cache_read_microcents_per_million": 1,
        }
        assert api.admin("POST", f"/admin/v1/models/{model}/prices", json=body).status_code == 201
        assert_error(
            api.admin("POST", f"/admin/v1/models/{model}/prices", json=body),
            409,
            "price_history_immutable",
            param="effective_at",
        )
        for date in ("0001-01-01", "9999-12-31"):
            put = api.admin(
                "PUT",
                f"/admin/v1/models/{model}",
                json={"display_name": "d", "context_length": 10, "deprecation_date": date},
            )
            assert put.status_code == 200, put.text
            assert_contract_response(api.client.get("/v1/models"))


class TestInjection:
    """Ids, names and filters are data: quoted SQL and unicode are stored or matched verbatim."""

    HOSTILE = [
        "' OR '1'='1",
        "'; DROP TABLE accounts; --",
        '" OR ""="',
        "%' OR 1=1 --",
        "\\'; SELECT pg_sleep(5); --",
        "Robert'); DELETE FROM ledger_entries;--",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃ 中文 العربية",
        "a\u202eb",  # right-to-left override
        "*",
        "_",
    ]

    @pytest.mark.parametrize("hostile", HOSTILE)
    def test_names_are_stored_verbatim(self, api: Api, hostile: str) -> None:
        created = api.admin("POST", "/admin/v1/accounts", json={"name": hostile})
        assert created.status_code == 201, created.text
        account = created.json()["id"]
        assert api.admin("GET", f"/admin/v1/accounts/{account}").json()["name"] == hostile
        key = api.admin("POST", f"/admin/v1/accounts/{account}/api-keys", json={"name": hostile})
        assert key.status_code == 201 and key.json()["name"] == hostile
        entry = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/grants",
            json={"amount_cents": 1, "idempotency_key": hostile, "note": hostile},
        )
        assert entry.status_code == 201, entry.text
        assert entry.json()["note"] == hostile
        (stored,) = api.admin("GET", f"/admin/v1/accounts/{account}/ledger").json()["data"]
        assert (stored["idempotency_key"], stored["note"]) == (hostile, hostile)

    @pytest.mark.parametrize("hostile", HOSTILE)
    def test_ids_and_filters_match_nothing(
        self, api: Api, setup: dict[str, Any], hostile: str
    ) -> None:
        from urllib.parse import quote

        before = account_count(api)
        ingest(api, usage_event(setup["key"], setup["model"], NOW - timedelta(hours=1)))
        quoted = quote(hostile, safe="")
        for path in (
            f"/admin/v1/accounts/{quoted}",
            f"/admin/v1/accounts/{quoted}/ledger",
            f"/admin/v1/usage/events/{quoted}?account_id={quoted}",
            f"/admin/v1/models/{quoted}",
        ):
            response = api.admin("GET", path)
            assert_contract_response(response)
            assert response.status_code == 404, (path, response.text)
        assert api.gateway("DELETE", f"/v1/authorizations/{quoted}").status_code == 404
        for listing in ("authorizations", "quarantine"):
            response = api.admin("GET", f"/admin/v1/{listing}?account_id={quoted}")
            assert_contract_response(response)
            if response.status_code == 200:  # else 400: longer than any account id
                assert response.json()["data"] == [], response.text
        for name in ("models", "api_key_ids"):
            report = api.as_key(
                setup["key"].secret, "GET", f"/v1/usage?starting_at=2026-11-29&{name}={quoted}"
            )
            assert report.status_code == 200, report.text
            assert report.json()["totals"]["requests"] == 0
        unfiltered = api.as_key(setup["key"].secret, "GET", "/v1/usage?starting_at=2026-11-29")
        assert unfiltered.json()["totals"]["requests"] == 1
        assert account_count(api) == before

    def test_ingest_ids_are_data(self, api: Api, setup: dict[str, Any]) -> None:
        before = account_count(api)
        events = [
            {**usage_event(setup["key"], setup["model"], NOW), "api_key_id": hostile}
            for hostile in self.HOSTILE
        ] + [usage_event(setup["key"], hostile, NOW) for hostile in self.HOSTILE]
        body = ingest(api, *events)
        assert body["quarantined"] == len(events)
        with api.database.unit_of_work() as session:
            stored = session.execute(
                select(QuarantinedEvent.api_key_id).where(
                    QuarantinedEvent.api_key_id.in_(self.HOSTILE)
                )
            ).scalars()
            assert sorted(stored) == sorted(self.HOSTILE)
        assert account_count(api) == before


class TestCredentials:
    @pytest.mark.parametrize(
        "header",
        [
            {"Authorization": "Bearer " + "k" * 100_000},
            {"Authorization": b"Bearer \xff\xfe\x80"},
            {"Authorization": "Bearer ' OR '1'='1"},
            {"Authorization": "Bearer %00"},
            {"x-api-key": "mk_" + secrets.token_urlsafe(32)},
            {"x-api-key": "%00"},
        ],
    )
    def test_junk_credentials_are_401_everywhere(self, api: Api, header: dict[str, Any]) -> None:
        for method, path in (
            ("GET", "/v1/credits"),
            ("GET", "/v1/usage?starting_at=2026-11-01"),
            ("GET", "/v1/models"),
            ("GET", "/admin/v1/accounts"),
            ("POST", "/v1/usage/events"),
            ("DELETE", "/v1/authorizations/auth_x"),
        ):
            response = api.client.request(method, path, headers=header)
            assert_contract_response(response)
            assert response.status_code == 401, (method, path, response.text)

    @pytest.mark.parametrize(
        "header", [{"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"}]
    )
    def test_no_bearer_credential_is_no_credential(self, api: Api, header: dict[str, Any]) -> None:
        """Not a credential at all: 401 missing_api_key where one is required. On /v1/models,
        which answers list prices to a caller who sends no credential header, a header that holds
        no usable key is 401 invalid_api_key: the client meant to send a key, and list prices
        in its place would read as its own rates."""
        for method, path in (("GET", "/v1/credits"), ("GET", "/admin/v1/accounts")):
            assert_error(api.client.request(method, path, headers=header), 401, "missing_api_key")
        assert_error(api.client.get("/v1/models", headers=header), 401, "invalid_api_key")
        assert api.client.get("/v1/models").status_code == 200


def test_after_all_of_it_the_books_still_reconcile(api: Api, setup: dict[str, Any]) -> None:
    """``metering verify`` over everything the tests above sent (they run first) and, so that it
    checks something of its own when run alone, a hostile batch beside a real charge: the one
    billable event is charged exactly and the rest changes no balance or aggregate."""
    key, model = setup["key"], setup["model"]
    before = credits_of(api, key)["balance_microcents"]
    good = usage_event(key, model, NOW, chat_usage(1000, 100), request_id=unique("ok"))
    events: list[Any] = [
        good,
        {**good, "usage": chat_usage(1000, 101)},  # its request_id with other content
        usage_event(key, model, NOW, chat_usage(7777777, 1)),  # becomes 2**64 + 1 tokens
        {**usage_event(key, model, NOW), "occurred_at": "2026-02-30T00:00:00Z"},
        42,
    ]
    raw = json.dumps({"events": events}).replace("7777777", str(HUGE))
    response = post_json(api, "/v1/usage/events", raw, api.gateway_headers)
    assert response.status_code == 200, response.text
    body = response.json()
    results = body["data"]
    assert [(r["status"], (r["error"] or {}).get("code")) for r in results] == [
        ("recorded", None),
        ("quarantined", "idempotency_conflict"),
        ("quarantined", "invalid_usage"),
        ("quarantined", "invalid_timestamp"),
        ("rejected", "invalid_parameter"),
    ]
    assert (body["recorded"], body["quarantined"], body["rejected"]) == (1, 3, 1)
    # 1000 input tokens at 22,000,000 and 100 output at 339,000,000 microcents per million
    assert before - credits_of(api, key)["balance_microcents"] == 22_000 + 33_900
    assert_books_reconcile(api)
