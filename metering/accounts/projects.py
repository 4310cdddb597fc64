"""Projects and members (an account's groups of keys, and its people): making, changing,
archiving and removing them, and what each answers.

Every account has a project named ``Default``, made with it, whose id is the account's with
``proj_`` in place of ``acct_`` (the migration that introduced projects made the older accounts'
so, and moved their keys there). A key belongs to one project and to one member or none (a
service key), both fixed for its life. Archiving a project or removing a member revokes its
keys in the same transaction, and no key can be made for either afterwards; the rows stay, so
what their keys spent is still reported under them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from metering.accounts.schemas import MemberUpdate, ProjectUpdate
from metering.accounts.service import (
    SpendLimit,
    catalog_ids,
    default_project_id,
    get_account,
    spend_limit_of,
)
from metering.kit.errors import Conflict, InvalidRequest, NotFound
from metering.kit.ids import new_id
from metering.kit.money import cents
from metering.kit.pagination import decode_cursor
from metering.kit.timeutil import format_timestamp, parse_timestamp
from metering.models import Account, AccountModel, ApiKey, Member, Project, ProjectModel, table

# What a project's and a member's audit events record of them.
PROJECT_FIELDS = ("name", "spend_limit_cents", "spend_limit_window", "allowed_models")
MEMBER_FIELDS = ("email", "name", "role", "spend_limit_cents", "spend_limit_window")

PROJECT_MODELS = table(ProjectModel)
ACCOUNTS = table(Account)
ACCOUNT_MODELS = table(AccountModel)
KEYS = table(ApiKey)


# -- projects ---------------------------------------------------------------------------------


def create_project(
    session: Session,
    account: Account,
    name: str,
    limit: SpendLimit,
    models: list[str] | None,
    now: datetime,
) -> Project:
    project = Project(
        id=new_id("proj"),
        account_id=account.id,
        name=name,
        spend_limit_microcents=limit.amount,
        spend_limit_window=limit.window or "month",
        restricts_models=False,
        created_at=now,
    )
    session.add(project)
    session.flush()
    note_scope_limit(session, project)
    if models is not None:
        set_project_models(session, project, models)
    return project


def get_project(session: Session, project_id: str, *, param: str = "project_id") -> Project:
    project = session.execute(select(Project).where(Project.id == project_id)).scalar_one_or_none()
    if project is None:
        raise NotFound(f"no project {project_id}", param=param)
    return project


def change_project(
    session: Session, project: Project, body: ProjectUpdate
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply a ``PATCH`` of the project (omitted fields unchanged; a null limit removes it):
    the project's body after, and the fields that changed (``PROJECT_FIELDS``)."""
    (before,) = project_bodies(session, [project])
    limit = spend_limit_of(body)
    if "name" in body.model_fields_set:
        project.name = body.name
    apply_limit(project, limit)
    note_scope_limit(session, project)
    if "allowed_models" in body.model_fields_set:
        set_project_models(session, project, body.allowed_models)
    session.flush()
    (after,) = project_bodies(session, [project])
    return after, {f: after[f] for f in PROJECT_FIELDS if after[f] != before[f]}


def apply_limit(row: Project | Member, limit: SpendLimit) -> None:
    if limit.given:
        row.spend_limit_microcents = limit.amount
    if limit.window is not None:
        row.spend_limit_window = limit.window


def note_scope_limit(session: Session, row: Project | Member) -> None:
    """Mark the account as having project or member limits once ``row`` has one; the ingest
    reads them only for such accounts (metering.usage.repository), and the check-and-hold the
    key's project and member (metering.ledger.resolution)."""
    if row.spend_limit_microcents is not None:
        _mark(session, row.account_id, ACCOUNTS.c.scope_limits)


def _mark(session: Session, account_id: str, mark: Any) -> None:
    """Set one of the account's marks (``scope_limits``, ``project_models``): once, never
    unmarked, a plain write whatever the concurrency."""
    session.execute(
        update(ACCOUNTS).where(ACCOUNTS.c.id == account_id, mark.is_(False)).values({mark: True})
    )


def set_project_models(session: Session, project: Project, names: list[str] | None) -> None:
    """Replace the project's model list: null, or models its account sees now (else 400)."""
    ids = None
    if names is not None:
        ids = catalog_ids(session, names, "allowed_models")
        account = get_account(session, project.account_id)
        if account.restricts_models:
            seen = set(
                session.execute(
                    select(ACCOUNT_MODELS.c.model_id).where(
                        ACCOUNT_MODELS.c.account_id == account.id
                    )
                ).scalars()
            )
            outside = [m for m in ids if m not in seen]
            if outside:
                raise InvalidRequest(
                    f"the project's account cannot use the model {outside[0]!r}",
                    param="allowed_models",
                )
    session.execute(
        delete(PROJECT_MODELS).where(
            PROJECT_MODELS.c.account_id == project.account_id,
            PROJECT_MODELS.c.project_id == project.id,
        )
    )
    if ids:
        session.execute(
            insert(PROJECT_MODELS),
            [
                {"account_id": project.account_id, "project_id": project.id, "model_id": m}
                for m in ids
            ],
        )
    project.restricts_models = ids is not None
    if ids is not None:
        # The check-and-hold reads the projects of marked accounts only.
        _mark(session, project.account_id, ACCOUNTS.c.project_models)
    session.flush()


def project_models(session: Session, projects: Sequence[Project]) -> dict[str, list[str] | None]:
    lists: dict[str, list[str] | None] = {
        p.id: ([] if p.restricts_models else None) for p in projects
    }
    restricted = [p for p in projects if p.restricts_models]
    for project in restricted:
        listed = lists[project.id]
        assert listed is not None
        listed.extend(
            session.execute(
                select(PROJECT_MODELS.c.model_id).where(
                    PROJECT_MODELS.c.account_id == project.account_id,
                    PROJECT_MODELS.c.project_id == project.id,
                )
            ).scalars()
        )
        listed.sort(key=str.encode)
    return lists


def project_bodies(session: Session, projects: Sequence[Project]) -> list[dict[str, Any]]:
    lists = project_models(session, projects)
    return [
        {
            "id": p.id,
            "object": "project",
            "account_id": p.account_id,
            "name": p.name,
            **_limit_fields(p.spend_limit_microcents, p.spend_limit_window),
            "allowed_models": lists[p.id],
            "created_at": format_timestamp(p.created_at),
            "archived_at": format_timestamp(p.archived_at) if p.archived_at else None,
        }
        for p in projects
    ]


def archive_project(session: Session, project: Project, now: datetime) -> list[str]:
    """Archive the project and revoke its live keys (the caller's transaction); the keys
    revoked, by id. Archiving again changes nothing. The account's ``Default`` project is never
    archived (400 ``default_project``): it is where a key goes when no project is named."""
    if project.id == default_project_id(project.account_id):
        raise InvalidRequest(
            "the Default project cannot be archived: a key made without a project goes there",
            code="default_project",
            param="project_id",
        )
    if project.archived_at is not None:
        return []
    project.archived_at = now
    session.flush()
    return _revoke_keys(session, project.account_id, KEYS.c.project_id == project.id, now)


# -- members ----------------------------------------------------------------------------------


def email_key(email: str) -> str:
    """An address as compared: case-insensitively."""
    return email.lower()


def create_member(
    session: Session,
    account: Account,
    email: str,
    name: str,
    role: str,
    limit: SpendLimit,
    now: datetime,
) -> Member:
    member = Member(
        id=new_id("mem"),
        account_id=account.id,
        email=email,
        email_key=email_key(email),
        name=name,
        role=role,
        spend_limit_microcents=limit.amount,
        spend_limit_window=limit.window or "month",
        created_at=now,
    )
    _refuse_taken_address(session, account.id, email, None)
    _flush_unique(session, member, email)
    note_scope_limit(session, member)
    return member


def change_member(
    session: Session, member: Member, body: MemberUpdate
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Apply a ``PATCH`` of the member (omitted fields unchanged; a null limit removes it): the
    member's body after, and the fields that changed (``MEMBER_FIELDS``)."""
    (before,) = member_bodies([member])
    limit = spend_limit_of(body)
    given = body.model_fields_set
    if "email" in given:
        change_email(session, member, body.email)
    if "name" in given:
        member.name = body.name
    if "role" in given:
        member.role = body.role
    apply_limit(member, limit)
    note_scope_limit(session, member)
    session.flush()
    (after,) = member_bodies([member])
    return after, {f: after[f] for f in MEMBER_FIELDS if after[f] != before[f]}


def change_email(session: Session, member: Member, email: str) -> None:
    if email_key(email) == member.email_key:
        member.email = email
        return
    _refuse_taken_address(session, member.account_id, email, member.id)
    member.email = email
    member.email_key = email_key(email)
    _flush_unique(session, member, email)


def _refuse_taken_address(
    session: Session, account_id: str, email: str, member_id: str | None
) -> None:
    query = select(Member.id).where(
        Member.account_id == account_id,
        Member.email_key == email_key(email),
        Member.removed_at.is_(None),
    )
    if member_id is not None:
        query = query.where(Member.id != member_id)
    if session.execute(query).first() is not None:
        raise _taken(email)


def _flush_unique(session: Session, member: Member, email: str) -> None:
    """Write the member; the unique index answers a concurrent twin with the same 409."""
    savepoint = session.begin_nested()
    try:
        session.add(member)
        session.flush()
    except IntegrityError:
        savepoint.rollback()
        raise _taken(email) from None
    savepoint.commit()


def _taken(email: str) -> Conflict:
    return Conflict(
        f"the account already has a member with the address {email!r}",
        code="member_exists",
        param="email",
    )


def get_member(session: Session, member_id: str, *, param: str = "member_id") -> Member:
    member = session.execute(select(Member).where(Member.id == member_id)).scalar_one_or_none()
    if member is None:
        raise NotFound(f"no member {member_id}", param=param)
    return member


def member_bodies(members: Sequence[Member]) -> list[dict[str, Any]]:
    return [
        {
            "id": m.id,
            "object": "member",
            "account_id": m.account_id,
            "email": m.email,
            "name": m.name,
            "role": m.role,
            **_limit_fields(m.spend_limit_microcents, m.spend_limit_window),
            "created_at": format_timestamp(m.created_at),
            "removed_at": format_timestamp(m.removed_at) if m.removed_at else None,
        }
        for m in members
    ]


def remove_member(session: Session, member: Member, now: datetime) -> list[str]:
    """Remove the member and revoke its live keys (the caller's transaction); the keys
    revoked, by id. Removing again changes nothing."""
    if member.removed_at is not None:
        return []
    member.removed_at = now
    session.flush()
    return _revoke_keys(session, member.account_id, KEYS.c.member_id == member.id, now)


# -- keys -------------------------------------------------------------------------------------


def key_owners(
    session: Session, account_id: str, project_id: str | None, member_id: str | None
) -> tuple[str, str | None]:
    """The project (by default the account's ``Default``) and the member a new key of the
    account is made for: each of the account, not archived or removed (else 400)."""
    project_id = project_id or default_project_id(account_id)
    project = session.execute(
        select(Project).where(Project.account_id == account_id, Project.id == project_id)
    ).scalar_one_or_none()
    if project is None:
        raise InvalidRequest(f"the account has no project {project_id}", param="project_id")
    if project.archived_at is not None:
        raise InvalidRequest(
            f"the project {project_id} is archived: no key can be made in it", param="project_id"
        )
    if member_id is not None:
        member = session.execute(
            select(Member).where(Member.account_id == account_id, Member.id == member_id)
        ).scalar_one_or_none()
        if member is None:
            raise InvalidRequest(f"the account has no member {member_id}", param="member_id")
        if member.removed_at is not None:
            raise InvalidRequest(
                f"the member {member_id} was removed: no key can be made for it",
                param="member_id",
            )
    return project.id, member_id


def _revoke_keys(session: Session, account_id: str, which: Any, now: datetime) -> list[str]:
    live = and_(KEYS.c.account_id == account_id, which, KEYS.c.revoked_at.is_(None))
    ids = sorted(session.execute(select(KEYS.c.id).where(live)).scalars())
    if ids:
        session.execute(
            update(KEYS)
            .where(KEYS.c.account_id == account_id, KEYS.c.id.in_(ids))
            .values(revoked_at=now)
        )
        session.expire_all()
    return ids


# -- shared -----------------------------------------------------------------------------------


def _limit_fields(limit: int | None, window: str) -> dict[str, Any]:
    return {
        "spend_limit_cents": None if limit is None else cents(limit),
        "spend_limit_microcents": limit,
        "spend_limit_window": window,
    }


def all_of(session: Session, model: Any, account_id: str) -> list[Any]:
    """Every one of an account's projects or members, oldest first (the portal's pages)."""
    query = select(model).where(model.account_id == account_id)
    return list(session.execute(query.order_by(model.created_at, model.id)).scalars().all())


def page_of(
    session: Session, model: Any, account_id: str, limit: int, after: str | None
) -> list[Any]:
    """A page of an account's projects, members or keys, oldest first, after the cursor
    ``after``."""
    query = (
        select(model)
        .where(model.account_id == account_id)
        .order_by(model.created_at, model.id)
        .limit(limit + 1)
    )
    if after:
        created, last_id = decode_cursor(after, 2)
        created_at = parse_timestamp(created, "after")
        query = query.where(
            or_(
                model.created_at > created_at,
                and_(model.created_at == created_at, model.id > str(last_id)),
            )
        )
    return list(session.execute(query).scalars().all())
