"""Start-up: the settings a process actually runs with, and the embedded quick start's setup."""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from metering.settings import Settings

DEV_TOKENS_FILE = "dev-tokens.env"
SECRET_KEY_FILE = "secret-key"
ADMIN_VAR = "METERING_ADMIN_TOKEN"
GATEWAY_VAR = "METERING_GATEWAY_TOKEN"


@dataclass(frozen=True)
class DevTokens:
    admin: str
    gateway: str
    path: Path
    created: bool


def dev_tokens_path(settings: Settings) -> Path:
    return settings.data_dir / DEV_TOKENS_FILE


def ensure_dev_tokens(settings: Settings) -> DevTokens:
    """The embedded quick start's tokens, generated on first start and kept (mode 0600) in the
    data directory as shell assignments, so ``. data/dev-tokens.env`` sets them for curl."""
    path = dev_tokens_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    created = False
    if not path.exists():
        text = (
            f"{ADMIN_VAR}=mt_admin_{secrets.token_urlsafe(24)}\n"
            f"{GATEWAY_VAR}=mt_gw_{secrets.token_urlsafe(24)}\n"
        )
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another worker won the race; read theirs
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            created = True
    values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return DevTokens(values[ADMIN_VAR], values[GATEWAY_VAR], path, created)


def ensure_secret_key(settings: Settings) -> str:
    """The embedded default's ``METERING_SECRET_KEY`` (§11): generated on first start and kept
    (mode 0600) in the data directory, never printed or logged."""
    path = settings.data_dir / SECRET_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass  # made before (or by another worker just now): read it
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
    return path.read_text().strip()


def with_secret_key(settings: Settings) -> Settings:
    """The settings with a secret key: the configured one, or the embedded default's."""
    if settings.secret_key or not settings.is_embedded:
        return settings
    return settings.model_copy(update={"secret_key": [ensure_secret_key(settings)]})


def runtime_settings(settings: Settings | None = None) -> Settings:
    """Settings from the environment; with the embedded database and no tokens (or secret key)
    configured, the generated ones. A server database without them is a configuration error."""
    settings = settings or Settings()
    if not settings.is_embedded:
        if not (settings.admin_tokens and settings.gateway_tokens):
            raise SystemExit(
                "METERING_ADMIN_TOKENS and METERING_GATEWAY_TOKENS must be set when "
                "METERING_DATABASE_URL points at a server database"
            )
        if not settings.secret_key:
            raise SystemExit(
                "METERING_SECRET_KEY must be set when METERING_DATABASE_URL points at a "
                "server database (at least 32 characters: it encrypts webhook signing secrets)"
            )
        return settings
    settings = with_secret_key(settings)
    if settings.admin_tokens and settings.gateway_tokens:
        return settings
    tokens = ensure_dev_tokens(settings)
    return settings.model_copy(
        update={
            "admin_tokens": settings.admin_tokens or [tokens.admin],
            "gateway_tokens": settings.gateway_tokens or [tokens.gateway],
        }
    )


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str) -> None:
    # The format names no source line, thread or process: not collecting them per record
    # (finding the caller walks the stack) halves what a line of the access log costs.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
