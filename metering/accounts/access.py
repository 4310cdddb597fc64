"""Model access and requests in flight (docs/api.md#accounts-and-keys), the rules the check-and-hold
adds.

**Model access.** An account sees every catalog model (``restricts_models`` false; hidden ones are
served but not listed) or exactly the models of its list (``account_models``, hidden ones
included: private models). A key may be narrowed further (``api_key_models``): its effective
models are its list ∩ its account's, so an entry made stale by a later narrowing of the account
grants nothing. A model the account cannot see is answered exactly as an unknown one (404
``model_not_found``); one it sees but the key may not use is 403 ``model_not_allowed``. Both are
columns of the authorization's resolution (metering.ledger.resolution), so a remembered
resolution stops holding the moment either list changes.

**In flight.** An account's requests in flight are its active holds. The check-and-hold keeps
their number (``accounts.held_count``) beside their sum (``held_microcents``) under the
account's lock, by the same steps (placing counts one, the releases it collects uncount them),
and refuses a hold when the count has reached ``max_concurrent_requests``. Unbilled accounts
skip the credit checks, so their holds are placed without the lock and uncounted — unless the
account has a limit: then they go through the check-and-hold too, which first counts any active
hold of theirs not yet counted (placed while there was no limit), so the count is exact.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, exists, false, or_, true

from metering.kit.errors import NotFound, PermissionDenied
from metering.models import AccountModel, ApiKeyModel, ProjectModel, table

ACCOUNT_MODELS = table(AccountModel)
KEY_MODELS = table(ApiKeyModel)
PROJECT_MODELS = table(ProjectModel)


def account_sees(account_id: Any, restricts: Any, model_id: Any) -> ColumnElement[bool]:
    """The account may use the model (columns or bound values)."""
    return or_(
        restricts.is_(false()),
        exists().where(
            ACCOUNT_MODELS.c.account_id == account_id, ACCOUNT_MODELS.c.model_id == model_id
        ),
    )


def key_allows(account_id: Any, key_id: Any, restricts: Any, model_id: Any) -> ColumnElement[bool]:
    """The key's own list lets it use the model (the account's must as well). The key's
    account is named too: the list is account data (on Citus, on the account's shard)."""
    return or_(
        restricts.is_(false()),
        exists().where(
            KEY_MODELS.c.account_id == account_id,
            KEY_MODELS.c.api_key_id == key_id,
            KEY_MODELS.c.model_id == model_id,
        ),
    )


def project_allows(
    account_id: Any, project_id: Any, restricts: Any, model_id: Any
) -> ColumnElement[bool]:
    """The key's project's list lets it use the model (a key's effective models are the
    account's ∩ its project's ∩ its own). ``restricts`` may be null (no project): no list."""
    return or_(
        restricts.isnot(true()),
        exists().where(
            PROJECT_MODELS.c.account_id == account_id,
            PROJECT_MODELS.c.project_id == project_id,
            PROJECT_MODELS.c.model_id == model_id,
        ),
    )


def unknown_model(name: str) -> NotFound:
    """The one answer for a model that does not exist *and* for one the account cannot see."""
    return NotFound(f"model {name!r} does not exist", code="model_not_found", param="model")


def not_allowed(model_id: str) -> PermissionDenied:
    return PermissionDenied(
        f"this API key may not use the model {model_id!r}", code="model_not_allowed", param="model"
    )


def listed_by_account_or_key(account_id: Any, key_id: Any, model_id: Any) -> ColumnElement[bool]:
    """A list names the model explicitly (a hidden model named so is listed to the key)."""
    return or_(
        exists().where(
            ACCOUNT_MODELS.c.account_id == account_id, ACCOUNT_MODELS.c.model_id == model_id
        ),
        exists().where(
            KEY_MODELS.c.account_id == account_id,
            KEY_MODELS.c.api_key_id == key_id,
            KEY_MODELS.c.model_id == model_id,
        ),
    )


def checked_under_lock(billing: str, max_concurrent_requests: int | None) -> bool:
    """Whether an account's holds go through the check-and-hold (under its lock): prepaid ones
    for credit, unbilled ones only when a concurrency limit applies to them."""
    return billing == "prepaid" or max_concurrent_requests is not None


def in_flight_limited(count: Any, limit: Any) -> ColumnElement[bool]:
    """The account has as many requests in flight as its limit allows, or more."""
    return and_(limit.isnot(None), count >= limit)


__all__ = [
    "ACCOUNT_MODELS",
    "KEY_MODELS",
    "account_sees",
    "checked_under_lock",
    "in_flight_limited",
    "key_allows",
    "listed_by_account_or_key",
    "not_allowed",
    "project_allows",
    "unknown_model",
]
