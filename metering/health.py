"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from sqlalchemy import text

from metering.kit.errors import DatabaseUnavailable
from metering.metrics import CONTENT_TYPE, REGISTRY
from metering.web.deps import NowDep, SessionDep, bearer_token, get_credentials, get_database
from metering.web.jsonio import MeteringRoute

router = APIRouter(route_class=MeteringRoute, tags=["operations"])


class NotReady(DatabaseUnavailable):
    pass


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> dict[str, str]:
    """The database answers."""
    try:
        with get_database(request).reader.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        raise NotReady("database unreachable") from exc
    return {"status": "ready"}


async def _metrics_credential(request: Request) -> None:
    """With ``METERING_METRICS_TOKEN`` set, the metrics token or an admin token (as Bearer);
    without it, /metrics is open (a scraper on a private network)."""
    credentials = get_credentials(request)
    if credentials.metrics:
        bearer_token(request, credentials.metrics + credentials.admin)


@router.get(
    "/metrics",
    dependencies=[Depends(_metrics_credential)],
    responses={200: {"description": "Prometheus text.", "content": {"text/plain": {}}}},
)
def metrics(session: SessionDep, now: NowDep) -> Response:
    """Prometheus metrics: counters and latencies summed over every worker of the server, and
    database-wide gauges."""
    return Response(REGISTRY.render(session, now), media_type=CONTENT_TYPE)
