"""Public identifiers: a readable prefix and enough randomness to be unguessable."""

from __future__ import annotations

import secrets

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def _random_text(length: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_id(prefix: str, length: int = 20) -> str:
    """``acct_…``, ``key_…``, ``auth_…``: ~103 bits at the default length."""
    return f"{prefix}_{_random_text(length)}"


def new_request_id() -> str:
    """The ``x-request-id`` of a response: 12 lower-case hex characters."""
    return secrets.token_hex(6)
