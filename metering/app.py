"""The FastAPI application: routers, plumbing, state (settings, database, clock)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from metering import __version__
from metering.db import Database
from metering.kit.clock import Clock, SystemClock
from metering.metrics import REGISTRY
from metering.settings import Settings
from metering.web.deps import Credentials
from metering.web.errors import ERROR_RESPONSES, error_response, install_error_handlers
from metering.web.fastlane import FastLane, lanes_of
from metering.web.jsonio import ExactJSONResponse
from metering.web.middleware import RequestContextMiddleware


def create_app(
    settings: Settings,
    *,
    database: Database | None = None,
    clock: Clock | None = None,
) -> FastAPI:
    owns_database = database is None
    db = database or Database.from_url(
        settings.effective_database_url,
        pool_size=settings.db_pool_size,
        wait_seconds=settings.db_wait_seconds,
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        REGISTRY.worker_started()
        try:
            yield
        finally:
            REGISTRY.worker_stopping()
            # The async pool belongs to this event loop, which ends here: closed on it whoever
            # owns the database (a pool left open has background tasks the loop's close would
            # wait on); another loop opens a fresh one.
            await db.close_async_pool()
            if owns_database:
                db.dispose()

    app = FastAPI(
        title="metering",
        version=__version__,
        description="Billing, metering and usage reporting for an LLM inference API.",
        default_response_class=ExactJSONResponse,
        lifespan=lifespan,
        strict_content_type=False,
        # No redirects (docs/api.md#conventions): a trailing slash is an unknown path, never a 307
        # whose Location comes from the Host header and invites the client to resend its body
        # elsewhere.
        redirect_slashes=False,
        # /docs and /redoc are served by metering.web.docs, assets included (no CDN).
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
        # FastAPI's own OpenTelemetry is not used (metrics are Prometheus, metering.metrics):
        # off, so a request no longer asks the global providers whether it is configured.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.credentials = Credentials.of(settings)
    app.state.database = db
    app.state.clock = clock or SystemClock()

    install_error_handlers(app)

    from metering import health
    from metering.accounts import endpoints as accounts
    from metering.accounts import team_endpoints as teams
    from metering.audit import endpoints as audit
    from metering.catalog import endpoints as catalog
    from metering.ledger import endpoints as ledger
    from metering.notifications import endpoints as webhooks
    from metering.payments import endpoints as payments
    from metering.portal import billing as portal_billing
    from metering.portal import endpoints as portal
    from metering.portal import keys as portal_keys
    from metering.portal import notifications as portal_notifications
    from metering.portal import team as portal_team
    from metering.reports import endpoints as reports
    from metering.usage import endpoints as usage
    from metering.web import docs, openapi

    # The gateway's hot paths first: routes are matched in order, router by router.
    routers = (
        ledger.gateway_router,
        usage.router,
        health.router,
        catalog.router,
        catalog.admin_router,
        accounts.admin_router,
        accounts.router,
        teams.admin_router,
        teams.router,
        ledger.router,
        ledger.admin_router,
        usage.admin_router,
        usage.requests_router,
        audit.admin_router,
        portal.admin_router,
        reports.router,
        webhooks.router,
        webhooks.admin_router,
        payments.router,
        payments.admin_router,
    )
    for router in routers:
        app.include_router(router, responses=ERROR_RESPONSES)
    app.include_router(docs.router)
    app.include_router(portal.router)
    portal.install_error_pages(app)
    app.include_router(portal_notifications.router)
    app.include_router(portal_keys.router)
    app.include_router(portal_team.router)
    app.include_router(portal_billing.router)
    openapi.install(app)
    # The last added is the outermost: the request context applies to the fast lane's answers.
    app.add_middleware(FastLane, lanes=lanes_of(r for router in routers for r in router.routes))
    app.add_middleware(
        RequestContextMiddleware,
        max_body_bytes=settings.max_body_bytes,
        render_error=error_response,
        body_timeout_seconds=settings.body_timeout_seconds,
        access_log=settings.access_log,
    )
    return app
