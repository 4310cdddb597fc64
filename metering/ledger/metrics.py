"""What /metrics says about credit holds: outcomes counted by every worker, lost usage from the
database."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from metering.metrics import REGISTRY
from metering.models import Authorization, table
from metering.states import holds
from metering.states.holds import HoldStatus

_HOLDS = table(Authorization)

AUTHORIZATIONS = REGISTRY.counter(
    "metering_authorizations_total",
    "Pre-flight authorizations by result: granted, replayed (an idempotent retry), or the error "
    "code of a refusal (insufficient_credits, member_spend_limit, invalid_api_key, ...).",
    ("result",),
)
VOIDS = REGISTRY.counter(
    "metering_authorization_voids_total",
    "DELETE /v1/authorizations/{id} by result: voided, or unchanged (no longer active).",
    ("result",),
)

RESOLUTIONS = REGISTRY.counter(
    "metering_authorization_resolutions_total",
    "PostgreSQL: how authorizations resolved their key, model and price: read (a resolving "
    "read), remembered (estimated from the resolution this process read before), stale (a "
    "remembered one the check-and-hold found changed; it was then read afresh).",
    ("source",),
)

EXPIRED_WITHOUT_USAGE = "metering_authorizations_expired_without_usage"


@REGISTRY.database_collector
def expired_without_usage(session: Session, now: datetime) -> Iterable[Metric]:
    """Holds that expired with no usage event: each is a sign of lost usage.

    Read from the database, so every process reports the same figure."""
    count = session.execute(
        select(func.count())
        .select_from(_HOLDS)
        .where(holds.reads_as_sql(HoldStatus.EXPIRED, _HOLDS, now))
    ).scalar_one()
    yield GaugeMetricFamily(
        EXPIRED_WITHOUT_USAGE, "Credit holds that expired without any usage event.", int(count)
    )
