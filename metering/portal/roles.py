"""Who may do what in the portal: the roles of an account's people, and what each kind of
session may do (docs/api.md#billing-portal-html).

A session is one of three kinds, decided when it starts and stored with it (``method``):

* ``link``: an operator's sign-in link for the account, naming no member: the account's owner,
  who may do everything an admin may;
* ``api_key:<key_…>``: signed in with one of the account's API keys: what that key may do
  through the JSON routes (read every page, manage the account's webhook endpoints);
* ``member:<mem_…>``: a member signed in as themselves: what the member's role grants.

Every page handler that changes something asks ``user.can(permission)`` of the one table below.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Role(StrEnum):
    VIEWER = "viewer"
    DEVELOPER = "developer"
    ADMIN = "admin"


class Permission(StrEnum):
    VIEW = "view"
    MANAGE_OWN_KEYS = "manage_own_keys"
    MANAGE_ANY_KEY = "manage_any_key"
    MANAGE_WEBHOOKS = "manage_webhooks"
    MANAGE_PROJECTS = "manage_projects"
    MANAGE_MEMBERS = "manage_members"
    MANAGE_BILLING = "manage_billing"


class SessionKind(StrEnum):
    LINK = "link"
    API_KEY = "api_key"
    MEMBER = "member"


GRANTED: Final[dict[Role, frozenset[Permission]]] = {
    Role.VIEWER: frozenset({Permission.VIEW}),
    Role.DEVELOPER: frozenset(
        {Permission.VIEW, Permission.MANAGE_OWN_KEYS, Permission.MANAGE_WEBHOOKS}
    ),
    Role.ADMIN: frozenset(Permission),
}

# What an account key may do through the JSON routes, and so what its portal session may do.
API_KEY_SESSION: Final = frozenset({Permission.VIEW, Permission.MANAGE_WEBHOOKS})


def method_of(kind: SessionKind, subject_id: str | None = None) -> str:
    """The stored ``method`` of such a session: ``link``, ``api_key:<id>``, ``member:<id>``."""
    if kind is SessionKind.LINK:
        return kind.value
    if not subject_id:
        raise ValueError(f"a {kind.value} session names its {kind.value}")
    return f"{kind.value}:{subject_id}"


def kind_of(method: str) -> tuple[SessionKind, str | None]:
    """The kind of a stored ``method`` and the id it names (None for ``link``)."""
    kind, _, subject_id = method.partition(":")
    return SessionKind(kind), subject_id or None


def permissions_of(kind: SessionKind, role: Role | None = None) -> frozenset[Permission]:
    """What a session of this kind may do; a member's session by the member's ``role``."""
    if kind is SessionKind.LINK:
        return GRANTED[Role.ADMIN]
    if kind is SessionKind.API_KEY:
        return API_KEY_SESSION
    if role is None:
        raise ValueError("a member's session needs the member's role")
    return GRANTED[role]
