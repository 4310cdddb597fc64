"""The ``metering`` command: serve, migrate, catalog import (and the operations of §8)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
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
    parser = argparse.ArgumentParser(prog="metering", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the API server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="server processes")

    sub.add_parser("migrate", help="bring the database schema to the newest migration")

    catalog = sub.add_parser("catalog", help="model catalog operations")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    load = catalog_sub.add_parser("import", help="load models and prices from a JSON file")
    load.add_argument("file", nargs="?", type=Path, help="default: the shipped catalog")
    return parser


def _schema_is_current(url: str) -> bool:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    from metering.migrate import alembic_config

    heads = set(ScriptDirectory.from_config(alembic_config(url)).get_heads())
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            current = set(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()
    return current == heads


@command("migrate")
def migrate(args: argparse.Namespace, settings: Settings) -> int:
    from metering import migrate as migrations

    if settings.is_embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrations.upgrade(settings.effective_database_url)
    print("schema is at the newest migration")
    return 0


def _import(settings: Settings, path: Path) -> int:
    from metering.catalog.importer import CatalogImportError, import_catalog, load_catalog_file
    from metering.db import Database
    from metering.kit.clock import SystemClock

    database = Database.from_url(settings.effective_database_url)
    try:
        catalog = load_catalog_file(path)
        with database.unit_of_work() as session:
            summary = import_catalog(session, catalog, SystemClock().now())
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


def _prepare_embedded(settings: Settings) -> None:
    """First start on the embedded database: schema, shipped catalog, dev tokens."""
    from sqlalchemy import func, select

    from metering import migrate as migrations
    from metering.catalog.importer import SHIPPED_CATALOG
    from metering.db import Database
    from metering.models import CatalogModel
    from metering.runtime import ensure_dev_tokens

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrations.upgrade(settings.effective_database_url)
    database = Database.from_url(settings.effective_database_url)
    try:
        with database.unit_of_work() as session:
            empty = session.execute(select(func.count()).select_from(CatalogModel)).scalar() == 0
    finally:
        database.dispose()
    if empty:
        _import(settings, SHIPPED_CATALOG)
    if not (settings.admin_tokens and settings.gateway_tokens):
        tokens = ensure_dev_tokens(settings)
        if tokens.created:
            # Printed to the terminal once, never through the logger.
            print(f"Generated development tokens (kept in {tokens.path}):")
            print(f"  admin token:   {tokens.admin}")
            print(f"  gateway token: {tokens.gateway}")
        else:
            print(f"Development tokens are in {tokens.path} (`. {tokens.path}` sets them)")


@command("serve")
def serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from metering.runtime import runtime_settings

    if settings.is_embedded:
        _prepare_embedded(settings)
    elif not _schema_is_current(settings.effective_database_url):
        print("the database schema is not current: run `metering migrate`", file=sys.stderr)
        return 1
    runtime_settings(settings)  # fails early on a missing token configuration
    print(f"metering listening on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(
        "metering.asgi:create",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except Exception as exc:  # a bad METERING_* value: say which, without a traceback
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    return COMMANDS[args.command](args, settings)


if __name__ == "__main__":
    raise SystemExit(main())
