"""Routes for an account's projects and members: the operator's (``/admin/v1``) and the
account key's read-only lists (``/v1/projects``, ``/v1/members``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from metering.accounts import projects, service
from metering.accounts.deps import AccountKeyDep
from metering.accounts.schemas import MemberCreate, MemberUpdate, ProjectCreate, ProjectUpdate
from metering.audit.deps import AuditDep
from metering.kit.pagination import PageParams, page
from metering.kit.timeutil import format_timestamp
from metering.models import Member, Project
from metering.web.deps import AdminDep, NowDep, SessionDep
from metering.web.jsonio import MeteringRoute

admin_router = APIRouter(
    prefix="/admin/v1",
    route_class=MeteringRoute,
    dependencies=[AdminDep],
    tags=["admin: projects and members"],
)
router = APIRouter(prefix="/v1", route_class=MeteringRoute, tags=["projects and members"])

# What a project's and a member's audit events record of them.
_PROJECT_FIELDS = projects.PROJECT_FIELDS
_MEMBER_FIELDS = projects.MEMBER_FIELDS


def _cursor(row: Project | Member) -> tuple[str, str]:
    return format_timestamp(row.created_at), row.id


def _projects_page(session: Any, account_id: str, paging: tuple[int, str | None]) -> Any:
    limit, after = paging
    rows = projects.page_of(session, Project, account_id, limit, after)
    bodies = {b["id"]: b for b in projects.project_bodies(session, rows)}
    return page(rows, limit, lambda p: bodies[p.id], _cursor)


def _members_page(session: Any, account_id: str, paging: tuple[int, str | None]) -> Any:
    limit, after = paging
    rows = projects.page_of(session, Member, account_id, limit, after)
    bodies = {b["id"]: b for b in projects.member_bodies(rows)}
    return page(rows, limit, lambda m: bodies[m.id], _cursor)


# -- projects ---------------------------------------------------------------------------------


@admin_router.post("/accounts/{account_id}/projects", status_code=201)
def create_project(
    account_id: str, body: ProjectCreate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Create a project: a group of the account's keys with its own models and spend limit."""
    limit = service.spend_limit_of(body)
    account = service.get_account(session, account_id)
    project = projects.create_project(session, account, body.name, limit, body.allowed_models, now)
    (shown,) = projects.project_bodies(session, [project])
    changes = {field: shown[field] for field in _PROJECT_FIELDS}
    audit.record(session, now, "project.create", "project", project.id, account.id, changes)
    return shown


@admin_router.get("/accounts/{account_id}/projects")
def list_projects(account_id: str, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List an account's projects (archived ones included), oldest first."""
    service.get_account(session, account_id)
    return _projects_page(session, account_id, paging)


@admin_router.get("/projects/{project_id}")
def get_project(project_id: str, session: SessionDep) -> dict[str, Any]:
    """One project."""
    (shown,) = projects.project_bodies(session, [projects.get_project(session, project_id)])
    return shown


@admin_router.patch("/projects/{project_id}")
def update_project(
    project_id: str, body: ProjectUpdate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Rename a project, change its spend limit or window (null removes the limit), or its
    model list (null: every model of its account)."""
    project = projects.get_project(session, project_id)
    after, changes = projects.change_project(session, project, body)
    if changes:
        audit.record(
            session, now, "project.update", "project", project.id, project.account_id, changes
        )
    return after


@admin_router.delete("/projects/{project_id}")
def archive_project(
    project_id: str, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Archive a project and revoke its keys, in one transaction; no key can be made in it
    afterwards. Archiving twice is harmless; the account's Default project is never archived."""
    project = projects.get_project(session, project_id)
    if project.archived_at is None:
        revoked = projects.archive_project(session, project, now)
        changes = {"archived_at": now, "revoked_api_key_ids": revoked}
        audit.record(
            session, now, "project.archive", "project", project.id, project.account_id, changes
        )
    (shown,) = projects.project_bodies(session, [project])
    return shown


# -- members ----------------------------------------------------------------------------------


@admin_router.post("/accounts/{account_id}/members", status_code=201)
def create_member(
    account_id: str, body: MemberCreate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Add a member (a person of the account, with a role); an address names one member of an
    account (case-insensitive: 409 ``member_exists``)."""
    limit = service.spend_limit_of(body)
    account = service.get_account(session, account_id)
    member = projects.create_member(session, account, body.email, body.name, body.role, limit, now)
    (shown,) = projects.member_bodies([member])
    changes = {field: shown[field] for field in _MEMBER_FIELDS}
    audit.record(session, now, "member.create", "member", member.id, account.id, changes)
    return shown


@admin_router.get("/accounts/{account_id}/members")
def list_members(account_id: str, session: SessionDep, paging: PageParams) -> dict[str, Any]:
    """List an account's members (removed ones included), oldest first."""
    service.get_account(session, account_id)
    return _members_page(session, account_id, paging)


@admin_router.get("/members/{member_id}")
def get_member(member_id: str, session: SessionDep) -> dict[str, Any]:
    """One member."""
    (shown,) = projects.member_bodies([projects.get_member(session, member_id)])
    return shown


@admin_router.patch("/members/{member_id}")
def update_member(
    member_id: str, body: MemberUpdate, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Change a member's address, name, role (it applies to its portal sessions at once) or
    spend limit and window (null removes the limit)."""
    member = projects.get_member(session, member_id)
    after, changes = projects.change_member(session, member, body)
    if changes:
        audit.record(session, now, "member.update", "member", member.id, member.account_id, changes)
    return after


@admin_router.delete("/members/{member_id}")
def remove_member(
    member_id: str, session: SessionDep, now: NowDep, audit: AuditDep
) -> dict[str, Any]:
    """Remove a member and revoke its keys, in one transaction (what they spent stays theirs
    in reports). Removing twice is harmless."""
    member = projects.get_member(session, member_id)
    if member.removed_at is None:
        revoked = projects.remove_member(session, member, now)
        changes = {"removed_at": now, "revoked_api_key_ids": revoked}
        audit.record(session, now, "member.remove", "member", member.id, member.account_id, changes)
    (shown,) = projects.member_bodies([member])
    return shown


# -- the account key's lists ------------------------------------------------------------------


@router.get("/projects")
def list_own_projects(key: AccountKeyDep, session: SessionDep, paging: PageParams) -> Any:
    """Your account's projects (archived ones included), oldest first."""
    return _projects_page(session, key.account_id, paging)


@router.get("/members")
def list_own_members(key: AccountKeyDep, session: SessionDep, paging: PageParams) -> Any:
    """Your account's members (removed ones included), oldest first."""
    return _members_page(session, key.account_id, paging)
