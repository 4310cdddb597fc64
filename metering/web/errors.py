"""The one place errors become the error body of docs/api.md#conventions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from metering.db import unreachable
from metering.kit.errors import (
    DatabaseUnavailable,
    InternalError,
    InvalidRequest,
    MeteringError,
    MethodNotAllowed,
    NotFound,
)
from metering.web.jsonio import ExactJSONResponse
from metering.web.middleware import logged_path, request_id_of
from metering.web.routes import allowed_methods

log = logging.getLogger("metering.errors")


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None
    code: str
    request_id: str


class ErrorBody(BaseModel):
    """Every error's body (docs/api.md#conventions); some codes add fields to ``error`` (for
    instance ``credits_available_cents`` on a 402, ``limit_bytes`` on a 413)."""

    error: ErrorObject


# Declared on every route in place of FastAPI's 422, which the service never answers.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {
        "model": ErrorBody,
        "description": "A client error: 400 invalid request, 401 no or bad credential, 402 not "
        "enough credit, 403 not permitted, 404 unknown, 405 method, 409 conflict, 413 body too "
        "large, 429 too many requests in flight.",
    },
    "500": {"model": ErrorBody, "description": "An unexpected error (code internal_error)."},
    "503": {
        "model": ErrorBody,
        "description": "The database is unavailable (code database_unavailable): try again.",
    },
}


# What answers an error in a part of the site that speaks HTML (the portal's pages).
ErrorPage = Callable[[Request, MeteringError], Response]


def add_error_pages(app: FastAPI, prefix: str, page: ErrorPage) -> None:
    """The errors of requests under ``prefix`` are answered by ``page`` instead of the JSON
    error body (the part of the site that serves ``prefix`` registers its own)."""
    app.state.error_pages = {**app.state.error_pages, prefix: page}


def _error_page_of(request: Request) -> ErrorPage | None:
    path = request.url.path
    pages: dict[str, ErrorPage] = request.app.state.error_pages
    for prefix, page in pages.items():
        if path == prefix or path.startswith(prefix + "/"):
            return page
    return None


def error_response(request: Request, error: MeteringError) -> Response:
    """The JSON error body of docs/api.md#conventions; under a prefix with error pages of its own
    (the portal's /billing), its HTML page instead."""
    page = _error_page_of(request)
    if page is not None:
        return page(request, error)
    request_id = request_id_of(request.scope)
    return ExactJSONResponse(
        error.body(request_id),
        status_code=error.status,
        headers={**error.headers, "x-request-id": request_id},
    )


def _field_path(loc: tuple[Any, ...], body: Any, kind: str) -> tuple[Any, ...]:
    """The fields of a body error's location: pydantic appends a union member's tag (``int``,
    ``decimal``) after the field, and that tag is not a field of the request."""
    path: list[Any] = []
    current = body
    for index, part in enumerate(loc):
        present = (isinstance(current, dict) and part in current) or (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        )
        if present:
            current = current[part]
        elif not (kind == "missing" and isinstance(current, dict) and index == len(loc) - 1):
            break
        path.append(part)
    return tuple(path)


def _param_of(loc: tuple[Any, ...]) -> str | None:
    parts = [part for part in loc if part not in ("body", "query", "path", "header")]
    if not parts:
        return None
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or None


_BODY_SHAPE_ERRORS = {"model_attributes_type", "dict_type", "model_type", "json_invalid"}


def validation_error(exc: RequestValidationError) -> MeteringError:
    """FastAPI's 422 never leaves the service: the first problem becomes a 400 naming its field."""
    errors = exc.errors()
    if not errors:
        return InvalidRequest("invalid request", code="invalid_parameter")
    first = errors[0]
    kind = first.get("type", "")
    loc = tuple(first.get("loc", ()))
    if loc[:1] == ("body",):
        loc = ("body", *_field_path(loc[1:], exc.body, kind))
    param = _param_of(loc)
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "malformed JSON")
        return InvalidRequest(
            f"request body is not valid JSON: {detail}", code="invalid_json_request"
        )
    if loc[:1] == ("body",) and param is None and (kind == "missing" or kind in _BODY_SHAPE_ERRORS):
        if kind == "missing":
            message = (
                "request body is required: send a JSON object (Content-Type: application/json)"
            )
        else:
            message = "request body must be a JSON object (Content-Type: application/json)"
        return InvalidRequest(message, code="invalid_json_request")
    reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    message = f"{param}: {reason}" if param else reason
    if kind == "missing":
        return InvalidRequest(f"{param} is required", code="missing_parameter", param=param)
    if kind in ("literal_error", "enum"):
        return InvalidRequest(message, code="unsupported_value", param=param)
    if kind == "extra_forbidden":
        return InvalidRequest(
            f"{param} is not a known field", code="invalid_parameter", param=param
        )
    return InvalidRequest(message, code="invalid_parameter", param=param)


def install_error_handlers(app: FastAPI) -> None:
    app.state.error_pages = {}

    async def on_metering_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, MeteringError)
        return error_response(request, exc)

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(request, validation_error(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        error: MeteringError
        if isinstance(exc.__cause__, MeteringError):
            # Raised while FastAPI read the body (e.g. the size limit); it wraps it in a 400.
            error = exc.__cause__
        elif exc.status_code == 404:
            error = NotFound(f"no route {request.method} {request.url.path}", code="not_found")
        elif exc.status_code == 405:
            error = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
            response = error_response(request, error)
            response.headers["allow"] = ", ".join(allowed_methods(request.app, request.scope))
            return response
        elif exc.status_code == 400:
            error = InvalidRequest("request body is not valid JSON", code="invalid_json_request")
        else:
            error = InvalidRequest(str(exc.detail), code="invalid_request")
            response = error_response(request, error)
            response.status_code = exc.status_code
            return response
        return error_response(request, error)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        request_id = request_id_of(request.scope)
        if unreachable(exc):
            # The first line only: the rest of SQLAlchemy's message is the statement and its
            # parameters, which may carry a request's data.
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("database unavailable (request_id=%s): %s", request_id, reason)
            unavailable = DatabaseUnavailable("the database is unavailable; try again shortly")
            return error_response(request, unavailable)
        log.exception(
            "unhandled error (request_id=%s, %s %s)",
            request_id,
            request.method,
            logged_path(request.url.path.encode("utf-8", "surrogateescape")),
        )
        return error_response(request, InternalError("internal error; quote the request_id"))

    app.add_exception_handler(MeteringError, on_metering_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
