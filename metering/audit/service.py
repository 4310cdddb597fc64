"""Recording changes in the audit log, in the caller's transaction, and listing them.

Every change made through ``/admin/v1/`` or the CLI is recorded by the code that makes it, in
the same unit of work, so a change and its record commit or roll back together. Only changes
are recorded: the caller writes nothing for a replay or a no-op. ``changes`` holds the fields
set; any field named like a secret is replaced by ``"[redacted]"`` here, whatever the caller
passed.

The vocabulary of ``action`` (``<resource>.<verb>``) is ``ACTIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from metering.kit import jsonenc
from metering.kit.ids import new_id
from metering.kit.jsonenc import RawJSON
from metering.kit.pagination import page, row_id_after
from metering.kit.timeutil import format_timestamp
from metering.models import AuditEvent, table

AUDIT = table(AuditEvent)
REDACTED = "[redacted]"
# Field names whose values are secrets (an API key's secret, a token): never recorded.
SECRET_FIELDS = frozenset({"key", "secret", "api_key", "token", "password"})
CLI_ACTOR = "cli"

# Every action the service records, with what it means (docs/api.md lists the same).
ACTIONS: dict[str, str] = {
    "account.create": "an account was created",
    "account.update": "an account was renamed, or its limit on requests in flight or its "
    "low-balance threshold changed",
    "model_access.update": "the models an account may use changed",
    "api_key.create": "an API key was created (its secret redacted)",
    "api_key.update": "a key was renamed, or its spend limit, window or models changed",
    "api_key.revoke": "a key was revoked",
    "project.create": "a project was created",
    "project.update": "a project was renamed, or its spend limit, window or models changed",
    "project.archive": "a project was archived and its keys revoked",
    "member.create": "a member was added to an account",
    "member.update": "a member's address, name, role, spend limit or window changed",
    "member.remove": "a member was removed and its keys revoked",
    "grant.create": "prepaid credit was added (a credit grant)",
    "grant.void": "a credit grant's remainder was forfeited",
    "adjustment.create": "a balance was corrected",
    "model.create": "a model was added to the catalog",
    "model.update": "a model's metadata changed",
    "price.create": "a list price version was added",
    "price.update": "a list price version's rates were changed by a catalog import "
    "(only while it has priced no charge)",
    "account_rate.create": "an account's rate override version was added (or ended)",
    "quarantine.reprocess": "quarantined events were retried",
    "portal_session.create": "a sign-in link to an account's billing portal was made",
    "webhook_endpoint.create": "a webhook endpoint was added (its secret redacted)",
    "webhook_endpoint.update": "a webhook endpoint's url, event types, state or description "
    "changed",
    "webhook_endpoint.delete": "a webhook endpoint was deleted (its undelivered messages dropped)",
    "webhook_endpoint.rotate": "a webhook endpoint's signing secret was rotated (redacted)",
    "webhook_endpoint.test": "a webhook.test event was sent to an endpoint",
    "webhook_event.resend": "a webhook event was sent again",
    "payment.create": "a payment was started (a top-up, before Stripe was asked)",
    "payment.succeed": "a payment succeeded and was credited (its paid grant named)",
    "payment.fail": "a payment failed (declined, canceled or abandoned)",
    "payment.refund": "a payment was refunded (an operator's refund, or one made in Stripe): "
    "its grant lost that much",
    "refund.fail": "an operator's refund was not made (Stripe could not be asked, refused, "
    "failed it, or never received it): nothing changed, its amount no longer reserved",
    "payment.dispute": "Stripe reported a dispute of a payment (no credit changed)",
    "card.save": "an account's card was saved for later payments (brand and last 4 digits)",
    "card.remove": "an account's saved card was removed (by the portal, or detached in Stripe)",
    "auto_recharge.update": "an account's auto-recharge settings changed",
    "auto_recharge.disable": "auto-recharge was turned off by the service (failures in a row, or "
    "the saved card gone)",
}


@dataclass(frozen=True, slots=True)
class Auditor:
    """Who is making changes (a token's name, or ``cli``) and in which request."""

    actor: str
    request_id: str | None = None

    def record(
        self,
        session: Session,
        at: datetime,
        action: str,
        target_type: str,
        target_id: str,
        account_id: str | None,
        changes: Mapping[str, Any],
    ) -> None:
        assert action in ACTIONS, action
        session.execute(
            insert(AUDIT).values(
                id=new_id("aud"),
                at=at,
                actor=self.actor,
                action=action,
                target_type=target_type,
                target_id=target_id,
                account_id=account_id,
                request_id=self.request_id,
                changes=jsonenc.dumps(redacted(changes)).decode("ascii"),
            )
        )


CLI = Auditor(CLI_ACTOR)


def redacted(value: Any) -> Any:
    """``value`` with every secret-named field's value replaced by ``"[redacted]"``."""
    if isinstance(value, Mapping):
        return {
            name: REDACTED if name in SECRET_FIELDS else redacted(item)
            for name, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redacted(item) for item in value]
    return value


def event_body(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "audit_event",
        "at": format_timestamp(row.at),
        "actor": row.actor,
        "action": row.action,
        "target_type": row.target_type,
        "target_id": row.target_id,
        "account_id": row.account_id,
        "request_id": row.request_id,
        "changes": RawJSON(row.changes),  # written by jsonenc: valid JSON, exact numbers
    }


@dataclass(frozen=True, slots=True)
class AuditFilter:
    account_id: str | None = None
    actor: str | None = None
    action: str | None = None
    starting_at: datetime | None = None  # inclusive
    ending_at: datetime | None = None  # exclusive


def list_events(
    session: Session, where: AuditFilter, limit: int, after: str | None
) -> dict[str, Any]:
    """Events newest first (by the order of appending), filtered, paginated."""
    query = select(AUDIT).order_by(AUDIT.c.seq.desc()).limit(limit + 1)
    if where.account_id is not None:
        query = query.where(AUDIT.c.account_id == where.account_id)
    if where.actor is not None:
        query = query.where(AUDIT.c.actor == where.actor)
    if where.action is not None:
        query = query.where(AUDIT.c.action == where.action)
    if where.starting_at is not None:
        query = query.where(AUDIT.c.at >= where.starting_at)
    if where.ending_at is not None:
        query = query.where(AUDIT.c.at < where.ending_at)
    if after:
        query = query.where(AUDIT.c.seq < row_id_after(after))
    rows = session.execute(query).all()
    return page(rows, limit, event_body, lambda row: (row.seq,))
