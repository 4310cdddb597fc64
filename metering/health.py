"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sqlalchemy import text

from metering.kit.errors import MeteringError
from metering.web.deps import get_database
from metering.web.jsonio import MeteringRoute

router = APIRouter(route_class=MeteringRoute, tags=["operations"])


class NotReady(MeteringError):
    status = 503
    type = "api_error"
    default_code = "database_unavailable"


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> dict[str, str]:
    """The database answers."""
    try:
        with get_database(request).engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        raise NotReady("database unreachable") from exc
    return {"status": "ready"}
