"""A real SMTP server for the tests (aiosmtpd, in a thread of the test process) that keeps what
it is sent, and the pass of the scheduler that sends the portal's sign-in mails."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from metering.scheduler import Scheduler
from tests.conftest import Api
from tests.servers import free_port

LINK = re.compile(r"https?://[^\s/]+/billing/sign-in/[A-Za-z0-9_-]{43}")


@dataclass
class Received:
    recipients: list[str]
    message: EmailMessage

    @property
    def body(self) -> str:
        part = self.message.get_body(("plain",))
        assert part is not None, self.message
        return str(part.get_content())  # type: ignore[attr-defined]

    @property
    def links(self) -> list[str]:
        return LINK.findall(self.body)


@dataclass
class Inbox:
    """Every message the server accepted, in order; ``url`` is METERING_SMTP_URL for it."""

    url: str = ""
    received: list[Received] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.content, policy=policy.default)
        with self.lock:
            self.received.append(Received(list(envelope.rcpt_tos), message))  # type: ignore[arg-type]
        return "250 Message accepted for delivery"

    def to(self, address: str) -> list[Received]:
        """The messages sent to ``address`` (as the envelope named it, any case)."""
        with self.lock:
            return [
                r for r in self.received if address.lower() in (a.lower() for a in r.recipients)
            ]

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        if isinstance(data, LoginPassword):
            login = (data.login.decode(), data.password.decode())
            with self.lock:
                self.logins.append(login)
            return AuthResult(success=login == ("mailer", "p@ss:word/1"))
        return AuthResult(success=False)


@contextmanager
def smtp_server(*, with_login: bool = False) -> Iterator[Inbox]:
    """An SMTP server on a loopback port; with ``with_login`` it asks for the user ``mailer``
    and the password ``p@ss:word/1`` (AUTH over plain SMTP: the test's loopback only)."""
    inbox = Inbox()
    for attempt in range(5):  # another process may take a free port before the server binds it
        port = free_port()
        extra: dict[str, Any] = {}
        if with_login:
            extra = {"authenticator": inbox.authenticate, "auth_require_tls": False}
        controller = Controller(inbox, hostname="127.0.0.1", port=port, **extra)
        try:
            controller.start()
        except (OSError, RuntimeError):
            if attempt == 4:
                raise
            continue
        break
    credentials = "mailer:p%40ss%3Aword%2F1@" if with_login else ""
    inbox.url = f"smtp://{credentials}127.0.0.1:{port}"
    try:
        yield inbox
    finally:
        controller.stop()


def send_mails(api: Api, **settings: Any) -> int | None:
    """The scheduler's pass of the sign-in mails, now (the server's clock): how many it sent."""
    config = api.settings.model_copy(update=settings) if settings else api.settings
    scheduler = Scheduler(api.database, config, api.clock)
    try:
        return scheduler.mail()
    finally:
        scheduler.close()
