"""``AsyncMeteringClient``: ``MeteringClient`` for asyncio gateways (the same spool and sender;
``authorize`` over an asyncio connection pool)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import datetime

import httpx2 as httpx

from metering_client.client import BaseClient, ClientSettings, Policy, transient_failure, utc_now
from metering_client.records import Authorization, new_request_id
from metering_client.sender import SenderSettings
from metering_client.usage import Api


class AsyncMeteringClient(BaseClient):
    """The asyncio client: ``await authorize(...)``; ``record`` and ``void`` return at once
    (they only append to the spool); ``await flush()`` and ``await close()``."""

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
        # One connection pool per event loop (a loop's connections cannot serve another's).
        self._pools: dict[int, httpx.AsyncClient] = {}
        super().__init__(settings)

    def _http(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        pool = self._pools.get(loop)
        if pool is None:
            pool = httpx.AsyncClient(base_url=self.settings.url, headers=self._headers)
            self._pools[loop] = pool
        return pool

    async def authorize(
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
        http = self._http()
        for pause, timeout in self._attempts():
            if pause:
                await asyncio.sleep(pause)
            try:
                response = await http.post("/v1/authorizations", json=body, timeout=timeout)
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
                continue
            if transient_failure(response):
                why = f"HTTP {response.status_code}"
                continue
            return self._granted(response, api_key, api, received_at)
        return self._unreachable(body, api, received_at, why)

    async def flush(self, timeout: float = 10.0) -> int:
        _, sender = self._started()
        return await asyncio.to_thread(sender.flush, timeout)

    async def close(self, timeout: float = 10.0) -> int:
        _, sender = self._started()
        left = await asyncio.to_thread(sender.close, timeout)
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            with contextlib.suppress(RuntimeError):  # a pool of a loop that has gone
                await pool.aclose()
        return left

    async def __aenter__(self) -> AsyncMeteringClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
