"""The one error hierarchy; a single handler turns it into the error body of
docs/api.md#conventions."""

from __future__ import annotations

from typing import Any, ClassVar


class MeteringError(Exception):
    status: ClassVar[int] = 400
    type: ClassVar[str] = "invalid_request_error"
    default_code: ClassVar[str] = "invalid_parameter"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.extra = extra

    # HTTP headers the answer carries besides the request id (e.g. ``Retry-After`` on a 429).
    headers: ClassVar[dict[str, str]] = {}

    def body(self, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        error.update(self.extra)
        error["request_id"] = request_id
        return {"error": error}


class InvalidRequest(MeteringError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_parameter"


class AuthenticationFailed(MeteringError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class InsufficientCredits(MeteringError):
    status = 402
    type = "insufficient_credits"
    default_code = "insufficient_credits"


class PermissionDenied(MeteringError):
    status = 403
    type = "permission_error"
    default_code = "model_not_allowed"


class NotFound(MeteringError):
    status = 404
    type = "not_found_error"
    default_code = "not_found"


class MethodNotAllowed(MeteringError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class Conflict(MeteringError):
    status = 409
    type = "conflict_error"
    default_code = "idempotency_conflict"


class BodyTooLarge(MeteringError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_body_too_large"


class RequestTimeout(MeteringError):
    """The client sent its body too slowly; the connection is closed after the answer."""

    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"
    headers: ClassVar[dict[str, str]] = {"connection": "close"}


class DatabaseUnavailable(MeteringError):
    """The database cannot be reached (down, restarting, refusing connections): try again."""

    status = 503
    type = "api_error"
    default_code = "database_unavailable"
    headers: ClassVar[dict[str, str]] = {"retry-after": "1"}


class RateLimited(MeteringError):
    """429: come back in a second (its two headers say so)."""

    status = 429
    type = "rate_limit_error"
    default_code = "concurrency_limit_exceeded"
    headers: ClassVar[dict[str, str]] = {"retry-after": "1", "ratelimit-reset": "1"}


class InternalError(MeteringError):
    status = 500
    type = "api_error"
    default_code = "internal_error"
