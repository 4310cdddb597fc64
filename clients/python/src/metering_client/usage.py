"""The ``usage`` object to send, taken from what the customer received.

Metering charges the usage object exactly as the API returned it (for a stream, its final
usage). These helpers take an OpenAI or Anthropic SDK response object (or its JSON as a dict),
or a stream's chunks or events (SDK objects, dicts, or raw server-sent-event text), and return
that object as a plain JSON dict. A response or stream without usage raises ``MissingUsage``:
such a request is reported to the caller, never sent as zero.

* ``chat_completions``: ``response.usage``; in a stream, the last chunk carrying ``usage``.
* ``responses``: ``response.usage``; in a stream, the ``response.completed`` event's (or
  ``response.failed``'s / ``response.incomplete``'s).
* ``messages``: ``response.usage``; in a stream, ``message_start``'s usage updated by
  ``message_delta``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

Api = Literal["chat_completions", "responses", "messages"]
APIS: tuple[str, ...] = get_args(Api)

# The counts without which a usage object cannot be charged.
_REQUIRED = {
    "chat_completions": ("prompt_tokens", "completion_tokens"),
    "responses": ("input_tokens", "output_tokens"),
    "messages": ("input_tokens", "output_tokens"),
}
_RESPONSES_FINAL_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.incomplete"}
)


class MissingUsage(Exception):
    """The response or stream carries no usage to charge (``api``, ``reason``). Do not send a
    zero: report it (the hold, if any, expires and is listed as lost usage for an operator)."""

    def __init__(self, api: str, reason: str) -> None:
        super().__init__(f"{api}: {reason}")
        self.api = api
        self.reason = reason


def usage_from_response(response: object, api: Api) -> dict[str, Any]:
    """The ``usage`` of a whole (non-streamed) response: an SDK object or its JSON dict."""
    _check_api(api)
    usage = _field(response, "usage")
    if usage is None:
        raise MissingUsage(api, "the response has no usage")
    return _checked(_as_dict(usage), api)


def usage_from_stream(items: Iterable[object], api: Api) -> dict[str, Any]:
    """The final ``usage`` of a stream, from all its chunks (chat completions) or events
    (responses, messages) in order."""
    collector = UsageCollector(api)
    for item in items:
        collector.add(item)
    return collector.usage()


class UsageCollector:
    """A stream's usage, gathered chunk by chunk as the stream passes (keeps no chunks)."""

    def __init__(self, api: Api) -> None:
        _check_api(api)
        self.api = api
        self._usage: dict[str, Any] | None = None
        # Messages: ``message_start`` carries the input side, ``message_delta`` the final counts.
        self._start_usage: dict[str, Any] = {}
        self.items = 0

    def add(self, item: object) -> None:
        for part in _parts(item):
            self.items += 1
            if self.api == "chat_completions":
                usage = _field(part, "usage")
                if usage is not None:
                    self._usage = _as_dict(usage)
            elif self.api == "responses":
                if _field(part, "type") in _RESPONSES_FINAL_EVENTS:
                    usage = _field(_field(part, "response"), "usage")
                    if usage is not None:
                        self._usage = _as_dict(usage)
            else:
                kind = _field(part, "type")
                if kind == "message_start":
                    usage = _field(_field(part, "message"), "usage")
                    self._start_usage = _as_dict(usage) if usage is not None else {}
                elif kind == "message_delta":
                    usage = _field(part, "usage")
                    if usage is not None:
                        merged = dict(self._usage or self._start_usage)
                        merged.update({k: v for k, v in _as_dict(usage).items() if v is not None})
                        self._usage = merged

    def usage(self) -> dict[str, Any]:
        """The final usage seen so far; ``MissingUsage`` when the stream carried none."""
        if self._usage is None:
            raise MissingUsage(self.api, f"no final usage in {self.items} stream items")
        return _checked(self._usage, self.api)

    @property
    def has_usage(self) -> bool:
        return self._usage is not None


def _check_api(api: str) -> None:
    if api not in APIS:
        raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")


def _checked(usage: dict[str, Any], api: str) -> dict[str, Any]:
    for name in _REQUIRED[api]:
        value = usage.get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise MissingUsage(api, f"the usage has no integer {name!r}: {usage!r}")
    return usage


def _field(obj: object, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _as_dict(obj: object) -> dict[str, Any]:
    """A JSON-ready dict of an SDK model (pydantic), a mapping, or a plain object."""
    if isinstance(obj, Mapping):
        return json.loads(json.dumps(obj, default=_jsonable))
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json", exclude_unset=True))
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return json.loads(json.dumps(vars(obj), default=_jsonable))


def _jsonable(obj: object) -> Any:
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=True)
    return vars(obj)


def _parts(item: object) -> Iterable[object]:
    """A stream item as the events it holds: raw server-sent-event text may hold several."""
    if isinstance(item, bytes | bytearray):
        item = item.decode("utf-8", "replace")
    if not isinstance(item, str):
        return (item,)
    events: list[object] = []
    for line in item.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        if not payload or payload == "[DONE]":
            continue
        try:
            events.append(json.loads(payload))
        except ValueError:
            continue
    return events
