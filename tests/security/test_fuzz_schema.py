"""Every route fuzzed from the service's own OpenAPI schema (schemathesis), in process, on each
backend, with the right credential for the route: the admin token under ``/admin/v1/``, the
gateway token on the gateway's routes, a real account key on ``/v1/usage``, ``/v1/credits`` and
``/v1/models``. Schema-valid and schema-violating requests alike must never get a 5xx, every
non-2xx answer is the error body of docs/api.md#conventions with a code and the response's request
id, and afterwards the books still reconcile (``metering verify``).

Some request schemas are loose on purpose (an ingest batch's events are any JSON: each event is
checked on its own), so half of the generated cases have their ids, keys and model swapped for
real ones, and their events merged into a valid event: those reach the service's rules instead
of stopping at "not found".

The schema must also say what the code enforces, in both directions: every answer's status and
content type is documented and every error body matches the documented error object; data that
violates the schema is refused (schemathesis' ``negative_data_rejection``); and data the schema
allows is never refused for its shape: a schema-valid request answered 400 must name one of the
rules JSON Schema cannot state (``STATED_ONLY_IN_CODE``: across fields, against stored state,
exact decimals). Integral floats (``5.0``), which JSON Schema counts as integers and the service
refuses (integers are JSON integers), are sent as integers in positive mode.

Budget: ``FUZZ_EXAMPLES`` cases per route and mode (positive, negative). Under CI the inputs are
derandomized (the same every run); elsewhere hypothesis draws new ones and keeps failures in its
example database, and a failure prints the request that caused it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database, running_api
from tests.factories import (
    authorize,
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.security.helpers import assert_books_reconcile, contract_problems

FUZZ_EXAMPLES = int(os.environ.get("METERING_FUZZ_EXAMPLES", "15"))
IN_CI = bool(os.environ.get("CI"))

GATEWAY_ROUTES = {
    ("POST", "/v1/authorizations"),
    ("DELETE", "/v1/authorizations/{authorization_id}"),
    ("POST", "/v1/usage/events"),
}
ACCOUNT_KEY_ROUTES = {
    "/v1/usage",
    "/v1/credits",
    "/v1/models",
    "/v1/api-keys",
    "/v1/projects",
    "/v1/members",
    "/v1/requests/{request_id}",
}
HOOK_URL = "https://11.22.33.44/hook"  # public for the address rules, never resolved


@dataclass
class Target:
    """The app with one of everything, so swapped-in ids name something real."""

    api: Api
    key_secret: str
    spare_key_id: str  # what fuzzed PATCH / DELETE of a key may change (not the key in use)
    values: dict[str, Any]  # path, query and body field name -> a real value
    event: dict[str, Any]  # a valid usage event

    def headers_for(self, method: str, path: str) -> dict[str, str]:
        if path.startswith("/admin/"):
            return dict(self.api.admin_headers)
        if (method, path) in GATEWAY_ROUTES:
            return dict(self.api.gateway_headers)
        if path in ACCOUNT_KEY_ROUTES or path.startswith("/v1/webhook-endpoints"):
            return {"Authorization": f"Bearer {self.key_secret}"}
        return {}


@pytest.fixture(scope="module", params=APP_BACKENDS)
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    with (
        migrated_database(request.param, tmp) as url,
        running_api(request.param, url, tmp) as api,
    ):
        account = create_account(api)
        key = create_key(api, account, limit_cents=10_000)
        spare = create_key(api, account)
        grant(api, account, 1_000_000)
        model = priced_model(api, NOW - timedelta(days=30))
        hold = authorize(api, key, model)
        assert hold.status_code == 200, hold.text
        recorded = usage_event(key, model, NOW - timedelta(hours=1))
        ingest(api, recorded, usage_event(key, "No-Such-Model", NOW - timedelta(hours=1)))
        quarantined = api.admin("GET", "/admin/v1/quarantine").json()["data"]
        hook = api.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={"url": HOOK_URL, "event_types": ["webhook.test"], "account_id": account},
        ).json()
        hook_event = api.admin("POST", f"/admin/v1/webhook-endpoints/{hook['id']}/test").json()
        member = api.admin(
            "POST", f"/admin/v1/accounts/{account}/members", json={"email": "fuzz@example.com"}
        ).json()["id"]
        project = "proj_" + account.removeprefix("acct_")
        values: dict[str, Any] = {
            "account_id": account,
            "key_id": spare.id,
            "model_id": model,
            "model": model,
            "authorization_id": hold.json()["id"],
            "request_id": recorded["request_id"],
            "api_key": key.secret,
            "api_key_ids": [key.id],
            "models": [model],
            "ids": [entry["id"] for entry in quarantined],
            "starting_at": "2026-11-01",
            "ending_at": "2026-12-01",
            "bucket_width": "1d",
            "amount_cents": 1,
            "effective_at": "2027-01-01T00:00:00Z",
            "prompt_tokens": 1000,
            "max_tokens": 100,
            "n": 1,
            "url": HOOK_URL,
            "endpoint_id": hook["id"],
            "event_id": hook_event["id"],
            "project_id": project,
            "member_id": member,
            "project_ids": [project],
            "member_ids": [member],
        }
        event = usage_event(key, model, NOW, chat_usage(1200, 300, cached=200, reasoning=50))
        yield Target(api, key.secret, spare.id, values, event)


def _with_real_values(case: Any, target: Target) -> None:
    """Swap generated ids for real ones, and merge generated events into a valid one."""
    for name in case.path_parameters or {}:
        if name in target.values:
            case.path_parameters[name] = target.values[name]
    if isinstance(case.query, dict):
        for name in case.query:
            if name in target.values:
                case.query[name] = target.values[name]
    body = case.body
    if isinstance(body, dict):
        for name in body:
            if name in target.values:
                body[name] = target.values[name]
        events = body.get("events")
        if isinstance(events, list):
            body["events"] = [
                {**target.event, **item, "request_id": f"fz-{index}-{id(item):x}"}
                if isinstance(item, dict)
                else item
                for index, item in enumerate(events[:50])
            ] or [dict(target.event)]


# Schema-valid requests may still be refused (400) by these rules only: (route or None for any,
# code, param or None, a text of the message). Each is a rule JSON Schema cannot state.
STATED_ONLY_IN_CODE = [
    (None, "invalid_parameter", "after", "not a cursor"),  # an opaque cursor this list returned
    (None, "invalid_parameter", None, "at most 6 decimals"),  # exact decimals, not binary floats
    (None, "invalid_timestamp", None, "not a valid timestamp"),  # e.g. year 0 once in UTC
    (("GET", "/v1/usage"), "unaligned_timestamp", None, ""),  # the window's rules
    (("GET", "/v1/usage"), "invalid_window", None, ""),
    (("GET", "/v1/usage"), "too_many_buckets", None, ""),
    (("POST", "/v1/authorizations"), "missing_parameter", "max_tokens", "messages"),
    (("POST", "/v1/authorizations"), "context_length_exceeded", None, ""),
    (("PUT", "/admin/v1/models/{model_id}"), "invalid_parameter", "max_output_tokens", "exceed"),
    (("PUT", "/admin/v1/models/{model_id}"), "invalid_parameter", "model_id", "reserved"),
    (("POST", "/admin/v1/accounts/{account_id}/rates"), "invalid_parameter", None, "all three"),
    # The older limit field with the newer ones; model lists against the catalog and the
    # account's own list (stored state).
    (None, "invalid_parameter", "monthly_spend_limit_cents", "cannot be sent with"),
    (None, "invalid_parameter", "allowed_models", ""),
    (None, "invalid_parameter", "models", "unknown model"),
    # A key's project and member, and a sign-in link's member, of the account and current
    # (stored state).
    (None, "invalid_parameter", "project_id", ""),
    (None, "invalid_parameter", "member_id", ""),
    # The account's Default project is never archived (stored state: which project it is).
    (("DELETE", "/admin/v1/projects/{project_id}"), "default_project", "project_id", ""),
    # a grant's expiry must be later than the clock's now
    (
        ("POST", "/admin/v1/accounts/{account_id}/grants"),
        "invalid_parameter",
        "expires_at",
        "later than now",
    ),
    # Webhook URLs: a URL the address rules refuse (a private address, no scheme).
    (None, "invalid_parameter", "url", ""),
    # An account key's endpoint may not take the operators' event types.
    (("POST", "/v1/webhook-endpoints"), "invalid_parameter", "event_types", "operators only"),
    (
        ("PATCH", "/v1/webhook-endpoints/{endpoint_id}"),
        "invalid_parameter",
        "event_types",
        "operators only",
    ),
    (
        ("POST", "/admin/v1/webhook-events/{event_id}/resend"),
        "invalid_parameter",
        "endpoint_id",
        "does not receive",
    ),
]


def _stated_only_in_code(operation: Any, error: dict[str, Any]) -> bool:
    route = (operation.method.upper(), operation.path)
    return any(
        where in (None, route)
        and error.get("code") == code
        and (param is None or error.get("param") == param)
        and text in str(error.get("message", ""))
        for where, code, param, text in STATED_ONLY_IN_CODE
    )


def _integers(value: Any) -> Any:
    """Integral floats as integers (JSON Schema's integers; the service's are JSON integers)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {name: _integers(item) for name, item in value.items()}
    if isinstance(value, list):
        return [_integers(item) for item in value]
    return value


def _schema_problems(case: Any, response: Any, mode: GenerationMode) -> list[str]:
    """What schemathesis' own checks say about the answer (documented status and content type,
    error bodies as documented, negative data refused)."""
    from schemathesis.specs.openapi import checks

    chosen = [
        checks.status_code_conformance,
        checks.content_type_conformance,
        checks.response_schema_conformance,
    ]
    if mode is GenerationMode.NEGATIVE:
        chosen.append(checks.negative_data_rejection)
    try:
        case.validate_response(response, checks=chosen)
    except BaseException as failures:  # a FailureGroup (an exception group) or one failure
        if isinstance(failures, KeyboardInterrupt):
            raise
        found = getattr(failures, "exceptions", [failures])
        return [str(failure).strip().splitlines()[0] for failure in found]
    return []


def _send(case: Any, target: Target) -> Any:
    """The case through the test client (a 5xx comes back as a response, not an exception)."""
    sent = case.as_transport_kwargs(base_url="http://testserver")
    headers = {
        name: value
        for name, value in (sent.get("headers") or {}).items()
        if name.lower() not in ("authorization", "x-api-key", "content-length")
    }
    headers.update(target.headers_for(case.method.upper(), case.path))
    content: bytes | None = None
    if "json" in sent:
        content = json.dumps(sent["json"]).encode()
        headers.setdefault("Content-Type", "application/json")
    elif sent.get("data") is not None:
        data = sent["data"]
        content = data.encode() if isinstance(data, str) else data
    path = sent["url"].removeprefix("http://testserver")
    return target.api.client.request(
        sent["method"], path, headers=headers, params=sent.get("params"), content=content
    )


def _fuzz(operation: Any, mode: GenerationMode, target: Target) -> str | None:
    """Run the budget of one operation in one mode; a description of the failure, or None."""

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=IN_CI,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        print_blob=True,
    )
    @given(case=operation.as_strategy(generation_mode=mode), real=st.booleans())
    def check(case: Any, real: bool) -> None:
        if real:
            _with_real_values(case, target)
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict | list):
            case.body = _integers(case.body)
        response = _send(case, target)
        problems = contract_problems(response) + _schema_problems(case, response, mode)
        if mode is GenerationMode.POSITIVE and response.status_code == 400:
            error = response.json()["error"]
            if not _stated_only_in_code(operation, error):
                problems.append(f"schema-valid data refused: {error['code']} {error['param']}")
        assert not problems, (
            f"{problems}\n{case.method.upper()} {case.formatted_path} query={case.query!r} "
            f"body={case.body!r}\n-> {response.status_code} {response.text[:500]}"
        )

    try:
        check()
    except Unsatisfiable:
        # Nothing of this operation can be made schema-invalid (say, only string path
        # parameters): its positive run covers it.
        if mode is GenerationMode.NEGATIVE:
            return None
        raise
    except AssertionError as error:
        return f"{operation.method.upper()} {operation.path} ({mode.value}): {error}"
    return None


def test_every_route_keeps_the_contract_under_fuzzing(target: Target) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", target.api.client.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    routes = {(op.method.upper(), op.path) for op in operations}
    # Every route of docs/api.md is in the schema, so every one of them is fuzzed.
    assert {
        ("POST", "/v1/authorizations"),
        ("POST", "/v1/usage/events"),
        ("GET", "/v1/usage"),
        ("GET", "/v1/credits"),
        ("GET", "/v1/models"),
        ("POST", "/admin/v1/accounts/{account_id}/grants"),
        ("POST", "/admin/v1/quarantine/reprocess"),
    } <= routes
    failures = [
        failure
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if (failure := _fuzz(operation, mode, target)) is not None
    ]
    assert not failures, "\n\n".join(failures)
    assert_books_reconcile(target.api)
