"""Every route fuzzed from the service's own OpenAPI schema (schemathesis), in process, on each
backend, with the right credential for the route: the admin token under ``/admin/v1/``, the
gateway token on the gateway's routes, a real account key on ``/v1/usage``, ``/v1/credits`` and
``/v1/models``. Schema-valid and schema-violating requests alike must never get a 5xx, every
non-2xx answer is the contract's error body (§1) with a code and the response's request id, and
afterwards the books still reconcile (``metering verify``).

Some request schemas are loose on purpose (an ingest batch's events are any JSON: each event is
checked on its own), so half of the generated cases have their ids, keys and model swapped for
real ones, and their events merged into a valid event: those reach the service's rules instead
of stopping at "not found".

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

from tests.conftest import BACKENDS, NOW, Api, migrated_database, running_api
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
ACCOUNT_KEY_ROUTES = {"/v1/usage", "/v1/credits", "/v1/models"}


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
        if path in ACCOUNT_KEY_ROUTES:
            return {"Authorization": f"Bearer {self.key_secret}"}
        return {}


@pytest.fixture(scope="module", params=BACKENDS)
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
        response = _send(case, target)
        problems = contract_problems(response)
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
    # Every route of the contract is in the schema, so every one of them is fuzzed.
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
