"""The Notifications page: the account's webhook endpoints (docs/api.md#webhooks) with their recent
deliveries, and its forms: add an endpoint, disable or enable it, remove it, send it a test.

Every form carries the session's CSRF token; every change goes through the same service as
``/v1/webhook-endpoints`` (with the account's scope, so another account's endpoint is not
found) and is audited as ``portal:<acct_…>``. A new endpoint's signing secret is shown
once, on the page the form's POST answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from metering.kit.errors import MeteringError
from metering.kit.text import check_url_text
from metering.notifications import changes
from metering.notifications.endpoints import rules_of
from metering.notifications.schemas import EndpointCreate
from metering.notifications.service import Scope
from metering.portal import pages, views
from metering.portal.endpoints import (
    FormDep,
    UserDep,
    auditor_of,
    check_csrf,
    page_of,
    require,
)
from metering.portal.roles import Permission
from metering.portal.sessions import PortalUser
from metering.web.deps import NowDep, SessionDep

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)
PAGE = f"{pages.PREFIX}/notifications"
TYPE_FIELD = "type:"  # a checkbox per event type: ``type:credit.balance_low``


def _show(
    request: Request,
    user: PortalUser,
    session: Session,
    status_code: int = 200,
    **context: Any,
) -> Response:
    return page_of(
        request,
        user,
        "notifications.html",
        status_code=status_code,
        endpoints=views.notifications(session, user.account_id),
        event_types=views.account_event_types(),
        **context,
    )


@router.get("/notifications")
def notifications(request: Request, user: UserDep, session: SessionDep) -> Response:
    return _show(request, user, session, form={})


def _problem(error: ValidationError) -> str:
    """What the person should fix, in words (the first problem only)."""
    first = error.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    if field == "event_types":
        return "Choose at least one event type."
    if field == "url":
        return "Give the endpoint's URL (at most 2,048 characters)."
    if field == "description":
        return "The description must be at most 500 characters, without NUL characters."
    return f"{field}: {first['msg']}"


@router.post("/notifications")
def add_endpoint(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_WEBHOOKS)
    # Every type the form names, offered or not: the endpoints' rules say what is refused.
    chosen = [
        f.removeprefix(TYPE_FIELD) for f, on in form.items() if f.startswith(TYPE_FIELD) and on
    ]
    fields = {
        "url": form.get("url", "").strip(),
        "event_types": chosen,
        "description": form.get("description", "").strip() or None,
    }
    try:
        body = EndpointCreate.model_validate(fields)
        endpoint, secret = changes.create(
            session,
            auditor_of(request, user),
            Scope(user.account_id),
            rules_of(request),
            url=body.url,
            event_types=body.event_types,
            account_id=None,
            description=body.description,
            now=now,
        )
    except ValidationError as error:
        return _show(request, user, session, 400, form=fields, problem=_problem(error))
    except MeteringError as error:  # the URL or the types refused by the endpoints' rules
        return _show(request, user, session, 400, form=fields, problem=error.message)
    return _show(request, user, session, form={}, created={"id": endpoint.id, "secret": secret})


def _change(request: Request, user: PortalUser, form: dict[str, str]) -> tuple[Scope, str]:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_WEBHOOKS)
    check_url_text(request.path_params, b"")
    return Scope(user.account_id), str(request.path_params["endpoint_id"])


@router.post("/notifications/{endpoint_id}/disable")
def disable_endpoint(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    return _set_enabled(request, form, user, session, now, enabled=False)


@router.post("/notifications/{endpoint_id}/enable")
def enable_endpoint(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    return _set_enabled(request, form, user, session, now, enabled=True)


def _set_enabled(
    request: Request,
    form: dict[str, str],
    user: PortalUser,
    session: Session,
    now: datetime,
    *,
    enabled: bool,
) -> Response:
    scope, endpoint_id = _change(request, user, form)
    changes.update(
        session, auditor_of(request, user), scope, rules_of(request), endpoint_id,
        {"enabled": enabled}, now,
    )  # fmt: skip
    return pages.see_other(PAGE)


@router.post("/notifications/{endpoint_id}/delete")
def delete_endpoint(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    scope, endpoint_id = _change(request, user, form)
    changes.delete(session, auditor_of(request, user), scope, endpoint_id, now)
    return pages.see_other(PAGE)


@router.post("/notifications/{endpoint_id}/test")
def test_endpoint(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    scope, endpoint_id = _change(request, user, form)
    changes.send_test(session, auditor_of(request, user), scope, endpoint_id, now)
    return pages.see_other(PAGE)
