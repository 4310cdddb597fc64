CREATE OR REPLACE FUNCTION metering_void_holds_of_account(p_account_id VARCHAR, p_voids json)
RETURNS TABLE (id VARCHAR(64), status VARCHAR(16), request_id VARCHAR(64), account_id VARCHAR(32), api_key_id VARCHAR(32), model_id VARCHAR(100), max_tokens INTEGER, estimate_microcents BIGINT, expires_at TIMESTAMP WITH TIME ZONE)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_sf_id VARCHAR(64);
    v_sf_status hold_status;
    v_sf_request_id VARCHAR(64);
    v_sf_account_id VARCHAR(32);
    v_sf_api_key_id VARCHAR(32);
    v_sf_model_id VARCHAR(100);
    v_sf_max_tokens INTEGER;
    v_sf_estimate_microcents non_negative_microcents;
    v_sf_expires_at TIMESTAMP WITH TIME ZONE;
    v_asked_account_id VARCHAR(32);
    v_asked_hold_id VARCHAR;
    v_asked_now TIMESTAMP WITH TIME ZONE;
    v_voided_id VARCHAR(64);
    v_voided_status hold_status;
    v_voided_request_id VARCHAR(64);
    v_voided_account_id VARCHAR(32);
    v_voided_api_key_id VARCHAR(32);
    v_voided_model_id VARCHAR(100);
    v_voided_max_tokens INTEGER;
    v_voided_estimate_microcents non_negative_microcents;
    v_voided_expires_at TIMESTAMP WITH TIME ZONE;
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    IF metering_shard_forms_here(v_shard) THEN
        FOR v_sf_id, v_sf_status, v_sf_request_id, v_sf_account_id, v_sf_api_key_id, v_sf_model_id, v_sf_max_tokens, v_sf_estimate_microcents, v_sf_expires_at IN
        SELECT not_delegable.id, not_delegable.status, not_delegable.request_id, not_delegable.account_id, not_delegable.api_key_id, not_delegable.model_id, not_delegable.max_tokens, not_delegable.estimate_microcents, not_delegable.expires_at
        FROM (SELECT shard_form.id AS id, shard_form.status AS status, shard_form.request_id AS request_id, shard_form.account_id AS account_id, shard_form.api_key_id AS api_key_id, shard_form.model_id AS model_id, shard_form.max_tokens AS max_tokens, shard_form.estimate_microcents AS estimate_microcents, shard_form.expires_at AS expires_at
        FROM metering_void_holds_of_shards(v_shard, p_account_id, p_voids) AS shard_form
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
        FOR v_asked_account_id, v_asked_hold_id, v_asked_now IN
        SELECT asked.account_id, asked.hold_id, asked.now
        FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_voids AS json)) AS (account_id VARCHAR(32), hold_id VARCHAR, now TIMESTAMP WITH TIME ZONE)) WITH ORDINALITY AS t(account_id, hold_id, now, position)) AS asked ORDER BY asked.account_id COLLATE "C", asked.hold_id COLLATE "C", asked.position
        LOOP
            UPDATE authorizations SET status='voided', closed_at=v_asked_now WHERE authorizations.account_id = p_account_id AND p_account_id = v_asked_account_id AND authorizations.id = v_asked_hold_id AND authorizations.status = 'active' AND authorizations.expires_at > v_asked_now RETURNING authorizations.id, authorizations.status, authorizations.request_id, authorizations.account_id, authorizations.api_key_id, authorizations.model_id, authorizations.max_tokens, authorizations.estimate_microcents, authorizations.expires_at
            INTO v_voided_id, v_voided_status, v_voided_request_id, v_voided_account_id, v_voided_api_key_id, v_voided_model_id, v_voided_max_tokens, v_voided_estimate_microcents, v_voided_expires_at;
            IF v_voided_id IS NOT NULL THEN
                id := v_voided_id;
                status := v_voided_status;
                request_id := v_voided_request_id;
                account_id := v_voided_account_id;
                api_key_id := v_voided_api_key_id;
                model_id := v_voided_model_id;
                max_tokens := v_voided_max_tokens;
                estimate_microcents := v_voided_estimate_microcents;
                expires_at := v_voided_expires_at;
                RETURN NEXT;
            END IF;
        END LOOP;
    END IF;
END;
$$
