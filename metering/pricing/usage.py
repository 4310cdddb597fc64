"""Normalising the usage object each API returns into four token counts
(docs/api.md#post-v1usageevents)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard

API_NAMES = ("chat_completions", "responses", "messages")

# Far above any context window; keeps every charge component inside a signed 64-bit integer.
MAX_TOKEN_COUNT = 2**31 - 1


class InvalidUsage(ValueError):
    """The usage object cannot be billed as sent (quarantined as ``invalid_usage``)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class NormalizedUsage(NamedTuple):
    # A named tuple, not a frozen dataclass: as immutable, and made in a third of the time (a
    # batch makes one per event; docs/performance.md).
    prompt_tokens: int  # all input tokens, cache reads included
    cached_tokens: int  # the subset of prompt tokens read from the prompt cache
    output_tokens: int  # all generated tokens, reasoning included
    reasoning_tokens: int  # the subset of output tokens spent on reasoning

    @property
    def uncached_input_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


# api -> ((prompt path), (cached path), (output path), (reasoning path) | None)
_FIELDS: dict[
    str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...] | None]
] = {
    "chat_completions": (
        ("prompt_tokens",),
        ("prompt_tokens_details", "cached_tokens"),
        ("completion_tokens",),
        ("completion_tokens_details", "reasoning_tokens"),
    ),
    "responses": (
        ("input_tokens",),
        ("input_tokens_details", "cached_tokens"),
        ("output_tokens",),
        ("output_tokens_details", "reasoning_tokens"),
    ),
    # On this API input_tokens already includes cache_read_input_tokens (unlike Anthropic's own).
    "messages": (
        ("input_tokens",),
        ("cache_read_input_tokens",),
        ("output_tokens",),
        None,
    ),
}


def _is_object(node: object) -> TypeGuard[Mapping[str, Any]]:
    # A JSON object is parsed as a dict: the exact type first, without the ABC's slower check.
    return type(node) is dict or isinstance(node, Mapping)


def _count(usage: Mapping[str, Any], path: tuple[str, ...]) -> int:
    """A token count at ``path``; a missing or null object or field on the way means 0."""
    node: Any = usage
    for name in path:
        if type(node) is not dict:  # the common case (a parsed JSON object) checked first
            if node is None:
                return 0
            if not isinstance(node, Mapping):
                depth = path.index(name)
                raise InvalidUsage(
                    f"usage.{'.'.join(path[:depth])} must be an object", ".".join(path)
                )
        node = node.get(name)
    if type(node) is int and 0 <= node <= MAX_TOKEN_COUNT:  # the common case, checked first
        return node
    if node is None:
        return 0
    dotted = ".".join(path)
    if isinstance(node, bool) or not isinstance(node, int):
        raise InvalidUsage(f"usage.{dotted} must be an integer", dotted)
    if node < 0:
        raise InvalidUsage(f"usage.{dotted} must not be negative", dotted)
    if node > MAX_TOKEN_COUNT:
        raise InvalidUsage(f"usage.{dotted} is larger than {MAX_TOKEN_COUNT}", dotted)
    return node


def normalize_usage(api: str, usage: object) -> NormalizedUsage:
    """The four billing counts of a usage object as ``api`` returned it.

    Unknown extra fields are ignored (SDKs add fields over time).
    """
    fields = _FIELDS.get(api)
    if fields is None:
        raise ValueError(f"unknown api {api!r}")
    if not _is_object(usage):
        raise InvalidUsage("usage must be an object")
    prompt_path, cached_path, output_path, reasoning_path = fields
    prompt = _count(usage, prompt_path)
    cached = _count(usage, cached_path)
    output = _count(usage, output_path)
    reasoning = _count(usage, reasoning_path) if reasoning_path else 0
    if cached > prompt:
        raise InvalidUsage(
            f"cached tokens ({cached}) exceed prompt tokens ({prompt})", ".".join(cached_path)
        )
    if reasoning > output:
        assert reasoning_path is not None
        raise InvalidUsage(
            f"reasoning tokens ({reasoning}) exceed output tokens ({output})",
            ".".join(reasoning_path),
        )
    return NormalizedUsage(prompt, cached, output, reasoning)
