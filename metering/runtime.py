"""Start-up: the settings a process actually runs with, and the embedded quick start's setup."""

from __future__ import annotations

import glob
import logging
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from metering.settings import Settings

DEV_TOKENS_FILE = "dev-tokens.env"
SECRET_KEY_FILE = "secret-key"
ADMIN_VAR = "METERING_ADMIN_TOKEN"
GATEWAY_VAR = "METERING_GATEWAY_TOKEN"
# prometheus_client's multiprocess mode: read by it when it is first imported (metering.metrics).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SECRET_KEY_FILE = "secret-key"
# The embedded server's address when METERING_PUBLIC_BASE_URL is unset (``metering serve``
# passes its own --host and --port to its workers instead).
EMBEDDED_BASE_URL = "http://127.0.0.1:8000"


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
    """The embedded quick start's ``METERING_SECRET_KEY`` (one home: the portal's cookies and
    the webhook signing secrets), generated on first start and kept (mode 0600) in the data
    directory, so sessions survive a restart; never printed or logged."""
    path = settings.data_dir / SECRET_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass  # made before, or by another worker just now
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(48) + "\n")
    for _ in range(50):  # another worker may be writing it this instant
        key = path.read_text().strip()
        if key:
            return key
        time.sleep(0.01)
    raise SystemExit(f"{path} is empty: remove it to have a new secret key generated")


def with_secret_key(settings: Settings) -> Settings:
    """The settings with a secret key: the configured one, or the embedded default's."""
    if settings.secret_key or not settings.is_embedded:
        return settings
    return settings.model_copy(update={"secret_key": [ensure_secret_key(settings)]})


def runtime_settings(settings: Settings | None = None) -> Settings:
    """Settings from the environment; with the embedded database, the generated dev tokens and
    secret key where none is configured, and the embedded server's own address as the public
    one. A server database without tokens, secret key or public address is a configuration
    error. The one secret key signs the portal's cookies and encrypts webhook signing secrets."""
    settings = settings or Settings()
    if not settings.is_embedded:
        missing = []
        if not (settings.admin_tokens and settings.gateway_tokens):
            missing.append("METERING_ADMIN_TOKENS and METERING_GATEWAY_TOKENS")
        if not settings.secret_key:
            missing.append("METERING_SECRET_KEY")
        if not settings.public_base_url:
            missing.append("METERING_PUBLIC_BASE_URL")
        if missing:
            raise SystemExit(
                f"{', '.join(missing)} must be set when METERING_DATABASE_URL points at a "
                "server database"
            )
        return settings
    settings = with_secret_key(settings)
    update: dict[str, object] = {}
    if not (settings.admin_tokens and settings.gateway_tokens):
        tokens = ensure_dev_tokens(settings)
        update["admin_tokens"] = settings.admin_tokens or [tokens.admin]
        update["gateway_tokens"] = settings.gateway_tokens or [tokens.gateway]
    if not settings.public_base_url:
        update["public_base_url"] = EMBEDDED_BASE_URL
    return settings.model_copy(update=update) if update else settings


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def configure_logging(level: str) -> None:
    # The format names no source line, thread or process: not collecting them per record
    # (finding the caller walks the stack) halves what a line of the access log costs.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def prepare_metrics_directory() -> Path:
    """For a server start (``metering serve``), before any worker starts: the directory its
    workers write their metrics to, set in ``PROMETHEUS_MULTIPROC_DIR``. One the operator set is
    used and emptied (the library's docs: wiped between runs); otherwise a fresh temporary one.
    Returns it; ``remove_metrics_directory`` removes a temporary one when the server stops."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
    else:
        path = Path(tempfile.mkdtemp(prefix="metering-metrics-"))
        os.environ[MULTIPROC_ENV] = str(path)
    return path


def remove_metrics_directory(path: Path, *, created: bool) -> None:
    if created:
        shutil.rmtree(path, ignore_errors=True)
