"""Notifications (§11): webhook endpoints, the outbox of events and their deliveries; the
accounts' low-balance threshold; the settlement functions write the balance crossings
(``credit.balance_low``, ``credit.balance_depleted``) in the transaction that crosses.

The two functions below are generated (``python -m metering.functions``) and frozen as they were
on this revision; ``tests/test_functions.py`` holds them equal to the definitions.

Revision ID: 0016
Revises: 0012
Create Date: 2026-12-01 12:45:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SETTLE_USAGE = """
CREATE OR REPLACE FUNCTION metering_settle_usage(p_now TIMESTAMP WITH TIME ZONE, p_charges json, p_rollups json)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_targets_hold_id VARCHAR(32)[];
    v_targets_event_id BIGINT[];
    v_debits_account_id VARCHAR(32)[];
    v_debits_total BIGINT[];
    v_moved_account_id VARCHAR(32)[];
    v_moved_after_microcents BIGINT[];
BEGIN
    SELECT array_agg(collected.hold_id ORDER BY collected.hold_id COLLATE "C"), array_agg(collected.event_id ORDER BY collected.hold_id COLLATE "C") INTO v_targets_hold_id, v_targets_event_id
    FROM (
    SELECT found.hold_id, min(found.event_id) AS event_id
    FROM (SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_charges AS json)) AS (account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), usage_event_id BIGINT, charge_microcents BIGINT, authorization_id VARCHAR(32), prepaid BOOLEAN)) WITH ORDINALITY AS t(account_id, api_key_id, request_id, usage_event_id, charge_microcents, authorization_id, prepaid, position)) AS c JOIN authorizations ON authorizations.id = c.authorization_id AND authorizations.account_id = c.account_id
    WHERE authorizations.status IN ('active', 'expired') UNION ALL SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_charges AS json)) AS (account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), usage_event_id BIGINT, charge_microcents BIGINT, authorization_id VARCHAR(32), prepaid BOOLEAN)) WITH ORDINALITY AS t(account_id, api_key_id, request_id, usage_event_id, charge_microcents, authorization_id, prepaid, position)) AS c JOIN authorizations ON authorizations.account_id = c.account_id AND authorizations.request_id = c.request_id
    WHERE c.authorization_id IS NULL AND authorizations.status IN ('active', 'expired')) AS found GROUP BY found.hold_id
    ) AS collected;
    IF coalesce(cardinality(v_targets_hold_id), 0) > 1 THEN
        PERFORM authorizations.id
        FROM authorizations
        WHERE authorizations.id IN (SELECT t.hold_id
        FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id)) AND authorizations.status IN ('active', 'expired') ORDER BY authorizations.id COLLATE "C" FOR NO KEY UPDATE;
    END IF;
    IF coalesce(cardinality(v_targets_hold_id), 0) > 0 THEN
        UPDATE authorizations SET status='settled', closed_at=p_now, usage_event_id=t.event_id FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id) WHERE authorizations.id = t.hold_id AND authorizations.status IN ('active', 'expired');
    END IF;
    INSERT INTO ledger_entries (account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at) SELECT c.account_id, 'charge' AS anon_1, -c.charge_microcents, c.usage_event_id, c.api_key_id, p_now AS anon_2
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_charges AS json)) AS (account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), usage_event_id BIGINT, charge_microcents BIGINT, authorization_id VARCHAR(32), prepaid BOOLEAN)) WITH ORDINALITY AS t(account_id, api_key_id, request_id, usage_event_id, charge_microcents, authorization_id, prepaid, position)) AS c
    WHERE c.prepaid ORDER BY c.usage_event_id;
    SELECT array_agg(collected.account_id ORDER BY collected.account_id COLLATE "C"), array_agg(collected.total ORDER BY collected.account_id COLLATE "C") INTO v_debits_account_id, v_debits_total
    FROM (
    SELECT c.account_id, CAST(sum(c.charge_microcents) AS BIGINT) AS total
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_charges AS json)) AS (account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), usage_event_id BIGINT, charge_microcents BIGINT, authorization_id VARCHAR(32), prepaid BOOLEAN)) WITH ORDINALITY AS t(account_id, api_key_id, request_id, usage_event_id, charge_microcents, authorization_id, prepaid, position)) AS c
    WHERE c.prepaid GROUP BY c.account_id
    ) AS collected;
    IF coalesce(cardinality(v_debits_account_id), 0) > 1 THEN
        PERFORM accounts.id
        FROM accounts
        WHERE accounts.id IN (SELECT d.account_id
        FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total)) ORDER BY accounts.id COLLATE "C" FOR NO KEY UPDATE;
    END IF;
    IF coalesce(cardinality(v_debits_account_id), 0) > 0 THEN
        WITH collected AS (
        UPDATE accounts SET balance_microcents=(accounts.balance_microcents - d.total) FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) WHERE accounts.id = d.account_id RETURNING accounts.id AS account_id, accounts.balance_microcents AS after_microcents
        )
        SELECT array_agg(collected.account_id), array_agg(collected.after_microcents) INTO v_moved_account_id, v_moved_after_microcents FROM collected;
        INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT crossed.event_id_1, crossed.account_id, crossed.anon_1, crossed.json_object_text_1, crossed.anon_2
        FROM (SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, m.account_id AS account_id, 'credit.balance_low' AS anon_1, CAST(json_build_object('balance_microcents', m.after_microcents, 'threshold_microcents', accounts.low_balance_threshold_microcents) AS TEXT) AS json_object_text_1, p_now AS anon_2
        FROM (SELECT mv.account_id AS account_id, mv.after_microcents + d.total AS before_microcents, mv.after_microcents AS after_microcents
        FROM unnest(v_moved_account_id, v_moved_after_microcents) AS mv(account_id, after_microcents) JOIN unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) ON d.account_id = mv.account_id) AS m JOIN accounts ON accounts.id = m.account_id
        WHERE accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.low_balance_threshold_microcents <= m.before_microcents AND accounts.low_balance_threshold_microcents > m.after_microcents UNION ALL SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_2, m.account_id AS account_id, 'credit.balance_depleted' AS anon_3, CAST(json_build_object('balance_microcents', m.after_microcents) AS TEXT) AS json_object_text_2, p_now AS anon_2
        FROM (SELECT mv.account_id AS account_id, mv.after_microcents + d.total AS before_microcents, mv.after_microcents AS after_microcents
        FROM unnest(v_moved_account_id, v_moved_after_microcents) AS mv(account_id, after_microcents) JOIN unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) ON d.account_id = mv.account_id) AS m
        WHERE m.before_microcents > 0 AND m.after_microcents <= 0) AS crossed;
    END IF;
    INSERT INTO usage_rollups (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id) SELECT r.account_id, r.bucket_width, r.grouping, r.bucket_start, r.api_key_id, r.model_id, r.requests, r.input_tokens, r.cache_read_tokens, r.output_tokens, r.reasoning_tokens, r.cost_microcents, r.last_event_id
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_rollups AS json)) AS (account_id VARCHAR(32), bucket_width VARCHAR(2), grouping VARCHAR(10), bucket_start TIMESTAMP WITH TIME ZONE, api_key_id VARCHAR(32), model_id VARCHAR(100), requests BIGINT, input_tokens BIGINT, cache_read_tokens BIGINT, output_tokens BIGINT, reasoning_tokens BIGINT, cost_microcents BIGINT, last_event_id BIGINT)) WITH ORDINALITY AS t(account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id, position)) AS r
    WHERE true ON CONFLICT (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id) DO UPDATE SET requests = (usage_rollups.requests + excluded.requests), input_tokens = (usage_rollups.input_tokens + excluded.input_tokens), cache_read_tokens = (usage_rollups.cache_read_tokens + excluded.cache_read_tokens), output_tokens = (usage_rollups.output_tokens + excluded.output_tokens), reasoning_tokens = (usage_rollups.reasoning_tokens + excluded.reasoning_tokens), cost_microcents = (usage_rollups.cost_microcents + excluded.cost_microcents), last_event_id = greatest(usage_rollups.last_event_id, excluded.last_event_id);
END;
$$
"""

RECORD_USAGE = """
CREATE OR REPLACE FUNCTION metering_record_usage(p_now TIMESTAMP WITH TIME ZONE, p_events json, p_prepaid BOOLEAN, p_rollups json)
RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_new_id BIGINT[];
    v_new_account_id VARCHAR(32)[];
    v_new_request_id VARCHAR(64)[];
    v_new_api_key_id VARCHAR(32)[];
    v_new_authorization_id VARCHAR(32)[];
    v_new_total_microcents BIGINT[];
    v_targets_hold_id VARCHAR(32)[];
    v_targets_event_id BIGINT[];
    v_debits_account_id VARCHAR(32)[];
    v_debits_total BIGINT[];
    v_moved_account_id VARCHAR(32)[];
    v_moved_after_microcents BIGINT[];
BEGIN
    WITH collected AS (
    INSERT INTO usage_events (account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id, recorded_at) SELECT e.account_id, e.request_id, e.api_key_id, e.model_id, e.api, e.outcome, e.occurred_at, e.authorization_id, e.prompt_tokens, e.cached_tokens, e.output_tokens, e.reasoning_tokens, e.input_microcents, e.cache_read_microcents, e.output_microcents, e.total_microcents, e.price_version_id, p_now AS anon_1
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_events AS json)) AS (account_id VARCHAR(32), request_id VARCHAR(64), api_key_id VARCHAR(32), model_id VARCHAR(100), api VARCHAR(20), outcome VARCHAR(10), occurred_at TIMESTAMP WITH TIME ZONE, authorization_id VARCHAR(32), prompt_tokens INTEGER, cached_tokens INTEGER, output_tokens INTEGER, reasoning_tokens INTEGER, input_microcents BIGINT, cache_read_microcents BIGINT, output_microcents BIGINT, total_microcents BIGINT, price_version_id VARCHAR(32))) WITH ORDINALITY AS t(account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id, position)) AS e
    WHERE true ORDER BY e.position ON CONFLICT (account_id, request_id) DO NOTHING RETURNING usage_events.id, usage_events.account_id, usage_events.request_id, usage_events.api_key_id, usage_events.authorization_id, usage_events.total_microcents
    )
    SELECT array_agg(collected.id), array_agg(collected.account_id), array_agg(collected.request_id), array_agg(collected.api_key_id), array_agg(collected.authorization_id), array_agg(collected.total_microcents) INTO v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents FROM collected;
    IF coalesce(cardinality(v_new_id), 0) > 0 THEN
        SELECT array_agg(collected.hold_id ORDER BY collected.hold_id COLLATE "C"), array_agg(collected.event_id ORDER BY collected.hold_id COLLATE "C") INTO v_targets_hold_id, v_targets_event_id
        FROM (
        SELECT found.hold_id, min(found.event_id) AS event_id
        FROM (SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
        FROM (SELECT n.account_id AS account_id, n.api_key_id AS api_key_id, n.request_id AS request_id, n.id AS usage_event_id, n.total_microcents AS charge_microcents, n.authorization_id AS authorization_id, p_prepaid AS prepaid
        FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents)) AS c JOIN authorizations ON authorizations.id = c.authorization_id AND authorizations.account_id = c.account_id
        WHERE authorizations.status IN ('active', 'expired') UNION ALL SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
        FROM (SELECT n.account_id AS account_id, n.api_key_id AS api_key_id, n.request_id AS request_id, n.id AS usage_event_id, n.total_microcents AS charge_microcents, n.authorization_id AS authorization_id, p_prepaid AS prepaid
        FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents)) AS c JOIN authorizations ON authorizations.account_id = c.account_id AND authorizations.request_id = c.request_id
        WHERE c.authorization_id IS NULL AND authorizations.status IN ('active', 'expired')) AS found GROUP BY found.hold_id
        ) AS collected;
        IF coalesce(cardinality(v_targets_hold_id), 0) > 1 THEN
            PERFORM authorizations.id
            FROM authorizations
            WHERE authorizations.id IN (SELECT t.hold_id
            FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id)) AND authorizations.status IN ('active', 'expired') ORDER BY authorizations.id COLLATE "C" FOR NO KEY UPDATE;
        END IF;
        IF coalesce(cardinality(v_targets_hold_id), 0) > 0 THEN
            UPDATE authorizations SET status='settled', closed_at=p_now, usage_event_id=t.event_id FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id) WHERE authorizations.id = t.hold_id AND authorizations.status IN ('active', 'expired');
        END IF;
        INSERT INTO ledger_entries (account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at) SELECT c.account_id, 'charge' AS anon_1, -c.charge_microcents, c.usage_event_id, c.api_key_id, p_now AS anon_2
        FROM (SELECT n.account_id AS account_id, n.api_key_id AS api_key_id, n.request_id AS request_id, n.id AS usage_event_id, n.total_microcents AS charge_microcents, n.authorization_id AS authorization_id, p_prepaid AS prepaid
        FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents)) AS c
        WHERE c.prepaid ORDER BY c.usage_event_id;
        SELECT array_agg(collected.account_id ORDER BY collected.account_id COLLATE "C"), array_agg(collected.total ORDER BY collected.account_id COLLATE "C") INTO v_debits_account_id, v_debits_total
        FROM (
        SELECT c.account_id, CAST(sum(c.charge_microcents) AS BIGINT) AS total
        FROM (SELECT n.account_id AS account_id, n.api_key_id AS api_key_id, n.request_id AS request_id, n.id AS usage_event_id, n.total_microcents AS charge_microcents, n.authorization_id AS authorization_id, p_prepaid AS prepaid
        FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents)) AS c
        WHERE c.prepaid GROUP BY c.account_id
        ) AS collected;
        IF coalesce(cardinality(v_debits_account_id), 0) > 1 THEN
            PERFORM accounts.id
            FROM accounts
            WHERE accounts.id IN (SELECT d.account_id
            FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total)) ORDER BY accounts.id COLLATE "C" FOR NO KEY UPDATE;
        END IF;
        IF coalesce(cardinality(v_debits_account_id), 0) > 0 THEN
            WITH collected AS (
            UPDATE accounts SET balance_microcents=(accounts.balance_microcents - d.total) FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) WHERE accounts.id = d.account_id RETURNING accounts.id AS account_id, accounts.balance_microcents AS after_microcents
            )
            SELECT array_agg(collected.account_id), array_agg(collected.after_microcents) INTO v_moved_account_id, v_moved_after_microcents FROM collected;
            INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT crossed.event_id_1, crossed.account_id, crossed.anon_1, crossed.json_object_text_1, crossed.anon_2
            FROM (SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, m.account_id AS account_id, 'credit.balance_low' AS anon_1, CAST(json_build_object('balance_microcents', m.after_microcents, 'threshold_microcents', accounts.low_balance_threshold_microcents) AS TEXT) AS json_object_text_1, p_now AS anon_2
            FROM (SELECT mv.account_id AS account_id, mv.after_microcents + d.total AS before_microcents, mv.after_microcents AS after_microcents
            FROM unnest(v_moved_account_id, v_moved_after_microcents) AS mv(account_id, after_microcents) JOIN unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) ON d.account_id = mv.account_id) AS m JOIN accounts ON accounts.id = m.account_id
            WHERE accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.low_balance_threshold_microcents <= m.before_microcents AND accounts.low_balance_threshold_microcents > m.after_microcents UNION ALL SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_2, m.account_id AS account_id, 'credit.balance_depleted' AS anon_3, CAST(json_build_object('balance_microcents', m.after_microcents) AS TEXT) AS json_object_text_2, p_now AS anon_2
            FROM (SELECT mv.account_id AS account_id, mv.after_microcents + d.total AS before_microcents, mv.after_microcents AS after_microcents
            FROM unnest(v_moved_account_id, v_moved_after_microcents) AS mv(account_id, after_microcents) JOIN unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) ON d.account_id = mv.account_id) AS m
            WHERE m.before_microcents > 0 AND m.after_microcents <= 0) AS crossed;
        END IF;
        INSERT INTO usage_rollups (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id) SELECT r.account_id, r.bucket_width, r.grouping, r.bucket_start, r.api_key_id, r.model_id, r.requests, r.input_tokens, r.cache_read_tokens, r.output_tokens, r.reasoning_tokens, r.cost_microcents, (SELECT max(n.id) AS max_1
        FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents)) AS anon_1
        FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_rollups AS json)) AS (account_id VARCHAR(32), bucket_width VARCHAR(2), grouping VARCHAR(10), bucket_start TIMESTAMP WITH TIME ZONE, api_key_id VARCHAR(32), model_id VARCHAR(100), requests BIGINT, input_tokens BIGINT, cache_read_tokens BIGINT, output_tokens BIGINT, reasoning_tokens BIGINT, cost_microcents BIGINT, last_event_id BIGINT)) WITH ORDINALITY AS t(account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id, position)) AS r
        WHERE true ON CONFLICT (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id) DO UPDATE SET requests = (usage_rollups.requests + excluded.requests), input_tokens = (usage_rollups.input_tokens + excluded.input_tokens), cache_read_tokens = (usage_rollups.cache_read_tokens + excluded.cache_read_tokens), output_tokens = (usage_rollups.output_tokens + excluded.output_tokens), reasoning_tokens = (usage_rollups.reasoning_tokens + excluded.reasoning_tokens), cost_microcents = (usage_rollups.cost_microcents + excluded.cost_microcents), last_event_id = greatest(usage_rollups.last_event_id, excluded.last_event_id);
    END IF;
    RETURN (SELECT max(n.id) AS max_1
    FROM unnest(v_new_id, v_new_account_id, v_new_request_id, v_new_api_key_id, v_new_authorization_id, v_new_total_microcents) AS n(id, account_id, request_id, api_key_id, authorization_id, total_microcents));
END;
$$
"""


def _stamp() -> sa.types.TypeEngine:  # UTCDateTime's storage
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "accounts", sa.Column("low_balance_threshold_microcents", sa.BigInteger(), nullable=True)
    )
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("event_types", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(500), nullable=True),
        sa.Column("secret_sealed", sa.Text(), nullable=False),
        sa.Column("previous_secret_sealed", sa.Text(), nullable=True),
        sa.Column("previous_until", _stamp(), nullable=True),
        sa.Column("created_at", _stamp(), nullable=False),
        sa.Column("deleted_at", _stamp(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_webhook_endpoints_account_id_accounts"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_endpoints"),
    )
    op.create_index(
        "ix_webhook_endpoints_account_id", "webhook_endpoints", ["account_id"], unique=False
    )
    big_pk = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "webhook_events",
        sa.Column("id", big_pk, autoincrement=True, nullable=False),
        sa.Column("public_id", sa.String(40), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", _stamp(), nullable=False),
        sa.Column("dispatched", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_events"),
        sa.UniqueConstraint("public_id", name="uq_webhook_events_public_id"),
    )
    op.create_index("ix_webhook_events_account_id", "webhook_events", ["account_id"])
    op.create_index(
        "ix_webhook_events_undispatched",
        "webhook_events",
        ["id"],
        postgresql_where=sa.text("NOT dispatched"),
        sqlite_where=sa.text("NOT dispatched"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", big_pk, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("endpoint_id", sa.String(32), nullable=False),
        sa.Column("account_id", sa.String(32), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", _stamp(), nullable=True),
        sa.Column("last_attempt_at", _stamp(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(500), nullable=True),
        sa.Column("delivered_at", _stamp(), nullable=True),
        sa.Column("created_at", _stamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name="fk_webhook_deliveries_endpoint_id_webhook_endpoints",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["webhook_events.id"],
            name="fk_webhook_deliveries_event_id_webhook_events",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_index("ix_webhook_deliveries_endpoint", "webhook_deliveries", ["endpoint_id", "id"])
    op.create_index(
        "uq_webhook_deliveries_event_endpoint",
        "webhook_deliveries",
        ["event_id", "endpoint_id"],
        unique=True,
    )
    with op.batch_alter_table("authorizations") as batch:
        batch.add_column(
            sa.Column("unused_noticed", sa.Boolean(), server_default="0", nullable=False)
        )
    # Holds that expired before this revision announce nothing.
    op.execute("UPDATE authorizations SET unused_noticed = true WHERE status = 'expired'")
    op.create_index(
        "ix_authorizations_unnoticed_expiry",
        "authorizations",
        ["id"],
        postgresql_where=sa.text("status = 'expired' AND NOT unused_noticed"),
        sqlite_where=sa.text("status = 'expired' AND NOT unused_noticed"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SETTLE_USAGE)
        op.execute(RECORD_USAGE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        revision_0012 = _migration("0012")
        op.execute(revision_0012.SETTLE_USAGE)
        op.execute(revision_0012.RECORD_USAGE)
    op.drop_index("ix_authorizations_unnoticed_expiry", table_name="authorizations")
    with op.batch_alter_table("authorizations") as batch:
        batch.drop_column("unused_noticed")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_endpoints")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("low_balance_threshold_microcents")


def _migration(name: str) -> ModuleType:
    """An earlier migration's module (a migration stays as it was written)."""
    path = next(Path(__file__).parent.glob(f"{name}_*.py"))
    spec = importlib.util.spec_from_file_location(f"metering_migration_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
