"""Sending one email over SMTP (``METERING_SMTP_URL``), with the standard library's ``smtplib``.

``smtp://[user:password@]host[:port]`` connects in the clear (port 25 by default) and upgrades
with STARTTLS whenever the server offers it; ``smtps://…`` speaks TLS from the first byte (port
465 by default). Certificates are verified against the system's CAs. The password is kept out of
every text this module makes: ``SmtpTarget``'s repr, its errors, the log.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

DEFAULT_PORTS = {"smtp": 25, "smtps": 465}
TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class SmtpTarget:
    scheme: str
    host: str
    port: int
    user: str = ""
    password: str = field(default="", repr=False)

    @property
    def where(self) -> str:
        """The server, for logs and errors (never the credentials)."""
        return f"{self.scheme}://{self.host}:{self.port}"


def smtp_target(url: str) -> SmtpTarget:
    """The server an ``smtp://`` or ``smtps://`` URL names; a ValueError (that does not repeat
    the URL, which may hold a password) for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        raise ValueError("must be smtp:// or smtps://[user:password@]host[:port]") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError("must be smtp:// or smtps://[user:password@]host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must name a server only: smtp(s)://[user:password@]host[:port]")
    return SmtpTarget(
        scheme,
        parts.hostname,
        port or DEFAULT_PORTS[scheme],
        unquote(parts.username or ""),
        unquote(parts.password or ""),
    )


class SendFailed(Exception):
    """The server could not be reached or refused the message (the text names the server and
    the reason, never the credentials)."""


def send(target: SmtpTarget, message: EmailMessage, timeout: float = TIMEOUT_SECONDS) -> None:
    """Hand ``message`` to the server (its ``From`` and ``To`` are the envelope's)."""
    context = ssl.create_default_context()
    try:
        client: smtplib.SMTP
        if target.scheme == "smtps":
            client = smtplib.SMTP_SSL(target.host, target.port, timeout=timeout, context=context)
        else:
            client = smtplib.SMTP(target.host, target.port, timeout=timeout)
        with client:
            client.ehlo()
            if target.scheme == "smtp" and client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
            if target.user:
                client.login(target.user, target.password)
            client.send_message(message)
    except (OSError, smtplib.SMTPException) as error:
        # smtplib's errors carry the server's reply, never what was sent to log in.
        reason = f"{type(error).__name__}: {error}"
        raise SendFailed(f"{target.where}: {reason}") from None
