"""Refunds: a payment's refunds (``payment_refunds``), the ledger entry kind ``refund`` (negative,
naming its grant) and the allocation kind ``refund`` (the part of a refund its grant no longer
held, taken as a deficit).

PostgreSQL keeps the three checks in the compact forms migrations 0001 and 0006 gave them (one
``text[]`` constant each; the same rows allowed). SQLite remakes the two tables to change them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 04:15:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from alembic.operations import ops

from metering.models.ledger import amount_sign_check, kind_check

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# The ledger's kinds with their amounts' signs, and the allocation days' kinds, before refunds.
ENTRY_SIGNS = {
    "grant": (1,),
    "adjustment": (1, -1),
    "charge": (0, -1),
    "expiry": (-1,),
    "void": (-1,),
}
ALLOCATION_KINDS = ("spend", "deficit", "payoff")


def _checks(refund: bool) -> dict[str, tuple[str, str]]:
    """The three checks with ``refund`` (or without it: as before), by name: (table, condition)
    as this backend keeps them (SQLite: the models' forms)."""
    signs = {**ENTRY_SIGNS, "refund": (-1,)} if refund else ENTRY_SIGNS
    allocations = (*ALLOCATION_KINDS, "refund") if refund else ALLOCATION_KINDS
    compact = op.get_bind().dialect.name != "sqlite"
    return {
        "ck_ledger_entries_kind": ("ledger_entries", kind_check(signs, compact)),
        "ck_ledger_entries_amount_sign": ("ledger_entries", amount_sign_check(signs, compact)),
        "ck_credit_allocation_days_kind": (
            "credit_allocation_days",
            kind_check(allocations, compact),
        ),
    }


def _replace_checks(refund: bool) -> None:
    checks = _checks(refund)
    for table in ("ledger_entries", "credit_allocation_days"):
        mine = {name: condition for name, (of, condition) in checks.items() if of == table}
        if op.get_bind().dialect.name == "sqlite":
            with op.batch_alter_table(table, recreate="always") as batch:
                for name, condition in mine.items():
                    batch.drop_constraint(op.f(name), type_="check")
                    batch.create_check_constraint(op.f(name), condition)
            continue
        for name, condition in mine.items():
            op.drop_constraint(op.f(name), table, type_="check")
            op.create_check_constraint(op.f(name), table, condition)


def _create_table(name: str, *elements: Any) -> None:
    """``op.create_table``, with SQLite's integer checks (as the baseline makes them)."""
    table = sa.Table(name, sa.MetaData(), *elements)
    if op.get_bind().dialect.name == "sqlite":
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


def upgrade() -> None:
    _replace_checks(refund=True)
    _create_table(
        "payment_refunds",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.String(length=32), nullable=False),
        sa.Column("payment_id", sa.String(length=32), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("stripe_refund_id", sa.String(length=255), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("entry_id", sa.BigInteger(), nullable=True),
        sa.Column("deficit_microcents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("succeeded_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')", name=op.f("ck_payment_refunds_status")
        ),
        sa.CheckConstraint(
            "source IN ('operator', 'stripe')", name=op.f("ck_payment_refunds_source")
        ),
        sa.CheckConstraint("amount_cents > 0", name=op.f("ck_payment_refunds_amount_positive")),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_payment_refunds_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payment_refunds")),
    )
    op.create_index(
        "ix_payment_refunds_account_id_payment_id",
        "payment_refunds",
        ["account_id", "payment_id"],
    )
    op.create_index(
        "uq_payment_refunds_account_id_idempotency_key",
        "payment_refunds",
        ["account_id", "idempotency_key"],
        unique=True,
        sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "uq_payment_refunds_account_id_stripe_refund_id",
        "payment_refunds",
        ["account_id", "stripe_refund_id"],
        unique=True,
        sqlite_where=sa.text("stripe_refund_id IS NOT NULL"),
        postgresql_where=sa.text("stripe_refund_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_payment_refunds_account_id_stripe_refund_id", table_name="payment_refunds")
    op.drop_index("uq_payment_refunds_account_id_idempotency_key", table_name="payment_refunds")
    op.drop_index("ix_payment_refunds_account_id_payment_id", table_name="payment_refunds")
    op.drop_table("payment_refunds")
    # What the refunds wrote goes with them: the books as they were before refunds existed.
    op.execute("DELETE FROM credit_allocation_days WHERE kind = 'refund'")
    op.execute("DELETE FROM ledger_entries WHERE kind = 'refund'")
    _replace_checks(refund=False)
