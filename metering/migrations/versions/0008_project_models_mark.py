"""An account gains ``project_models``, set once a project of it is given a model list (never
cleared), as ``scope_limits`` is set once a project or a member is given a spend limit.

Together the two marks say when an account's projects and members cannot change what its keys
resolve to: with neither set, no project limits or lists models and no member limits spend, so
the check-and-hold confirms a remembered resolution without reading the key's project and member
(metering.ledger.resolution).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "accounts",
        sa.Column("project_models", sa.Boolean(), server_default="0", nullable=False),
    )
    op.execute(
        "UPDATE accounts SET project_models = true WHERE id IN (SELECT account_id FROM "
        "projects WHERE restricts_models)"
    )


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("project_models")
