"""``GET /admin/v1/audit-events``: the audit log, newest first."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from metering.audit import service
from metering.kit.errors import InvalidRequest
from metering.kit.pagination import PageParams
from metering.kit.timeutil import TIMESTAMP_OR_DATE_SCHEMA, parse_timestamp
from metering.web.deps import AdminDep, SessionDep
from metering.web.jsonio import MeteringRoute

admin_router = APIRouter(
    prefix="/admin/v1", route_class=MeteringRoute, dependencies=[AdminDep], tags=["admin: audit"]
)

TIME = "An RFC 3339 timestamp with an offset, or a YYYY-MM-DD date (midnight UTC)."


@admin_router.get("/audit-events")
def list_audit_events(
    session: SessionDep,
    paging: PageParams,
    account_id: Annotated[str | None, Query(max_length=32)] = None,
    actor: Annotated[str | None, Query(max_length=100)] = None,
    action: Annotated[
        str | None, Query(max_length=64, json_schema_extra={"enum": list(service.ACTIONS)})
    ] = None,
    starting_at: Annotated[
        str | None,
        Query(description=f"Inclusive. {TIME}", json_schema_extra=TIMESTAMP_OR_DATE_SCHEMA),
    ] = None,
    ending_at: Annotated[
        str | None,
        Query(description=f"Exclusive. {TIME}", json_schema_extra=TIMESTAMP_OR_DATE_SCHEMA),
    ] = None,
) -> dict[str, Any]:
    """Every change made through /admin/v1/ and the CLI, newest first."""
    limit, after = paging
    where = service.AuditFilter(
        account_id=account_id,
        actor=actor,
        action=action,
        starting_at=None
        if starting_at is None
        else parse_timestamp(starting_at, "starting_at", allow_date=True),
        ending_at=None
        if ending_at is None
        else parse_timestamp(ending_at, "ending_at", allow_date=True),
    )
    if action is not None and action not in service.ACTIONS:
        raise InvalidRequest(
            f"action must be one of {', '.join(service.ACTIONS)}",
            code="unsupported_value",
            param="action",
        )
    return service.list_events(session, where, limit, after)
