"""The OpenAPI document, with what the routes enforce centrally stated on every parameter."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from metering.kit.text import NO_NUL_PATTERN


def _no_nul(schema: dict[str, Any]) -> None:
    """Every path and query parameter refuses a NUL character (``check_url_text``, applied to
    every route by ``MeteringRoute``): say so on each string schema without a pattern."""
    if schema.get("type") == "string" and "pattern" not in schema and "enum" not in schema:
        schema["pattern"] = NO_NUL_PATTERN
    for key in ("anyOf", "oneOf", "allOf"):
        for member in schema.get(key, []):
            _no_nul(member)
    if isinstance(schema.get("items"), dict):
        _no_nul(schema["items"])


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        document = FastAPI.openapi(app)
        for path_item in document["paths"].values():
            for operation in path_item.values():
                for parameter in operation.get("parameters", []):
                    _no_nul(parameter["schema"])
        return document

    app.openapi = openapi  # type: ignore[method-assign]
