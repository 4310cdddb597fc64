"""Text the databases can store and compare: no NUL character, no unpaired surrogate.

PostgreSQL ``text`` cannot hold U+0000 (a parameter containing it fails the statement), and a
lone surrogate — valid in a JSON string (``"\\ud800"``), yet not a character — has no UTF-8 form,
so neither backend can even receive it. No id, name or key of the service contains either, so
such input names nothing: names and notes are refused (400 naming the field), lookups by such an
id find nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import parse_qsl

from pydantic import AfterValidator, Field

from metering.kit.errors import InvalidRequest

PROBLEM = "must not contain NUL characters or unpaired surrogates"


def storable(text: str) -> bool:
    """Whether ``text`` can be stored in (and compared by) both databases."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _storable_text(value: str) -> str:
    if not storable(value):
        raise ValueError(PROBLEM)
    return value


# The schema's statement of the rule (a lone surrogate is no character a generator produces).
NO_NUL_PATTERN = "^[^\\u0000]*$"

# A request body's string field that is stored or looked up: 400 naming the field otherwise.
Text = Annotated[
    str, AfterValidator(_storable_text), Field(json_schema_extra={"pattern": NO_NUL_PATTERN})
]


def check_url_text(path_params: Mapping[str, Any], query_string: bytes) -> None:
    """400 naming the parameter for a NUL character (``%00``) in a path or query parameter.
    (Percent-decoding replaces invalid UTF-8, so a URL cannot carry a lone surrogate.)"""
    for name, value in path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise InvalidRequest(f"{name} must not contain NUL characters (%00)", param=name)
    if b"%00" in query_string or b"\x00" in query_string:
        for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                raise InvalidRequest(f"{name} must not contain NUL characters (%00)", param=name)
