"""The ``metering`` command: serve, migrate, catalog import, verify, scheduler, export."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

from metering.settings import Settings

Command = Callable[[argparse.Namespace, Settings], int]
COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    def register(func: Command) -> Command:
        COMMANDS[name] = func
        return func

    return register


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metering",
        description="Billing, metering and usage reporting for an LLM inference API.",
        epilog="Configuration: METERING_* variables (docs/operations.md#configuration). "
        "The HTTP API: docs/api.md in the repository, or /docs on a running server. "
        "Operations: docs/operations.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="server processes")
    serve.add_argument(
        "--scheduler-interval",
        type=float,
        default=60.0,
        help="embedded database only: seconds between the scheduler's ticks (exports, "
        "hold tidy-up), which run in this process",
    )

    sub.add_parser("migrate", help="bring the database schema to the newest migration")

    catalog = sub.add_parser("catalog", help="model catalog operations")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    load = catalog_sub.add_parser("import", help="load models and prices from a JSON file")
    load.add_argument("file", nargs="?", type=Path, help="default: the shipped catalog")

    sub.add_parser(
        "verify", help="reconcile balances with the ledger and usage aggregates with their events"
    )

    scheduler = sub.add_parser(
        "scheduler", help="run the scheduler: daily exports, late re-exports, hold tidy-up"
    )
    scheduler.add_argument("--interval", type=float, default=60.0, help="seconds between ticks")
    scheduler.add_argument("--once", action="store_true", help="run one tick, then exit")
    scheduler.add_argument("--heartbeat", type=Path, help="file rewritten after every tick")

    link = sub.add_parser(
        "portal-link", help="print a single-use sign-in link to an account's billing portal"
    )
    link.add_argument("account_id", help="the account (acct_…)")
    link.add_argument(
        "--member", help="sign in as this member of the account (mem_…), with its role"
    )

    export = sub.add_parser("export", help="export UTC days by hand (backfills)")
    days = export.add_mutually_exclusive_group(required=True)
    days.add_argument("--date", type=_iso_date, help="one day, YYYY-MM-DD")
    days.add_argument("--from", dest="first", type=_iso_date, help="first day (with --to)")
    export.add_argument("--to", dest="last", type=_iso_date, help="last day, included")
    export.add_argument("--account", help="only this account's files")
    return parser


def _iso_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a YYYY-MM-DD date: {text!r}") from None


def _schema_is_current(url: str) -> bool:
    from metering.migrate import is_current

    return is_current(url)


@command("migrate")
def migrate(args: argparse.Namespace, settings: Settings) -> int:
    return _migrate_and_load_catalog(settings)


def _migrate_and_load_catalog(settings: Settings) -> int:
    """The schema by the migrations and the generated functions (saying which ran and which
    were installed), then the shipped catalog when the catalog is empty (a first start): the
    server has models to bill from the start."""
    # Every program imported, so that each registers its shard form (metering.citus.shard_forms).
    import metering.functions  # noqa: F401
    from metering import migrate as migrations

    if settings.is_embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    done = migrations.upgrade(settings.effective_database_url)
    head = migrations.head_revision()
    if done.applied:
        print(f"applied {len(done.applied)} migrations:")
        for step in done.applied:
            print(f"  {step}")
        print(f"the schema is at the newest migration ({head})")
    else:
        print(f"nothing to apply: the schema is at the newest migration ({head})")
    if done.installed:
        print(f"installed {len(done.installed)} of the {done.functions} generated functions:")
        for name in done.installed:
            print(f"  {name}")
    elif done.functions:
        print(f"the {done.functions} generated functions are current: none installed")
    for signature in done.dropped:
        print(f"dropped {signature}: no program generates it any more")
    _say_where_tables_are(settings.effective_database_url)
    return _load_shipped_catalog_if_empty(settings)


def _say_where_tables_are(url: str) -> None:
    """On a Citus coordinator: how the schema is placed (metering.citus)."""
    from metering import citus
    from metering.db import Database, Kind

    database = Database.from_url(url, pool_size=1)
    try:
        cluster = database.kind is Kind.CITUS
    finally:
        database.dispose()
    if not cluster:
        return
    kinds = [placed.kind for placed in citus.placements(url)]
    print(
        f"Citus: {kinds.count('distributed')} account tables distributed by account, "
        f"colocated; {kinds.count('reference')} reference tables; "
        f"{kinds.count('local')} on the coordinator"
    )


def _load_shipped_catalog_if_empty(settings: Settings) -> int:
    from sqlalchemy import func, select

    from metering.catalog.importer import SHIPPED_CATALOG
    from metering.db import Database
    from metering.models import CatalogModel

    database = Database.from_url(settings.effective_database_url)
    try:
        with database.reading() as session:
            empty = session.execute(select(func.count()).select_from(CatalogModel)).scalar() == 0
    finally:
        database.dispose()
    if not empty:
        return 0
    print("the model catalog was empty: loading the shipped catalog")
    return _import(settings, SHIPPED_CATALOG)


def _import(settings: Settings, path: Path) -> int:
    from metering.catalog.importer import CatalogImportError, import_catalog, load_catalog_file
    from metering.db import Database
    from metering.kit.clock import SystemClock

    database = Database.from_url(settings.effective_database_url)
    try:
        catalog = load_catalog_file(path)
        with database.unit_of_work() as session:
            summary = import_catalog(session, catalog, SystemClock().now())
            session.commit()
    except CatalogImportError as exc:
        print(f"catalog import refused, nothing changed: {exc}", file=sys.stderr)
        return 1
    finally:
        database.dispose()
    print(f"imported {path}")
    for line in summary.lines():
        print(f"  {line}")
    return 0


@command("catalog")
def catalog(args: argparse.Namespace, settings: Settings) -> int:
    from metering.catalog.importer import SHIPPED_CATALOG

    return _import(settings, args.file or SHIPPED_CATALOG)


@command("verify")
def verify(args: argparse.Namespace, settings: Settings) -> int:
    from metering.db import Database
    from metering.usage.verify import verify as reconcile

    database = Database.from_url(settings.effective_database_url)
    try:
        with database.reading() as session:
            report = reconcile(session)
    finally:
        database.dispose()
    for mismatch in report.mismatches or []:
        print(f"MISMATCH {mismatch}")
    if not report.ok:
        print(f"verify failed: {len(report.mismatches or [])} mismatches", file=sys.stderr)
        return 1
    print(f"verified {report.accounts} accounts and {report.rollup_rows} usage aggregate rows")
    if report.pending_expiries:
        print(
            f"pending: {report.pending_expiries} grant expiries not yet written "
            f"({report.pending_microcents} microcents)"
        )
    return 0


def _prepare_embedded(settings: Settings, base_url: str = "http://127.0.0.1:8000") -> None:
    """First start on the embedded database: schema, shipped catalog, dev tokens, demo data."""
    from metering.runtime import ensure_dev_tokens

    if _migrate_and_load_catalog(settings) != 0:
        raise SystemExit(1)
    if not (settings.admin_tokens and settings.gateway_tokens):
        tokens = ensure_dev_tokens(settings)
        if tokens.created:
            # Printed to the terminal once, never through the logger.
            print(f"Generated development tokens (kept in {tokens.path}):")
            print(f"  admin token:   {tokens.admin}")
            print(f"  gateway token: {tokens.gateway}")
        else:
            print(f"Development tokens are in {tokens.path} (`. {tokens.path}` sets them)")
    if settings.demo:
        from metering import demo

        demo.first_start(settings, base_url)


@command("scheduler")
def scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from metering import scheduler as jobs

    if not _schema_is_current(settings.effective_database_url):
        print("the database schema is not current: run `metering migrate`", file=sys.stderr)
        return 1
    return jobs.command(settings, args.interval, args.once, args.heartbeat)


@command("export")
def export(args: argparse.Namespace, settings: Settings) -> int:
    from metering.exports.commands import export as export_days

    if (args.first is None) != (args.last is None):
        print("--from and --to go together", file=sys.stderr)
        return 2
    if not _schema_is_current(settings.effective_database_url):
        print("the database schema is not current: run `metering migrate`", file=sys.stderr)
        return 1
    return export_days(settings, args.date, args.first, args.last, args.account)


@command("portal-link")
def portal_link(args: argparse.Namespace, settings: Settings) -> int:
    """A sign-in link (valid 15 minutes, single use), recorded in the audit log as the CLI's."""
    from metering.audit.service import CLI
    from metering.db import Database
    from metering.kit.clock import SystemClock
    from metering.kit.errors import InvalidRequest, NotFound
    from metering.kit.timeutil import format_timestamp
    from metering.portal.sessions import create_link
    from metering.runtime import EMBEDDED_BASE_URL

    base_url = settings.public_base_url
    if not base_url:
        if not settings.is_embedded:
            print(
                "METERING_PUBLIC_BASE_URL must be set when METERING_DATABASE_URL points at a "
                "server database (the link starts with it)",
                file=sys.stderr,
            )
            return 2
        base_url = EMBEDDED_BASE_URL
    if not _schema_is_current(settings.effective_database_url):
        print("the database schema is not current: run `metering migrate`", file=sys.stderr)
        return 1
    database = Database.from_url(settings.effective_database_url)
    now = SystemClock().now()
    try:
        with database.unit_of_work() as session:
            link = create_link(session, args.account_id, base_url, now, args.member)
            expires_at = format_timestamp(link.expires_at)
            CLI.record(
                session,
                now,
                "portal_session.create",
                "account",
                args.account_id,
                args.account_id,
                {"expires_at": expires_at, **({"member_id": args.member} if args.member else {})},
            )
            session.commit()
    except (NotFound, InvalidRequest) as exc:
        print(exc.message, file=sys.stderr)
        return 1
    finally:
        database.dispose()
    print(link.url)
    print(f"single use, valid until {expires_at}", file=sys.stderr)
    return 0


@command("serve")
def serve(args: argparse.Namespace, settings: Settings) -> int:
    from metering.runtime import MULTIPROC_ENV, prepare_metrics_directory, remove_metrics_directory

    # Before anything imports prometheus_client (its mode is chosen then): the directory where
    # every worker's metrics go, so that one scrape sums them all (docs/operations.md#metrics).
    # (tests/reliability/test_metrics_workers.py fails should anything import it earlier.)
    created = not os.environ.get(MULTIPROC_ENV)
    directory = prepare_metrics_directory()
    try:
        return _serve(args, settings)
    finally:
        remove_metrics_directory(directory, created=created)
        if created:
            os.environ.pop(MULTIPROC_ENV, None)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from metering.runtime import runtime_settings

    if settings.is_embedded:
        from metering.demo import local_url

        _prepare_embedded(settings, local_url(args.host, args.port))
        if not settings.public_base_url:
            # The workers read their settings from the environment: the portal's links point
            # at this server unless METERING_PUBLIC_BASE_URL says otherwise.
            os.environ["METERING_PUBLIC_BASE_URL"] = local_url(args.host, args.port)
    elif not _schema_is_current(settings.effective_database_url):
        print("the database schema is not current: run `metering migrate`", file=sys.stderr)
        return 1
    runtime_settings(settings)  # fails early on a missing token configuration
    jobs = None
    if settings.is_embedded:
        # The embedded quick start has no `metering scheduler`: its jobs run here, once.
        from metering.runtime import configure_logging
        from metering.scheduler import EmbeddedScheduler

        configure_logging(settings.log_level)
        jobs = EmbeddedScheduler(settings, args.scheduler_interval)
        jobs.start()
    print(f"metering listening on http://{args.host}:{args.port}", flush=True)
    try:
        uvicorn.run(
            "metering.asgi:create",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=settings.log_level.lower(),
            access_log=False,  # the service writes its own (metering.access, no query strings)
            http="metering.web.slow_clients:HeaderDeadlineProtocol",  # slow headers: 408
        )
    finally:
        if jobs is not None:
            jobs.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    from metering.settings import describe_error

    try:
        settings = Settings()
    except ValidationError as exc:  # a bad METERING_* value: say which, in one line
        print(f"configuration error: {describe_error(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a value pydantic-settings could not even decode
        print(f"configuration error: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    try:
        return COMMANDS[args.command](args, settings)
    except OperationalError as exc:  # the database is down or unreachable: say so, briefly
        where = make_url(settings.effective_database_url).render_as_string(hide_password=True)
        reason = str(exc.orig or exc).strip().splitlines()[0]
        print(f"cannot use the database {where}: {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
