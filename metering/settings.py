"""The one place configuration is read from the environment (prefix ``METERING_``)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from metering.kit.smtp import smtp_target
from metering.kit.tokens import duplicate_secrets

DEFAULT_BODY_LIMIT = 16 * 1024 * 1024
MIN_SECRET_KEY_LENGTH = 32


def _split_tokens(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METERING_", extra="ignore")

    data_dir: Path = Path("./data")
    # Empty means the embedded SQLite file ``<data_dir>/metering.sqlite3``; a sqlite:/// URL
    # names another file for the embedded database.
    database_url: str = ""
    gateway_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    admin_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Operators who may read everything under /admin/v1/ and change nothing.
    admin_readonly_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # When set, GET /metrics asks for it (or an admin token); unset, /metrics is open.
    metrics_token: str = ""
    hold_ttl_seconds: int = Field(default=3600, ge=1, le=7 * 24 * 3600)
    export_dir: Path = Path("./data/exports")
    # The scheduler exports a UTC day this many minutes after it ends (late events: re-export).
    export_after_minutes: int = Field(default=15, ge=0, le=24 * 60)
    # The embedded quick start seeds a demo account with 7 days of usage on its first start.
    demo: bool = True
    max_body_bytes: int = Field(default=DEFAULT_BODY_LIMIT, ge=1024)
    # Slow clients: a request's headers must arrive within this many seconds of its first byte
    # (of the connection, for a new one), and its body within this many of the request's start.
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    body_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)
    # Connections per process: this many for the thread-pool routes, as many for the gateway's.
    db_pool_size: int = Field(default=10, ge=1, le=100)
    # How long a request waits for the database (a connection of the pool; the embedded
    # database's writer's turn) before it is refused 503 database_unavailable (Retry-After): a
    # burst is queued this long, never left hanging.
    db_wait_seconds: float = Field(default=10.0, gt=0, le=300)
    # Single usage events on PostgreSQL, recorded together: after a call, the longest the next
    # waits for the requests that call answered to be followed by their clients' next ones (at
    # most as long as that call took; 0: never waits). metering.usage.together
    usage_gather_wait_ms: float = Field(default=5.0, ge=0, le=100)
    log_level: str = "INFO"
    # One line per request on the "metering.access" logger (method, path, status, duration).
    access_log: bool = True
    # One home for the service's secret key (webhooks and the portal): one or more comma-separated
    # strings of at least 32 characters; the first signs the portal's cookies and CSRF tokens
    # and encrypts the webhook signing secrets, every one verifies/decrypts (rotation).
    # Generated for the embedded quick start; required with a server database
    # (metering.runtime.runtime_settings).
    secret_key: Annotated[list[str], NoDecode] = Field(default_factory=list, repr=False)
    # The address customers reach the service at: the portal's sign-in links start with it.
    # Defaults to the embedded server's own address; required with a server database.
    public_base_url: str = ""
    # Webhook delivery: the timeout of one attempt, extra CA certificates (a PEM file), and
    # whether private and loopback addresses (and http://) are allowed (None: only embedded).
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    webhook_ca_bundle: Path | None = None
    webhook_allow_private: bool | None = None
    # credit.grant_expiring: written by the scheduler this many days before a grant expires.
    grant_notice_days: int = Field(default=7, ge=0, le=366)
    # Payments (Stripe, metering.payments): off unless the secret key is set. The API base is
    # Stripe's own unless pointed elsewhere (the tests' localstripe); the script is Stripe.js,
    # the portal's only script from another origin, and only when payments are on.
    stripe_secret_key: str = Field(default="", repr=False)
    stripe_publishable_key: str = ""
    stripe_webhook_secret: str = Field(default="", repr=False)
    stripe_api_base: str = "https://api.stripe.com"
    stripe_js_url: str = "https://js.stripe.com/v3/"
    # Every payment's bounds, in whole cents, and the expiry of bought credit (None: never).
    topup_min_cents: int = Field(default=500, ge=1, le=9 * 10**12)
    topup_max_cents: int = Field(default=1_000_000, ge=1, le=9 * 10**12)
    topup_expiry_days: int | None = Field(default=None, ge=1, le=36500)
    # Sign-in links by email (the portal's "email me a sign-in link", and a new member's link):
    # off unless the SMTP server is set, ``smtp://`` (STARTTLS when the server offers it) or
    # ``smtps://`` (TLS from the start), ``[user:password@]host[:port]``; the sender's address.
    smtp_url: str = Field(default="", repr=False)
    mail_from: str = ""

    _split = field_validator(
        "gateway_tokens", "admin_tokens", "admin_readonly_tokens", "secret_key", mode="before"
    )(_split_tokens)

    @field_validator("secret_key")
    @classmethod
    def _long_enough(cls, keys: list[str]) -> list[str]:
        if any(len(key) < MIN_SECRET_KEY_LENGTH for key in keys):
            raise ValueError(
                f"each comma-separated key must be at least {MIN_SECRET_KEY_LENGTH} characters"
            )
        return keys

    @field_validator("public_base_url")
    @classmethod
    def _an_address(cls, url: str) -> str:
        url = url.strip().rstrip("/")
        if url and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
            raise ValueError(
                "must be an http:// or https:// address, e.g. https://billing.example.com"
            )
        return url

    @field_validator("stripe_api_base", "stripe_js_url")
    @classmethod
    def _an_http_address(cls, url: str) -> str:
        url = url.strip()
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
            raise ValueError("must be an http:// or https:// address")
        return url

    @field_validator("smtp_url")
    @classmethod
    def _an_smtp_address(cls, url: str) -> str:
        url = url.strip()
        if url:
            smtp_target(url)  # a ValueError that never repeats the URL (it holds a password)
        return url

    @field_validator("mail_from")
    @classmethod
    def _a_mailbox(cls, address: str) -> str:
        address = address.strip()
        mailbox = r"[^\s@<>]+@[^\s@<>]+"  # an address alone, or "Name <address>"
        if address and not re.fullmatch(rf"{mailbox}|[^<>]*<{mailbox}>", address):
            raise ValueError("must be an email address, e.g. billing@example.com")
        return address

    @model_validator(mode="after")
    def _mail_needs_a_sender(self) -> Settings:
        if self.smtp_url and not self.mail_from:
            raise ValueError("METERING_MAIL_FROM is required with METERING_SMTP_URL")
        return self

    @model_validator(mode="after")
    def _topup_bounds(self) -> Settings:
        if self.topup_min_cents > self.topup_max_cents:
            raise ValueError("METERING_TOPUP_MIN_CENTS must not be above METERING_TOPUP_MAX_CENTS")
        return self

    @model_validator(mode="after")
    def _each_secret_once(self) -> Settings:
        problem = duplicate_secrets(
            {
                "METERING_GATEWAY_TOKENS": self.gateway_tokens,
                "METERING_ADMIN_TOKENS": self.admin_tokens,
                "METERING_ADMIN_READONLY_TOKENS": self.admin_readonly_tokens,
                "METERING_METRICS_TOKEN": [self.metrics_token] if self.metrics_token else [],
            }
        )
        if problem:
            raise ValueError(problem)
        return self

    @property
    def is_embedded(self) -> bool:
        """SQLite, however it is named: the quick start's file or one METERING_DATABASE_URL
        names (``sqlite:///…``, ``sqlite+pysqlite:///…``) is the embedded database."""
        scheme = self.database_url.partition(":")[0].partition("+")[0]
        return not self.database_url or scheme.strip().lower() == "sqlite"

    @property
    def payments_on(self) -> bool:
        """Payments are on exactly when the Stripe secret key is set."""
        return bool(self.stripe_secret_key)

    @property
    def mail_on(self) -> bool:
        """Sign-in links are emailed exactly when the SMTP server is set."""
        return bool(self.smtp_url)

    @property
    def webhooks_may_reach_private(self) -> bool:
        if self.webhook_allow_private is None:
            return self.is_embedded
        return self.webhook_allow_private

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'metering.sqlite3').resolve()}"


def describe_error(error: ValidationError) -> str:
    """A bad setting in one line: the variable and what is wrong, never its value (it may be a
    secret or a password)."""
    problems = error.errors()
    first = problems[0]
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    loc = [str(part) for part in first.get("loc", ())]
    text = f"METERING_{loc[0].upper()}: {message}" if loc else message
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more)"
    return text


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
