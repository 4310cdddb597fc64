"""JSON rendering that writes money exactly.

The standard encoders cannot emit a Decimal as a bare number, and floats are refused here on
purpose: every amount reaches the wire as ``ExactNumber`` text built from an integer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from enum import Enum
from json.encoder import encode_basestring_ascii
from typing import Any

from metering.kit.money import ExactNumber
from metering.kit.timeutil import format_timestamp


class RawJSON(str):
    """JSON text that is already valid (a stored canonical document), written verbatim."""

    __slots__ = ()


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, ExactNumber | RawJSON):
        out.append(str.__str__(value))
    elif isinstance(value, Enum):
        _encode(value.value, out)
    elif isinstance(value, str):
        out.append(encode_basestring_ascii(value))
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
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
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
