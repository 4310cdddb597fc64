"""HMAC signatures with ``METERING_SECRET_KEY``: the portal's cookies and CSRF tokens.

The first key signs; every configured key verifies, so a key can be rotated without signing
everyone out (add the new one first, drop the old one 12 hours later).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field


def _mac(key: str, purpose: str, value: str) -> str:
    digest = hmac.new(key.encode(), f"{purpose}\x00{value}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class Signer:
    keys: tuple[str, ...] = field(repr=False)

    @classmethod
    def of(cls, keys: Sequence[str]) -> Signer:
        return cls(tuple(keys))

    @property
    def configured(self) -> bool:
        return bool(self.keys)

    def sign(self, purpose: str, value: str) -> str:
        """``value`` with its signature for ``purpose`` (a cookie's name, say)."""
        return f"{value}.{_mac(self.keys[0], purpose, value)}"

    def unsign(self, purpose: str, signed: str | None) -> str | None:
        """The value of a ``sign`` output, or None when it is not one of ours."""
        if not signed or not self.keys:
            return None
        value, dot, mac = signed.rpartition(".")
        if not dot or not value:
            return None
        return value if self._any_matches(purpose, value, mac) else None

    def token(self, purpose: str, value: str) -> str:
        """A token that stands for ``value`` (a CSRF token bound to a session, say)."""
        return _mac(self.keys[0], purpose, value)

    def token_matches(self, purpose: str, value: str, token: str | None) -> bool:
        return bool(token) and self._any_matches(purpose, value, token or "")

    def _any_matches(self, purpose: str, value: str, mac: str) -> bool:
        found = False
        for key in self.keys:  # every key, so timing tells nothing of which one matched
            found |= hmac.compare_digest(_mac(key, purpose, value).encode(), mac.encode())
        return found
