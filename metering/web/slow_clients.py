"""The served HTTP protocol with a deadline for a request's headers: a client that sends them
slowly (a byte every few seconds, to hold a connection) is answered 408 and disconnected once
``METERING_HEADER_TIMEOUT_SECONDS`` have passed since the request's first byte, or since the
connection was opened when it sends nothing. uvicorn times out only idle keep-alive connections;
the body's deadline is the request middleware's (metering.web.middleware).

``metering serve`` names the class to uvicorn (``http=``); it reads its settings once per worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from metering.settings import get_settings

_MESSAGE = b"the request headers arrived too slowly\n"
TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_MESSAGE), _MESSAGE)
)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the deadline for headers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = get_settings().header_timeout_seconds
        self.header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _too_slow(self) -> None:
        self.header_timer = None
        if not self.transport.is_closing():
            self.transport.write(TIMED_OUT)
            self.transport.close()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._between_requests():
            self._arm()  # the first bytes of a request: its headers are due
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle or self.transport.is_closing():
            self._disarm()  # its headers are in (a new cycle), or the connection is over

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
