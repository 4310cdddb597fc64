"""Metering's refusals as typed exceptions, and their renderings as the errors LLM clients expect.

Every error metering answers has the body
``{"error": {"message", "type", "param", "code", "request_id", ...extra fields}}`` with the HTTP
status carrying its category. ``MeteringError.from_response`` turns one into the exception of its
``code`` (an unknown code into the class of its status), and each exception renders itself for
the API the customer called:

* ``to_openai()``: ``{"error": {...}}`` as the Chat Completions and Responses APIs answer;
* ``to_anthropic()``: ``{"type": "error", "error": {...}}`` as the Messages API answers;

each with the status and, on a 429, ``Retry-After`` and ``RateLimit-Reset``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

# The fields of an error object that every body has; any other field is a code's extra detail
# (``credits_available_cents``, ``context_length_limit``, ...), passed on to the customer.
_COMMON_FIELDS = frozenset({"message", "type", "param", "code", "request_id"})

# The Messages API names its error types after Anthropic's (the status picks the SDK's class).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


@dataclass(frozen=True)
class Rendering:
    """An HTTP answer to send to the customer: status, JSON body and headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


ErrorClass = type["MeteringError"]


class MeteringError(Exception):
    """An error metering answered (or, for ``MeteringUnavailable``, the lack of an answer).

    ``status``, ``type`` and ``code`` as metering sent them; ``param``; ``extra`` (the code's
    other fields); ``request_id`` (metering's id for the call); ``retry_after`` in seconds
    (429s and transient failures)."""

    status: int = 500
    type: str = "api_error"
    default_code: ClassVar[str] = "internal_error"
    # The classes by code and by status that ``from_response`` picks from.
    _by_code: ClassVar[dict[str, ErrorClass]] = {}
    _by_status: ClassVar[dict[int, ErrorClass]] = {}

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        request_id: str | None = None,
        retry_after: int | None = None,
        extra: Mapping[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.request_id = request_id
        self.retry_after = retry_after
        self.extra = dict(extra or {})
        if status is not None:
            # A status without a class of its own (a 502 from a proxy) is kept as it came.
            self.status = status

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "default_code" in cls.__dict__ and cls.__dict__.get("_code_class", True):
            MeteringError._by_code[cls.default_code] = cls
        if cls.__dict__.get("_category", False):
            MeteringError._by_status[cls.status] = cls

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code!r}, {self.message!r})"

    @property
    def body(self) -> dict[str, Any]:
        """The error object as metering sent it."""
        return {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
            **self.extra,
            "request_id": self.request_id,
        }

    @classmethod
    def from_response(
        cls, status: int, body: object, headers: Mapping[str, str] | None = None
    ) -> MeteringError:
        """The exception for one of metering's error answers (``body`` as parsed JSON)."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            error = {"message": f"metering answered {status} without an error body"}
        code = error.get("code")
        known = cls._by_code.get(code) if isinstance(code, str) else None
        if known is None or known.status != status:
            known = cls._by_status.get(status) or (
                ServerError if status >= 500 else InvalidRequestError
            )
        extra = {k: v for k, v in error.items() if k not in _COMMON_FIELDS}
        return known(
            str(error.get("message") or ""),
            code=code if isinstance(code, str) else None,
            param=error.get("param") if isinstance(error.get("param"), str) else None,
            request_id=error.get("request_id")
            if isinstance(error.get("request_id"), str)
            else None,
            retry_after=_retry_after(headers or {}),
            extra=extra,
            status=status,
        )

    # -- renderings ----------------------------------------------------------------------------

    def _customer_param(self) -> str | None:
        return self.param

    def _headers(self) -> dict[str, str]:
        if self.status != 429:
            return {}
        seconds = str(self.retry_after if self.retry_after is not None else 1)
        return {"Retry-After": seconds, "RateLimit-Reset": seconds}

    def to_openai(self, request_id: str | None = None) -> Rendering:
        """The answer of an OpenAI-style API (Chat Completions, Responses)."""
        error = {
            "message": self.message,
            "type": self.type,
            "param": self._customer_param(),
            "code": self.code,
            **_json_ready(self.extra),
            "request_id": request_id or self.request_id,
        }
        return Rendering(self.status, {"error": error}, self._headers())

    def to_anthropic(self, request_id: str | None = None) -> Rendering:
        """The answer of the Messages API: Anthropic's wrapper, with the same code and fields."""
        error = {
            "type": _ANTHROPIC_TYPES.get(self.status, "api_error"),
            "message": self.message,
            "code": self.code,
            **_json_ready(self.extra),
            "request_id": request_id or self.request_id,
        }
        return Rendering(self.status, {"type": "error", "error": error}, self._headers())


def _json_ready(extra: Mapping[str, Any]) -> dict[str, Any]:
    """The extra fields with exact decimals (``credits_available_cents``) as JSON numbers: an
    integer, or a float whose shortest form is the same decimal (every amount below about $10
    million to the microcent). One beyond that stays exact as a string rather than be rounded."""
    ready: dict[str, Any] = {}
    for name, value in extra.items():
        if isinstance(value, Decimal):
            if value == value.to_integral_value():
                value = int(value)
            elif Decimal(repr(float(value))) == value:
                value = float(value)
            else:
                value = format(value, "f")
        ready[name] = value
    return ready


def _retry_after(headers: Mapping[str, str]) -> int | None:
    lowered = {k.lower(): v for k, v in headers.items()}
    value = lowered.get("retry-after")
    if value is not None and value.strip().isdigit():
        return int(value.strip())
    return None


# -- categories: one per status -------------------------------------------------------------------


class InvalidRequestError(MeteringError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_parameter"
    _category = True
    _code_class = False


class AuthenticationError(MeteringError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"
    _category = True
    _code_class = False

    def _customer_param(self) -> str | None:
        # Metering names the body field ``api_key``; the customer sent a header.
        return None


class InsufficientCreditsError(MeteringError):
    """402: the request's maximum cost is above what the account or a limit allows."""

    status = 402
    type = "insufficient_credits"
    default_code = "insufficient_credits"
    _category = True
    _code_class = False


class PermissionDeniedError(MeteringError):
    status = 403
    type = "permission_error"
    default_code = "model_not_allowed"
    _category = True
    _code_class = False


class NotFoundError(MeteringError):
    status = 404
    type = "not_found_error"
    default_code = "not_found"
    _category = True
    _code_class = False


class MethodNotAllowedError(MeteringError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"
    _category = True
    _code_class = False


class ConflictError(MeteringError):
    status = 409
    type = "conflict_error"
    default_code = "idempotency_conflict"
    _category = True
    _code_class = False


class RequestTooLargeError(MeteringError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_body_too_large"
    _category = True
    _code_class = False


class RateLimitError(MeteringError):
    status = 429
    type = "rate_limit_error"
    default_code = "concurrency_limit_exceeded"
    _category = True
    _code_class = False


class ServerError(MeteringError):
    """A 5xx: metering failed; the same call may be retried (with the same ids)."""

    status = 500
    type = "api_error"
    default_code = "internal_error"
    _category = True
    _code_class = False


class ServiceUnavailableError(ServerError):
    status = 503
    default_code = "database_unavailable"
    _category = True
    _code_class = False


# -- one class per code -------------------------------------------------------------------------


class InvalidJsonRequest(InvalidRequestError):
    default_code = "invalid_json_request"


class MissingParameter(InvalidRequestError):
    default_code = "missing_parameter"


class InvalidParameter(InvalidRequestError):
    default_code = "invalid_parameter"


class UnsupportedValue(InvalidRequestError):
    default_code = "unsupported_value"


class InvalidTimestamp(InvalidRequestError):
    default_code = "invalid_timestamp"


class UnalignedTimestamp(InvalidRequestError):
    default_code = "unaligned_timestamp"


class TooManyBuckets(InvalidRequestError):
    default_code = "too_many_buckets"


class InvalidWindow(InvalidRequestError):
    default_code = "invalid_window"


class ContextLengthExceeded(InvalidRequestError):
    """The prompt (plus ``max_tokens`` where it must fit) exceeds the model's context window."""

    default_code = "context_length_exceeded"


class BatchTooLarge(InvalidRequestError):
    default_code = "batch_too_large"


class MissingApiKey(AuthenticationError):
    default_code = "missing_api_key"


class InvalidApiKey(AuthenticationError):
    default_code = "invalid_api_key"


class InsufficientCredits(InsufficientCreditsError):
    default_code = "insufficient_credits"


class MemberSpendLimit(InsufficientCreditsError):
    default_code = "member_spend_limit"


class ProjectSpendLimit(InsufficientCreditsError):
    default_code = "project_spend_limit"


class ModelNotAllowed(PermissionDeniedError):
    default_code = "model_not_allowed"


class ReadOnlyToken(PermissionDeniedError):
    default_code = "read_only_token"


class NotFound(NotFoundError):
    default_code = "not_found"


class ModelNotFound(NotFoundError):
    default_code = "model_not_found"


class MethodNotAllowed(MethodNotAllowedError):
    default_code = "method_not_allowed"


class IdempotencyConflict(ConflictError):
    default_code = "idempotency_conflict"


class PriceHistoryImmutable(ConflictError):
    default_code = "price_history_immutable"


class MemberExists(ConflictError):
    default_code = "member_exists"


class RequestBodyTooLarge(RequestTooLargeError):
    default_code = "request_body_too_large"


class ConcurrencyLimitExceeded(RateLimitError):
    default_code = "concurrency_limit_exceeded"


class InternalError(ServerError):
    default_code = "internal_error"


class DatabaseUnavailable(ServiceUnavailableError):
    default_code = "database_unavailable"


class MeteringUnavailable(MeteringError):
    """Metering could not be reached (or kept failing) within the authorization's deadline, and
    the policy is ``deny``; also raised under ``allow`` for a key never authorized before.

    Rendered as the reference API's transient failure: 429 ``auth_backend_unavailable`` with
    ``Retry-After``, which the OpenAI and Anthropic SDKs retry by themselves."""

    status = 429
    type = "rate_limit_error"
    default_code = "auth_backend_unavailable"
    _code_class = False


# The service's error codes (docs/api.md#conventions), each with its class (what the tests hold
# complete).
ERROR_CLASSES: Mapping[str, ErrorClass] = MeteringError._by_code
