"""Request bodies parsed without floats (``metering.kit.jsonenc.loads_exact``), responses
written with exact decimals."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.datastructures import DefaultPlaceholder
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from metering.kit import jsonenc
from metering.kit.errors import InvalidRequest
from metering.kit.jsonenc import loads_exact
from metering.kit.text import check_url_text
from metering.web.deps import refuse_read_only_change, require_operator


class ExactJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return jsonenc.dumps(content)


def json_answer(content: bytes) -> Response:
    """A 200 answer of JSON already written (the hot routes write their own)."""
    return Response(content, media_type="application/json")


class ExactJSONRequest(Request):
    async def json(self) -> Any:
        """The body, which must be a JSON object: every body of the API is one, and a bare
        scalar, array or null is never read as "no body" or as a default (strict types)."""
        if not hasattr(self, "_json"):
            value = loads_exact(await self.body())
            if not isinstance(value, dict):
                raise InvalidRequest(
                    "request body must be a JSON object (Content-Type: application/json)",
                    code="invalid_json_request",
                )
            self._json = value
        return self._json


class MeteringRoute(APIRoute):
    """Every route parses JSON bodies with ``loads_exact`` (money never passes through float) and
    returns its content as built: no response model is inferred from the return annotation, so
    exact decimals are never re-serialised through pydantic (which would quote them)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        if isinstance(kwargs.get("response_model"), DefaultPlaceholder) or (
            "response_model" not in kwargs
        ):
            kwargs["response_model"] = None
        super().__init__(path, endpoint, **kwargs)

    @property
    def body_is_optional(self) -> bool:
        """Whether the route's JSON body has fields and none of them is required."""
        model = self.body_field.field_info.annotation if self.body_field is not None else None
        return (
            isinstance(model, type)
            and issubclass(model, BaseModel)
            and not any(field.is_required() for field in model.model_fields.values())
        )

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        operator_route = any(d.dependency is require_operator for d in self.dependencies)
        optional_body = self.body_is_optional

        async def exact_handler(request: Request) -> Response:
            if operator_route:
                refuse_read_only_change(request)  # before any validation
            check_url_text(request.path_params, request.scope["query_string"])
            if optional_body:
                return await handler(await _with_optional_body(request))
            return await handler(ExactJSONRequest(request.scope, request.receive))

        return exact_handler


async def _with_optional_body(request: Request) -> ExactJSONRequest:
    """The request to a route whose body fields are all optional, its body read; without one
    (whatever its Content-Type) it is read as the body ``{}``."""
    body = await request.body()
    scope = request.scope
    if not body:
        body = b"{}"
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
    exact = ExactJSONRequest(scope, request.receive)
    exact._body = body  # read once, here
    return exact
