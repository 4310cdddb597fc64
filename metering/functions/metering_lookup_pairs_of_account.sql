CREATE OR REPLACE FUNCTION metering_lookup_pairs_of_account(p_account_id VARCHAR, p_pairs json)
RETURNS TABLE (kind VARCHAR, a VARCHAR, b VARCHAR, c VARCHAR, at TIMESTAMP WITH TIME ZONE, price_version_id VARCHAR, input_microcents_per_million BIGINT, output_microcents_per_million BIGINT, cache_read_microcents_per_million BIGINT, project_id VARCHAR(32), member_id VARCHAR(32), spend_limit BIGINT, spend_window VARCHAR(8), scope_limits BOOLEAN)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_sf_kind VARCHAR;
    v_sf_a VARCHAR;
    v_sf_b VARCHAR;
    v_sf_c VARCHAR;
    v_sf_at TIMESTAMP WITH TIME ZONE;
    v_sf_price_version_id VARCHAR;
    v_sf_input_microcents_per_million BIGINT;
    v_sf_output_microcents_per_million BIGINT;
    v_sf_cache_read_microcents_per_million BIGINT;
    v_sf_project_id VARCHAR(32);
    v_sf_member_id VARCHAR(32);
    v_sf_spend_limit BIGINT;
    v_sf_spend_window VARCHAR(8);
    v_sf_scope_limits BOOLEAN;
    v_lookup_kind VARCHAR;
    v_lookup_a VARCHAR;
    v_lookup_b VARCHAR;
    v_lookup_c VARCHAR;
    v_lookup_at TIMESTAMP WITH TIME ZONE;
    v_lookup_price_version_id VARCHAR;
    v_lookup_input_microcents_per_million BIGINT;
    v_lookup_output_microcents_per_million BIGINT;
    v_lookup_cache_read_microcents_per_million BIGINT;
    v_lookup_project_id VARCHAR(32);
    v_lookup_member_id VARCHAR(32);
    v_lookup_spend_limit BIGINT;
    v_lookup_spend_window VARCHAR(8);
    v_lookup_scope_limits BOOLEAN;
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    IF metering_shard_forms_here(v_shard) THEN
        FOR v_sf_kind, v_sf_a, v_sf_b, v_sf_c, v_sf_at, v_sf_price_version_id, v_sf_input_microcents_per_million, v_sf_output_microcents_per_million, v_sf_cache_read_microcents_per_million, v_sf_project_id, v_sf_member_id, v_sf_spend_limit, v_sf_spend_window, v_sf_scope_limits IN
        SELECT not_delegable.kind, not_delegable.a, not_delegable.b, not_delegable.c, not_delegable.at, not_delegable.price_version_id, not_delegable.input_microcents_per_million, not_delegable.output_microcents_per_million, not_delegable.cache_read_microcents_per_million, not_delegable.project_id, not_delegable.member_id, not_delegable.spend_limit, not_delegable.spend_window, not_delegable.scope_limits
        FROM (SELECT shard_form.kind AS kind, shard_form.a AS a, shard_form.b AS b, shard_form.c AS c, shard_form.at AS at, shard_form.price_version_id AS price_version_id, shard_form.input_microcents_per_million AS input_microcents_per_million, shard_form.output_microcents_per_million AS output_microcents_per_million, shard_form.cache_read_microcents_per_million AS cache_read_microcents_per_million, shard_form.project_id AS project_id, shard_form.member_id AS member_id, shard_form.spend_limit AS spend_limit, shard_form.spend_window AS spend_window, shard_form.scope_limits AS scope_limits
        FROM metering_lookup_pairs_of_shards(v_shard, p_account_id, p_pairs) AS shard_form
         LIMIT ALL OFFSET 0) AS not_delegable
        LOOP
            kind := v_sf_kind;
            a := v_sf_a;
            b := v_sf_b;
            c := v_sf_c;
            at := v_sf_at;
            price_version_id := v_sf_price_version_id;
            input_microcents_per_million := v_sf_input_microcents_per_million;
            output_microcents_per_million := v_sf_output_microcents_per_million;
            cache_read_microcents_per_million := v_sf_cache_read_microcents_per_million;
            project_id := v_sf_project_id;
            member_id := v_sf_member_id;
            spend_limit := v_sf_spend_limit;
            spend_window := v_sf_spend_window;
            scope_limits := v_sf_scope_limits;
            RETURN NEXT;
        END LOOP;
    ELSE
        FOR v_lookup_kind, v_lookup_a, v_lookup_b, v_lookup_c, v_lookup_at, v_lookup_price_version_id, v_lookup_input_microcents_per_million, v_lookup_output_microcents_per_million, v_lookup_cache_read_microcents_per_million, v_lookup_project_id, v_lookup_member_id, v_lookup_spend_limit, v_lookup_spend_window, v_lookup_scope_limits IN
        WITH keyed AS
        (SELECT api_keys.id AS api_key_id, api_keys.account_id AS account_id, accounts.billing AS billing, api_keys.project_id AS project_id, api_keys.member_id AS member_id, api_keys.monthly_spend_limit_microcents AS spend_limit, api_keys.spend_limit_window AS spend_window, accounts.scope_limits AS scope_limits, pair.model_key AS model_key, catalog_models.id AS model_id
        FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_pairs AS json)) AS (api_key_id VARCHAR, model_key VARCHAR)) WITH ORDINALITY AS t(api_key_id, model_key, position)) AS pair JOIN api_keys ON api_keys.id = pair.api_key_id JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS accounts ON accounts.id = api_keys.account_id LEFT OUTER JOIN catalog_models ON catalog_models.id_key = pair.model_key)
         SELECT DISTINCT 'key' AS kind, keyed.api_key_id, keyed.account_id, keyed.billing, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS anon_1, CAST(NULL AS VARCHAR) AS anon__1, CAST(NULL AS BIGINT) AS anon__2, CAST(NULL AS BIGINT) AS anon__3, CAST(NULL AS BIGINT) AS anon__4, keyed.project_id, keyed.member_id, keyed.spend_limit, keyed.spend_window, keyed.scope_limits
        FROM keyed UNION ALL SELECT DISTINCT 'model' AS anon_2, keyed.model_key, keyed.model_id, CAST(NULL AS VARCHAR) AS anon_1, CAST(NULL AS TIMESTAMP WITH TIME ZONE) AS anon__5, CAST(NULL AS VARCHAR) AS anon__6, CAST(NULL AS BIGINT) AS anon__7, CAST(NULL AS BIGINT) AS anon__8, CAST(NULL AS BIGINT) AS anon__9, CAST(NULL AS VARCHAR(32)) AS anon__10, CAST(NULL AS VARCHAR(32)) AS anon__11, CAST(NULL AS BIGINT) AS anon__12, CAST(NULL AS VARCHAR(8)) AS anon__13, CAST(NULL AS BOOLEAN) AS anon__14
        FROM keyed
        WHERE keyed.model_id IS NOT NULL UNION ALL SELECT 'price' AS anon_3, instant.account_id, instant.model_id, CAST(NULL AS VARCHAR) AS anon_1, instant.effective_at, coalesce(override.id, listed.id) AS price_version_id, coalesce(override.input_microcents_per_million, listed.input_microcents_per_million) AS input_microcents_per_million, coalesce(override.output_microcents_per_million, listed.output_microcents_per_million) AS output_microcents_per_million, coalesce(override.cache_read_microcents_per_million, listed.cache_read_microcents_per_million) AS cache_read_microcents_per_million, CAST(NULL AS VARCHAR(32)) AS anon__15, CAST(NULL AS VARCHAR(32)) AS anon__16, CAST(NULL AS BIGINT) AS anon__17, CAST(NULL AS VARCHAR(8)) AS anon__18, CAST(NULL AS BOOLEAN) AS anon__19
        FROM (SELECT prepaid.account_id AS account_id, prepaid.model_id AS model_id, price_versions.effective_at AS effective_at
        FROM (SELECT DISTINCT keyed.account_id AS account_id, keyed.model_id AS model_id
        FROM keyed
        WHERE keyed.billing = 'prepaid' AND keyed.model_id IS NOT NULL) AS prepaid JOIN price_versions ON price_versions.model_id = prepaid.model_id UNION SELECT prepaid.account_id AS account_id, prepaid.model_id AS model_id, account_rates.effective_at AS effective_at
        FROM (SELECT DISTINCT keyed.account_id AS account_id, keyed.model_id AS model_id
        FROM keyed
        WHERE keyed.billing = 'prepaid' AND keyed.model_id IS NOT NULL) AS prepaid JOIN (SELECT * FROM account_rates WHERE account_rates.account_id = p_account_id) AS account_rates ON account_rates.account_id = prepaid.account_id AND account_rates.model_id = prepaid.model_id) AS instant LEFT OUTER JOIN (SELECT * FROM account_rates WHERE account_rates.account_id = p_account_id) AS override ON override.account_id = instant.account_id AND override.id = (SELECT account_rates.id
        FROM (SELECT * FROM account_rates WHERE account_rates.account_id = p_account_id) AS account_rates
        WHERE account_rates.account_id = instant.account_id AND account_rates.model_id = instant.model_id AND account_rates.effective_at <= instant.effective_at ORDER BY account_rates.effective_at DESC
         LIMIT 1) AND override.input_microcents_per_million IS NOT NULL LEFT OUTER JOIN price_versions AS listed ON listed.id = (SELECT price_versions.id
        FROM price_versions
        WHERE price_versions.model_id = instant.model_id AND price_versions.effective_at <= instant.effective_at ORDER BY price_versions.effective_at DESC
         LIMIT 1)
        LOOP
            kind := v_lookup_kind;
            a := v_lookup_a;
            b := v_lookup_b;
            c := v_lookup_c;
            at := v_lookup_at;
            price_version_id := v_lookup_price_version_id;
            input_microcents_per_million := v_lookup_input_microcents_per_million;
            output_microcents_per_million := v_lookup_output_microcents_per_million;
            cache_read_microcents_per_million := v_lookup_cache_read_microcents_per_million;
            project_id := v_lookup_project_id;
            member_id := v_lookup_member_id;
            spend_limit := v_lookup_spend_limit;
            spend_window := v_lookup_spend_window;
            scope_limits := v_lookup_scope_limits;
            RETURN NEXT;
        END LOOP;
    END IF;
END;
$$
