"""``metering catalog import``: load models and price history from a JSON file, idempotently.

Unlike the admin API it may add versions dated in the past (to seed history), but it refuses,
changing nothing, anything that would alter the price of a charge already recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.audit.service import CLI, Auditor
from metering.catalog import service
from metering.catalog.schemas import CatalogFile, PriceSpec
from metering.kit.ids import new_id
from metering.kit.timeutil import format_timestamp, parse_timestamp
from metering.models import PriceVersion
from metering.models.catalog import RATE_COLUMNS

SHIPPED_CATALOG = Path(__file__).resolve().parent.parent / "data" / "catalog.json"


class CatalogImportError(Exception):
    """The file cannot be imported; nothing was changed."""


@dataclass
class ImportSummary:
    models_created: list[str] = field(default_factory=list)
    models_updated: list[str] = field(default_factory=list)
    versions_added: int = 0
    versions_changed: int = 0
    versions_unchanged: int = 0

    def lines(self) -> list[str]:
        return [
            f"models created: {len(self.models_created)} {' '.join(self.models_created)}".rstrip(),
            f"models updated: {len(self.models_updated)} {' '.join(self.models_updated)}".rstrip(),
            f"price versions added: {self.versions_added}, changed: {self.versions_changed}, "
            f"unchanged: {self.versions_unchanged}",
        ]


def load_catalog_file(path: Path) -> CatalogFile:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogImportError(f"{path}: cannot read JSON: {exc}") from exc
    try:
        return CatalogFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CatalogImportError(f"{path}: {where}: {first['msg']}") from exc


def import_catalog(
    session: Session, catalog: CatalogFile, now: datetime, audit: Auditor = CLI
) -> ImportSummary:
    """Apply ``catalog`` inside the caller's transaction, each change recorded in the audit log
    (as ``cli``); raise (so it all rolls back) on a refusal."""
    summary = ImportSummary()
    seen: set[str] = set()
    for entry in catalog.models:
        if entry.id.lower() in seen:
            raise CatalogImportError(f"model {entry.id!r} appears twice")
        seen.add(entry.id.lower())
        # An entry is a ModelSpec (its metadata, validated as the admin API's) with more fields.
        put = service.put_model(session, entry.id, entry, now)
        if put.changes:
            (summary.models_created if put.created else summary.models_updated).append(put.model.id)
            action = "model.create" if put.created else "model.update"
            audit.record(session, now, action, "model", put.model.id, None, put.changes)
        _import_prices(session, put.model.id, entry.prices, summary, now, audit)
    return summary


def _import_prices(
    session: Session,
    model_id: str,
    prices: list[PriceSpec],
    summary: ImportSummary,
    now: datetime,
    audit: Auditor,
) -> None:
    existing = {
        v.effective_at: v
        for v in session.execute(
            select(PriceVersion).where(PriceVersion.model_id == model_id)
        ).scalars()
    }
    wanted: dict[datetime, PriceSpec] = {}
    for spec in prices:
        try:
            at = parse_timestamp(spec.effective_at, "effective_at")
        except Exception as exc:
            raise CatalogImportError(f"{model_id}: {exc}") from exc
        if at in wanted:
            raise CatalogImportError(f"{model_id}: two versions at {format_timestamp(at)}")
        wanted[at] = spec
    for at in sorted(wanted):
        spec = wanted[at]
        rates = {name: getattr(spec, name) for name in RATE_COLUMNS}
        version = existing.get(at)
        if version is not None:
            if {name: getattr(version, name) for name in RATE_COLUMNS} == rates:
                summary.versions_unchanged += 1
                continue
            if service.version_has_charges(session, version.id):
                raise CatalogImportError(
                    f"{model_id}: the version at {format_timestamp(at)} already priced recorded "
                    "charges; its rates cannot change (add a new version instead)"
                )
            for name, rate in rates.items():
                setattr(version, name, rate)
            summary.versions_changed += 1
            _record_version(session, audit, "price.update", version, now)
            continue
        following = [t for t in existing if t > at]
        until = min(following) if following else None
        if service.list_priced_charges_between(session, model_id, at, until):
            raise CatalogImportError(
                f"{model_id}: a version at {format_timestamp(at)} would reprice charges already "
                "recorded after that instant"
            )
        version = PriceVersion(
            id=new_id("price"),
            model_id=model_id,
            effective_at=at,
            **rates,
            created_at=now,
        )
        session.add(version)
        existing[at] = version
        summary.versions_added += 1
        _record_version(session, audit, "price.create", version, now)
    session.flush()


def _record_version(
    session: Session, audit: Auditor, action: str, version: PriceVersion, now: datetime
) -> None:
    shown = service.price_version_body(version)
    changes = {name: shown[name] for name in service.PRICE_FIELDS}
    audit.record(session, now, action, "price_version", version.id, None, changes)
