"""All ORM tables, imported in one place so Alembic sees the whole schema."""

from metering.models.accounts import Account, ApiKey
from metering.models.base import Base
from metering.models.catalog import AccountRate, CatalogModel, PriceVersion

__all__ = ["Account", "AccountRate", "ApiKey", "Base", "CatalogModel", "PriceVersion"]
