"""``MeteringClient`` (and ``AsyncMeteringClient``, metering_client.aio): the three calls a
gateway makes.

* ``authorize(...)`` before the model runs: a hold on the request's maximum cost, or the typed
  refusal to answer the customer with (``err.to_openai()`` / ``err.to_anthropic()``).
* ``void(authorization)`` when the request failed before generating anything.
* ``record(event)`` when it ran (streams too; ``outcome="failed"`` for a stream that broke after
  it started).

``record`` and ``void`` never wait for the network: they append to the durable journal (the
spool) and return; a background thread sends. ``flush()`` waits for the journal to empty;
``close()`` flushes and stops (what could not be sent stays in the spool for the next start).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import httpx2 as httpx

from metering_client.errors import MeteringError, MeteringUnavailable
from metering_client.records import (
    Authorization,
    UsageEvent,
    check_request_id,
    new_request_id,
)
from metering_client.sender import Sender, SenderSettings
from metering_client.spool import Spool, default_spool_path
from metering_client.usage import APIS, Api

log = logging.getLogger("metering_client")

Policy = Literal["deny", "allow"]

# Keys remembered (by their SHA-256) with the key id metering resolved them to: the ``allow``
# policy serves a key it has seen while metering is away, and only those.
_KNOWN_KEYS = 10_000


@dataclass(frozen=True)
class ClientSettings:
    """Where metering is and how to treat it. Every field has an environment variable."""

    url: str
    token: str
    spool_path: Path
    # ``deny``: refuse requests while metering cannot be reached (prepaid credit: the default).
    # ``allow``: serve keys authorized before, record their usage when metering is back.
    on_unavailable: Policy = "deny"
    # The longest an authorization may take, retries included, before the policy applies.
    authorize_timeout: float = 3.0
    # One HTTP call's timeout.
    request_timeout: float = 2.0
    sender: SenderSettings = field(default_factory=SenderSettings)

    @classmethod
    def resolve(
        cls,
        url: str | None = None,
        token: str | None = None,
        *,
        spool_path: str | os.PathLike[str] | None = None,
        on_unavailable: Policy | None = None,
        authorize_timeout: float | None = None,
        request_timeout: float = 2.0,
        sender: SenderSettings | None = None,
    ) -> ClientSettings:
        """Arguments first, then ``METERING_URL``, ``METERING_GATEWAY_TOKEN``,
        ``METERING_SPOOL_PATH``, ``METERING_ON_UNAVAILABLE``, ``METERING_AUTHORIZE_TIMEOUT``."""
        env = os.environ
        url = url or env.get("METERING_URL")
        token = token or env.get("METERING_GATEWAY_TOKEN")
        if not url:
            raise ValueError("metering's URL: pass url= or set METERING_URL")
        if not token:
            raise ValueError("a gateway token: pass token= or set METERING_GATEWAY_TOKEN")
        policy = on_unavailable or env.get("METERING_ON_UNAVAILABLE") or "deny"
        if policy not in ("deny", "allow"):
            raise ValueError(f"on_unavailable must be deny or allow, not {policy!r}")
        timeout = authorize_timeout
        if timeout is None:
            timeout = float(env.get("METERING_AUTHORIZE_TIMEOUT") or 3.0)
        path = spool_path or env.get("METERING_SPOOL_PATH") or default_spool_path()
        return cls(
            url=url.rstrip("/"),
            token=token,
            spool_path=Path(path),
            on_unavailable=policy,  # type: ignore[arg-type]
            authorize_timeout=timeout,
            request_timeout=request_timeout,
            sender=sender or SenderSettings(),
        )


class BaseClient:
    """What both clients share: settings, the journal and its sender (made per process, so a
    client made before a fork works in the child), the authorization's wire format."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._pid = -1
        self._spool: Spool | None = None
        self._sender: Sender | None = None
        self._known_keys: OrderedDict[str, str] = OrderedDict()
        self._headers = {"Authorization": f"Bearer {settings.token}"}
        self._started()

    # -- the journal ---------------------------------------------------------------------------

    def _started(self) -> tuple[Spool, Sender]:
        if self._pid != os.getpid() or self._sender is None or self._spool is None:
            with self._lock:
                if self._pid != os.getpid() or self._sender is None or self._spool is None:
                    # A fresh connection and thread in this process (a forked child inherits
                    # neither usable).
                    self._spool = Spool(self.settings.spool_path)
                    self._sender = Sender(self._spool, self._sender_http, self.settings.sender)
                    self._pid = os.getpid()
        return self._spool, self._sender

    def _sender_http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.settings.url,
            headers=self._headers,
            timeout=max(self.settings.request_timeout, 10.0),
        )

    def record(self, event: UsageEvent) -> None:
        """Queue a usage event: durable in the spool when this returns, sent in the background
        (batched, retried with the same ``request_id`` until metering acknowledges it)."""
        if not isinstance(event, UsageEvent):
            raise TypeError("record() takes a UsageEvent (see Authorization.usage_event)")
        spool, sender = self._started()
        spool.append("event", event.to_json())
        sender.notify()

    def void(self, authorization: Authorization | str) -> None:
        """Release the hold of a request that failed before generating anything (not charged).
        Queued like ``record``; a provisional authorization has no hold and needs none."""
        authorization_id = (
            authorization.id if isinstance(authorization, Authorization) else authorization
        )
        if authorization_id is None:
            return
        spool, sender = self._started()
        spool.append("void", {"authorization_id": authorization_id})
        sender.notify()

    def pending(self) -> int:
        """Entries not yet acknowledged by metering (events and voids)."""
        spool, _ = self._started()
        return spool.pending()

    # -- authorization -------------------------------------------------------------------------

    def _authorization_body(
        self,
        *,
        api_key: str,
        model: str,
        api: Api,
        prompt_tokens: int,
        max_tokens: int | None,
        n: int,
        reasoning: bool,
        request_id: str,
        hold_ttl_seconds: int | None,
    ) -> dict[str, Any]:
        if api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {api!r}")
        body: dict[str, Any] = {
            "api_key": api_key,
            "request_id": check_request_id(request_id),
            "model": model,
            "api": api,
            "prompt_tokens": prompt_tokens,
            "n": n,
            "reasoning": reasoning,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if hold_ttl_seconds is not None:
            body["hold_ttl_seconds"] = hold_ttl_seconds
        return body

    def _granted(
        self, response: httpx.Response, api_key: str, api: Api, received_at: datetime
    ) -> Authorization:
        try:
            # Money fields stay exact (Decimal), never a float.
            data = json.loads(response.content, parse_float=Decimal)
        except ValueError:
            data = None
        if response.status_code != 200 or not isinstance(data, dict):
            raise MeteringError.from_response(response.status_code, data, response.headers)
        self._remember_key(api_key, data["api_key_id"])
        return Authorization(
            id=data["id"],
            request_id=data["request_id"],
            api_key_id=data["api_key_id"],
            model=data["model"],
            api=api,
            received_at=received_at,
            account_id=data.get("account_id"),
            max_tokens=data.get("max_tokens"),
            estimate_microcents=data.get("estimate_microcents"),
            expires_at=data.get("expires_at"),
            raw=data,
        )

    def _unreachable(
        self, body: Mapping[str, Any], api: Api, received_at: datetime, why: str
    ) -> Authorization:
        """The policy's answer when metering could not answer in time."""
        key_id = self._known_key(str(body["api_key"]))
        if self.settings.on_unavailable == "allow" and key_id is not None:
            log.warning("metering unreachable (%s): serving request %s", why, body["request_id"])
            return Authorization(
                id=None,
                request_id=str(body["request_id"]),
                api_key_id=key_id,
                model=str(body["model"]),
                api=api,
                received_at=received_at,
                provisional=True,
            )
        raise MeteringUnavailable(
            "The billing service is temporarily unavailable. Retry after a short delay.",
            retry_after=1,
        )

    def _remember_key(self, api_key: str, key_id: str) -> None:
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        with self._lock:
            self._known_keys[digest] = key_id
            self._known_keys.move_to_end(digest)
            while len(self._known_keys) > _KNOWN_KEYS:
                self._known_keys.popitem(last=False)

    def _known_key(self, api_key: str) -> str | None:
        return self._known_keys.get(hashlib.sha256(api_key.encode()).hexdigest())

    def _attempts(self) -> Iterator[tuple[float, float]]:
        """(pause before the attempt, that attempt's timeout) within ``authorize_timeout``."""
        deadline = time.monotonic() + self.settings.authorize_timeout
        pause = 0.0
        while True:
            left = deadline - time.monotonic() - pause
            if left <= 0:
                return
            yield pause, min(self.settings.request_timeout, left)
            pause = min(1.0, max(0.05, pause * 2)) * random.uniform(0.8, 1.2)


def transient_failure(response: httpx.Response) -> bool:
    """A failure the same authorization may be retried after (same ``request_id``: no double
    hold). A 429 is a refusal (concurrency), never retried here."""
    return response.status_code >= 500


def utc_now() -> datetime:
    return datetime.now(UTC)


class MeteringClient(BaseClient):
    """The synchronous client (threads). Configure by arguments or ``METERING_*`` variables."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        spool_path: str | os.PathLike[str] | None = None,
        on_unavailable: Policy | None = None,
        authorize_timeout: float | None = None,
        sender: SenderSettings | None = None,
    ) -> None:
        settings = ClientSettings.resolve(
            url,
            token,
            spool_path=spool_path,
            on_unavailable=on_unavailable,
            authorize_timeout=authorize_timeout,
            sender=sender,
        )
        self._http = httpx.Client(
            base_url=settings.url, headers={"Authorization": f"Bearer {settings.token}"}
        )
        super().__init__(settings)

    def authorize(
        self,
        *,
        api_key: str,
        model: str,
        api: Api,
        prompt_tokens: int,
        max_tokens: int | None = None,
        n: int = 1,
        reasoning: bool = False,
        request_id: str | None = None,
        hold_ttl_seconds: int | None = None,
        received_at: datetime | None = None,
    ) -> Authorization:
        """Hold the request's maximum cost, or raise the refusal (a ``MeteringError``)."""
        received_at = received_at or utc_now()
        body = self._authorization_body(
            api_key=api_key,
            model=model,
            api=api,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            n=n,
            reasoning=reasoning,
            request_id=request_id or new_request_id(),
            hold_ttl_seconds=hold_ttl_seconds,
        )
        why = "no attempt"
        for pause, timeout in self._attempts():
            if pause:
                time.sleep(pause)
            try:
                response = self._http.post("/v1/authorizations", json=body, timeout=timeout)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
                continue
            if transient_failure(response):
                why = f"HTTP {response.status_code}"
                continue
            return self._granted(response, api_key, api, received_at)
        return self._unreachable(body, api, received_at, why)

    def flush(self, timeout: float = 10.0) -> int:
        """Wait until every queued event and void is acknowledged, or ``timeout``; how many are
        left (they stay in the spool)."""
        _, sender = self._started()
        return sender.flush(timeout)

    def close(self, timeout: float = 10.0) -> int:
        """Flush (up to ``timeout``), stop the sender and close the connections."""
        _, sender = self._started()
        left = sender.close(timeout)
        self._http.close()
        return left

    def __enter__(self) -> MeteringClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
