"""Projects and members: every key in a project (the account's ``Default`` one for the keys
there were), and owned by a member or by no one (a service key).

Every account gets a project named ``Default`` whose id is the account's after ``proj_`` in place
of ``acct_`` (as a hold's id carries its account's: metering.accounts.projects), so the keys are
moved into it by one statement of their own table, without a join: on Citus ``api_keys`` is a
reference table and the projects are account data. Nothing that was spent, held or charged
changes: the keys keep their ids, and their limits and rollups are untouched.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 00:00:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from alembic.operations import ops

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _dialect() -> str:
    return op.get_bind().dialect.name


def _create_table(name: str, *elements: Any) -> None:
    """``op.create_table`` with SQLite's integer checks, as the baseline makes them."""
    table = sa.Table(name, sa.MetaData(), *elements)
    if _dialect() == "sqlite":
        for column in table.columns:
            if isinstance(column.type, sa.Integer) and not column.primary_key:
                condition = (
                    f"typeof({column.name}) IN ('integer', 'null')"
                    if column.nullable
                    else f"typeof({column.name}) = 'integer'"
                )
                table.append_constraint(
                    sa.CheckConstraint(condition, name=op.f(f"ck_{name}_{column.name}_integer"))
                )
    op.invoke(ops.CreateTableOp.from_table(table))


WINDOW = "spend_limit_window IN ('day', 'week', 'month')"


def _foreign_keys(lead: tuple[str, ...]) -> list[tuple[str, list[str], str, list[str]]]:
    """Each foreign key of the new tables: table, columns, referred table and columns."""
    return [
        ("projects", ["account_id"], "accounts", ["id"]),
        ("project_models", ["account_id"], "accounts", ["id"]),
        ("project_models", [*lead, "project_id"], "projects", [*lead, "id"]),
        ("project_models", ["model_id"], "catalog_models", ["id"]),
        ("members", ["account_id"], "accounts", ["id"]),
    ]


def _fk_name(table: str, columns: list[str], referred: str) -> str:
    return f"fk_{table}_{columns[-1]}_{referred}"


def _inline_foreign_keys(table: str, lead: tuple[str, ...], cluster: bool) -> list[Any]:
    """The table's foreign keys as it is made (on a cluster they come after its placement)."""
    if cluster:
        return []
    return [
        sa.ForeignKeyConstraint(
            columns,
            [f"{referred}.{c}" for c in referred_columns],
            name=_fk_name(table, columns, referred),
        )
        for name, columns, referred, referred_columns in _foreign_keys(lead)
        if name == table
    ]


def _distributed() -> bool:
    """The schema is on a Citus cluster already (an upgrade there): the new account tables are
    placed here, beside their account, before their foreign keys are made."""
    if _dialect() != "postgresql":
        return False
    bind = op.get_bind()
    if bind.execute(sa.text("SELECT to_regclass('pg_dist_partition') IS NULL")).scalar():
        return False
    return bool(
        bind.execute(
            sa.text(
                "SELECT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'accounts'::regclass)"
            )
        ).scalar()
    )


def upgrade() -> None:
    cluster = _distributed()
    # On a cluster, every key and unique index of an account table leads with the account (as
    # metering.citus widens them on a fresh schema), and the foreign keys wait for placement.
    lead: tuple[str, ...] = ("account_id",) if cluster else ()
    _create_table(
        "projects",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("spend_limit_microcents", sa.BigInteger(), nullable=True),
        sa.Column(
            "spend_limit_window", sa.String(length=8), server_default="month", nullable=False
        ),
        sa.Column("restricts_models", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(WINDOW, name=op.f("ck_projects_spend_limit_window")),
        sa.PrimaryKeyConstraint(*lead, "id", name="pk_projects"),
        *_inline_foreign_keys("projects", lead, cluster),
    )
    op.create_index("ix_projects_account_id", "projects", ["account_id"])
    _create_table(
        "project_models",
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("model_id", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint(*lead, "project_id", "model_id", name="pk_project_models"),
        *_inline_foreign_keys("project_models", lead, cluster),
    )
    _create_table(
        "members",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("email_key", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("spend_limit_microcents", sa.BigInteger(), nullable=True),
        sa.Column(
            "spend_limit_window", sa.String(length=8), server_default="month", nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('viewer', 'developer', 'admin')", name=op.f("ck_members_role")
        ),
        sa.CheckConstraint(WINDOW, name=op.f("ck_members_spend_limit_window")),
        sa.PrimaryKeyConstraint(*lead, "id", name="pk_members"),
        *_inline_foreign_keys("members", lead, cluster),
    )
    op.create_index("ix_members_account_id", "members", ["account_id"])
    op.create_index(
        "uq_members_account_id_email_key",
        "members",
        ["account_id", "email_key"],
        unique=True,
        sqlite_where=sa.text("removed_at IS NULL"),
        postgresql_where=sa.text("removed_at IS NULL"),
    )
    if cluster:
        for name in ("projects", "project_models", "members"):
            op.execute(
                sa.text(
                    "SELECT create_distributed_table(:t, 'account_id', colocate_with => 'accounts')"
                ).bindparams(t=name)
            )
    if cluster:
        for table, columns, referred, referred_columns in _foreign_keys(lead):
            op.create_foreign_key(
                _fk_name(table, columns, referred), table, referred, columns, referred_columns
            )
    op.add_column("api_keys", sa.Column("project_id", sa.String(length=32), nullable=True))
    op.add_column("api_keys", sa.Column("member_id", sa.String(length=32), nullable=True))
    op.create_index("ix_api_keys_project_id", "api_keys", ["project_id"])
    op.create_index("ix_api_keys_member_id", "api_keys", ["member_id"])
    # A sign-in link may sign in as a member of the account.
    op.add_column(
        "portal_sign_in_tokens", sa.Column("member_id", sa.String(length=32), nullable=True)
    )
    # Every account's Default project, made when the account was; every key into it.
    op.execute(
        "INSERT INTO projects (id, account_id, name, spend_limit_window, restricts_models, "
        "created_at) SELECT 'proj_' || substr(id, 6), id, 'Default', 'month', false, created_at "
        "FROM accounts"
    )
    op.execute("UPDATE api_keys SET project_id = 'proj_' || substr(account_id, 6)")


def downgrade() -> None:
    op.drop_column("portal_sign_in_tokens", "member_id")
    op.drop_index("ix_api_keys_member_id", table_name="api_keys")
    op.drop_index("ix_api_keys_project_id", table_name="api_keys")
    op.drop_column("api_keys", "member_id")
    op.drop_column("api_keys", "project_id")
    op.drop_table("members")
    op.drop_table("project_models")
    op.drop_table("projects")
