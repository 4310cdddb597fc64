"""The public model list and the operators' catalog routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from sqlalchemy import select

from metering.accounts.deps import OptionalAccountKeyDep
from metering.audit.deps import AuditDep
from metering.catalog import service
from metering.catalog.schemas import MODEL_ID, AccountRateSpec, ModelSpec, PriceSpec
from metering.kit.pagination import PageParams, decode_cursor, page
from metering.models import CatalogModel, PriceVersion
from metering.web.deps import AdminDep, NowDep, SessionDep
from metering.web.jsonio import MeteringRoute

router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["catalog"])
admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: catalog"]
)


@router.get("/models")
def list_models(session: SessionDep, key: OptionalAccountKeyDep, now: NowDep) -> dict[str, Any]:
    """List the models in service with the prices in force now; with a key, the models that key
    may use, at your account's rates."""
    cards = service.listed_models(session, key, now)
    return {"object": "list", "data": cards}


@admin_router.put(
    "/models/{model_id}",
    responses={
        200: {"description": "The model's metadata was replaced (or was already this)."},
        201: {"description": "The model was created."},
    },
)
def put_model(
    # The pattern is stated for the schema; check_model_id applies it (and the reserved ids).
    model_id: Annotated[str, Path(json_schema_extra={"pattern": MODEL_ID.pattern})],
    body: ModelSpec,
    session: SessionDep,
    now: NowDep,
    response: Response,
    audit: AuditDep,
) -> dict[str, Any]:
    """Create or replace a model's metadata (201 when created, 200 when replaced)."""
    put = service.put_model(session, model_id, body, now)
    if put.created:
        response.status_code = 201
    if put.changes:
        action = "model.create" if put.created else "model.update"
        audit.record(session, now, action, "model", put.model.id, None, put.changes)
    return service.model_admin_body(put.model)


@admin_router.get("/models")
def list_catalog(session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """Every model, hidden and retired ones included, by id."""
    limit, after = paging
    query = select(CatalogModel).order_by(CatalogModel.id).limit(limit + 1)
    if after:
        (last_id,) = decode_cursor(after, 1)
        query = query.where(CatalogModel.id > str(last_id))
    rows = session.execute(query).scalars().all()
    return page(rows, limit, service.model_admin_body, lambda m: (m.id,))


@admin_router.get("/models/{model_id}")
def get_model(model_id: str, session: SessionDep) -> dict[str, Any]:
    """One model with its whole list-price history, oldest first."""
    model = service.require_model(session, model_id)
    versions = session.execute(
        select(PriceVersion)
        .where(PriceVersion.model_id == model.id)
        .order_by(PriceVersion.effective_at)
    ).scalars()
    return {
        **service.model_admin_body(model),
        "prices": [service.price_version_body(v) for v in versions],
    }


@admin_router.post("/models/{model_id}/prices", status_code=201)
def add_price(
    model_id: str, body: PriceSpec, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Add a list price version, effective now or later (past prices never change)."""
    shown = service.price_version_body(service.add_price_version(session, model_id, body, now))
    changes = {name: shown[name] for name in service.PRICE_FIELDS}
    audit.record(session, now, "price.create", "price_version", shown["id"], None, changes)
    return shown


@admin_router.post("/accounts/{account_id}/rates", status_code=201)
def add_account_rate(
    account_id: str, body: AccountRateSpec, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Add an account's rate override version for a model (all rates null ends the override)."""
    shown = service.account_rate_body(service.add_account_rate(session, account_id, body, now))
    changes = {name: shown[name] for name in service.PRICE_FIELDS}
    audit.record(
        session, now, "account_rate.create", "account_rate", shown["id"], account_id, changes
    )
    return shown
