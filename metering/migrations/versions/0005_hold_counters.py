"""Hold counters: each account's held total maintained beside its balance, and the check-and-hold
as one server-side function on PostgreSQL.

``accounts.held_microcents`` is the sum of the estimates of the account's holds with
``authorizations.counted`` set. The function ``metering_place_holds`` (PostgreSQL only; SQLite
runs the same steps in Python under BEGIN IMMEDIATE, see ``metering.ledger.placement``) locks
the account row, stops counting the holds released or expired since, then checks credit and
the key's monthly limit and places each hold it is given, in order: one round trip, with the
row lock held only while it runs and commits.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RELEASED = "counted AND status <> 'active'"

# READ COMMITTED: every statement of a VOLATILE function takes a fresh snapshot, so each one
# after the lock sees everything committed before the lock was granted (holds placed, released
# or settled, charges rolled up). ``p_holds`` is a JSON array of holds to place, in order, each
# decided as if alone after those before it; the outcome of each, by its id: 'granted',
# 'insufficient_credits', 'member_spend_limit', or 'exists' (the account already has a hold
# with this request id). ``available`` is the account's balance minus its holds in force,
# before that hold.
PLACE_HOLDS = """
CREATE OR REPLACE FUNCTION metering_place_holds(
    p_account_id text, p_now timestamptz, p_holds json)
RETURNS TABLE (hold_id text, outcome text, available bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_balance bigint;
    v_held bigint;
    v_released bigint;
    v_expired bigint;
    v_key_committed bigint;
    v_changed boolean;
    h record;
BEGIN
    SELECT balance_microcents, held_microcents INTO v_balance, v_held
    FROM accounts WHERE id = p_account_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no account %', p_account_id;
    END IF;

    -- Holds released since the account's last check (voided, settled, tidied up) and holds
    -- past their expires_at (lazy expiry: no sweeper needed, they become 'expired') stop
    -- counting. A hold locked by another transaction is skipped, never waited for: settlement
    -- locks holds before accounts, so waiting here could deadlock. Such a hold is being
    -- settled or tidied up right now; it counts until this account's next check.
    WITH released AS (
        UPDATE authorizations SET counted = false
        WHERE id IN (
            SELECT id FROM authorizations
            WHERE account_id = p_account_id AND counted AND status <> 'active'
            FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING estimate_microcents
    )
    SELECT coalesce(sum(estimate_microcents), 0) INTO v_released FROM released;
    WITH expired AS (
        UPDATE authorizations SET counted = false, status = 'expired'
        WHERE id IN (
            SELECT id FROM authorizations
            WHERE account_id = p_account_id AND status = 'active' AND expires_at <= p_now
              AND counted
            FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING estimate_microcents
    )
    SELECT coalesce(sum(estimate_microcents), 0) INTO v_expired FROM expired;
    v_held := v_held - v_released - v_expired;
    v_changed := v_released <> 0 OR v_expired <> 0;

    FOR h IN
        SELECT * FROM ROWS FROM (json_to_recordset(p_holds) AS (
            id text, api_key_id text, request_id text, request_fingerprint text,
            model_id text, api text, prompt_tokens integer, requested_max_tokens integer,
            n integer, reasoning boolean, max_tokens integer, estimate_microcents bigint,
            created_at timestamptz, expires_at timestamptz, spend_limit bigint,
            month_start timestamptz, month_end timestamptz)
        ) WITH ORDINALITY AS t(
            id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens,
            requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, created_at,
            expires_at, spend_limit, month_start, month_end, position)
        ORDER BY position
    LOOP
        hold_id := h.id;
        available := v_balance - v_held;
        IF h.request_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM authorizations
            WHERE account_id = p_account_id AND request_id = h.request_id
        ) THEN
            outcome := 'exists';
        ELSIF h.estimate_microcents > available THEN
            outcome := 'insufficient_credits';
        ELSE
            outcome := 'granted';
            IF h.spend_limit IS NOT NULL THEN
                -- The key's charges this month (the daily per-key rollups, written in the
                -- ingest transaction) plus its holds in force.
                SELECT coalesce(sum(cost_microcents), 0) INTO v_key_committed
                FROM usage_rollups
                WHERE account_id = p_account_id AND bucket_width = '1d' AND grouping = 'key'
                  AND bucket_start >= h.month_start AND bucket_start < h.month_end
                  AND api_key_id = h.api_key_id;
                v_key_committed := v_key_committed + (
                    SELECT coalesce(sum(estimate_microcents), 0) FROM authorizations
                    WHERE api_key_id = h.api_key_id AND status = 'active'
                      AND expires_at > h.created_at
                );
                IF v_key_committed + h.estimate_microcents > h.spend_limit THEN
                    outcome := 'member_spend_limit';
                END IF;
            END IF;
        END IF;
        IF outcome = 'granted' THEN
            INSERT INTO authorizations (
                id, account_id, api_key_id, request_id, request_fingerprint, model_id, api,
                prompt_tokens, requested_max_tokens, n, reasoning, max_tokens,
                estimate_microcents, status, created_at, expires_at, counted)
            VALUES (
                h.id, p_account_id, h.api_key_id, h.request_id, h.request_fingerprint,
                h.model_id, h.api, h.prompt_tokens, h.requested_max_tokens, h.n, h.reasoning,
                h.max_tokens, h.estimate_microcents, 'active', h.created_at, h.expires_at,
                true);
            v_held := v_held + h.estimate_microcents;
            v_changed := true;
        END IF;
        RETURN NEXT;
    END LOOP;

    IF v_changed THEN
        UPDATE accounts SET held_microcents = v_held WHERE id = p_account_id;
    END IF;
END;
$$
"""


def upgrade() -> None:
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("held_microcents", sa.BigInteger(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("authorizations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("counted", sa.Boolean(), server_default="0", nullable=False))
    # Holds already placed: the active ones of prepaid accounts count from now on.
    op.execute(
        "UPDATE authorizations SET counted = (status = 'active' AND account_id IN "
        "(SELECT id FROM accounts WHERE billing = 'prepaid'))"
    )
    op.execute(
        "UPDATE accounts SET held_microcents = COALESCE((SELECT SUM(estimate_microcents) "
        "FROM authorizations WHERE authorizations.account_id = accounts.id AND counted), 0)"
    )
    with op.batch_alter_table("authorizations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_authorizations_released",
            ["account_id"],
            unique=False,
            sqlite_where=sa.text(_RELEASED),
            postgresql_where=sa.text(_RELEASED),
        )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PLACE_HOLDS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION metering_place_holds(text, timestamptz, json)")
    with op.batch_alter_table("authorizations", schema=None) as batch_op:
        batch_op.drop_index(
            "ix_authorizations_released",
            sqlite_where=sa.text(_RELEASED),
            postgresql_where=sa.text(_RELEASED),
        )
        batch_op.drop_column("counted")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("held_microcents")
