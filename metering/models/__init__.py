"""All ORM tables, imported in one place so Alembic sees the whole schema."""

from metering.models.accounts import Account, AccountModel, ApiKey, ApiKeyModel
from metering.models.audit import AuditEvent
from metering.models.base import Base, table
from metering.models.catalog import AccountRate, CatalogModel, PriceVersion
from metering.models.exports import ExportDay, ExportRun
from metering.models.ledger import Authorization, LedgerEntry
from metering.models.usage import QuarantinedEvent, UsageEvent, UsageRollup

__all__ = [
    "Account",
    "AccountModel",
    "AccountRate",
    "ApiKey",
    "ApiKeyModel",
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
    "table",
]
