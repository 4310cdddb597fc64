CREATE OR REPLACE FUNCTION metering_lookup_of_account(p_account_id VARCHAR, p_api_key_id VARCHAR, p_model_key VARCHAR)
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
    v_l_api_keys_found BOOLEAN;
    v_l_api_keys_id VARCHAR(32);
    v_l_api_keys_account_id VARCHAR(32);
    v_l_api_keys_project_id VARCHAR(32);
    v_l_api_keys_member_id VARCHAR(32);
    v_l_api_keys_monthly_spend_limit_microcents BIGINT;
    v_l_api_keys_spend_limit_window VARCHAR(8);
    v_l_accounts_found BOOLEAN;
    v_l_accounts_billing account_billing;
    v_l_accounts_scope_limits BOOLEAN;
    v_l_catalog_models_id VARCHAR(100);
    v_l_at TIMESTAMP WITH TIME ZONE;
    v_p_1 VARCHAR(32);
    v_p_override_found BOOLEAN;
    v_p_override_id VARCHAR(32);
    v_p_override_input_microcents_per_million BIGINT;
    v_p_override_output_microcents_per_million BIGINT;
    v_p_override_cache_read_microcents_per_million BIGINT;
    v_p_listed_id VARCHAR(32);
    v_p_listed_input_microcents_per_million BIGINT;
    v_p_listed_output_microcents_per_million BIGINT;
    v_p_listed_cache_read_microcents_per_million BIGINT;
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    IF metering_shard_forms_here(v_shard) THEN
        FOR v_sf_kind, v_sf_a, v_sf_b, v_sf_c, v_sf_at, v_sf_price_version_id, v_sf_input_microcents_per_million, v_sf_output_microcents_per_million, v_sf_cache_read_microcents_per_million, v_sf_project_id, v_sf_member_id, v_sf_spend_limit, v_sf_spend_window, v_sf_scope_limits IN
        SELECT not_delegable.kind, not_delegable.a, not_delegable.b, not_delegable.c, not_delegable.at, not_delegable.price_version_id, not_delegable.input_microcents_per_million, not_delegable.output_microcents_per_million, not_delegable.cache_read_microcents_per_million, not_delegable.project_id, not_delegable.member_id, not_delegable.spend_limit, not_delegable.spend_window, not_delegable.scope_limits
        FROM (SELECT shard_form.kind AS kind, shard_form.a AS a, shard_form.b AS b, shard_form.c AS c, shard_form.at AS at, shard_form.price_version_id AS price_version_id, shard_form.input_microcents_per_million AS input_microcents_per_million, shard_form.output_microcents_per_million AS output_microcents_per_million, shard_form.cache_read_microcents_per_million AS cache_read_microcents_per_million, shard_form.project_id AS project_id, shard_form.member_id AS member_id, shard_form.spend_limit AS spend_limit, shard_form.spend_window AS spend_window, shard_form.scope_limits AS scope_limits
        FROM metering_lookup_of_shards(v_shard, p_account_id, p_api_key_id, p_model_key) AS shard_form
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
        kind := 'text';
        a := p_api_key_id;
        b := p_model_key;
        c := (WITH keyed AS
        (SELECT api_keys.id AS api_key_id, api_keys.account_id AS account_id, accounts.billing AS billing, api_keys.project_id AS project_id, api_keys.member_id AS member_id, api_keys.monthly_spend_limit_microcents AS spend_limit, api_keys.spend_limit_window AS spend_window, accounts.scope_limits AS scope_limits, p_model_key AS model_key, catalog_models.id AS model_id
        FROM api_keys JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS accounts ON accounts.id = api_keys.account_id LEFT OUTER JOIN catalog_models ON catalog_models.id_key = p_model_key
        WHERE api_keys.id = p_api_key_id)
         SELECT CAST(array_agg(CAST(every AS TEXT) ORDER BY CAST(every AS TEXT)) AS TEXT) AS array_agg_1
        FROM (SELECT 'keyed' AS source, CAST(keyed AS TEXT) AS row
        FROM keyed UNION ALL SELECT 'price_versions' AS anon_1, CAST(price_versions AS TEXT) AS price_versions
        FROM keyed JOIN price_versions ON price_versions.model_id = keyed.model_id UNION ALL SELECT 'account_rates' AS anon_2, CAST(account_rates AS TEXT) AS account_rates
        FROM keyed JOIN (SELECT * FROM account_rates WHERE account_rates.account_id = p_account_id) AS account_rates ON account_rates.account_id = keyed.account_id AND account_rates.model_id = keyed.model_id) AS every);
        at := CAST(NULL AS TIMESTAMP WITH TIME ZONE);
        price_version_id := CAST(NULL AS VARCHAR);
        input_microcents_per_million := CAST(NULL AS BIGINT);
        output_microcents_per_million := CAST(NULL AS BIGINT);
        cache_read_microcents_per_million := CAST(NULL AS BIGINT);
        project_id := CAST(NULL AS VARCHAR(32));
        member_id := CAST(NULL AS VARCHAR(32));
        spend_limit := CAST(NULL AS BIGINT);
        spend_window := CAST(NULL AS VARCHAR(8));
        scope_limits := CAST(NULL AS BOOLEAN);
        RETURN NEXT;
        SELECT true AS anon_1, api_keys.id, api_keys.account_id, api_keys.project_id, api_keys.member_id, api_keys.monthly_spend_limit_microcents, api_keys.spend_limit_window
        FROM api_keys
        WHERE api_keys.id = p_api_key_id
        INTO v_l_api_keys_found, v_l_api_keys_id, v_l_api_keys_account_id, v_l_api_keys_project_id, v_l_api_keys_member_id, v_l_api_keys_monthly_spend_limit_microcents, v_l_api_keys_spend_limit_window;
        IF v_l_api_keys_account_id IS NOT NULL THEN
            SELECT true AS anon_1, accounts.billing, accounts.scope_limits
            FROM accounts
            WHERE accounts.id = p_account_id AND p_account_id = v_l_api_keys_account_id
            INTO v_l_accounts_found, v_l_accounts_billing, v_l_accounts_scope_limits;
        ELSE
            v_l_accounts_found := NULL;
            v_l_accounts_billing := NULL;
            v_l_accounts_scope_limits := NULL;
        END IF;
        SELECT catalog_models.id
        FROM catalog_models
        WHERE catalog_models.id_key = p_model_key
        INTO v_l_catalog_models_id;
        IF v_l_api_keys_found IS NOT NULL AND v_l_accounts_found IS NOT NULL THEN
            kind := 'key';
            a := v_l_api_keys_id;
            b := v_l_api_keys_account_id;
            c := v_l_accounts_billing;
            at := CAST(NULL AS TIMESTAMP WITH TIME ZONE);
            price_version_id := CAST(NULL AS VARCHAR);
            input_microcents_per_million := CAST(NULL AS BIGINT);
            output_microcents_per_million := CAST(NULL AS BIGINT);
            cache_read_microcents_per_million := CAST(NULL AS BIGINT);
            project_id := v_l_api_keys_project_id;
            member_id := v_l_api_keys_member_id;
            spend_limit := v_l_api_keys_monthly_spend_limit_microcents;
            spend_window := v_l_api_keys_spend_limit_window;
            scope_limits := v_l_accounts_scope_limits;
            RETURN NEXT;
            IF v_l_catalog_models_id IS NOT NULL THEN
                kind := 'model';
                a := p_model_key;
                b := v_l_catalog_models_id;
                c := CAST(NULL AS VARCHAR);
                at := CAST(NULL AS TIMESTAMP WITH TIME ZONE);
                price_version_id := CAST(NULL AS VARCHAR);
                input_microcents_per_million := CAST(NULL AS BIGINT);
                output_microcents_per_million := CAST(NULL AS BIGINT);
                cache_read_microcents_per_million := CAST(NULL AS BIGINT);
                project_id := CAST(NULL AS VARCHAR(32));
                member_id := CAST(NULL AS VARCHAR(32));
                spend_limit := CAST(NULL AS BIGINT);
                spend_window := CAST(NULL AS VARCHAR(8));
                scope_limits := CAST(NULL AS BOOLEAN);
                RETURN NEXT;
            END IF;
            IF v_l_accounts_billing = 'prepaid' AND v_l_catalog_models_id IS NOT NULL THEN
                FOR v_l_at IN
                SELECT price_versions.effective_at
                FROM price_versions
                WHERE price_versions.model_id = v_l_catalog_models_id
                LOOP
                    SELECT account_rates.id
                    FROM account_rates
                    WHERE account_rates.account_id = p_account_id AND p_account_id = v_l_api_keys_account_id AND account_rates.model_id = v_l_catalog_models_id AND account_rates.effective_at <= v_l_at ORDER BY account_rates.effective_at DESC
                     LIMIT 1
                    INTO v_p_1;
                    IF v_p_1 IS NOT NULL THEN
                        SELECT true AS anon_1, override.id, override.input_microcents_per_million, override.output_microcents_per_million, override.cache_read_microcents_per_million
                        FROM account_rates AS override
                        WHERE override.account_id = p_account_id AND p_account_id = v_l_api_keys_account_id AND override.id = v_p_1 AND override.input_microcents_per_million IS NOT NULL
                        INTO v_p_override_found, v_p_override_id, v_p_override_input_microcents_per_million, v_p_override_output_microcents_per_million, v_p_override_cache_read_microcents_per_million;
                    ELSE
                        v_p_override_found := NULL;
                        v_p_override_id := NULL;
                        v_p_override_input_microcents_per_million := NULL;
                        v_p_override_output_microcents_per_million := NULL;
                        v_p_override_cache_read_microcents_per_million := NULL;
                    END IF;
                    SELECT price_versions.id, price_versions.input_microcents_per_million, price_versions.output_microcents_per_million, price_versions.cache_read_microcents_per_million
                    FROM price_versions
                    WHERE price_versions.model_id = v_l_catalog_models_id AND price_versions.effective_at <= v_l_at ORDER BY price_versions.effective_at DESC
                     LIMIT 1
                    INTO v_p_listed_id, v_p_listed_input_microcents_per_million, v_p_listed_output_microcents_per_million, v_p_listed_cache_read_microcents_per_million;
                    kind := 'price';
                    a := v_l_api_keys_account_id;
                    b := v_l_catalog_models_id;
                    c := CAST(NULL AS VARCHAR);
                    at := v_l_at;
                    price_version_id := coalesce(v_p_override_id, v_p_listed_id);
                    input_microcents_per_million := coalesce(v_p_override_input_microcents_per_million, v_p_listed_input_microcents_per_million);
                    output_microcents_per_million := coalesce(v_p_override_output_microcents_per_million, v_p_listed_output_microcents_per_million);
                    cache_read_microcents_per_million := coalesce(v_p_override_cache_read_microcents_per_million, v_p_listed_cache_read_microcents_per_million);
                    project_id := CAST(NULL AS VARCHAR(32));
                    member_id := CAST(NULL AS VARCHAR(32));
                    spend_limit := CAST(NULL AS BIGINT);
                    spend_window := CAST(NULL AS VARCHAR(8));
                    scope_limits := CAST(NULL AS BOOLEAN);
                    RETURN NEXT;
                END LOOP;
                FOR v_l_at IN
                SELECT account_rates.effective_at
                FROM account_rates
                WHERE account_rates.account_id = p_account_id AND p_account_id = v_l_api_keys_account_id AND account_rates.model_id = v_l_catalog_models_id
                LOOP
                    SELECT account_rates.id
                    FROM account_rates
                    WHERE account_rates.account_id = p_account_id AND p_account_id = v_l_api_keys_account_id AND account_rates.model_id = v_l_catalog_models_id AND account_rates.effective_at <= v_l_at ORDER BY account_rates.effective_at DESC
                     LIMIT 1
                    INTO v_p_1;
                    IF v_p_1 IS NOT NULL THEN
                        SELECT true AS anon_1, override.id, override.input_microcents_per_million, override.output_microcents_per_million, override.cache_read_microcents_per_million
                        FROM account_rates AS override
                        WHERE override.account_id = p_account_id AND p_account_id = v_l_api_keys_account_id AND override.id = v_p_1 AND override.input_microcents_per_million IS NOT NULL
                        INTO v_p_override_found, v_p_override_id, v_p_override_input_microcents_per_million, v_p_override_output_microcents_per_million, v_p_override_cache_read_microcents_per_million;
                    ELSE
                        v_p_override_found := NULL;
                        v_p_override_id := NULL;
                        v_p_override_input_microcents_per_million := NULL;
                        v_p_override_output_microcents_per_million := NULL;
                        v_p_override_cache_read_microcents_per_million := NULL;
                    END IF;
                    SELECT price_versions.id, price_versions.input_microcents_per_million, price_versions.output_microcents_per_million, price_versions.cache_read_microcents_per_million
                    FROM price_versions
                    WHERE price_versions.model_id = v_l_catalog_models_id AND price_versions.effective_at <= v_l_at ORDER BY price_versions.effective_at DESC
                     LIMIT 1
                    INTO v_p_listed_id, v_p_listed_input_microcents_per_million, v_p_listed_output_microcents_per_million, v_p_listed_cache_read_microcents_per_million;
                    kind := 'price';
                    a := v_l_api_keys_account_id;
                    b := v_l_catalog_models_id;
                    c := CAST(NULL AS VARCHAR);
                    at := v_l_at;
                    price_version_id := coalesce(v_p_override_id, v_p_listed_id);
                    input_microcents_per_million := coalesce(v_p_override_input_microcents_per_million, v_p_listed_input_microcents_per_million);
                    output_microcents_per_million := coalesce(v_p_override_output_microcents_per_million, v_p_listed_output_microcents_per_million);
                    cache_read_microcents_per_million := coalesce(v_p_override_cache_read_microcents_per_million, v_p_listed_cache_read_microcents_per_million);
                    project_id := CAST(NULL AS VARCHAR(32));
                    member_id := CAST(NULL AS VARCHAR(32));
                    spend_limit := CAST(NULL AS BIGINT);
                    spend_window := CAST(NULL AS VARCHAR(8));
                    scope_limits := CAST(NULL AS BOOLEAN);
                    RETURN NEXT;
                END LOOP;
            END IF;
        END IF;
    END IF;
END;
$$
