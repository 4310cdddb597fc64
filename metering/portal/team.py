"""The Members and Projects pages, for an account's admins (and its owner's session): add a
member (its sign-in link emailed to it with ``METERING_SMTP_URL``, otherwise shown to copy),
remove one (its keys revoked);
make a project, archive one (its keys revoked). Audited as the session's actor."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.accounts import projects, service
from metering.accounts.schemas import MemberCreate, ProjectCreate
from metering.audit.service import Auditor
from metering.kit.errors import MeteringError, NotFound
from metering.models import Member, Project
from metering.portal import mail, pages, sessions
from metering.portal.endpoints import (
    FormDep,
    UserDep,
    check_csrf,
    page_of,
    public_base_url,
    require,
)
from metering.portal.roles import Permission
from metering.portal.sessions import PortalUser
from metering.web.deps import NowDep, SessionDep, get_settings
from metering.web.middleware import request_id_of

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)


def _auditor(request: Request, user: PortalUser) -> Auditor:
    return Auditor(user.actor, request_id_of(request.scope))


def _members(
    request: Request, user: PortalUser, session: Session, status: int = 200, **context: Any
) -> Response:
    rows = projects.all_of(session, Member, user.account_id)
    return page_of(
        request,
        user,
        "members.html",
        status_code=status,
        members=projects.member_bodies(rows),
        **context,
    )


def _projects(
    request: Request, user: PortalUser, session: Session, status: int = 200, **context: Any
) -> Response:
    rows = projects.all_of(session, Project, user.account_id)
    return page_of(
        request,
        user,
        "projects.html",
        status_code=status,
        projects=projects.project_bodies(session, rows),
        **context,
    )


def _problem(error: ValidationError) -> str:
    first = error.errors()[0]
    field = str(first["loc"][0]) if first["loc"] else ""
    return f"{field}: {first['msg']}"


@router.get("/members")
def members_page(request: Request, user: UserDep, session: SessionDep) -> Response:
    require(user, Permission.MANAGE_MEMBERS)
    return _members(request, user, session)


@router.post("/members")
def add_member(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_MEMBERS)
    fields = {
        "email": form.get("email", "").strip(),
        "name": form.get("name", "").strip(),
        "role": form.get("role", "developer"),
    }
    try:
        body = MemberCreate.model_validate(fields)
        account = service.get_account(session, user.account_id)
        member = projects.create_member(
            session, account, body.email, body.name, body.role, service.spend_limit_of(body), now
        )
    except ValidationError as error:
        return _members(request, user, session, 400, problem=_problem(error))
    except MeteringError as error:
        return _members(request, user, session, 400, problem=error.message)
    (shown,) = projects.member_bodies([member])
    changes = {f: shown[f] for f in ("email", "name", "role")}
    _auditor(request, user).record(
        session, now, "member.create", "member", member.id, account.id, changes
    )
    created: dict[str, Any] = {"id": member.id, "email": member.email}
    settings = get_settings(request)
    if settings.mail_on:
        mail.mail_new_member(session, member, now)  # sent by the scheduler, after this commits
    else:
        link = sessions.create_link(session, account.id, public_base_url(settings), now, member.id)
        created.update(url=link.url, expires_at=link.expires_at)
    return _members(request, user, session, created=created)


@router.post("/members/{member_id}/remove")
def remove_member(
    member_id: str, request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_MEMBERS)
    member = _of_account(session, Member, user.account_id, member_id)
    if member.removed_at is None:
        revoked = projects.remove_member(session, member, now)
        changes = {"removed_at": now, "revoked_api_key_ids": revoked}
        _auditor(request, user).record(
            session, now, "member.remove", "member", member.id, member.account_id, changes
        )
    return pages.see_other(f"{pages.PREFIX}/members")


@router.get("/projects")
def projects_page(request: Request, user: UserDep, session: SessionDep) -> Response:
    require(user, Permission.MANAGE_PROJECTS)
    return _projects(request, user, session)


@router.post("/projects")
def add_project(
    request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_PROJECTS)
    try:
        body = ProjectCreate.model_validate({"name": form.get("name", "").strip()})
        account = service.get_account(session, user.account_id)
        project = projects.create_project(
            session, account, body.name, service.spend_limit_of(body), None, now
        )
    except ValidationError as error:
        return _projects(request, user, session, 400, problem=_problem(error))
    (shown,) = projects.project_bodies(session, [project])
    _auditor(request, user).record(
        session, now, "project.create", "project", project.id, account.id, {"name": shown["name"]}
    )
    return pages.see_other(f"{pages.PREFIX}/projects")


@router.post("/projects/{project_id}/archive")
def archive_project(
    project_id: str,
    request: Request,
    form: FormDep,
    user: UserDep,
    session: SessionDep,
    now: NowDep,
) -> Response:
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_PROJECTS)
    project = _of_account(session, Project, user.account_id, project_id)
    if project.archived_at is None:
        revoked = projects.archive_project(session, project, now)
        changes = {"archived_at": now, "revoked_api_key_ids": revoked}
        _auditor(request, user).record(
            session, now, "project.archive", "project", project.id, project.account_id, changes
        )
    return pages.see_other(f"{pages.PREFIX}/projects")


def _of_account(session: Session, model: Any, account_id: str, row_id: str) -> Any:
    row = session.execute(
        select(model).where(model.account_id == account_id, model.id == row_id)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound("nothing of that id in this account")
    return row
