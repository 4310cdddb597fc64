"""The audit of a request, as a route's dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from metering.audit.service import Auditor
from metering.web.deps import actor_of
from metering.web.middleware import request_id_of


async def _auditor(request: Request) -> Auditor:
    return Auditor(actor_of(request), request_id_of(request.scope))


# Records an admin route's changes in the audit log, as the caller's token and this request.
AuditDep = Annotated[Auditor, Depends(_auditor)]
