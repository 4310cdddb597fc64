"""Authorizations in one round trip: a resolution that the check-and-hold confirms.

``metering_resolution`` is the resolving read of an authorization as one JSON array: the
client's live key and its account, the model, and the account's rates in force at a given
moment (the override, then the list price). An API process keeps the last resolution of each
key and model it saw (``metering.ledger.placement.postgres``) and, for the next authorization
with them, computes the estimate from it and sends it with the hold. ``metering_place_holds``
now recomputes the resolution of such a hold at its ``created_at``, after the account's lock,
and places the hold only if the text is unchanged; otherwise the outcome is 'stale' and the
process resolves afresh. So a revoked key, a new price or override in force, a retired or
changed model, a new spend limit or billing mode takes effect at once, whatever any process
remembers: the database decides, as before, and a remembered resolution only saves the
resolving round trip.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 05:00:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RATES = (
    "input_microcents_per_million, output_microcents_per_million, cache_read_microcents_per_million"
)
# NULL when no live key has this hash. PL/pgSQL, not SQL: its plan is kept per connection.
RESOLUTION = f"""
CREATE OR REPLACE FUNCTION metering_resolution(
    p_secret_hash text, p_model_key text, p_now timestamptz)
RETURNS json
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT json_build_array(
            k.id, k.account_id, k.monthly_spend_limit_microcents, a.billing,
            m.id, m.context_length, m.max_output_tokens, m.reasoning_headroom_tokens,
            m.deprecation_date,
            o.input_microcents_per_million, o.output_microcents_per_million,
            o.cache_read_microcents_per_million,
            p.input_microcents_per_million, p.output_microcents_per_million,
            p.cache_read_microcents_per_million)
        FROM api_keys AS k
        JOIN accounts AS a ON a.id = k.account_id
        LEFT JOIN catalog_models AS m ON m.id_key = p_model_key
        LEFT JOIN LATERAL (
            SELECT {_RATES} FROM account_rates AS r
            WHERE r.account_id = k.account_id AND r.model_id = m.id AND r.effective_at <= p_now
            ORDER BY r.effective_at DESC LIMIT 1
        ) AS o ON true
        LEFT JOIN LATERAL (
            SELECT {_RATES} FROM price_versions AS v
            WHERE v.model_id = m.id AND v.effective_at <= p_now
            ORDER BY v.effective_at DESC LIMIT 1
        ) AS p ON true
        WHERE k.secret_hash = p_secret_hash AND k.revoked_at IS NULL);
END;
$$
"""

# Migration 0005's function, with one more outcome: 'stale', for a hold sent with a
# resolution (``resolution``, from ``secret_hash`` and ``model_key``) that no longer holds at
# its ``created_at``; such a hold is neither placed nor refused.
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
            month_start timestamptz, month_end timestamptz, resolution text,
            secret_hash text, model_key text)
        ) WITH ORDINALITY AS t(
            id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens,
            requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, created_at,
            expires_at, spend_limit, month_start, month_end, resolution, secret_hash,
            model_key, position)
        ORDER BY position
    LOOP
        hold_id := h.id;
        available := v_balance - v_held;
        IF h.resolution IS NOT NULL AND metering_resolution(
            h.secret_hash, h.model_key, h.created_at)::text IS DISTINCT FROM h.resolution
        THEN
            outcome := 'stale';
        ELSIF h.request_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM authorizations
            WHERE account_id = p_account_id AND request_id = h.request_id
        ) THEN
            outcome := 'exists';
        ELSIF h.estimate_microcents > available THEN
            outcome := 'insufficient_credits';
        ELSE
            outcome := 'granted';
            IF h.spend_limit IS NOT NULL THEN
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


# Holds of several accounts in one transaction: ``metering_place_holds`` for each account in
# turn, in byte order of account id (the order settlement locks accounts in, so the two cannot
# deadlock), each account's holds in the order given. ``p_holds``: a JSON array of holds, each
# with its ``account_id``.
PLACE_HOLDS_OF_ACCOUNTS = """
CREATE OR REPLACE FUNCTION metering_place_holds_of_accounts(p_now timestamptz, p_holds json)
RETURNS TABLE (hold_id text, outcome text, available bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    a record;
BEGIN
    FOR a IN
        SELECT h.account_id, json_agg(h.hold ORDER BY h.position) AS holds
        FROM (
            SELECT t.hold ->> 'account_id' AS account_id, t.hold, t.position
            FROM json_array_elements(p_holds) WITH ORDINALITY AS t(hold, position)
        ) AS h
        GROUP BY h.account_id
        ORDER BY h.account_id COLLATE "C"
    LOOP
        RETURN QUERY SELECT * FROM metering_place_holds(a.account_id, p_now, a.holds);
    END LOOP;
END;
$$
"""


def _revision_0005_place_holds() -> str:
    """The function as migration 0005 made it (a migration stays as it was written)."""
    path = Path(__file__).with_name("0005_hold_counters.py")
    spec = importlib.util.spec_from_file_location("metering_migration_0005", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.PLACE_HOLDS)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(RESOLUTION)
        op.execute(PLACE_HOLDS)
        op.execute(PLACE_HOLDS_OF_ACCOUNTS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION metering_place_holds_of_accounts(timestamptz, json)")
        op.execute(_revision_0005_place_holds())
        op.execute("DROP FUNCTION metering_resolution(text, text, timestamptz)")
