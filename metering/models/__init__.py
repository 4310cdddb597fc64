"""All ORM tables, imported in one place so Alembic sees the whole schema."""

from metering.kit.ranges import add_integer_checks
from metering.models.accounts import (
    Account,
    AccountModel,
    ApiKey,
    ApiKeyModel,
    Member,
    Project,
    ProjectModel,
)
from metering.models.audit import AuditEvent
from metering.models.base import Base, add_domain_checks, table
from metering.models.catalog import AccountRate, CatalogModel, PriceVersion
from metering.models.exports import ExportDay, ExportRun
from metering.models.grants import CreditAllocationDay, CreditGrant, CreditRollforward
from metering.models.ledger import Authorization, LedgerEntry
from metering.models.notifications import (
    SpendLimitNotice,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from metering.models.payments import (
    AutoRecharge,
    Payment,
    PaymentProfile,
    PaymentRefund,
    StripeEvent,
)
from metering.models.portal import PortalMail, PortalSession, PortalSignInToken
from metering.models.usage import QuarantinedEvent, UsageEvent, UsageRollup

__all__ = [
    "Account",
    "AccountModel",
    "AccountRate",
    "ApiKey",
    "ApiKeyModel",
    "AuditEvent",
    "Authorization",
    "AutoRecharge",
    "Base",
    "CatalogModel",
    "CreditAllocationDay",
    "CreditGrant",
    "CreditRollforward",
    "ExportDay",
    "ExportRun",
    "LedgerEntry",
    "Member",
    "Payment",
    "PaymentProfile",
    "PaymentRefund",
    "PortalMail",
    "PortalSession",
    "PortalSignInToken",
    "PriceVersion",
    "Project",
    "ProjectModel",
    "QuarantinedEvent",
    "SpendLimitNotice",
    "StripeEvent",
    "UsageEvent",
    "UsageRollup",
    "WebhookDelivery",
    "WebhookEndpoint",
    "WebhookEvent",
    "table",
]

# Ranges (metering.kit.ranges): on SQLite every integer column refuses a non-integer value
# (the baseline migration makes the checks); PostgreSQL's column types refuse by themselves.
# A column of a domain (``one_of``, ``checked``): a domain on PostgreSQL, a table's check on
# SQLite.
for _table in Base.metadata.tables.values():
    add_integer_checks(_table)
    add_domain_checks(_table)
