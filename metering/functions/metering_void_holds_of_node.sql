CREATE OR REPLACE FUNCTION metering_void_holds_of_node(p_voids json)
RETURNS TABLE (id VARCHAR(64), status VARCHAR(16), request_id VARCHAR(64), account_id VARCHAR(32), api_key_id VARCHAR(32), model_id VARCHAR(100), max_tokens INTEGER, estimate_microcents BIGINT, expires_at TIMESTAMP WITH TIME ZONE)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_part JSON;
    v_sf_id VARCHAR(64);
    v_sf_status hold_status;
    v_sf_request_id VARCHAR(64);
    v_sf_account_id VARCHAR(32);
    v_sf_api_key_id VARCHAR(32);
    v_sf_model_id VARCHAR(100);
    v_sf_max_tokens INTEGER;
    v_sf_estimate_microcents non_negative_microcents;
    v_sf_expires_at TIMESTAMP WITH TIME ZONE;
    v_account VARCHAR;
    v_account_part JSON;
BEGIN
    FOR v_shard, v_part IN
    SELECT get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id') AS part_key, json_agg(given.value ORDER BY given.position) AS part_rows
    FROM json_array_elements(p_voids) WITH ORDINALITY AS given(value, position) GROUP BY get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id') ORDER BY get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id')
    LOOP
        PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
        IF metering_shard_forms_here(v_shard) THEN
            FOR v_sf_id, v_sf_status, v_sf_request_id, v_sf_account_id, v_sf_api_key_id, v_sf_model_id, v_sf_max_tokens, v_sf_estimate_microcents, v_sf_expires_at IN
            SELECT not_delegable.id, not_delegable.status, not_delegable.request_id, not_delegable.account_id, not_delegable.api_key_id, not_delegable.model_id, not_delegable.max_tokens, not_delegable.estimate_microcents, not_delegable.expires_at
            FROM (SELECT shard_form.id AS id, shard_form.status AS status, shard_form.request_id AS request_id, shard_form.account_id AS account_id, shard_form.api_key_id AS api_key_id, shard_form.model_id AS model_id, shard_form.max_tokens AS max_tokens, shard_form.estimate_microcents AS estimate_microcents, shard_form.expires_at AS expires_at
            FROM metering_void_holds_of_shards(v_shard, CAST(NULL AS VARCHAR), v_part) AS shard_form
             LIMIT ALL OFFSET 0) AS not_delegable
            LOOP
                id := v_sf_id;
                status := v_sf_status;
                request_id := v_sf_request_id;
                account_id := v_sf_account_id;
                api_key_id := v_sf_api_key_id;
                model_id := v_sf_model_id;
                max_tokens := v_sf_max_tokens;
                estimate_microcents := v_sf_estimate_microcents;
                expires_at := v_sf_expires_at;
                RETURN NEXT;
            END LOOP;
        ELSE
            FOR v_account, v_account_part IN
            SELECT given.value ->> 'account_id' AS part_key, json_agg(given.value ORDER BY given.position) AS part_rows
            FROM json_array_elements(v_part) WITH ORDINALITY AS given(value, position) GROUP BY given.value ->> 'account_id' ORDER BY (given.value ->> 'account_id') COLLATE "C"
            LOOP
                FOR v_sf_id, v_sf_status, v_sf_request_id, v_sf_account_id, v_sf_api_key_id, v_sf_model_id, v_sf_max_tokens, v_sf_estimate_microcents, v_sf_expires_at IN
                SELECT not_delegable.id, not_delegable.status, not_delegable.request_id, not_delegable.account_id, not_delegable.api_key_id, not_delegable.model_id, not_delegable.max_tokens, not_delegable.estimate_microcents, not_delegable.expires_at
                FROM (SELECT account_form.id AS id, account_form.status AS status, account_form.request_id AS request_id, account_form.account_id AS account_id, account_form.api_key_id AS api_key_id, account_form.model_id AS model_id, account_form.max_tokens AS max_tokens, account_form.estimate_microcents AS estimate_microcents, account_form.expires_at AS expires_at
                FROM metering_void_holds_of_account(v_account, v_account_part) AS account_form
                 LIMIT ALL OFFSET 0) AS not_delegable
                LOOP
                    id := v_sf_id;
                    status := v_sf_status;
                    request_id := v_sf_request_id;
                    account_id := v_sf_account_id;
                    api_key_id := v_sf_api_key_id;
                    model_id := v_sf_model_id;
                    max_tokens := v_sf_max_tokens;
                    estimate_microcents := v_sf_estimate_microcents;
                    expires_at := v_sf_expires_at;
                    RETURN NEXT;
                END LOOP;
            END LOOP;
        END IF;
    END LOOP;
END;
$$
