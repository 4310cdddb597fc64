CREATE OR REPLACE FUNCTION metering_place_holds_of_account(p_account_id VARCHAR, p_now TIMESTAMP WITH TIME ZONE, p_holds json)
RETURNS TABLE (hold_id VARCHAR, outcome VARCHAR, available BIGINT, spent BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_sf_hold_id VARCHAR;
    v_sf_outcome VARCHAR;
    v_sf_available BIGINT;
    v_sf_spent BIGINT;
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
    v_scope_limits BOOLEAN;
    v_project_models BOOLEAN;
    v_released BIGINT;
    v_released_count BIGINT;
    v_released_ids VARCHAR(64)[];
    v_released_id VARCHAR(64);
    v_released_amount BIGINT;
    v_expired BIGINT;
    v_expired_count BIGINT;
    v_expired_ids VARCHAR(64)[];
    v_expired_id VARCHAR(64);
    v_expired_amount BIGINT;
    v_changed BOOLEAN := false;
    v_adopted BIGINT;
    v_adopted_count BIGINT;
    v_adopted_ids VARCHAR(64)[];
    v_adopted_id VARCHAR(64);
    v_adopted_amount BIGINT;
    v_available BIGINT;
    v_r_api_keys_found BOOLEAN;
    v_r_api_keys_id VARCHAR(32);
    v_r_api_keys_account_id VARCHAR(32);
    v_r_api_keys_monthly_spend_limit_microcents BIGINT;
    v_r_api_keys_spend_limit_window VARCHAR(8);
    v_r_api_keys_project_id VARCHAR(32);
    v_r_api_keys_member_id VARCHAR(32);
    v_r_api_keys_restricts_models BOOLEAN;
    v_r_accounts_found BOOLEAN;
    v_r_accounts_billing account_billing;
    v_r_accounts_max_concurrent_requests concurrency_limit;
    v_r_accounts_restricts_models BOOLEAN;
    v_r_projects_spend_limit_microcents BIGINT;
    v_r_projects_spend_limit_window VARCHAR(8);
    v_r_projects_restricts_models BOOLEAN;
    v_r_members_spend_limit_microcents BIGINT;
    v_r_members_spend_limit_window VARCHAR(8);
    v_r_model_id VARCHAR(100);
    v_r_model_context_length INTEGER;
    v_r_model_max_output_tokens INTEGER;
    v_r_model_reasoning_headroom_tokens INTEGER;
    v_r_model_deprecation_date DATE;
    v_r_1 VARCHAR(32);
    v_r_override_id VARCHAR(32);
    v_r_override_input_microcents_per_million BIGINT;
    v_r_override_output_microcents_per_million BIGINT;
    v_r_override_cache_read_microcents_per_million BIGINT;
    v_r_listed_id VARCHAR(32);
    v_r_listed_input_microcents_per_million BIGINT;
    v_r_listed_output_microcents_per_million BIGINT;
    v_r_listed_cache_read_microcents_per_million BIGINT;
    v_r_2 BOOLEAN;
    v_r_3 BOOLEAN;
    v_r_4 BOOLEAN;
    v_resolution TEXT;
    v_known BOOLEAN;
    v_outcome VARCHAR;
    v_project_spent BIGINT;
    v_member_spent BIGINT;
    v_key_spent BIGINT;
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    IF metering_shard_forms_here(v_shard) THEN
        FOR v_sf_hold_id, v_sf_outcome, v_sf_available, v_sf_spent IN
        SELECT not_delegable.hold_id, not_delegable.outcome, not_delegable.available, not_delegable.spent
        FROM (SELECT shard_form.hold_id AS hold_id, shard_form.outcome AS outcome, shard_form.available AS available, shard_form.spent AS spent
        FROM metering_place_holds_of_shards(v_shard, p_account_id, p_now, p_holds) AS shard_form
         LIMIT ALL OFFSET 0) AS not_delegable
        LOOP
            hold_id := v_sf_hold_id;
            outcome := v_sf_outcome;
            available := v_sf_available;
            spent := v_sf_spent;
            RETURN NEXT;
        END LOOP;
    ELSE
        FOR v_h_id, v_h_account_id, v_h_api_key_id, v_h_request_id, v_h_request_fingerprint, v_h_model_id, v_h_api, v_h_prompt_tokens, v_h_requested_max_tokens, v_h_n, v_h_reasoning, v_h_max_tokens, v_h_estimate_microcents, v_h_created_at, v_h_expires_at, v_h_spend_limit, v_h_window_start, v_h_window_end, v_h_project_id, v_h_project_limit, v_h_project_window_start, v_h_project_window_end, v_h_member_id, v_h_member_limit, v_h_member_window_start, v_h_member_window_end, v_h_resolution, v_h_secret_hash, v_h_model_key, v_h_generation, v_h_model_generation, v_h_valid_from, v_h_valid_until IN
        SELECT h.id, h.account_id, h.api_key_id, h.request_id, h.request_fingerprint, h.model_id, h.api, h.prompt_tokens, h.requested_max_tokens, h.n, h.reasoning, h.max_tokens, h.estimate_microcents, h.created_at, h.expires_at, h.spend_limit, h.window_start, h.window_end, h.project_id, h.project_limit, h.project_window_start, h.project_window_end, h.member_id, h.member_limit, h.member_window_start, h.member_window_end, h.resolution, h.secret_hash, h.model_key, h.generation, h.model_generation, h.valid_from, h.valid_until
        FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_holds AS json)) AS (id VARCHAR(64), account_id VARCHAR(32), api_key_id VARCHAR(32), request_id VARCHAR(64), request_fingerprint VARCHAR(64), model_id VARCHAR(100), api VARCHAR(20), prompt_tokens INTEGER, requested_max_tokens INTEGER, n INTEGER, reasoning BOOLEAN, max_tokens INTEGER, estimate_microcents non_negative_microcents, created_at TIMESTAMP WITH TIME ZONE, expires_at TIMESTAMP WITH TIME ZONE, spend_limit BIGINT, window_start TIMESTAMP WITH TIME ZONE, window_end TIMESTAMP WITH TIME ZONE, project_id VARCHAR, project_limit BIGINT, project_window_start TIMESTAMP WITH TIME ZONE, project_window_end TIMESTAMP WITH TIME ZONE, member_id VARCHAR, member_limit BIGINT, member_window_start TIMESTAMP WITH TIME ZONE, member_window_end TIMESTAMP WITH TIME ZONE, resolution TEXT, secret_hash VARCHAR, model_key VARCHAR, generation BIGINT, model_generation BIGINT, valid_from TIMESTAMP WITH TIME ZONE, valid_until TIMESTAMP WITH TIME ZONE)) WITH ORDINALITY AS t(id, account_id, api_key_id, request_id, request_fingerprint, model_id, api, prompt_tokens, requested_max_tokens, n, reasoning, max_tokens, estimate_microcents, created_at, expires_at, spend_limit, window_start, window_end, project_id, project_limit, project_window_start, project_window_end, member_id, member_limit, member_window_start, member_window_end, resolution, secret_hash, model_key, generation, model_generation, valid_from, valid_until, position)) AS h ORDER BY h.account_id COLLATE "C", h.position
        LOOP
            IF v_h_account_id IS DISTINCT FROM v_account_id THEN
                IF v_changed THEN
                    UPDATE accounts SET held_microcents=v_held, held_count=v_count WHERE accounts.id = p_account_id AND p_account_id = v_account_id;
                END IF;
                v_account_id := v_h_account_id;
                SELECT accounts.balance_microcents, accounts.held_microcents, accounts.held_count, accounts.max_concurrent_requests, accounts.billing, accounts.next_expiry_at, accounts.scope_limits, accounts.project_models
                FROM accounts
                WHERE accounts.id = p_account_id AND p_account_id = v_account_id FOR NO KEY UPDATE
                INTO v_balance, v_held, v_count, v_limit, v_billing, v_next_expiry, v_scope_limits, v_project_models;
                IF NOT FOUND THEN
                    RAISE EXCEPTION 'no such account';
                END IF;
                IF v_next_expiry <= p_now THEN
                    v_balance := v_balance - (SELECT coalesce(sum(credit_grants.remaining_microcents), 0) AS coalesce_1
                    FROM credit_grants
                    WHERE credit_grants.account_id = p_account_id AND p_account_id = v_account_id AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND credit_grants.expires_at IS NOT NULL AND credit_grants.expires_at <= p_now);
                END IF;
                v_released := 0;
                v_released_count := 0;
                v_released_ids := ARRAY[]::VARCHAR(64)[];
                FOR v_released_id, v_released_amount IN
                SELECT locked.id, locked.estimate_microcents
                FROM authorizations AS locked
                WHERE locked.account_id = p_account_id AND p_account_id = v_account_id AND locked.counted AND locked.status != 'active' FOR NO KEY UPDATE SKIP LOCKED
                LOOP
                    v_released := v_released + v_released_amount;
                    v_released_count := v_released_count + 1;
                    v_released_ids := array_append(v_released_ids, v_released_id);
                END LOOP;
                IF v_released_count != 0 THEN
                    UPDATE authorizations SET counted=false WHERE authorizations.account_id = p_account_id AND authorizations.id = ANY (v_released_ids);
                END IF;
                v_expired := 0;
                v_expired_count := 0;
                v_expired_ids := ARRAY[]::VARCHAR(64)[];
                FOR v_expired_id, v_expired_amount IN
                SELECT locked.id, locked.estimate_microcents
                FROM authorizations AS locked
                WHERE locked.account_id = p_account_id AND p_account_id = v_account_id AND locked.status = 'active' AND locked.expires_at <= p_now AND locked.counted FOR NO KEY UPDATE SKIP LOCKED
                LOOP
                    v_expired := v_expired + v_expired_amount;
                    v_expired_count := v_expired_count + 1;
                    v_expired_ids := array_append(v_expired_ids, v_expired_id);
                END LOOP;
                IF v_expired_count != 0 THEN
                    UPDATE authorizations SET status='expired', counted=false WHERE authorizations.account_id = p_account_id AND authorizations.id = ANY (v_expired_ids);
                END IF;
                v_held := (v_held - v_released) - v_expired;
                v_count := (v_count - v_released_count) - v_expired_count;
                v_changed := v_released_count != 0 OR v_expired_count != 0;
                IF v_billing = 'unbilled' THEN
                    v_adopted := 0;
                    v_adopted_count := 0;
                    v_adopted_ids := ARRAY[]::VARCHAR(64)[];
                    FOR v_adopted_id, v_adopted_amount IN
                    SELECT uncounted.id, uncounted.estimate_microcents
                    FROM authorizations AS uncounted
                    WHERE uncounted.account_id = p_account_id AND p_account_id = v_account_id AND uncounted.status = 'active' AND uncounted.expires_at > p_now AND NOT uncounted.counted FOR NO KEY UPDATE SKIP LOCKED
                    LOOP
                        v_adopted := v_adopted + v_adopted_amount;
                        v_adopted_count := v_adopted_count + 1;
                        v_adopted_ids := array_append(v_adopted_ids, v_adopted_id);
                    END LOOP;
                    IF v_adopted_count != 0 THEN
                        UPDATE authorizations SET counted=true WHERE authorizations.account_id = p_account_id AND authorizations.id = ANY (v_adopted_ids);
                    END IF;
                    v_held := v_held + v_adopted;
                    v_count := v_count + v_adopted_count;
                    v_changed := v_changed OR v_adopted_count != 0;
                END IF;
            END IF;
            v_available := CASE WHEN (v_balance < CAST(-9223372036854775808 AS BIGINT) + v_held) THEN CAST(-9223372036854775808 AS BIGINT) ELSE v_balance - v_held END;
            IF v_h_resolution IS NOT NULL THEN
                IF v_scope_limits OR v_project_models THEN
                    SELECT true AS anon_1, api_keys.id, api_keys.account_id, api_keys.monthly_spend_limit_microcents, api_keys.spend_limit_window, api_keys.project_id, api_keys.member_id, api_keys.restricts_models
                    FROM api_keys
                    WHERE api_keys.secret_hash = v_h_secret_hash AND api_keys.revoked_at IS NULL
                    INTO v_r_api_keys_found, v_r_api_keys_id, v_r_api_keys_account_id, v_r_api_keys_monthly_spend_limit_microcents, v_r_api_keys_spend_limit_window, v_r_api_keys_project_id, v_r_api_keys_member_id, v_r_api_keys_restricts_models;
                    IF v_r_api_keys_account_id IS NOT NULL THEN
                        SELECT true AS anon_1, accounts.billing, accounts.max_concurrent_requests, accounts.restricts_models
                        FROM accounts
                        WHERE accounts.id = p_account_id AND p_account_id = v_r_api_keys_account_id
                        INTO v_r_accounts_found, v_r_accounts_billing, v_r_accounts_max_concurrent_requests, v_r_accounts_restricts_models;
                    ELSE
                        v_r_accounts_found := NULL;
                        v_r_accounts_billing := NULL;
                        v_r_accounts_max_concurrent_requests := NULL;
                        v_r_accounts_restricts_models := NULL;
                    END IF;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_api_keys_project_id IS NOT NULL THEN
                        SELECT projects.spend_limit_microcents, projects.spend_limit_window, projects.restricts_models
                        FROM projects
                        WHERE projects.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND projects.id = v_r_api_keys_project_id
                        INTO v_r_projects_spend_limit_microcents, v_r_projects_spend_limit_window, v_r_projects_restricts_models;
                    ELSE
                        v_r_projects_spend_limit_microcents := NULL;
                        v_r_projects_spend_limit_window := NULL;
                        v_r_projects_restricts_models := NULL;
                    END IF;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_api_keys_member_id IS NOT NULL THEN
                        SELECT members.spend_limit_microcents, members.spend_limit_window
                        FROM members
                        WHERE members.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND members.id = v_r_api_keys_member_id
                        INTO v_r_members_spend_limit_microcents, v_r_members_spend_limit_window;
                    ELSE
                        v_r_members_spend_limit_microcents := NULL;
                        v_r_members_spend_limit_window := NULL;
                    END IF;
                    SELECT model.id, model.context_length, model.max_output_tokens, model.reasoning_headroom_tokens, model.deprecation_date
                    FROM catalog_models AS model
                    WHERE model.id_key = v_h_model_key
                    INTO v_r_model_id, v_r_model_context_length, v_r_model_max_output_tokens, v_r_model_reasoning_headroom_tokens, v_r_model_deprecation_date;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                        SELECT account_rates.id
                        FROM account_rates
                        WHERE account_rates.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND account_rates.model_id = v_r_model_id AND account_rates.effective_at <= v_h_created_at ORDER BY account_rates.effective_at DESC
                         LIMIT 1
                        INTO v_r_1;
                    ELSE
                        v_r_1 := NULL;
                    END IF;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_1 IS NOT NULL THEN
                        SELECT override.id, override.input_microcents_per_million, override.output_microcents_per_million, override.cache_read_microcents_per_million
                        FROM account_rates AS override
                        WHERE override.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND override.id = v_r_1 AND override.input_microcents_per_million IS NOT NULL
                        INTO v_r_override_id, v_r_override_input_microcents_per_million, v_r_override_output_microcents_per_million, v_r_override_cache_read_microcents_per_million;
                    ELSE
                        v_r_override_id := NULL;
                        v_r_override_input_microcents_per_million := NULL;
                        v_r_override_output_microcents_per_million := NULL;
                        v_r_override_cache_read_microcents_per_million := NULL;
                    END IF;
                    IF v_r_model_id IS NOT NULL THEN
                        SELECT price_versions.id, price_versions.input_microcents_per_million, price_versions.output_microcents_per_million, price_versions.cache_read_microcents_per_million
                        FROM price_versions
                        WHERE price_versions.model_id = v_r_model_id AND price_versions.effective_at <= v_h_created_at ORDER BY price_versions.effective_at DESC
                         LIMIT 1
                        INTO v_r_listed_id, v_r_listed_input_microcents_per_million, v_r_listed_output_microcents_per_million, v_r_listed_cache_read_microcents_per_million;
                    ELSE
                        v_r_listed_id := NULL;
                        v_r_listed_input_microcents_per_million := NULL;
                        v_r_listed_output_microcents_per_million := NULL;
                        v_r_listed_cache_read_microcents_per_million := NULL;
                    END IF;
                    IF (v_r_accounts_restricts_models IS false) IS NOT true THEN
                        IF v_r_api_keys_account_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                            SELECT true AS anon_1
                            FROM account_models
                            WHERE account_models.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND account_models.model_id = v_r_model_id
                             LIMIT 1
                            INTO v_r_2;
                        ELSE
                            v_r_2 := NULL;
                        END IF;
                    ELSE
                        v_r_2 := NULL;
                    END IF;
                    IF (v_r_api_keys_restricts_models IS false) IS NOT true THEN
                        IF v_r_api_keys_account_id IS NOT NULL AND v_r_api_keys_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                            SELECT true AS anon_1
                            FROM api_key_models
                            WHERE api_key_models.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND api_key_models.api_key_id = v_r_api_keys_id AND api_key_models.model_id = v_r_model_id
                             LIMIT 1
                            INTO v_r_3;
                        ELSE
                            v_r_3 := NULL;
                        END IF;
                    ELSE
                        v_r_3 := NULL;
                    END IF;
                    IF (v_r_projects_restricts_models IS NOT true) IS NOT true THEN
                        IF v_r_api_keys_account_id IS NOT NULL AND v_r_api_keys_project_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                            SELECT true AS anon_1
                            FROM project_models
                            WHERE project_models.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND project_models.project_id = v_r_api_keys_project_id AND project_models.model_id = v_r_model_id
                             LIMIT 1
                            INTO v_r_4;
                        ELSE
                            v_r_4 := NULL;
                        END IF;
                    ELSE
                        v_r_4 := NULL;
                    END IF;
                    v_resolution := CASE WHEN (v_r_api_keys_found IS NOT NULL AND v_r_accounts_found IS NOT NULL) THEN CAST(json_build_array(v_r_api_keys_id, v_r_api_keys_account_id, v_r_accounts_billing, v_r_api_keys_monthly_spend_limit_microcents, v_r_api_keys_spend_limit_window, v_r_api_keys_project_id, v_r_api_keys_member_id, v_r_projects_spend_limit_microcents, CASE WHEN (v_r_projects_spend_limit_microcents IS NULL) THEN NULL ELSE v_r_projects_spend_limit_window END, v_r_members_spend_limit_microcents, CASE WHEN (v_r_members_spend_limit_microcents IS NULL) THEN NULL ELSE v_r_members_spend_limit_window END, v_r_accounts_max_concurrent_requests, v_r_model_id, v_r_model_context_length, v_r_model_max_output_tokens, v_r_model_reasoning_headroom_tokens, v_r_model_deprecation_date, coalesce(v_r_override_id, v_r_listed_id), v_r_accounts_restricts_models IS false OR (v_r_2 IS NOT NULL), v_r_api_keys_restricts_models IS false OR (v_r_3 IS NOT NULL), v_r_projects_restricts_models IS NOT true OR (v_r_4 IS NOT NULL), coalesce(v_r_override_input_microcents_per_million, v_r_listed_input_microcents_per_million), coalesce(v_r_override_output_microcents_per_million, v_r_listed_output_microcents_per_million), coalesce(v_r_override_cache_read_microcents_per_million, v_r_listed_cache_read_microcents_per_million)) AS TEXT) END;
                ELSE
                    SELECT true AS anon_1, api_keys.id, api_keys.account_id, api_keys.monthly_spend_limit_microcents, api_keys.spend_limit_window, api_keys.project_id, api_keys.member_id, api_keys.restricts_models
                    FROM api_keys
                    WHERE api_keys.secret_hash = v_h_secret_hash AND api_keys.revoked_at IS NULL
                    INTO v_r_api_keys_found, v_r_api_keys_id, v_r_api_keys_account_id, v_r_api_keys_monthly_spend_limit_microcents, v_r_api_keys_spend_limit_window, v_r_api_keys_project_id, v_r_api_keys_member_id, v_r_api_keys_restricts_models;
                    IF v_r_api_keys_account_id IS NOT NULL THEN
                        SELECT true AS anon_1, accounts.billing, accounts.max_concurrent_requests, accounts.restricts_models
                        FROM accounts
                        WHERE accounts.id = p_account_id AND p_account_id = v_r_api_keys_account_id
                        INTO v_r_accounts_found, v_r_accounts_billing, v_r_accounts_max_concurrent_requests, v_r_accounts_restricts_models;
                    ELSE
                        v_r_accounts_found := NULL;
                        v_r_accounts_billing := NULL;
                        v_r_accounts_max_concurrent_requests := NULL;
                        v_r_accounts_restricts_models := NULL;
                    END IF;
                    SELECT model.id, model.context_length, model.max_output_tokens, model.reasoning_headroom_tokens, model.deprecation_date
                    FROM catalog_models AS model
                    WHERE model.id_key = v_h_model_key
                    INTO v_r_model_id, v_r_model_context_length, v_r_model_max_output_tokens, v_r_model_reasoning_headroom_tokens, v_r_model_deprecation_date;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                        SELECT account_rates.id
                        FROM account_rates
                        WHERE account_rates.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND account_rates.model_id = v_r_model_id AND account_rates.effective_at <= v_h_created_at ORDER BY account_rates.effective_at DESC
                         LIMIT 1
                        INTO v_r_1;
                    ELSE
                        v_r_1 := NULL;
                    END IF;
                    IF v_r_api_keys_account_id IS NOT NULL AND v_r_1 IS NOT NULL THEN
                        SELECT override.id, override.input_microcents_per_million, override.output_microcents_per_million, override.cache_read_microcents_per_million
                        FROM account_rates AS override
                        WHERE override.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND override.id = v_r_1 AND override.input_microcents_per_million IS NOT NULL
                        INTO v_r_override_id, v_r_override_input_microcents_per_million, v_r_override_output_microcents_per_million, v_r_override_cache_read_microcents_per_million;
                    ELSE
                        v_r_override_id := NULL;
                        v_r_override_input_microcents_per_million := NULL;
                        v_r_override_output_microcents_per_million := NULL;
                        v_r_override_cache_read_microcents_per_million := NULL;
                    END IF;
                    IF v_r_model_id IS NOT NULL THEN
                        SELECT price_versions.id, price_versions.input_microcents_per_million, price_versions.output_microcents_per_million, price_versions.cache_read_microcents_per_million
                        FROM price_versions
                        WHERE price_versions.model_id = v_r_model_id AND price_versions.effective_at <= v_h_created_at ORDER BY price_versions.effective_at DESC
                         LIMIT 1
                        INTO v_r_listed_id, v_r_listed_input_microcents_per_million, v_r_listed_output_microcents_per_million, v_r_listed_cache_read_microcents_per_million;
                    ELSE
                        v_r_listed_id := NULL;
                        v_r_listed_input_microcents_per_million := NULL;
                        v_r_listed_output_microcents_per_million := NULL;
                        v_r_listed_cache_read_microcents_per_million := NULL;
                    END IF;
                    IF (v_r_accounts_restricts_models IS false) IS NOT true THEN
                        IF v_r_api_keys_account_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                            SELECT true AS anon_1
                            FROM account_models
                            WHERE account_models.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND account_models.model_id = v_r_model_id
                             LIMIT 1
                            INTO v_r_2;
                        ELSE
                            v_r_2 := NULL;
                        END IF;
                    ELSE
                        v_r_2 := NULL;
                    END IF;
                    IF (v_r_api_keys_restricts_models IS false) IS NOT true THEN
                        IF v_r_api_keys_account_id IS NOT NULL AND v_r_api_keys_id IS NOT NULL AND v_r_model_id IS NOT NULL THEN
                            SELECT true AS anon_1
                            FROM api_key_models
                            WHERE api_key_models.account_id = p_account_id AND p_account_id = v_r_api_keys_account_id AND api_key_models.api_key_id = v_r_api_keys_id AND api_key_models.model_id = v_r_model_id
                             LIMIT 1
                            INTO v_r_3;
                        ELSE
                            v_r_3 := NULL;
                        END IF;
                    ELSE
                        v_r_3 := NULL;
                    END IF;
                    v_resolution := CASE WHEN (v_r_api_keys_found IS NOT NULL AND v_r_accounts_found IS NOT NULL) THEN CAST(json_build_array(v_r_api_keys_id, v_r_api_keys_account_id, v_r_accounts_billing, v_r_api_keys_monthly_spend_limit_microcents, v_r_api_keys_spend_limit_window, v_r_api_keys_project_id, v_r_api_keys_member_id, CAST(NULL AS BIGINT), CAST(NULL AS VARCHAR), CAST(NULL AS BIGINT), CAST(NULL AS VARCHAR), v_r_accounts_max_concurrent_requests, v_r_model_id, v_r_model_context_length, v_r_model_max_output_tokens, v_r_model_reasoning_headroom_tokens, v_r_model_deprecation_date, coalesce(v_r_override_id, v_r_listed_id), v_r_accounts_restricts_models IS false OR (v_r_2 IS NOT NULL), v_r_api_keys_restricts_models IS false OR (v_r_3 IS NOT NULL), true, coalesce(v_r_override_input_microcents_per_million, v_r_listed_input_microcents_per_million), coalesce(v_r_override_output_microcents_per_million, v_r_listed_output_microcents_per_million), coalesce(v_r_override_cache_read_microcents_per_million, v_r_listed_cache_read_microcents_per_million)) AS TEXT) END;
                END IF;
            END IF;
            SELECT true AS anon_1
            FROM authorizations
            WHERE authorizations.account_id = p_account_id AND p_account_id = v_account_id AND authorizations.request_id = v_h_request_id
             LIMIT 1
            INTO v_known;
            v_outcome := CASE WHEN (v_h_resolution IS NOT NULL AND v_resolution IS DISTINCT FROM v_h_resolution) THEN 'stale' WHEN (v_h_request_id IS NOT NULL AND v_known IS NOT NULL) THEN 'exists' WHEN (v_billing != 'prepaid' AND v_h_estimate_microcents > 9223372036854775807 - v_held) THEN 'out_of_range' WHEN (v_limit IS NOT NULL AND v_count >= v_limit) THEN 'concurrency_limit_exceeded' WHEN (v_billing = 'prepaid' AND v_h_estimate_microcents > v_available) THEN 'insufficient_credits' ELSE 'granted' END;
            IF v_outcome = 'granted' AND v_billing = 'prepaid' AND (v_h_project_limit IS NOT NULL OR v_h_member_limit IS NOT NULL OR v_h_spend_limit IS NOT NULL) THEN
                SELECT coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_project_window_start AND spent.day < v_h_project_window_end) AND api_keys.project_id = v_h_project_id), 0) AS project, coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_member_window_start AND spent.day < v_h_member_window_end) AND api_keys.member_id = v_h_member_id), 0) AS member, coalesce(sum(spent.amount) FILTER (WHERE (spent.day IS NULL OR spent.day >= v_h_window_start AND spent.day < v_h_window_end) AND api_keys.id = v_h_api_key_id), 0) AS key
                FROM (SELECT usage_rollups.api_key_id AS api_key_id, usage_rollups.cost_microcents AS amount, usage_rollups.bucket_start AS day
                FROM usage_rollups
                WHERE usage_rollups.account_id = p_account_id AND p_account_id = v_account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= least(v_h_project_window_start, v_h_member_window_start, v_h_window_start) AND usage_rollups.bucket_start < greatest(v_h_project_window_end, v_h_member_window_end, v_h_window_end) UNION ALL SELECT authorizations.api_key_id AS api_key_id, authorizations.estimate_microcents AS amount, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS day
                FROM authorizations
                WHERE authorizations.account_id = p_account_id AND p_account_id = v_account_id AND authorizations.status = 'active' AND authorizations.expires_at > v_h_created_at) AS spent JOIN api_keys ON api_keys.account_id = v_account_id AND api_keys.id = spent.api_key_id
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
            UPDATE accounts SET held_microcents=v_held, held_count=v_count WHERE accounts.id = p_account_id AND p_account_id = v_account_id;
        END IF;
    END IF;
END;
$$
