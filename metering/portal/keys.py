"""The Keys page's forms: a developer makes, renames and revokes its own keys, an admin (or the
account's owner) any key. A key made here is in the chosen project of the account (its
``Default`` one unless another is chosen) and owned by the member signed in (a service key when
the owner makes it); its secret is shown on the answer to the form that made it, once. Every
change is audited as ``portal:<mem_…>`` (``portal:<acct_…>`` for the owner's or a key's
session)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.accounts import projects, service
from metering.kit.errors import MeteringError, NotFound
from metering.models import ApiKey, Project
from metering.portal import pages, views
from metering.portal.endpoints import (
    FormDep,
    NotPermitted,
    UserDep,
    auditor_of,
    check_csrf,
    page_of,
)
from metering.portal.roles import Permission
from metering.portal.sessions import PortalUser
from metering.web.deps import NowDep, SessionDep

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)
MAX_NAME = 200
NAME_PROBLEM = "Give the key a name (1 to 200 characters)."


def may_change(user: PortalUser, key_member_id: str | None) -> bool:
    """Whether the session may rename or revoke a key owned by ``key_member_id``."""
    if user.can(Permission.MANAGE_ANY_KEY):
        return True
    return (
        user.can(Permission.MANAGE_OWN_KEYS)
        and user.member_id is not None
        and key_member_id == user.member_id
    )


def may_make(user: PortalUser) -> bool:
    return user.can(Permission.MANAGE_ANY_KEY) or (
        user.can(Permission.MANAGE_OWN_KEYS) and user.member_id is not None
    )


@router.get("/keys")
def keys_page(request: Request, user: UserDep, session: SessionDep, now: NowDep) -> Response:
    return show(request, user, session, now)


def show(
    request: Request,
    user: PortalUser,
    session: Session,
    now: datetime,
    status_code: int = 200,
    **context: Any,
) -> Response:
    rows = views.keys(session, user.account_id, now)
    open_projects = session.execute(
        select(Project.id, Project.name)
        .where(Project.account_id == user.account_id, Project.archived_at.is_(None))
        .order_by(Project.created_at, Project.id)
    ).all()
    return page_of(
        request,
        user,
        "keys.html",
        status_code=status_code,
        keys=rows,
        projects=open_projects,
        may_make=may_make(user),
        may_change={row.id: may_change(user, row.body.get("member_id")) for row in rows},
        **context,
    )


@router.post("/keys")
def make_key(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    if not may_make(user):
        raise NotPermitted("your role does not allow making keys")
    name = form.get("name", "").strip()
    if not name or len(name) > MAX_NAME or "\x00" in name:
        return show(
            request, user, session, now, 400, problem="Give the key a name (1 to 200 characters)."
        )
    account = service.get_account(session, user.account_id)
    try:
        project_id, member_id = projects.key_owners(
            session, account.id, form.get("project_id") or None, user.member_id
        )
    except MeteringError as error:
        return show(request, user, session, now, 400, problem=error.message)
    key, secret = service.create_api_key(
        session, account, name, None, now, project_id=project_id, member_id=member_id
    )
    changes = {"name": name, "project_id": project_id, "member_id": member_id, "key": secret}
    auditor_of(request, user).record(
        session, now, "api_key.create", "api_key", key.id, account.id, changes
    )
    return show(request, user, session, now, created={"id": key.id, "secret": secret, "name": name})


def _own_key(request: Request, user: PortalUser, session: Session, form: dict[str, str]) -> ApiKey:
    check_csrf(request, user, form)
    key_id = str(request.path_params["key_id"])
    key = session.execute(
        select(ApiKey).where(ApiKey.account_id == user.account_id, ApiKey.id == key_id)
    ).scalar_one_or_none()
    if key is None:
        raise NotFound("no such key in this account")
    if not may_change(user, key.member_id):
        raise NotPermitted("your role does not allow changing this key")
    return key


@router.post("/keys/{key_id}/revoke")
def revoke_key(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    key = _own_key(request, user, session, form)
    if key.revoked_at is None:
        key.revoked_at = now
        session.flush()
        auditor_of(request, user).record(
            session, now, "api_key.revoke", "api_key", key.id, key.account_id, {"revoked_at": now}
        )
    return pages.see_other(f"{pages.PREFIX}/keys")


@router.post("/keys/{key_id}/rename")
def rename_key(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    key = _own_key(request, user, session, form)
    name = form.get("name", "").strip()
    if not name or len(name) > MAX_NAME or "\x00" in name:
        return show(
            request, user, session, now, 400, problem="Give the key a name (1 to 200 characters)."
        )
    if name != key.name:
        key.name = name
        session.flush()
        auditor_of(request, user).record(
            session, now, "api_key.update", "api_key", key.id, key.account_id, {"name": name}
        )
    return pages.see_other(f"{pages.PREFIX}/keys")
