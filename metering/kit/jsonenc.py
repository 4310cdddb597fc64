"""JSON that keeps money exact, both ways: written without floats, read without them.

The standard encoders cannot emit a Decimal as a bare number, and floats are refused here on
purpose: every amount reaches the wire as ``ExactNumber`` text built from an integer. What is
read (``loads_exact``) has every non-integer number as a Decimal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from json.encoder import encode_basestring_ascii
from typing import Any

from metering.kit.money import ExactNumber
from metering.kit.timeutil import format_timestamp


class RawJSON(str):
    """JSON text that is already valid (a stored canonical document), written verbatim."""

    __slots__ = ()


def _literal(value: bool | None) -> str:
    return "null" if value is None else "true" if value else "false"


# The leaf values by their exact type (no subclass: an Enum that is also a str, say, takes the
# general path), each written by one call: the common case of a response, without walking the
# checks below for every value.
_LEAVES: dict[type, Any] = {
    str: encode_basestring_ascii,
    int: int.__repr__,
    bool: _literal,
    type(None): _literal,
    ExactNumber: str.__str__,
    RawJSON: str.__str__,
}


def _encode(value: Any, out: list[str]) -> None:
    leaf = _LEAVES.get(type(value))
    if leaf is not None:
        out.append(leaf(value))
    elif isinstance(value, ExactNumber | RawJSON):
        out.append(str.__str__(value))
    elif isinstance(value, Enum):
        _encode(value.value, out)
    elif isinstance(value, str):
        out.append(encode_basestring_ascii(value))
    elif isinstance(value, bool):
        out.append(_literal(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(encode_basestring_ascii(str(key)))
            out.append(":")
            leaf = _LEAVES.get(type(item))
            if leaf is not None:
                out.append(leaf(item))
            else:
                _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            leaf = _LEAVES.get(type(item))
            if leaf is not None:
                out.append(leaf(item))
            else:
                _encode(item, out)
        out.append("]")
    elif isinstance(value, datetime):
        out.append(f'"{format_timestamp(value)}"')
    elif isinstance(value, date):
        out.append(f'"{value.isoformat()}"')
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON (floats are refused)")


def dumps(value: Any) -> bytes:
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("ascii")


def loads_exact(body: bytes) -> Any:
    """JSON with every non-integer number as a Decimal; bad UTF-8 and absurd nesting are reported
    as JSON errors. NaN and ±Infinity become Decimal values, so the field they were sent in refuses
    them by name (docs/api.md#conventions: a NaN money input is a 400 naming the field)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError("request body is not valid UTF-8", "", exc.start) from None
    try:
        return json.loads(text, parse_float=Decimal, parse_constant=Decimal)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("JSON nesting is too deep", text, 0) from None
    except ValueError as exc:
        raise json.JSONDecodeError(str(exc), text, 0) from None
