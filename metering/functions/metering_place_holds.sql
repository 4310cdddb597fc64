CREATE OR REPLACE FUNCTION metering_place_holds(p_now TIMESTAMP WITH TIME ZONE, p_holds json)
RETURNS TABLE (hold_id VARCHAR, outcome VARCHAR, available BIGINT, spent BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_h_id VARCHAR(64);
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
    v_h_estimate_microcents non_negative_microcents;
    v_h_created_at TIMESTAMP WITH TIME ZONE;
    v_h_expires_at TIMESTAMP WITH TIME ZONE;
    v_h_spend_limit BIGINT;
    v_h_window_start TIMESTAMP WITH TIME ZONE;
    v_h_window_end TIMESTAMP WITH TIME ZONE;
    v_h_project_id VARCHAR;
    v_h_project_limit BIGINT;
    v_h_project_window_start TIMESTAMP WITH TIME ZONE;
    v_h_project_window_end TIMESTAMP WITH TIME ZONE;
    v_h_member_id VARCHAR;
    v_h_member_limit BIGINT;
    v_h_member_window_start TIMESTAMP WITH TIME ZONE;
    v_h_member_window_end TIMESTAMP WITH TIME ZONE;
    v_h_resolution TEXT;
    v_h_secret_hash VARCHAR;
    v_h_model_key VARCHAR;
    v_h_generation BIGINT;
    v_h_model_generation BIGINT;
    v_h_valid_from TIMESTAMP WITH TIME ZONE;
    v_h_valid_until TIMESTAMP WITH TIME ZONE;
    v_account_id VARCHAR;
    v_balance BIGINT;
    v_held BIGINT;
    v_count BIGINT;
    v_limit INTEGER;
    v_billing VARCHAR;
    v_next_expiry TIMESTAMP WITH TIME ZONE;
    v_generation BIGINT;
    v_released BIGINT;
    v_released_count BIGINT;
    v_expired BIGINT;
    v_expired_count BIGINT;
    v_changed BOOLEAN := false;
    v_adopted BIGINT;
    v_adopted_count BIGINT;
    v_available BIGINT;
    v_outcome VARCHAR;
    v_project_spent BIGINT;
    v_member_spent BIGINT;
    v_key_spent BIGINT;
BEGIN
    FOR v_h_id, v_h_account_id, v_h_api_key_id, v_h_request_id, v_h_request_fingerprint, v_h_model_id, v_h_api, v_h_prompt_tokens, v_h_requested_max_tokens, v_h_n, v_h_reasoning, v_h_max_tokens, v_h_estimate_microcents, v_h_created_at, v_h_expires_at, v_h_spend_limit, v_h_window_start, v_h_window_end, v_h_project_id, v_h_project_limit, v_h_project_window_start, v_h_project_window_end, v_h_member_id, v_h_member_limit, v_h_member_window_start, v_h_member_window_end, v_h_resolution, v_h_secret_hash, v_h_model_key, v_h_generation, v_h_model_generation, v_h_valid_from, v_h_valid_until IN
    SELECT h.id, h.account_id, h.api_key_id, h.request_id, h.request_fingerprint, h.model_id, h.api, h.prompt_tokens, h.requested_max_tokens, h.n, h.reasoning, h.max_tokens, h.estimate_microcents, h.created_at, h.expires_at, h.spend_limit, h.window_start, h.window_end, h.project_id, h.project_limit, h.project_window_start, h.project_window_end, h.member_id, h.member_limit, h.member_window_start, h.member_window_end, h.resolution, h.secret_hash, h.model_key, h.generation, h.model_generation, h.valid_from, h.valid_until
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_holds AS json)) AS (id VARCHAR(64), account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), request_fingerprint VARCHAR(64), model_id VARCHAR(100), api VARCHAR(20), prompt_tokens INTEGER, requested_max_tokens INTEGER, n INTEGER, reasoning BOOLEAN, max_tokens INTEGER, estimate_microcents non_negative_microcents, created_at TIMESTAMP WITH TIME ZONE, expires_at TIMESTAMP WITH TIME ZONE, spend_limit BIGINT, window_start TIMESTAMP WITH TIME ZONE, window_end TIMESTAMP WITH TIME ZONE, project_id VARCHAR, project_limit BIGINT, project_window_start TIMESTAMP WITH TIME ZONE, project_window_end TIMESTAMP WITH TIME ZONE, member_id VARCHAR, member_limit BIGINT, member_window_start TIMESTAMP WITH TIME ZONE, member_window_end TIMESTAMP WITH TIME ZONE, resolution TEXT, secret_hash VARCHAR, model_key VARCHAR, generation BIGINT, model_generation BIGINT, valid_from TIMESTAMP WITH TIME ZONE, valid_until TIMESTAMP WITH TIME ZONE)) WITH ORDINALITY AS t(id, account_id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens, requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, created_at, expires_at, spend_limit, window_start, window_end, project_id, project_limit, project_window_start, project_window_end, member_id, member_limit, member_window_start, member_window_end, resolution, secret_hash, model_key, generation, model_generation, valid_from, valid_until, position)) AS h ORDER BY h.account_id COLLATE "C", h.position
    LOOP
        IF v_h_account_id IS DISTINCT FROM v_account_id THEN
            IF v_changed THEN
                UPDATE accounts SET held_microcents=v_held, held_count=v_count WHERE accounts.id = v_account_id;
            END IF;
            v_account_id := v_h_account_id;
            SELECT accounts.balance_microcents, accounts.held_microcents, accounts.held_count, accounts.max_concurrent_requests, accounts.billing, accounts.next_expiry_at, accounts.resolution_generation
            FROM accounts
            WHERE accounts.id = v_account_id FOR NO KEY UPDATE
            INTO v_balance, v_held, v_count, v_limit, v_billing, v_next_expiry, v_generation;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no such account';
            END IF;
            IF v_next_expiry <= p_now THEN
                v_balance := v_balance - (SELECT coalesce(sum(credit_grants.remaining_microcents), 0) AS coalesce_1
                FROM credit_grants
                WHERE credit_grants.account_id = v_account_id AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND credit_grants.expires_at IS NOT NULL AND credit_grants.expires_at <= p_now);
            END IF;
            WITH summed AS (
            UPDATE authorizations SET counted=false WHERE authorizations.id IN (SELECT locked.id
            FROM authorizations AS locked
            WHERE locked.account_id = v_account_id AND locked.counted AND locked.status != 'active' FOR NO KEY UPDATE SKIP LOCKED) RETURNING authorizations.estimate_microcents
            )
            SELECT coalesce(sum(summed.estimate_microcents), 0), count(*) INTO v_released, v_released_count FROM summed;
            WITH summed AS (
            UPDATE authorizations SET status='expired', counted=false WHERE authorizations.id IN (SELECT locked.id
            FROM authorizations AS locked
            WHERE locked.account_id = v_account_id AND locked.status = 'active' AND locked.expires_at <= p_now AND locked.counted FOR NO KEY UPDATE SKIP LOCKED) RETURNING authorizations.estimate_microcents
            )
            SELECT coalesce(sum(summed.estimate_microcents), 0), count(*) INTO v_expired, v_expired_count FROM summed;
            v_held := (v_held - v_released) - v_expired;
            v_count := (v_count - v_released_count) - v_expired_count;
            v_changed := v_released_count != 0 OR v_expired_count != 0;
            IF v_billing = 'unbilled' THEN
                WITH summed AS (
                UPDATE authorizations SET counted=true WHERE authorizations.id IN (SELECT uncounted.id
                FROM authorizations AS uncounted
                WHERE uncounted.account_id = v_account_id AND uncounted.status = 'active' AND uncounted.expires_at > p_now AND NOT uncounted.counted FOR NO KEY UPDATE SKIP LOCKED) RETURNING authorizations.estimate_microcents
                )
                SELECT coalesce(sum(summed.estimate_microcents), 0), count(*) INTO v_adopted, v_adopted_count FROM summed;
                v_held := v_held + v_adopted;
                v_count := v_count + v_adopted_count;
                v_changed := v_changed OR v_adopted_count != 0;
            END IF;
        END IF;
        v_available := CASE WHEN (v_balance < CAST(-9223372036854775808 AS BIGINT) + v_held) THEN CAST(-9223372036854775808 AS BIGINT) ELSE v_balance - v_held END;
        v_outcome := CASE WHEN (v_h_generation IS NOT NULL AND (v_h_generation != v_generation OR v_h_model_generation IS DISTINCT FROM (SELECT catalog_models.resolution_generation
        FROM catalog_models
        WHERE catalog_models.id = v_h_model_id) OR v_h_created_at < v_h_valid_from OR v_h_created_at >= v_h_valid_until)) THEN 'stale' WHEN (v_h_request_id IS NOT NULL AND (EXISTS (SELECT *
        FROM authorizations
        WHERE authorizations.account_id = v_account_id AND authorizations.request_id = v_h_request_id))) THEN 'exists' WHEN (v_billing != 'prepaid' AND v_h_estimate_microcents > 9223372036854775807 - v_held) THEN 'out_of_range' WHEN (v_limit IS NOT NULL AND v_count >= v_limit) THEN 'concurrency_limit_exceeded' WHEN (v_billing = 'prepaid' AND v_h_estimate_microcents > v_available) THEN 'insufficient_credits' ELSE 'granted' END;
        IF v_outcome = 'granted' AND v_billing = 'prepaid' AND (v_h_project_limit IS NOT NULL OR v_h_member_limit IS NOT NULL OR v_h_spend_limit IS NOT NULL) THEN
            SELECT coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_project_window_start AND spent.day < v_h_project_window_end) AND api_keys.project_id = v_h_project_id), 0) AS project, coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_member_window_start AND spent.day < v_h_member_window_end) AND api_keys.member_id = v_h_member_id), 0) AS member, coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_window_start AND spent.day < v_h_window_end) AND api_keys.id = v_h_api_key_id), 0) AS key
            FROM (SELECT usage_rollups.api_key_id AS api_key_id, usage_rollups.cost_microcents AS amount, usage_rollups.bucket_start AS day
            FROM usage_rollups
            WHERE usage_rollups.account_id = v_account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= least(v_h_project_window_start, v_h_member_window_start, v_h_window_start) AND usage_rollups.bucket_start < greatest(v_h_project_window_end, v_h_member_window_end, v_h_window_end) UNION ALL SELECT authorizations.api_key_id AS api_key_id, authorizations.estimate_microcents AS amount, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS day
            FROM authorizations
            WHERE authorizations.account_id = v_account_id AND authorizations.status = 'active' AND authorizations.expires_at > v_h_created_at) AS spent JOIN api_keys ON api_keys.account_id = v_account_id AND api_keys.id = spent.api_key_id
            INTO v_project_spent, v_member_spent, v_key_spent;
            v_outcome := CASE WHEN (v_billing = 'prepaid' AND v_h_project_limit IS NOT NULL AND v_project_spent + v_h_estimate_microcents > v_h_project_limit) THEN 'project_spend_limit' WHEN (v_billing = 'prepaid' AND v_h_member_limit IS NOT NULL AND v_member_spent + v_h_estimate_microcents > v_h_member_limit) THEN 'member_spend_limit' WHEN (v_billing = 'prepaid' AND v_h_spend_limit IS NOT NULL AND v_key_spent + v_h_estimate_microcents > v_h_spend_limit) THEN 'key_spend_limit' ELSE 'granted' END;
        END IF;
        IF v_outcome = 'granted' THEN
            INSERT INTO authorizations (id, account_id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens, requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, status, created_at, expires_at, counted) VALUES (v_h_id, v_h_account_id, v_h_api_key_id, v_h_request_id, v_h_request_fingerprint, v_h_model_id, v_h_api, v_h_prompt_tokens, v_h_requested_max_tokens, v_h_n, v_h_reasoning, v_h_max_tokens, v_h_estimate_microcents, 'active', v_h_created_at, v_h_expires_at, true);
            v_held := v_held + v_h_estimate_microcents;
            v_count := v_count + 1;
            v_changed := true;
        END IF;
        hold_id := v_h_id;
        outcome := v_outcome;
        available := v_available;
        spent := CASE WHEN (v_outcome = 'project_spend_limit') THEN v_project_spent WHEN (v_outcome = 'member_spend_limit') THEN v_member_spent WHEN (v_outcome = 'key_spend_limit') THEN v_key_spent ELSE CAST(NULL AS BIGINT) END;
        RETURN NEXT;
    END LOOP;
    IF v_changed THEN
        UPDATE accounts SET held_microcents=v_held, held_count=v_count WHERE accounts.id = v_account_id;
    END IF;
END;
$$
