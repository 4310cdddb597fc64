"""Pure ASGI middleware: a request id on every response, and the request body limit."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metering.db import unreachable
from metering.kit.errors import (
    BodyTooLarge,
    DatabaseUnavailable,
    InternalError,
    MeteringError,
    RequestTimeout,
)
from metering.kit.ids import new_request_id
from metering.metrics import REQUEST_LATENCY

REQUEST_ID_HEADER = b"x-request-id"
# How the app answers an error (metering.web.errors.error_response).
ErrorRenderer = Callable[[Request, MeteringError], Response]
log = logging.getLogger("metering.errors")
# One line per request: method, path (as sent, without the query string: it may carry a
# secret), status, duration and request id. Never a header, so never a credential.
access = logging.getLogger("metering.access")


# The portal's sign-in links carry their token in the path: logs show the path without it.
SIGN_IN_PREFIX = b"/billing/sign-in/"
REDACTED_SIGN_IN = SIGN_IN_PREFIX + b"[redacted]"


def logged_path(raw: bytes) -> str:
    """A request path as logs show it: without the query string (it may carry a secret) and
    without a sign-in link's token; control characters escaped."""
    raw = raw.partition(b"?")[0]
    if raw.startswith(SIGN_IN_PREFIX) and len(raw) > len(SIGN_IN_PREFIX):
        raw = REDACTED_SIGN_IN
    return raw.decode("ascii", "backslashreplace")


def _path_of(scope: Scope) -> str:
    return logged_path(scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape"))


def request_id_of(scope: Scope) -> str:
    state = scope.setdefault("state", {})
    request_id = state.get("request_id")
    if request_id is None:
        request_id = state["request_id"] = new_request_id()
    return str(request_id)


class RequestContextMiddleware:
    """Gives each request its id (``x-request-id``), refuses bodies over ``max_body_bytes`` and
    writes the access log (``access_log``).

    An oversized body is refused from its Content-Length before it is read, and a chunked one as
    soon as the running count passes the limit. Its own errors are answered as the app answers
    them (``render_error``: the JSON body, or the page of a part of the site with pages of its
    own, the portal's), handed in by the app so that this layer imports none of them.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        render_error: ErrorRenderer,
        body_timeout_seconds: float = 60.0,
        access_log: bool = True,
    ) -> None:
        self.app = app
        self.render_error = render_error
        self.max_body_bytes = max_body_bytes
        self.body_timeout_seconds = body_timeout_seconds
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        header_value = request_id.encode()
        limit = self.max_body_bytes
        started = time.perf_counter()
        status = 500
        responded = observed = False

        def observe() -> None:
            nonlocal observed
            observed = True
            route = scope.get("route")
            # The route template (not the raw path) keeps the label set small.
            template = getattr(route, "path", None) or "unmatched"
            REQUEST_LATENCY.observe(
                time.perf_counter() - started, template, scope["method"], str(status)
            )

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status, responded = message["status"], True
                headers = [(k, v) for k, v in message.get("headers", []) if k != REQUEST_ID_HEADER]
                headers.append((REQUEST_ID_HEADER, header_value))
                message["headers"] = headers
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Counted before its last part leaves: a scrape made after the client has its
                # answer counts it.
                observe()
            await send(message)

        declared = _content_length(scope)
        if declared is not None and declared > limit:
            too_large = BodyTooLarge(_too_large(limit), limit_bytes=limit)
            await _send_error(self.render_error, too_large, scope, send)
            if self.access_log:
                _log_access(scope, 413, started, request_id)
            return

        received = 0
        body_done = False
        deadline = asyncio.get_running_loop().time() + self.body_timeout_seconds

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # waiting for a disconnect, as a streamed answer does: no deadline
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):  # a timer, not a task: cheap
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    f"the request body did not arrive within {self.body_timeout_seconds:g} s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(_too_large(limit), limit_bytes=limit)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        try:
            await self.app(scope, limited_receive, send_with_id)
        except Exception:
            if responded:
                raise
            # Answered here: Starlette's outermost middleware would answer too, then re-raise,
            # and uvicorn closes the connection on that, failing the client's next request on it.
            await _send_error(
                self.render_error, _unexpected(scope, request_id), scope, send_with_id, close=False
            )
        finally:
            if not observed:  # no answer was finished (the client went away first)
                observe()
            if self.access_log:
                _log_access(scope, status, started, request_id)


def _unexpected(scope: Scope, request_id: str) -> MeteringError:
    """The answer to an exception no handler took (called in its ``except``): 503 when the
    database is out of reach, else 500."""
    exc = sys.exc_info()[1]
    if exc is not None and unreachable(exc):
        log.warning(
            "database unavailable (request_id=%s, %s %s): %s",
            request_id,
            scope["method"],
            _path_of(scope),
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )
        return DatabaseUnavailable("the database is unavailable; try again shortly")
    log.exception(
        "unhandled error (request_id=%s, %s %s)", request_id, scope["method"], _path_of(scope)
    )
    return InternalError("internal error; quote the request_id")


def _log_access(scope: Scope, status: int, started: float, request_id: str) -> None:
    if access.isEnabledFor(logging.INFO):
        access.info(
            "%s %s %d %.1fms request_id=%s",
            scope["method"],
            _path_of(scope),
            status,
            (time.perf_counter() - started) * 1000,
            request_id,
        )


def _too_large(limit: int) -> str:
    return f"request body is larger than the limit of {limit} bytes"


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_error(
    render_error: ErrorRenderer,
    error: MeteringError,
    scope: Scope,
    send: Send,
    *,
    close: bool = True,
) -> None:
    """The error as the app answers it, sent from here where the app's handlers are not around."""
    response = render_error(Request(scope), error)
    if close:
        response.headers["connection"] = "close"

    async def no_body() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)
