"""The LiteLLM proxy in front of metering (``pip install 'metering-client[litellm]'``).

In LiteLLM's config file::

    general_settings:
      master_key: os.environ/LITELLM_MASTER_KEY   # LiteLLM refuses to start without one
      custom_auth: metering_client.litellm.auth
    litellm_settings:
      callbacks: metering_client.litellm.hook

with ``METERING_URL``, ``METERING_GATEWAY_TOKEN`` and ``METERING_SPOOL_PATH`` in its environment
(``METERING_ON_UNAVAILABLE=allow`` to serve known keys while metering is away). LiteLLM's
``model_name``s must be metering's catalog ids.

* ``auth`` takes the customer's key (``Authorization: Bearer`` or ``x-api-key``) on the metered
  routes only (Chat Completions, Messages, Responses); any other route is 404 ``not_found``.
  LiteLLM sees a hash of the key, never the secret (it may log what auth returns).
* ``hook.async_pre_call_hook`` places the hold (``authorize``): a refusal is answered with
  metering's status, code, fields and ``Retry-After``/``RateLimit-Reset``, in the shape of the
  API called (``{"error": ...}``, or Anthropic's ``{"type": "error", ...}`` on ``/v1/messages``).
* ``hook.async_post_call_success_hook`` records the usage of a whole response as the customer
  received it; ``hook.async_post_call_streaming_iterator_hook`` watches the chunks on their way
  to the customer and records the stream's final usage, ``outcome: failed`` with the usage seen
  so far when the stream broke after it started.
* ``hook.async_post_call_failure_hook`` voids the hold of a request that failed before producing
  anything.

A stream that ended without usage is never recorded as zero: it is logged (``MissingUsage``)
and its hold left to expire, which metering counts and lists as lost usage for an operator.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import litellm
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import ProxyException, UserAPIKeyAuth

from metering_client.aio import AsyncMeteringClient
from metering_client.errors import MeteringError, MissingApiKey, NotFound, Rendering
from metering_client.records import Authorization, Outcome, new_request_id
from metering_client.usage import Api, MissingUsage, UsageCollector, usage_from_response

log = logging.getLogger("metering_client.litellm")

# The routes a customer's key may call, and the API each is billed as. Others (LiteLLM's
# pass-through and management routes) would bypass the hooks: refused.
METERED_ROUTES: Mapping[str, Api] = {
    "/v1/chat/completions": "chat_completions",
    "/chat/completions": "chat_completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/responses": "responses",
}
# LiteLLM's call types of those routes.
_API_BY_CALL_TYPE: Mapping[str, Api] = {
    "completion": "chat_completions",
    "acompletion": "chat_completions",
    "anthropic_messages": "messages",
    "responses": "responses",
    "aresponses": "responses",
}
_STATE = "metering"  # the key of this integration's state in LiteLLM's request metadata
_NO_KEY = "metering-no-key"
_SECRETS_KEPT = 10_000


class MeteringRefusal(ProxyException):
    """A refusal LiteLLM answers exactly as rendered: its status and headers, and its body.

    LiteLLM's handler answers ``{"error": exc.to_dict()}`` on the OpenAI routes; on
    ``/v1/messages`` it passes through a message that already is an Anthropic error body."""

    def __init__(self, rendering: Rendering, *, anthropic: bool) -> None:
        error = rendering.body["error"]
        super().__init__(
            message=json.dumps(rendering.body) if anthropic else str(error["message"]),
            type=str(error["type"]),
            param=error.get("param"),
            code=rendering.status,
            headers=dict(rendering.headers),
        )
        self.rendering = rendering

    def to_dict(self) -> dict[str, Any]:
        return dict(self.rendering.body["error"])


def refusal(error: MeteringError, api: Api) -> MeteringRefusal:
    if api == "messages":
        return MeteringRefusal(error.to_anthropic(), anthropic=True)
    return MeteringRefusal(error.to_openai(), anthropic=False)


# -- custom auth ----------------------------------------------------------------------------------

_secrets: OrderedDict[str, str] = OrderedDict()
_secrets_lock = threading.Lock()


def _handle(api_key: str) -> str:
    """What LiteLLM gets to see of a key: a hash, by which the hook finds the secret again."""
    handle = "metering-" + hashlib.sha256(api_key.encode()).hexdigest()[:40]
    with _secrets_lock:
        _secrets[handle] = api_key
        _secrets.move_to_end(handle)
        while len(_secrets) > _SECRETS_KEPT:
            _secrets.popitem(last=False)
    return handle


def _secret(handle: str | None) -> str | None:
    if not handle or handle == _NO_KEY:
        return None
    with _secrets_lock:
        return _secrets.get(handle)


async def auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    """LiteLLM's ``custom_auth``: the customer's key on a metered route. Metering checks the key
    itself when the pre-call hook authorizes the request (one round trip, not two)."""
    route = request.url.path
    if route not in METERED_ROUTES:
        raise refusal(NotFound(f"Unknown path {route}.", request_id=None), "chat_completions")
    key = (api_key or "").strip()
    if key[:7].lower() == "bearer ":
        key = key[7:].strip()
    return UserAPIKeyAuth(api_key=_handle(key) if key else _NO_KEY)


# -- the hook -------------------------------------------------------------------------------------


class MeteringHook(CustomLogger):
    """LiteLLM's callbacks: hold, record, void. The client is made on first use, from the
    ``METERING_*`` variables (or pass one)."""

    def __init__(self, client: AsyncMeteringClient | None = None) -> None:
        super().__init__()
        self._client = client
        self._client_lock = threading.Lock()

    @property
    def client(self) -> AsyncMeteringClient:
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = AsyncMeteringClient()
        return self._client

    async def async_pre_call_hook(
        self, user_api_key_dict: UserAPIKeyAuth, cache: Any, data: dict, call_type: Any
    ) -> dict:
        api = _API_BY_CALL_TYPE.get(str(call_type))
        if api is None:
            raise refusal(
                NotFound(f"{call_type} is not served by this gateway.", request_id=None),
                "chat_completions",
            )
        api_key = _secret(user_api_key_dict.api_key)
        if api_key is None:
            raise refusal(
                MissingApiKey(
                    "You didn't provide an API key. Send it as Authorization: Bearer <key> "
                    "or x-api-key: <key>."
                ),
                api,
            )
        request_id = str(data.get("litellm_call_id") or "")
        if not request_id or len(request_id) > 64:
            request_id = new_request_id()
        try:
            authorization = await self.client.authorize(
                api_key=api_key,
                model=str(data.get("model")),
                api=api,
                prompt_tokens=_prompt_tokens(data, api),
                max_tokens=_max_tokens(data, api),
                n=_choices(data, api),
                reasoning=_reasoning(data, api),
                request_id=request_id,
            )
        except MeteringError as error:
            raise refusal(error, api) from None
        _metadata(data)[_STATE] = {"authorization": authorization.to_json(), "state": "held"}
        return data

    async def async_post_call_success_hook(
        self, data: dict, user_api_key_dict: UserAPIKeyAuth, response: Any
    ) -> Any:
        state = _state(data)
        if state is None:
            return response
        if _usage_of(response) is None and (data.get("stream") or hasattr(response, "__aiter__")):
            return response  # a stream: the streaming hook records it as it ends
        authorization = Authorization.from_json(state["authorization"])
        try:
            usage = usage_from_response(response, authorization.api)
        except MissingUsage as missing:
            _unmetered(state, authorization, missing)
            return response
        self._record(state, authorization, usage, "completed")
        return response

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: UserAPIKeyAuth, response: Any, request_data: dict
    ) -> AsyncGenerator[Any, None]:
        state = _state(request_data)
        if state is None:
            async for item in response:
                yield item
            return
        authorization = Authorization.from_json(state["authorization"])
        collector = UsageCollector(authorization.api)
        outcome: Outcome = "failed"
        try:
            async for item in response:
                try:
                    collector.add(item)
                except Exception:  # a chunk we cannot read must not break the customer's stream
                    log.exception(
                        "metering: unreadable stream item in %s", authorization.request_id
                    )
                yield item
            outcome = "completed"
        finally:
            if not collector.has_usage:
                _usage_litellm_received(response, collector)
            self._settle_stream(state, authorization, collector, outcome)

    async def async_post_call_failure_hook(
        self,
        request_data: dict,
        original_exception: Exception,
        user_api_key_dict: UserAPIKeyAuth,
        traceback_str: str | None = None,
    ) -> None:
        state = _state(request_data)
        if state is None:
            return
        # Failed before any response: nothing was generated, nothing is charged.
        self.client.void(Authorization.from_json(state["authorization"]))
        state["state"] = "voided"

    # -- settling ------------------------------------------------------------------------------

    def _settle_stream(
        self,
        state: dict[str, Any],
        authorization: Authorization,
        collector: UsageCollector,
        outcome: Outcome,
    ) -> None:
        if state["state"] != "held":
            return
        if collector.has_usage:
            self._record(state, authorization, collector.usage(), outcome)
        elif outcome == "failed" and collector.items == 0:
            # The stream failed before its first chunk: nothing was generated.
            self.client.void(authorization)
            state["state"] = "voided"
        else:
            _unmetered(
                state,
                authorization,
                MissingUsage(authorization.api, f"stream {outcome} without usage"),
            )

    def _record(
        self,
        state: dict[str, Any],
        authorization: Authorization,
        usage: dict[str, Any],
        outcome: Outcome,
    ) -> None:
        if state["state"] != "held":
            return
        self.client.record(authorization.usage_event(usage, outcome=outcome))
        state["state"] = "recorded"


def _usage_litellm_received(response: Any, collector: UsageCollector) -> None:
    """A stream that broke before its usage chunk: the usage the model's provider had reported
    with the chunks LiteLLM received (LiteLLM keeps them as ``chunks`` on its stream wrapper,
    and strips their usage before the customer sees them)."""
    received = getattr(response, "chunks", None)
    if not isinstance(received, list):
        return
    for chunk in received:
        try:
            collector.add(chunk)
        except Exception:
            log.exception("metering: unreadable chunk of LiteLLM's stream")


def _unmetered(state: dict[str, Any], authorization: Authorization, missing: MissingUsage) -> None:
    state["state"] = "unmetered"
    log.error(
        "metering: request %s (hold %s) has no usage to record (%s); its hold is left to "
        "expire and will be listed as lost usage",
        authorization.request_id,
        authorization.id,
        missing.reason,
    )


def _metadata(data: dict) -> dict:
    """LiteLLM's own metadata of the request (never forwarded to the model's provider)."""
    metadata = data.get("litellm_metadata")
    if isinstance(metadata, dict):
        return metadata
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        metadata = data["metadata"] = {}
    return metadata


def _state(data: dict) -> dict[str, Any] | None:
    for name in ("litellm_metadata", "metadata"):
        metadata = data.get(name)
        if isinstance(metadata, dict) and isinstance(metadata.get(_STATE), dict):
            state: dict[str, Any] = metadata[_STATE]
            return state if state.get("state") == "held" else None
    return None


def _usage_of(response: Any) -> Any:
    if isinstance(response, Mapping):
        return response.get("usage")
    return getattr(response, "usage", None)


# -- the estimate's inputs from the request -------------------------------------------------------


def _prompt_tokens(data: Mapping[str, Any], api: Api) -> int:
    """The prompt's tokens by LiteLLM's counter over everything the model reads (the JSON of
    the messages, system prompt and tools: a little above the model's own count, as a hold
    should be); the UTF-8 length, an upper bound, if the counter fails."""
    fields = {
        "chat_completions": ("messages", "tools", "functions"),
        "messages": ("system", "messages", "tools"),
        "responses": ("instructions", "input", "tools"),
    }[api]
    text = json.dumps(
        [data.get(name) for name in fields if data.get(name) is not None],
        ensure_ascii=False,
        default=str,
    )
    try:
        return int(litellm.token_counter(model=str(data.get("model") or ""), text=text))
    except Exception:
        return len(text.encode())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _max_tokens(data: Mapping[str, Any], api: Api) -> int | None:
    if api == "chat_completions":
        # Both given: max_tokens wins (the reference API's rule).
        given = _int(data.get("max_tokens"))
        return given if given is not None else _int(data.get("max_completion_tokens"))
    if api == "messages":
        return _int(data.get("max_tokens"))
    return _int(data.get("max_output_tokens"))


def _choices(data: Mapping[str, Any], api: Api) -> int:
    return (_int(data.get("n")) or 1) if api == "chat_completions" else 1


def _reasoning(data: Mapping[str, Any], api: Api) -> bool:
    """Whether the request may reason. Messages: off unless ``thinking`` enables it. The other
    APIs: on unless the effort is ``none`` (a model may reason by default, and the hold must
    cover the most the request can cost)."""
    if api == "messages":
        thinking = data.get("thinking")
        return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")
    if api == "chat_completions":
        effort = data.get("reasoning_effort")
    else:
        reasoning = data.get("reasoning")
        effort = reasoning.get("effort") if isinstance(reasoning, Mapping) else None
    return effort != "none"


hook = MeteringHook()
