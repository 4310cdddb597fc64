"""On PostgreSQL, the holds' index by status and expiry keeps only the open holds (active or
expired: what the tidy-up and the expired holds' gauge read). A void or a settlement then no
longer writes an entry into it, nor does the next check-and-hold that stops counting the
released hold. SQLite keeps its index of every hold (it cannot use a partial index for a query
of one status of the two).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_authorizations_status_expires_at"
COLUMNS = ["status", "expires_at"]
# metering.states.holds.OPEN_ROWS as it is at this revision.
OPEN_ROWS = sa.text("status IN ('active', 'expired')")


def _index(where: sa.TextClause | None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="authorizations")
    op.create_index(INDEX, "authorizations", COLUMNS, postgresql_where=where)


def upgrade() -> None:
    _index(OPEN_ROWS)


def downgrade() -> None:
    _index(None)
