"""The Members and Projects pages, for an account's admins (and its owner's session): add a
member (its sign-in link emailed to it with ``METERING_SMTP_URL``, otherwise shown to copy),
change its name, role and spend limit, remove one (its keys revoked); make a project, rename it
and set its spend limit, archive one (its keys revoked; never the Default project). Each change
is the admin routes' own (metering.accounts.projects), audited as the session's actor; a refused
one shows the page again with the problem (400)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from metering.accounts import projects, service
from metering.accounts.schemas import MemberCreate, MemberUpdate, ProjectCreate, ProjectUpdate
from metering.kit.errors import InvalidRequest, MeteringError, NotFound
from metering.models import Member, Project
from metering.portal import mail, pages, sessions
from metering.portal.endpoints import (
    FormDep,
    UserDep,
    auditor_of,
    check_csrf,
    page_of,
    public_base_url,
    require,
)
from metering.portal.roles import Permission
from metering.portal.sessions import PortalUser
from metering.web.deps import NowDep, SessionDep, get_settings

router = APIRouter(prefix=pages.PREFIX, include_in_schema=False)


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
        default_project_id=service.default_project_id(user.account_id),
        **context,
    )


# A spend limit as the forms take it: dollars, at most 8 decimals (a microcent); blank: none.
_DOLLARS = re.compile(r"[0-9]{1,11}(\.[0-9]{1,8})?")


def _limit_fields(form: dict[str, str]) -> dict[str, Any]:
    """The form's ``spend_limit`` (dollars; blank removes the limit) and
    ``spend_limit_window`` as the admin routes' body fields (their schema checks the rest)."""
    text = form.get("spend_limit", "").strip().removeprefix("$")
    if text and not _DOLLARS.fullmatch(text):
        raise InvalidRequest(
            "spend limit: enter dollars, e.g. 25 or 25.50, or leave it blank for no limit",
            param="spend_limit",
        )
    return {
        "spend_limit_cents": Decimal(text) * 100 if text else None,
        "spend_limit_window": form.get("spend_limit_window", "month"),
    }


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
    auditor_of(request, user).record(
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


@router.post("/members/{member_id}/edit")
def edit_member(
    member_id: str, request: Request, form: FormDep, user: UserDep, session: SessionDep, now: NowDep
) -> Response:
    """Change a member's name, role and spend limit (``PATCH /admin/v1/members/{id}``'s
    rules)."""
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_MEMBERS)
    member = _of_account(session, Member, user.account_id, member_id)
    return _edit(
        request,
        user,
        session,
        now,
        member,
        kind="member",
        body_of=lambda: MemberUpdate.model_validate(
            {
                "name": form.get("name", "").strip(),
                "role": form.get("role", member.role),
                **_limit_fields(form),
            }
        ),
        change=projects.change_member,
        refusal="a removed member cannot be changed" if member.removed_at is not None else None,
        page=_members,
    )


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
        auditor_of(request, user).record(
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
    auditor_of(request, user).record(
        session, now, "project.create", "project", project.id, account.id, {"name": shown["name"]}
    )
    return pages.see_other(f"{pages.PREFIX}/projects")


@router.post("/projects/{project_id}/edit")
def edit_project(
    project_id: str,
    request: Request,
    form: FormDep,
    user: UserDep,
    session: SessionDep,
    now: NowDep,
) -> Response:
    """Rename a project and set its spend limit (``PATCH /admin/v1/projects/{id}``'s rules)."""
    check_csrf(request, user, form)
    require(user, Permission.MANAGE_PROJECTS)
    project = _of_account(session, Project, user.account_id, project_id)
    return _edit(
        request,
        user,
        session,
        now,
        project,
        kind="project",
        body_of=lambda: ProjectUpdate.model_validate(
            {"name": form.get("name", "").strip(), **_limit_fields(form)}
        ),
        change=projects.change_project,
        refusal="an archived project cannot be changed"
        if project.archived_at is not None
        else None,
        page=_projects,
    )


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
        try:
            revoked = projects.archive_project(session, project, now)
        except MeteringError as error:  # the Default project
            return _projects(request, user, session, 400, problem=error.message)
        changes = {"archived_at": now, "revoked_api_key_ids": revoked}
        auditor_of(request, user).record(
            session, now, "project.archive", "project", project.id, project.account_id, changes
        )
    return pages.see_other(f"{pages.PREFIX}/projects")


def _edit(
    request: Request,
    user: PortalUser,
    session: Session,
    now: datetime,
    row: Any,
    *,
    kind: str,
    body_of: Callable[[], Any],
    change: Callable[[Session, Any, Any], tuple[Any, dict[str, Any]]],
    refusal: str | None,
    page: Callable[..., Response],
) -> Response:
    """The edit form of a ``kind`` ("member" or "project") ``row``: ``body_of`` reads the form
    into the admin routes' update body and ``change`` applies it; a ``refusal`` (the row is
    removed or archived) or a refused value shows the ``page`` again with the problem (400);
    a change is audited."""
    try:
        body = body_of()
        if refusal is not None:
            raise InvalidRequest(refusal, param=f"{kind}_id")
        _, changes = change(session, row, body)
    except ValidationError as error:
        return page(request, user, session, 400, problem=_problem(error))
    except MeteringError as error:
        return page(request, user, session, 400, problem=error.message)
    if changes:
        auditor_of(request, user).record(
            session, now, f"{kind}.update", kind, row.id, row.account_id, changes
        )
    return pages.see_other(f"{pages.PREFIX}/{kind}s")


def _of_account(session: Session, model: Any, account_id: str, row_id: str) -> Any:
    row = session.execute(
        select(model).where(model.account_id == account_id, model.id == row_id)
    ).scalar_one_or_none()
    if row is None:
        raise NotFound("nothing of that id in this account")
    return row
