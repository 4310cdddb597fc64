"""What every response of the service must look like, whatever it was sent
(docs/api.md#conventions)."""

from __future__ import annotations

import json
from typing import Any

from metering.usage.verify import verify
from tests.conftest import Api
from tests.factories import ERROR_TYPES, REQUEST_ID


def contract_problems(response: Any) -> list[str]:
    """Why ``response`` breaks the conventions of docs/api.md (empty when it keeps them): never a
    5xx; always an ``x-request-id``; every non-2xx body the error object, typed by its status,
    with a code and the same request id as the header."""
    problems: list[str] = []
    status = response.status_code
    request_id = response.headers.get("x-request-id", "")
    if status >= 500:
        problems.append(f"server error {status}")
    if not REQUEST_ID.fullmatch(request_id):
        problems.append(f"x-request-id {request_id!r} is not 12 lower-case hex characters")
    if 200 <= status < 300:
        return problems
    try:
        body = json.loads(response.content)
    except ValueError:
        return [*problems, f"{status} body is not JSON"]
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return [*problems, f"{status} body is not {{'error': {{...}}}}"]
    error = body["error"]
    missing = {"message", "type", "param", "code", "request_id"} - set(error)
    if missing:
        problems.append(f"error lacks {sorted(missing)}")
    if error.get("type") != ERROR_TYPES.get(status):
        problems.append(f"status {status} with type {error.get('type')!r}")
    if not isinstance(error.get("code"), str) or not error["code"]:
        problems.append(f"error code {error.get('code')!r}")
    if not isinstance(error.get("message"), str) or not error["message"]:
        problems.append("error message is empty")
    if error.get("param") is not None and not isinstance(error["param"], str):
        problems.append(f"param {error['param']!r} is neither a field name nor null")
    if error.get("request_id") != request_id:
        problems.append(f"error.request_id {error.get('request_id')!r} != header {request_id!r}")
    return problems


def assert_contract_response(response: Any) -> None:
    problems = contract_problems(response)
    assert not problems, f"{problems}: {response.status_code} {response.text[:500]}"


def assert_books_reconcile(api: Api) -> None:
    """``metering verify``: balances equal their ledgers, aggregates equal their events."""
    with api.database.unit_of_work() as session:
        report = verify(session)
    assert report.ok, report.mismatches
