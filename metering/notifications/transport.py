"""The webhook deliveries' HTTP client: it follows no redirect, ignores proxy variables and
connects only to addresses the rules allow (metering.notifications.addresses), checked on the
resolved address itself. Its own module, loaded by the delivery loop only (the HTTP client's
modules are not needed in the server's workers)."""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2
from httpcore2 import NetworkStream
from httpcore2._backends.sync import SyncBackend

from metering.notifications.addresses import Resolver, allowed_addresses
from metering.settings import Settings


class GuardedBackend(SyncBackend):
    """Connects only to addresses the rules allow, checked on the resolved address itself."""

    def __init__(self, allow_private: bool, resolver: Resolver) -> None:
        self.allow_private = allow_private
        self.resolver = resolver

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> NetworkStream:
        try:
            addresses = allowed_addresses(host, port, self.allow_private, self.resolver)
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from exc
        last: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore2.ConnectError as exc:
                last = exc
        assert last is not None
        raise last


def make_client(settings: Settings, resolver: Resolver, max_connections: int) -> httpx2.Client:
    """An HTTP client that follows no redirect, ignores proxy variables and checks addresses."""
    context = ssl.create_default_context()
    if settings.webhook_ca_bundle is not None:
        context.load_verify_locations(cafile=str(settings.webhook_ca_bundle))
    transport = httpx2.HTTPTransport(verify=context, trust_env=False)
    transport._pool = httpcore2.ConnectionPool(
        ssl_context=context,
        max_connections=max_connections,
        max_keepalive_connections=10,
        keepalive_expiry=5.0,
        network_backend=GuardedBackend(settings.webhooks_may_reach_private, resolver),
    )
    return httpx2.Client(
        transport=transport,
        timeout=httpx2.Timeout(settings.webhook_timeout_seconds),
        follow_redirects=False,
        trust_env=False,
    )
