"""A lean request path for the gateway's hot routes, in front of FastAPI's own.

The gateway calls ``POST /v1/authorizations``, ``DELETE /v1/authorizations/{id}`` and
``POST /v1/usage/events`` for every LLM request, and most of the CPU those requests cost was
FastAPI's per-request machinery (routing through each router, dependency solving, the request
and response objects), not their work. This middleware answers a well-formed request to one of
them directly: the gateway's token checked, the JSON body read once and validated by the same
pydantic model, the same handler function called, and its answer or its ``MeteringError``
written as the FastAPI route writes it.

Anything else goes to FastAPI unchanged, with the body it has read replayed: a request it does
not recognise, a missing or wrong token, an unusual content type, malformed JSON, a body that
fails validation. Every error answer for those (which field, which code, in which order the
checks apply) is therefore FastAPI's and the error handlers', written once; the routes there
remain the definition of the API (OpenAPI, docs) and answer whatever this lane passes on.
tests/web/test_fastlane.py holds the two paths to the same answers.

It sits inside ``RequestContextMiddleware``: request id, body size limit, latency metrics and
the answer to an unexpected error apply to both paths.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers, State
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metering.kit import jsonenc
from metering.kit.errors import MeteringError
from metering.kit.jsonenc import loads_exact
from metering.kit.text import check_url_text
from metering.kit.tokens import Token
from metering.web.deps import bearer_of, require_gateway, token_matches
from metering.web.middleware import request_id_of

# The handler of a lane: the app's state, the validated body (None for a route without one) and
# the path parameters; returns the JSON of a 200 answer, or raises a MeteringError.
LaneHandler = Callable[[State, Any, Mapping[str, str]], Awaitable[bytes]]
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])
_PARAMETER = re.compile(r"\{(\w+)\}")
_MARK = "__fast_lane__"


def fast_lane(handler: LaneHandler) -> Callable[[Endpoint], Endpoint]:
    """Marks a FastAPI endpoint whose work is ``handler`` as served by the lean path too; the
    route (method, path, body model) stays the definition of what the lane accepts."""

    def mark(endpoint: Endpoint) -> Endpoint:
        setattr(endpoint, _MARK, handler)
        return endpoint

    return mark


def lanes_of(routes: Iterable[BaseRoute]) -> list[Lane]:
    """The lanes of the marked routes, from each route's own method, path and body model."""
    lanes = []
    for route in routes:
        handler = getattr(getattr(route, "endpoint", None), _MARK, None)
        if handler is None:
            continue
        assert isinstance(route, APIRoute) and route.methods and len(route.methods) == 1, route
        # The lane checks the gateway's token: only gateway routes may be marked.
        assert any(d.dependency is require_gateway for d in route.dependencies), route.path
        body = route.body_field.field_info.annotation if route.body_field else None
        assert body is None or (isinstance(body, type) and issubclass(body, BaseModel)), body
        lanes.append(Lane(next(iter(route.methods)), route.path, body, handler))
    return lanes


@dataclass(frozen=True, slots=True)
class Lane:
    """One route served by the lean path; ``path`` is the route's template, as FastAPI's."""

    method: str
    path: str
    body: type[BaseModel] | None
    handler: LaneHandler

    def pattern(self) -> re.Pattern[str]:
        # Starlette's ``str`` convertor: one segment, without a slash.
        return re.compile("^" + _PARAMETER.sub(r"(?P<\1>[^/]+)", self.path) + "$")


class _Fallback(Exception):
    """The request is not one this lane answers: FastAPI does."""


class FastLane:
    """Serves ``lanes`` (gateway routes) directly when the request is well formed."""

    def __init__(self, app: ASGIApp, lanes: list[Lane]) -> None:
        self.app = app
        self._lanes = [(lane, lane.pattern()) for lane in lanes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self._match(scope) if scope["type"] == "http" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        lane, params = match
        state: State = scope["app"].state
        scope["route"] = lane  # its template labels the latency metric, as a route's does
        received: list[Message] = []
        try:
            if not _gateway_token_ok(scope, state.credentials.gateway):
                raise _Fallback
            body = None
            if lane.body is not None:
                body = await _read_body(lane.body, scope, receive, received)
            # What was read is kept only to replay it to FastAPI, which takes over before the
            # handler runs, never after: not held while it works (a batch's bytes, beside its
            # parsed events, for as long as the batch is recorded).
            received.clear()
            content = await lane.handler(state, body, params)
        except _Fallback:
            await self.app(scope, _replaying(received, receive), send)
            return
        except MeteringError as error:
            request_id = request_id_of(scope)
            answer = jsonenc.dumps(error.body(request_id))
            await _answer(send, error.status, answer, error.headers)
            return
        await _answer(send, 200, content)

    def _match(self, scope: Scope) -> tuple[Lane, dict[str, str]] | None:
        if scope["query_string"]:
            return None
        method, path = scope["method"], scope["path"]
        for lane, pattern in self._lanes:
            if lane.method == method:
                found = pattern.match(path)
                if found is not None:
                    params = found.groupdict()
                    try:
                        check_url_text(params, b"")
                    except MeteringError:
                        return None
                    return lane, params
        return None


def _gateway_token_ok(scope: Scope, tokens: Sequence[Token]) -> bool:
    credential = bearer_of(Headers(scope=scope).get("authorization"))
    return credential is not None and token_matches(credential, tokens)


async def _read_body(
    model: type[BaseModel], scope: Scope, receive: Receive, received: list[Message]
) -> BaseModel:
    """The body validated by ``model``; falls back on anything FastAPI would judge itself."""
    chunks = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            raise _Fallback  # the client went away: FastAPI's handling, as ever
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    content_type = Headers(scope=scope).get("content-type")
    if not raw or (
        content_type is not None
        and content_type.partition(";")[0].strip().lower() != "application/json"
    ):
        raise _Fallback
    try:
        data = loads_exact(raw)
        if not isinstance(data, dict):
            raise _Fallback
        return model.model_validate(data)
    except (ValueError, ValidationError):  # JSONDecodeError is a ValueError
        raise _Fallback from None


def _replaying(received: list[Message], receive: Receive) -> Receive:
    """``receive`` as if nothing had been read: the messages already read first."""
    pending = list(received)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


async def _answer(
    send: Send, status: int, body: bytes, headers: Mapping[str, str] | None = None
) -> None:
    # The headers FastAPI's JSON response writes (the request id is added outside).
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-length", str(len(body)).encode()),
                (b"content-type", b"application/json"),
                *((name.encode(), value.encode()) for name, value in (headers or {}).items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
