"""The embedded quick start's demo: on the first start against an empty database, an account
with three keys and credit, and 7 days of synthetic usage recorded through the real ingest
service, so every report, credit figure, export and dashboard has data to show.

The usage is generated from a fixed seed: a diurnal shape (quiet nights, an afternoon peak,
slower weekends), several models and APIs, prompt cache hits, reasoning on the models that
reason, occasional long contexts, and a few streams that failed part-way (billed for the tokens
they report). ``METERING_DEMO=false`` turns it off.
"""

from __future__ import annotations

import math
import os
import random
import shlex
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metering.db import Database
from metering.kit.money import MICROCENTS_PER_CENT, usd_text
from metering.kit.timeutil import floor_hour, format_timestamp
from metering.models import Account, CatalogModel, PriceVersion
from metering.settings import Settings

SEED = 20261129
DAYS = 7
ACCOUNT_NAME = "Demo Co"
GRANT_CENTS = 5_000  # $50.00
GRANT_IDEMPOTENCY_KEY = "demo-welcome-credit"
DEMO_ENV_FILE = "demo.env"
DEMO_KEY_VAR = "METERING_DEMO_KEY"
# (name, share of traffic, monthly spend limit in cents or None)
KEYS: tuple[tuple[str, float, int | None], ...] = (
    ("demo", 0.5, None),
    ("ci-pipeline", 0.3, 20_000),
    ("notebook", 0.2, 5_000),
)
# Models known to reason; the others never report reasoning tokens.
REASONING_MODELS = ("GLM-5.3", "DeepSeek-V4-Pro")
# Traffic shares by rank; the shipped catalog's flagship first, then any other model by id.
MODEL_SHARES = (0.4, 0.25, 0.15, 0.12, 0.08)
PREFERRED_MODELS = ("GLM-5.3", "GLM-5.3-Flash", "DeepSeek-V4-Pro", "Qwen3.8-27B")
APIS = (("chat_completions", 0.6), ("responses", 0.25), ("messages", 0.15))
REQUESTS_PER_PEAK_HOUR = 40
FAILED_STREAM_RATE = 0.006
BATCH = 1000


@dataclass(frozen=True, slots=True)
class DemoSummary:
    account_id: str
    key_id: str
    secret: str
    starting_date: str
    requests: int
    failed: int
    input_tokens: int
    cache_read_tokens: int
    output_tokens: int
    reasoning_tokens: int
    cost_microcents: int
    grant_microcents: int


def _weighted(rng: random.Random, choices: Sequence[tuple[Any, float]]) -> Any:
    return rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]


def _hourly_rate(at: datetime) -> float:
    """Requests per hour: a peak around 15:00 UTC, a trough around 03:00, weekends at 45%."""
    shape = 0.15 + 0.85 * (0.5 + 0.5 * math.cos((at.hour - 15) / 24 * 2 * math.pi)) ** 2
    weekend = 0.45 if at.weekday() >= 5 else 1.0
    return REQUESTS_PER_PEAK_HOUR * shape * weekend


def _usage(api: str, prompt: int, cached: int, output: int, reasoning: int) -> dict[str, Any]:
    """The usage object exactly as each API returns it."""
    if api == "chat_completions":
        return {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        }
    if api == "responses":
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + output,
        }
    # Messages: input_tokens already includes the cache reads; no reasoning field.
    return {"input_tokens": prompt, "cache_read_input_tokens": cached, "output_tokens": output}


def synthetic_events(
    key_ids: Sequence[str], models: Sequence[tuple[str, int]], start: datetime, end: datetime
) -> Iterator[dict[str, Any]]:
    """Usage events on [start, end) for ``key_ids`` (in ``KEYS`` order) and ``models`` (id,
    context length), from the fixed seed: the same arguments give the same events."""
    rng = random.Random(SEED)
    key_choices = [(key_id, share) for key_id, (_, share, _) in zip(key_ids, KEYS, strict=True)]
    model_choices = [(model, share) for model, share in zip(models, MODEL_SHARES, strict=False)]
    hour = floor_hour(start)
    while hour < end:
        count = sum(1 for _ in range(int(_hourly_rate(hour) * 2)) if rng.random() < 0.5)
        offsets = sorted(rng.randrange(3600) for _ in range(count))
        for offset in offsets:
            occurred_at = hour + timedelta(seconds=offset, microseconds=rng.randrange(1_000_000))
            if not start <= occurred_at < end:
                continue
            (model, context_length) = _weighted(rng, model_choices)
            api = _weighted(rng, APIS)
            long_context = rng.random() < 0.04
            median = 40_000 if long_context else 1_800
            prompt = min(int(rng.lognormvariate(math.log(median), 0.8)) + 16, context_length // 2)
            cached = int(prompt * rng.uniform(0.5, 0.95)) if rng.random() < 0.45 else 0
            output = min(int(rng.lognormvariate(math.log(320), 0.9)) + 1, 16_384)
            reasoning = 0
            if model in REASONING_MODELS and api != "messages" and rng.random() < 0.35:
                reasoning = int(output * rng.uniform(0.2, 0.7))
            outcome = "completed"
            if rng.random() < FAILED_STREAM_RATE:
                outcome = "failed"  # the stream broke off: billed for what it reports
                output = max(1, output // 5)
                reasoning = min(reasoning, output)
            yield {
                "request_id": f"demo_{rng.getrandbits(64):016x}",
                "api_key_id": _weighted(rng, key_choices),
                "model": model,
                "api": api,
                "usage": _usage(api, prompt, cached, output, reasoning),
                "occurred_at": format_timestamp(occurred_at),
                "outcome": outcome,
            }
        hour += timedelta(hours=1)


def _demo_models(session: Session, start: datetime) -> list[tuple[str, int]]:
    """Visible, undeprecated catalog models with a list price in force over the whole window,
    the preferred ones first."""
    priced = select(PriceVersion.model_id).where(PriceVersion.effective_at <= start)
    rows = session.execute(
        select(CatalogModel.id, CatalogModel.context_length)
        .where(
            CatalogModel.hidden.is_(False),
            CatalogModel.deprecation_date.is_(None),
            CatalogModel.id.in_(priced),
        )
        .order_by(CatalogModel.id)
    ).all()

    def rank(model_id: str) -> tuple[int, str]:
        preferred = model_id in PREFERRED_MODELS
        return (PREFERRED_MODELS.index(model_id) if preferred else len(PREFERRED_MODELS), model_id)

    found = sorted(((row.id, row.context_length) for row in rows), key=lambda m: rank(m[0]))
    return found[: len(MODEL_SHARES)]


def seed(database: Database, now: datetime) -> DemoSummary | None:
    """Create the demo in one transaction, if the database has no account yet; None otherwise
    (an existing database, or a catalog without prices to bill with)."""
    from metering.accounts.service import create_account, create_api_key
    from metering.ledger.service import add_entry
    from metering.usage import quarantine
    from metering.usage.service import RECORDED, record_events

    end = now - timedelta(minutes=1)
    start = end - timedelta(days=DAYS)
    with database.unit_of_work() as session:
        if session.execute(select(func.count()).select_from(Account)).scalar():
            return None
        models = _demo_models(session, start)
        if not models:
            return None
        account = create_account(session, ACCOUNT_NAME, "prepaid", start)
        keys = [
            create_api_key(
                session,
                account,
                name,
                None if limit is None else limit * MICROCENTS_PER_CENT,
                start,
            )
            for name, _, limit in KEYS
        ]
        grant = GRANT_CENTS * MICROCENTS_PER_CENT
        add_entry(session, account.id, "grant", grant, GRANT_IDEMPOTENCY_KEY, "Demo credit", start)
        events = list(synthetic_events([key.id for key, _ in keys], models, start, end))
        totals = Counter[str]()  # the summary's counts, by their names
        for first in range(0, len(events), BATCH):
            outcome = record_events(session, events[first : first + BATCH], now)
            quarantine.keep(session, outcome.quarantined, now)
            for result in outcome.results:
                charge = result.charge
                if result.status != RECORDED or charge is None:
                    continue
                raw = events[first + result.index]
                totals["requests"] += 1
                totals["failed"] += raw["outcome"] == "failed"
                totals["input_tokens"] += (
                    charge["uncached_input_tokens"] + charge["cache_read_tokens"]
                )
                totals["cache_read_tokens"] += charge["cache_read_tokens"]
                totals["output_tokens"] += charge["output_tokens"]
                totals["reasoning_tokens"] += charge["reasoning_tokens"]
                totals["cost_microcents"] += charge["total_microcents"]
        session.commit()
        demo_key, secret = keys[0]
        return DemoSummary(
            account_id=account.id,
            key_id=demo_key.id,
            secret=secret,
            starting_date=start.date().isoformat(),
            requests=totals["requests"],
            failed=totals["failed"],
            input_tokens=totals["input_tokens"],
            cache_read_tokens=totals["cache_read_tokens"],
            output_tokens=totals["output_tokens"],
            reasoning_tokens=totals["reasoning_tokens"],
            cost_microcents=totals["cost_microcents"],
            grant_microcents=grant,
        )


def demo_env_path(settings: Settings) -> Path:
    return settings.data_dir / DEMO_ENV_FILE


def keep_secret(settings: Settings, summary: DemoSummary) -> Path:
    """The demo key, as a shell assignment (mode 0600) beside the dev tokens."""
    path = demo_env_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{DEMO_KEY_VAR}={summary.secret}\n")
    return path


def curl_commands(summary: DemoSummary, base_url: str) -> list[str]:
    """Three commands that work as printed: the usage report, the credits, the models."""
    auth = shlex.quote(f"Authorization: Bearer {summary.secret}")
    report = shlex.quote(f"{base_url}/v1/usage?starting_at={summary.starting_date}&group_by=model")
    return [
        f"curl -s {report} -H {auth}",
        f"curl -s {shlex.quote(base_url + '/v1/credits')} -H {auth}",
        f"curl -s {shlex.quote(base_url + '/v1/models')} -H {auth}",
    ]


def banner(summary: DemoSummary, base_url: str, secret_path: Path) -> str:
    """What the first start prints to the terminal (never through the logger: a secret)."""
    lines = [
        f"Demo data (METERING_DEMO=false turns it off): account {summary.account_id} "
        f'"{ACCOUNT_NAME}", 3 keys, ${usd_text(summary.grant_microcents)} of credit, and {DAYS} '
        "days of usage:",
        f"  {summary.requests:,} requests ({summary.failed} failed streams), "
        f"{summary.input_tokens:,} input tokens ({summary.cache_read_tokens:,} cache reads), "
        f"{summary.output_tokens:,} output tokens ({summary.reasoning_tokens:,} reasoning), "
        f"cost ${usd_text(summary.cost_microcents)}",
        f"  demo key {summary.key_id} (secret shown once, kept in {secret_path}):",
        f"    {summary.secret}",
        "Try:",
        *(f"  {command}" for command in curl_commands(summary, base_url)),
        f"Billing portal: {base_url}/billing/sign-in (sign in with the demo key), or "
        f"`metering portal-link {summary.account_id}` for a sign-in link",
    ]
    return "\n".join(lines)


def local_url(host: str, port: int) -> str:
    """The URL a local curl reaches the server at (a wildcard bind answers on loopback)."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def first_start(settings: Settings, base_url: str) -> None:
    """Seed the demo into an empty embedded database and print how to use it; on later starts,
    say where its key is."""
    from metering.kit.clock import SystemClock

    database = Database.from_url(settings.effective_database_url)
    try:
        summary = seed(database, SystemClock().now())
    finally:
        database.dispose()
    path = demo_env_path(settings)
    if summary is not None:
        print(banner(summary, base_url, keep_secret(settings, summary)))
    elif path.exists():
        print(f"The demo key is in {path} (`. {path}` sets ${DEMO_KEY_VAR})")
