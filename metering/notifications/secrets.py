"""Webhook signing secrets: made, encrypted at rest, signed with (Standard Webhooks).

A secret is ``whsec_`` + base64 of 32 random bytes (the Standard Webhooks form). It is needed in
clear to sign, so it is stored encrypted: AES-256-GCM under a key derived (HKDF-SHA-256) from
each ``METERING_SECRET_KEY`` string; the first key encrypts, every key decrypts (rotation). The
endpoint's id is the associated data, so a ciphertext copied to another row does not decrypt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SECRET_PREFIX = "whsec_"
_FORMAT = "v1."
_INFO = b"metering webhook signing secrets v1"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


@lru_cache(maxsize=16)
def _derived(key: str) -> AESGCM:
    # Imported here: only sealing and opening a secret need cryptography (~6 MB a process),
    # which the server's other routes never do.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(key.encode())
    return AESGCM(derived)


class SecretKeyMissing(RuntimeError):
    """No METERING_SECRET_KEY is configured: secrets can be neither sealed nor opened."""


class SecretUnreadable(RuntimeError):
    """No configured key opens a stored secret (a key was removed from METERING_SECRET_KEY)."""


def seal(keys: Sequence[str], secret: str, endpoint_id: str) -> str:
    """``secret`` encrypted with the first key, bound to ``endpoint_id``."""
    if not keys:
        raise SecretKeyMissing("METERING_SECRET_KEY is not set")
    nonce = os.urandom(12)
    sealed = _derived(keys[0]).encrypt(nonce, secret.encode(), endpoint_id.encode())
    return _FORMAT + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")


def open_sealed(keys: Sequence[str], stored: str, endpoint_id: str) -> str:
    if not keys:
        raise SecretKeyMissing("METERING_SECRET_KEY is not set")
    if not stored.startswith(_FORMAT):
        raise SecretUnreadable(f"endpoint {endpoint_id}: unknown secret format")
    from cryptography.exceptions import InvalidTag

    raw = base64.urlsafe_b64decode(stored[len(_FORMAT) :])
    nonce, sealed = raw[:12], raw[12:]
    for key in keys:
        try:
            return _derived(key).decrypt(nonce, sealed, endpoint_id.encode()).decode()
        except InvalidTag:
            continue
    raise SecretUnreadable(f"endpoint {endpoint_id}: no METERING_SECRET_KEY opens its secret")


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` keyed by the secret's bytes."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per secret in force, space-separated."""
    return " ".join(signature(s, message_id, timestamp, body) for s in secrets)
