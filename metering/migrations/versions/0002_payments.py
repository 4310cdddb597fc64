"""Payments: the payments customers make through Stripe, each account's Stripe customer and saved
card, its auto-recharge settings (and, on the account, the recharge's threshold and due mark),
and the Stripe events already processed (metering.payments).

Every table is account data (a NOT NULL ``account_id``): a Citus coordinator shards them by
account (metering.citus). On SQLite every integer column outside the primary key refuses a
non-integer, as the baseline's do.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-05 00:30:00
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from alembic.operations import ops

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


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


def _when(condition: str) -> dict[str, Any]:
    return {"sqlite_where": sa.text(condition), "postgresql_where": sa.text(condition)}


def _account() -> sa.Column[Any]:
    return sa.Column("account_id", sa.String(length=32), nullable=False)


def _account_key(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["account_id"], ["accounts.id"], name=op.f(f"fk_{table}_account_id_accounts")
    )


def upgrade() -> None:
    _create_table(
        "payments",
        sa.Column("id", sa.String(length=32), nullable=False),
        _account(),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("refunded_cents", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("grant_id", sa.String(length=32), nullable=True),
        sa.Column("failure_code", sa.String(length=64), nullable=True),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column("receipt_url", sa.Text(), nullable=True),
        sa.Column("stripe_payment_intent_id", sa.String(length=255), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("succeeded_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')", name=op.f("ck_payments_status")
        ),
        sa.CheckConstraint("kind IN ('top_up', 'auto_recharge')", name=op.f("ck_payments_kind")),
        sa.CheckConstraint("amount_cents > 0", name=op.f("ck_payments_amount_positive")),
        sa.CheckConstraint(
            "refunded_cents >= 0 AND refunded_cents <= amount_cents",
            name=op.f("ck_payments_refunded_within"),
        ),
        _account_key("payments"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_payments")),
    )
    op.create_index("ix_payments_account_id_created_at", "payments", ["account_id", "created_at"])
    op.create_index(
        "uq_payments_account_id_idempotency_key",
        "payments",
        ["account_id", "idempotency_key"],
        unique=True,
        **_when("idempotency_key IS NOT NULL"),
    )
    op.create_index(
        "ix_payments_pending", "payments", ["created_at"], **_when("status = 'pending'")
    )
    op.create_index(
        "ix_payments_stripe_payment_intent_id", "payments", ["stripe_payment_intent_id"]
    )
    op.create_index(
        "uq_payments_recharge_in_flight",
        "payments",
        ["account_id"],
        unique=True,
        **_when("kind = 'auto_recharge' AND status = 'pending'"),
    )
    _create_table(
        "payment_profiles",
        _account(),
        sa.Column("stripe_customer_id", sa.String(length=255), nullable=True),
        sa.Column("card_payment_method_id", sa.String(length=255), nullable=True),
        sa.Column("card_brand", sa.String(length=32), nullable=True),
        sa.Column("card_last4", sa.String(length=4), nullable=True),
        sa.Column("card_exp_month", sa.Integer(), nullable=True),
        sa.Column("card_exp_year", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        _account_key("payment_profiles"),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_payment_profiles")),
    )
    _create_table(
        "stripe_events",
        sa.Column("id", sa.String(length=255), nullable=False),
        _account(),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=False),
        _account_key("stripe_events"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripe_events")),
    )
    _create_table(
        "auto_recharges",
        _account(),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("threshold_cents", sa.BigInteger(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("monthly_limit_cents", sa.BigInteger(), nullable=False),
        sa.Column("limit_noticed_month", sa.String(length=7), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "threshold_cents >= 0", name=op.f("ck_auto_recharges_threshold_nonnegative")
        ),
        sa.CheckConstraint("amount_cents > 0", name=op.f("ck_auto_recharges_amount_positive")),
        sa.CheckConstraint(
            "monthly_limit_cents >= amount_cents", name=op.f("ck_auto_recharges_limit_within")
        ),
        _account_key("auto_recharges"),
        sa.PrimaryKeyConstraint("account_id", name=op.f("pk_auto_recharges")),
    )
    # Auto-recharge's threshold and due mark, beside the balance the debits move.
    for name, kind in (
        ("recharge_threshold_microcents", "BIGINT"),
        ("recharge_due_at", None),
    ):
        if kind is not None and op.get_bind().dialect.name == "sqlite":
            op.execute(
                f"ALTER TABLE accounts ADD COLUMN {name} {kind} "
                f"CONSTRAINT ck_accounts_{name}_integer CHECK (typeof({name}) IN ('integer', 'null'))"
            )
        elif kind is not None:
            op.add_column("accounts", sa.Column(name, sa.BigInteger(), nullable=True))
        else:
            op.add_column("accounts", sa.Column(name, sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_accounts_recharge_due_at",
        "accounts",
        ["recharge_due_at"],
        **_when("recharge_due_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_accounts_recharge_due_at", table_name="accounts")
    with op.batch_alter_table("accounts") as batch:
        if op.get_bind().dialect.name == "sqlite":
            batch.drop_constraint(
                op.f("ck_accounts_recharge_threshold_microcents_integer"), type_="check"
            )
        batch.drop_column("recharge_due_at")
        batch.drop_column("recharge_threshold_microcents")
    op.drop_table("auto_recharges")
    op.drop_index("uq_payments_recharge_in_flight", table_name="payments")
    op.drop_table("stripe_events")
    op.drop_table("payment_profiles")
    op.drop_index("ix_payments_stripe_payment_intent_id", table_name="payments")
    op.drop_index("ix_payments_pending", table_name="payments")
    op.drop_index("uq_payments_account_id_idempotency_key", table_name="payments")
    op.drop_index("ix_payments_account_id_created_at", table_name="payments")
    op.drop_table("payments")
