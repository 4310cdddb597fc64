"""Catalog rules: model lookup, the price in force for an account at an instant, new versions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from metering.accounts.access import (
    account_sees,
    key_allows,
    listed_by_account_or_key,
    project_allows,
)
from metering.accounts.keys import KeyPrincipal
from metering.accounts.service import get_account
from metering.catalog.prices import PriceInForce, price_in_force, price_of
from metering.catalog.rules import is_retired
from metering.catalog.schemas import AccountRateSpec, ModelSpec, PriceSpec, check_model_id
from metering.kit.errors import Conflict, InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.money import is_whole_cents, whole_cents
from metering.kit.timeutil import format_timestamp, parse_timestamp
from metering.models import (
    Account,
    AccountRate,
    ApiKey,
    CatalogModel,
    PriceVersion,
    Project,
    UsageEvent,
    table,
)
from metering.models.catalog import RATE_COLUMNS
from metering.pricing import Rates

MODELS = table(CatalogModel)


def find_model(session: Session, model_id: str) -> CatalogModel | None:
    """Model ids are case-insensitive on input."""
    return session.execute(
        select(CatalogModel).where(CatalogModel.id_key == model_id.lower())
    ).scalar_one_or_none()


def require_model(session: Session, model_id: str, *, lock: bool = False) -> CatalogModel:
    query = select(CatalogModel).where(CatalogModel.id_key == model_id.lower())
    if lock:
        query = query.with_for_update()
    model = session.execute(query).scalar_one_or_none()
    if model is None:
        raise NotFound(f"model {model_id!r} does not exist", code="model_not_found", param="model")
    return model


def listed_models(
    session: Session, key: KeyPrincipal | None, now: datetime, *, account_id: str | None = None
) -> list[dict[str, Any]]:
    """The cards of the models in service now (not retired, with a price in force: the
    account's rates, or list prices without a key), by id in byte order. Without a key, the
    models not hidden; with one, the models that key may use, leaving out hidden ones
    that no list of its own or its account's names; with ``account_id`` instead (the portal's
    view of an account), the models the account may use, the same way without a key's list."""
    if key is not None:
        account_id = key.account_id
    price = price_in_force(account_id, MODELS.c.id, now)
    query = select(MODELS, *price.labelled()).select_from(price.join(MODELS))
    if account_id is None:
        query = query.where(MODELS.c.hidden.is_(False))
    else:
        accounts = table(Account)
        account_restricts = (
            select(accounts.c.restricts_models).where(accounts.c.id == account_id).scalar_subquery()
        )
        key_id = key.api_key_id if key is not None else None
        query = query.where(
            account_sees(account_id, account_restricts, MODELS.c.id),
            or_(
                MODELS.c.hidden.is_(False),
                listed_by_account_or_key(account_id, key_id, MODELS.c.id),
            ),
        )
        if key is not None:
            keys = table(ApiKey)
            restricts = (
                select(keys.c.restricts_models).where(keys.c.id == key.api_key_id).scalar_subquery()
            )
            query = query.where(key_allows(account_id, key.api_key_id, restricts, MODELS.c.id))
            # The key's project's list narrows it too (its models: account ∩ project ∩ key).
            projects = table(Project)
            project_id = (
                select(keys.c.project_id).where(keys.c.id == key.api_key_id).scalar_subquery()
            )
            project_restricts = (
                select(projects.c.restricts_models)
                .where(projects.c.account_id == account_id, projects.c.id == project_id)
                .scalar_subquery()
            )
            query = query.where(
                project_allows(account_id, project_id, project_restricts, MODELS.c.id)
            )
    rows = session.execute(query).all()
    cards = []
    for row in rows:
        found = price_of(row._mapping)
        if found is not None and not is_retired(row.deprecation_date, now):
            cards.append(model_card(row, found, now))
    cards.sort(key=lambda card: card["id"].encode())
    return cards


def version_has_charges(session: Session, version_id: str) -> bool:
    """Whether any recorded charge was priced by this version."""
    found = session.execute(
        select(UsageEvent.id).where(UsageEvent.price_version_id == version_id).limit(1)
    ).first()
    return found is not None


def list_priced_charges_between(
    session: Session, model_id: str, start: datetime, end: datetime | None
) -> bool:
    """Whether charges of ``model_id`` priced at a list price occurred in [start, end): a new
    list version there would have priced them differently."""
    query = select(UsageEvent.id).where(
        UsageEvent.model_id == model_id,
        UsageEvent.occurred_at >= start,
        UsageEvent.price_version_id.in_(
            select(PriceVersion.id).where(PriceVersion.model_id == model_id)
        ),
    )
    if end is not None:
        query = query.where(UsageEvent.occurred_at < end)
    return session.execute(query.limit(1)).first() is not None


@dataclass(frozen=True, slots=True)
class ModelPut:
    model: CatalogModel
    created: bool
    changes: dict[str, Any]  # the metadata fields that changed (all of them when created)


def put_model(session: Session, model_id: str, spec: ModelSpec, now: datetime) -> ModelPut:
    """Create or replace a model's metadata. Replacing it with the same metadata changes
    nothing (``updated_at`` included)."""
    model = find_model(session, model_id)
    created = model is None
    if model is None:
        problem = check_model_id(model_id)
        if problem:
            raise InvalidRequest(problem, param="model_id")
        model = CatalogModel(id=model_id, id_key=model_id.lower(), created_at=now)
        session.add(model)
    changes = {
        name: getattr(spec, name)
        for name in ModelSpec.model_fields
        if created or getattr(model, name) != getattr(spec, name)
    }
    if changes:
        for name, value in changes.items():
            setattr(model, name, value)
        model.updated_at = now
        session.flush()
    return ModelPut(model, created, changes)


def _check_new_version_time(effective_at: datetime, newest: datetime | None, now: datetime) -> None:
    if effective_at < now:
        raise Conflict(
            "effective_at is in the past: price history is immutable, add a version from now on",
            code="price_history_immutable",
            param="effective_at",
        )
    if newest is not None and effective_at <= newest:
        raise Conflict(
            f"effective_at must be after the newest version ({format_timestamp(newest)})",
            code="price_history_immutable",
            param="effective_at",
        )


def add_price_version(
    session: Session, model_id: str, spec: PriceSpec, now: datetime
) -> PriceVersion:
    """A new list price version, effective now or later and after every existing version."""
    effective_at = parse_timestamp(spec.effective_at, "effective_at")
    model = require_model(session, model_id, lock=True)  # serialises versions of one model
    newest = session.execute(
        select(PriceVersion.effective_at)
        .where(PriceVersion.model_id == model.id)
        .order_by(PriceVersion.effective_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    _check_new_version_time(effective_at, newest, now)
    version = PriceVersion(
        id=new_id("price"),
        model_id=model.id,
        effective_at=effective_at,
        **{name: getattr(spec, name) for name in RATE_COLUMNS},
        created_at=now,
    )
    session.add(version)
    session.flush()
    return version


def add_account_rate(
    session: Session, account_id: str, spec: AccountRateSpec, now: datetime
) -> AccountRate:
    """A new override version for one account and model (all-null rates end the override)."""
    effective_at = parse_timestamp(spec.effective_at, "effective_at")
    get_account(session, account_id, lock=True)  # serialises the account's rate versions
    model = require_model(session, spec.model)
    newest = session.execute(
        select(AccountRate.effective_at)
        .where(AccountRate.account_id == account_id, AccountRate.model_id == model.id)
        .order_by(AccountRate.effective_at.desc())
        .limit(1)
    ).scalar_one_or_none()
    _check_new_version_time(effective_at, newest, now)
    rate = AccountRate(
        id=new_id("rate"),
        account_id=account_id,
        model_id=model.id,
        effective_at=effective_at,
        **{name: getattr(spec, name) for name in RATE_COLUMNS},
        created_at=now,
    )
    session.add(rate)
    session.flush()
    return rate


def pricing_body(rates: Rates) -> dict[str, Any]:
    """A card's ``pricing``: whole cents always, exact microcents where cents would lie."""
    body: dict[str, Any] = {
        "currency": "usd",
        "input_cents_per_million": whole_cents(rates.input_microcents_per_million),
        "output_cents_per_million": whole_cents(rates.output_microcents_per_million),
        "cache_read_cents_per_million": whole_cents(rates.cache_read_microcents_per_million),
        "cache_read_microcents_per_million": rates.cache_read_microcents_per_million,
    }
    if not is_whole_cents(rates.input_microcents_per_million):
        body["input_microcents_per_million"] = rates.input_microcents_per_million
    if not is_whole_cents(rates.output_microcents_per_million):
        body["output_microcents_per_million"] = rates.output_microcents_per_million
    return body


def model_card(model: Any, price: PriceInForce, now: datetime) -> dict[str, Any]:
    wafer: dict[str, Any] = {
        "display_name": model.display_name,
        "context_length": model.context_length,
        "max_output_tokens": model.max_output_tokens,
    }
    if model.deprecation_date is not None:
        wafer["deprecation_date"] = model.deprecation_date.isoformat()
    wafer["pricing"] = pricing_body(price.rates)
    return {
        "id": model.id,
        "object": "model",
        "created": int(now.timestamp()),
        "owned_by": model.owned_by,
        "max_model_len": model.context_length,
        "wafer": wafer,
    }


def model_admin_body(model: CatalogModel) -> dict[str, Any]:
    return {
        "id": model.id,
        "object": "model",
        "display_name": model.display_name,
        "owned_by": model.owned_by,
        "context_length": model.context_length,
        "max_output_tokens": model.max_output_tokens,
        "reasoning_headroom_tokens": model.reasoning_headroom_tokens,
        "hidden": model.hidden,
        "deprecation_date": model.deprecation_date.isoformat() if model.deprecation_date else None,
        "created_at": format_timestamp(model.created_at),
        "updated_at": format_timestamp(model.updated_at),
    }


# What a price or rate version sets (its audit event's changes).
PRICE_FIELDS = (
    "model",
    "effective_at",
    "input_microcents_per_million",
    "output_microcents_per_million",
    "cache_read_microcents_per_million",
)


def price_version_body(version: PriceVersion) -> dict[str, Any]:
    return {
        "id": version.id,
        "object": "price_version",
        "model": version.model_id,
        "effective_at": format_timestamp(version.effective_at),
        **{name: getattr(version, name) for name in RATE_COLUMNS},
        "created_at": format_timestamp(version.created_at),
    }


def account_rate_body(rate: AccountRate) -> dict[str, Any]:
    return {
        "id": rate.id,
        "object": "account_rate",
        "account_id": rate.account_id,
        "model": rate.model_id,
        "effective_at": format_timestamp(rate.effective_at),
        **{name: getattr(rate, name) for name in RATE_COLUMNS},
        "created_at": format_timestamp(rate.created_at),
    }
