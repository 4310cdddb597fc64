"""Public identifiers: a readable prefix and enough randomness to be unguessable."""

from __future__ import annotations

import base64
import secrets


def random_text(length: int) -> str:
    """``length`` random characters of ``a–z2–7`` (5 bits each): one call into the OS's random
    source, base32-encoded (drawing one character at a time cost ~50 µs per id)."""
    raw = secrets.token_bytes((length * 5 + 7) // 8)
    return base64.b32encode(raw).decode("ascii").lower()[:length]


def new_id(prefix: str, length: int = 20) -> str:
    """``acct_…``, ``key_…``, ``auth_…``: 100 random bits at the default length."""
    return f"{prefix}_{random_text(length)}"


def new_request_id() -> str:
    """The ``x-request-id`` of a response: 12 lower-case hex characters."""
    return secrets.token_hex(6)
