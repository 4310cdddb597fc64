"""All ORM tables, imported in one place so Alembic sees the whole schema."""

from metering.models.accounts import Account, ApiKey
from metering.models.audit import AuditEvent
from metering.models.base import Base, table
from metering.models.catalog import AccountRate, CatalogModel, PriceVersion
from metering.models.exports import ExportDay, ExportRun
from metering.models.ledger import Authorization, LedgerEntry
from metering.models.notifications import WebhookDelivery, WebhookEndpoint, WebhookEvent
from metering.models.usage import QuarantinedEvent, UsageEvent, UsageRollup

__all__ = [
    "Account",
    "AccountRate",
    "ApiKey",
    "AuditEvent",
    "Authorization",
    "Base",
    "CatalogModel",
    "ExportDay",
    "ExportRun",
    "LedgerEntry",
    "PriceVersion",
    "QuarantinedEvent",
    "UsageEvent",
    "UsageRollup",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
    "table",
]
