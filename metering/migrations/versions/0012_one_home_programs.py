"""One home for every ledger rule: the write transactions as programs (metering.kit.programs).

The check-and-hold, the settlement of a batch's charges with its rollups, and the single-event
record are each defined once, as steps over SQLAlchemy Core statements: SQLite runs the steps in
the unit of work, and PostgreSQL runs the functions below, generated from the same definitions
(``python -m metering.functions``) and frozen here as they were generated on this revision;
``tests/test_functions.py`` holds them equal to what the definitions produce now.

* ``metering_place_holds(p_now, p_holds)`` replaces ``metering_place_holds(account, now,
  holds)`` and ``metering_place_holds_of_accounts``: holds of any accounts, each account locked
  once in byte order of id; it recomputes a remembered resolution inline (the resolution's
  statement, metering.ledger.resolution), so ``metering_resolution`` is gone.
* ``metering_settle_usage(p_now, p_charges, p_rollups)`` replaces ``metering_settle_charges``:
  the settlement and the rollup upsert of a batch in one call.
* ``metering_record_usage(p_now, p_events, p_prepaid, p_rollups)``: as before, with parameter
  names of the programs' convention.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 12:00:00
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PLACE_HOLDS = """
CREATE OR REPLACE FUNCTION metering_place_holds(p_now TIMESTAMP WITH TIME ZONE, p_holds json)
RETURNS TABLE (hold_id VARCHAR, outcome VARCHAR, available BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_h_id VARCHAR(32);
    v_h_account_id VARCHAR(32);
    v_h_api_key_id VARCHAR(32);
    v_h_request_id VARCHAR(64);
    v_h_request_fingerprint VARCHAR(64);
    v_h_model_id VARCHAR(100);
    v_h_api VARCHAR(20);
    v_h_prompt_tokens INTEGER;
    v_h_requested_max_tokens INTEGER;
    v_h_n INTEGER;
    v_h_reasoning BOOLEAN;
    v_h_max_tokens INTEGER;
    v_h_estimate_microcents BIGINT;
    v_h_created_at TIMESTAMP WITH TIME ZONE;
    v_h_expires_at TIMESTAMP WITH TIME ZONE;
    v_h_spend_limit BIGINT;
    v_h_window_start TIMESTAMP WITH TIME ZONE;
    v_h_window_end TIMESTAMP WITH TIME ZONE;
    v_h_resolution TEXT;
    v_h_secret_hash VARCHAR;
    v_h_model_key VARCHAR;
    v_account_id VARCHAR;
    v_balance BIGINT;
    v_held BIGINT;
    v_released BIGINT;
    v_expired BIGINT;
    v_changed BOOLEAN := false;
    v_available BIGINT;
    v_outcome VARCHAR;
BEGIN
    FOR v_h_id, v_h_account_id, v_h_api_key_id, v_h_request_id, v_h_request_fingerprint, v_h_model_id, v_h_api, v_h_prompt_tokens, v_h_requested_max_tokens, v_h_n, v_h_reasoning, v_h_max_tokens, v_h_estimate_microcents, v_h_created_at, v_h_expires_at, v_h_spend_limit, v_h_window_start, v_h_window_end, v_h_resolution, v_h_secret_hash, v_h_model_key IN
    SELECT h.id, h.account_id, h.api_key_id, h.request_id, h.request_fingerprint, h.model_id, h.api, h.prompt_tokens, h.requested_max_tokens, h.n, h.reasoning, h.max_tokens, h.estimate_microcents, h.created_at, h.expires_at, h.spend_limit, h.window_start, h.window_end, h.resolution, h.secret_hash, h.model_key
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_holds AS json)) AS (id VARCHAR(32), account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), request_fingerprint VARCHAR(64), model_id VARCHAR(100), api VARCHAR(20), prompt_tokens INTEGER, requested_max_tokens INTEGER, n INTEGER, reasoning BOOLEAN, max_tokens INTEGER, estimate_microcents BIGINT, created_at TIMESTAMP WITH TIME ZONE, expires_at TIMESTAMP WITH TIME ZONE, spend_limit BIGINT, window_start TIMESTAMP WITH TIME ZONE, window_end TIMESTAMP WITH TIME ZONE, resolution TEXT, secret_hash VARCHAR, model_key VARCHAR)) WITH ORDINALITY AS t(id, account_id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens, requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, created_at, expires_at, spend_limit, window_start, window_end, resolution, secret_hash, model_key, position)) AS h ORDER BY h.account_id COLLATE "C", h.position
    LOOP
        IF v_h_account_id IS DISTINCT FROM v_account_id THEN
            IF v_changed THEN
                UPDATE accounts SET held_microcents=v_held WHERE accounts.id = v_account_id;
            END IF;
            v_account_id := v_h_account_id;
            SELECT accounts.balance_microcents, accounts.held_microcents
            FROM accounts
            WHERE accounts.id = v_account_id FOR NO KEY UPDATE
            INTO v_balance, v_held;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no such account';
            END IF;
            WITH summed AS (
            UPDATE authorizations SET counted=false WHERE authorizations.id IN (SELECT locked.id
            FROM authorizations AS locked
            WHERE locked.account_id = v_account_id AND locked.counted AND locked.status != 'active' FOR NO KEY UPDATE SKIP LOCKED) RETURNING authorizations.estimate_microcents
            )
            SELECT coalesce(sum(summed.estimate_microcents), 0) INTO v_released FROM summed;
            WITH summed AS (
            UPDATE authorizations SET status='expired', counted=false WHERE authorizations.id IN (SELECT locked.id
            FROM authorizations AS locked
            WHERE locked.account_id = v_account_id AND locked.status = 'active' AND locked.expires_at <= p_now AND locked.counted FOR NO KEY UPDATE SKIP LOCKED) RETURNING authorizations.estimate_microcents
            )
            SELECT coalesce(sum(summed.estimate_microcents), 0) INTO v_expired FROM summed;
            v_held := (v_held - v_released) - v_expired;
            v_changed := v_released != 0 OR v_expired != 0;
        END IF;
        v_available := v_balance - v_held;
        v_outcome := CASE WHEN (v_h_resolution IS NOT NULL AND (SELECT CAST(json_build_array(resolution.api_key_id, resolution.account_id, resolution.billing, resolution.spend_limit_microcents, resolution.model_id, resolution.context_length, resolution.max_output_tokens, resolution.reasoning_headroom_tokens, resolution.deprecation_date, resolution.price_version_id, resolution.input_microcents_per_million, resolution.output_microcents_per_million, resolution.cache_read_microcents_per_million) AS TEXT) AS json_build_array_1
        FROM (SELECT api_keys.id AS api_key_id, api_keys.account_id AS account_id, accounts.billing AS billing, api_keys.monthly_spend_limit_microcents AS spend_limit_microcents, model.id AS model_id, model.context_length AS context_length, model.max_output_tokens AS max_output_tokens, model.reasoning_headroom_tokens AS reasoning_headroom_tokens, model.deprecation_date AS deprecation_date, coalesce(override.id, listed.id) AS price_version_id, coalesce(override.input_microcents_per_million, listed.input_microcents_per_million) AS input_microcents_per_million, coalesce(override.output_microcents_per_million, listed.output_microcents_per_million) AS output_microcents_per_million, coalesce(override.cache_read_microcents_per_million, listed.cache_read_microcents_per_million) AS cache_read_microcents_per_million
        FROM api_keys JOIN accounts ON accounts.id = api_keys.account_id LEFT OUTER JOIN catalog_models AS model ON model.id_key = v_h_model_key LEFT OUTER JOIN account_rates AS override ON override.id = (SELECT account_rates.id
        FROM account_rates
        WHERE account_rates.account_id = api_keys.account_id AND account_rates.model_id = model.id AND account_rates.effective_at <= v_h_created_at ORDER BY account_rates.effective_at DESC
         LIMIT 1) AND override.input_microcents_per_million IS NOT NULL LEFT OUTER JOIN price_versions AS listed ON listed.id = (SELECT price_versions.id
        FROM price_versions
        WHERE price_versions.model_id = model.id AND price_versions.effective_at <= v_h_created_at ORDER BY price_versions.effective_at DESC
         LIMIT 1)
        WHERE api_keys.secret_hash = v_h_secret_hash AND api_keys.revoked_at IS NULL) AS resolution) IS DISTINCT FROM v_h_resolution) THEN 'stale' WHEN (v_h_request_id IS NOT NULL AND (EXISTS (SELECT *
        FROM authorizations
        WHERE authorizations.account_id = v_account_id AND authorizations.request_id = v_h_request_id))) THEN 'exists' WHEN (v_h_estimate_microcents > v_available) THEN 'insufficient_credits' WHEN (v_h_spend_limit IS NOT NULL AND (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_1
        FROM usage_rollups
        WHERE usage_rollups.account_id = v_account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= v_h_window_start AND usage_rollups.bucket_start < v_h_window_end AND usage_rollups.api_key_id = v_h_api_key_id) + (SELECT coalesce(sum(authorizations.estimate_microcents), 0) AS coalesce_2
        FROM authorizations
        WHERE authorizations.api_key_id = v_h_api_key_id AND authorizations.status = 'active' AND authorizations.expires_at > v_h_created_at) + v_h_estimate_microcents > v_h_spend_limit) THEN 'member_spend_limit' ELSE 'granted' END;
        IF v_outcome = 'granted' THEN
            INSERT INTO authorizations (id, account_id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens, requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, status, created_at, expires_at, counted) VALUES (v_h_id, v_h_account_id, v_h_api_key_id, v_h_request_id, v_h_request_fingerprint, v_h_model_id, v_h_api, v_h_prompt_tokens, v_h_requested_max_tokens, v_h_n, v_h_reasoning, v_h_max_tokens, v_h_estimate_microcents, 'active', v_h_created_at, v_h_expires_at, true);
            v_held := v_held + v_h_estimate_microcents;
            v_changed := true;
        END IF;
        hold_id := v_h_id;
        outcome := v_outcome;
        available := v_available;
        RETURN NEXT;
    END LOOP;
    IF v_changed THEN
        UPDATE accounts SET held_microcents=v_held WHERE accounts.id = v_account_id;
    END IF;
END;
$$
"""

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
        UPDATE accounts SET balance_microcents=(accounts.balance_microcents - d.total) FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) WHERE accounts.id = d.account_id;
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
            UPDATE accounts SET balance_microcents=(accounts.balance_microcents - d.total) FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) WHERE accounts.id = d.account_id;
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

_DROPPED = (
    "metering_place_holds_of_accounts(timestamptz, json)",
    "metering_place_holds(text, timestamptz, json)",
    "metering_resolution(text, text, timestamptz)",
    "metering_record_usage(timestamptz, json, boolean, json)",
    "metering_settle_charges(timestamptz, json)",
)
_CREATED = (
    "metering_place_holds(timestamptz, json)",
    "metering_settle_usage(timestamptz, json, json)",
    "metering_record_usage(timestamptz, json, boolean, json)",
)


def _migration(name: str) -> ModuleType:
    """An earlier migration's module (a migration stays as it was written)."""
    path = next(Path(__file__).parent.glob(f"{name}_*.py"))
    spec = importlib.util.spec_from_file_location(f"metering_migration_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for signature in _DROPPED:
            op.execute(f"DROP FUNCTION {signature}")
        for function in (PLACE_HOLDS, SETTLE_USAGE, RECORD_USAGE):
            op.execute(function)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for signature in _CREATED:
            op.execute(f"DROP FUNCTION {signature}")
        op.execute(_migration("0007").SETTLE_CHARGES)
        op.execute(_migration("0009").RECORD_USAGE)
        revision_0010 = _migration("0010")
        op.execute(revision_0010.RESOLUTION)
        op.execute(revision_0010.PLACE_HOLDS)
        op.execute(revision_0010.PLACE_HOLDS_OF_ACCOUNTS)
