"""Configured tokens (gateway, admin, read-only, metrics): named or not, each secret once.

A configured token may be ``name:secret`` where the name matches ``[a-z0-9_-]{1,40}``;
otherwise the whole string is the secret. The client sends only the secret; the caller's name
(the audit log's ``actor``) is the name, or ``token:<first 8 hex of the secret's SHA-256>`` for
an unnamed token, so a log never shows a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

NAME = re.compile(r"[a-z0-9_-]{1,40}", re.ASCII)


@dataclass(frozen=True, slots=True)
class Token:
    name: str
    secret: str

    def __repr__(self) -> str:  # never the secret, in a traceback or a log
        return f"Token({self.name!r})"


def parse_token(text: str) -> Token:
    name, colon, secret = text.partition(":")
    if colon and secret and NAME.fullmatch(name):
        return Token(name, secret)
    return Token(f"token:{hashlib.sha256(text.encode()).hexdigest()[:8]}", text)


def parse_tokens(texts: Iterable[str]) -> tuple[Token, ...]:
    return tuple(parse_token(text) for text in texts)


def duplicate_secrets(lists: Mapping[str, Sequence[str]]) -> str | None:
    """Why these configured lists (by setting name) cannot be used, or None: one secret in two
    lists, or twice in one, would make a caller's role or name ambiguous."""
    seen: dict[str, str] = {}
    for setting, texts in lists.items():
        for token in parse_tokens(texts):
            if token.secret in seen:
                where = seen[token.secret]
                place = f"twice in {setting}" if where == setting else f"in {where} and {setting}"
                return f"a token secret is configured {place} (named {token.name!r})"
            seen[token.secret] = setting
    return None


def matching(credential: str, tokens: Sequence[Token]) -> Token | None:
    """The token whose secret is ``credential``, comparing against every one so that timing
    does not reveal which one (if any) matched."""
    presented = credential.encode("utf-8", "surrogatepass")
    found = None
    for token in tokens:
        if hmac.compare_digest(presented, token.secret.encode()):
            found = token
    return found
