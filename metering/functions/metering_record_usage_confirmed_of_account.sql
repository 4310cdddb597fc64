CREATE OR REPLACE FUNCTION metering_record_usage_confirmed_of_account(p_account_id VARCHAR, p_now TIMESTAMP WITH TIME ZONE, p_events json, p_prepaid BOOLEAN, p_rollups json, p_spend_limits json, p_spend_limited BOOLEAN, p_lookup_key_id VARCHAR, p_lookup_model_key VARCHAR, p_lookup_text VARCHAR)
RETURNS TABLE (usage_event_id BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_sf_usage_event_id BIGINT;
    v_new_id BIGINT[];
    v_new_account_id VARCHAR(32)[];
    v_new_request_id VARCHAR(64)[];
    v_new_api_key_id VARCHAR(32)[];
    v_new_authorization_id VARCHAR(64)[];
    v_new_total_microcents BIGINT[];
    v_newest BIGINT;
    v_row1_0 VARCHAR(32);
    v_row1_1 VARCHAR(64);
    v_row1_2 VARCHAR(32);
    v_row1_3 VARCHAR(100);
    v_row1_4 usage_api;
    v_row1_5 usage_outcome;
    v_row1_6 TIMESTAMP WITH TIME ZONE;
    v_row1_7 VARCHAR(64);
    v_row1_8 INTEGER;
    v_row1_9 INTEGER;
    v_row1_10 INTEGER;
    v_row1_11 INTEGER;
    v_row1_12 BIGINT;
    v_row1_13 BIGINT;
    v_row1_14 BIGINT;
    v_row1_15 BIGINT;
    v_row1_16 VARCHAR(32);
    v_row1_17 TIMESTAMP WITH TIME ZONE;
    v_row1_id BIGINT;
    v_row1_returned_id BIGINT;
    v_row1_returned_account_id VARCHAR(32);
    v_row1_returned_request_id VARCHAR(64);
    v_row1_returned_api_key_id VARCHAR(32);
    v_row1_returned_authorization_id VARCHAR(64);
    v_row1_returned_total_microcents BIGINT;
    v_targets_hold_id VARCHAR(64)[];
    v_targets_event_id BIGINT[];
    v_charge_account_id VARCHAR(32);
    v_charge_request_id VARCHAR(64);
    v_charge_authorization_id VARCHAR(64);
    v_charge_usage_event_id BIGINT;
    v_charge_hold VARCHAR(64);
    v_target_hold VARCHAR(64);
    v_target_event BIGINT;
    v_row2_0 VARCHAR(32);
    v_row2_1 VARCHAR;
    v_row2_2 BIGINT;
    v_row2_3 BIGINT;
    v_row2_4 VARCHAR(32);
    v_row2_5 TIMESTAMP WITH TIME ZONE;
    v_row2_id BIGINT;
    v_debits_account_id VARCHAR(32)[];
    v_debits_total BIGINT[];
    v_moved_account_id VARCHAR(32)[];
    v_moved_after_microcents BIGINT[];
    v_moved_expiring BIGINT[];
    v_moved_crossing BIGINT[];
    v_debit_account_id VARCHAR(32);
    v_debit_total BIGINT;
    v_debited_account_id VARCHAR(32);
    v_debited_after_microcents BIGINT;
    v_debited_expiring BIGINT;
    v_debited_crossing BIGINT;
    v_due_grant_id VARCHAR(32)[];
    v_due_account_id VARCHAR(32)[];
    v_due_amount BIGINT[];
    v_due_expires_at TIMESTAMP WITH TIME ZONE[];
    v_row3_0 VARCHAR(32);
    v_row3_1 VARCHAR;
    v_row3_2 BIGINT;
    v_row3_3 VARCHAR(32);
    v_row3_4 TIMESTAMP WITH TIME ZONE;
    v_row3_5 TIMESTAMP WITH TIME ZONE;
    v_row3_id BIGINT;
    v_row4_0 VARCHAR;
    v_row4_1 VARCHAR(32);
    v_row4_2 VARCHAR;
    v_row4_3 TEXT;
    v_row4_4 TIMESTAMP WITH TIME ZONE;
    v_row4_id BIGINT;
    v_paid_account_id VARCHAR(32)[];
    v_paid_grant_id VARCHAR(32)[];
    v_paid_amount BIGINT[];
    v_whole_account_id VARCHAR(32);
    v_whole_total BIGINT;
    v_first_grant_id VARCHAR(32);
    v_first_remaining BIGINT;
    v_first_updated VARCHAR(32);
    v_row5_0 VARCHAR(32);
    v_row5_1 DATE;
    v_row5_2 VARCHAR;
    v_row5_3 VARCHAR(32);
    v_row5_4 BIGINT;
    v_unpaid_account_id VARCHAR(32)[];
    v_unpaid_total BIGINT[];
    v_parts_grant_id VARCHAR(32)[];
    v_parts_account_id VARCHAR(32)[];
    v_parts_amount BIGINT[];
    v_parts_kind allocation_kind[];
    v_row6_0 VARCHAR(32);
    v_row6_1 DATE;
    v_row6_2 VARCHAR;
    v_row6_3 VARCHAR(32);
    v_row6_4 BIGINT;
    v_hour_account_id VARCHAR(32);
    v_hour_api_key_id VARCHAR(32);
    v_hour_model_id VARCHAR(100);
    v_hour_hour TIMESTAMP WITH TIME ZONE;
    v_hour_day TIMESTAMP WITH TIME ZONE;
    v_hour_requests BIGINT;
    v_hour_input_tokens BIGINT;
    v_hour_cache_read_tokens BIGINT;
    v_hour_output_tokens BIGINT;
    v_hour_reasoning_tokens BIGINT;
    v_hour_cost_microcents BIGINT;
    v_reached_account_id VARCHAR(32)[];
    v_reached_scope_id VARCHAR(32)[];
    v_reached_percent INTEGER[];
    v_reached_spent_microcents BIGINT[];
    v_row7_0 VARCHAR;
    v_row7_1 VARCHAR(32);
    v_row7_2 VARCHAR;
    v_row7_3 TEXT;
    v_row7_4 TIMESTAMP WITH TIME ZONE;
    v_row7_id BIGINT;
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    IF metering_shard_forms_here(v_shard) THEN
        FOR v_sf_usage_event_id IN
        SELECT not_delegable.usage_event_id
        FROM (SELECT shard_form.usage_event_id AS usage_event_id
        FROM metering_record_usage_confirmed_of_shards(v_shard, p_account_id, p_now, p_events, p_prepaid, p_rollups, p_spend_limits, p_spend_limited, p_lookup_key_id, p_lookup_model_key, p_lookup_text) AS shard_form
         LIMIT ALL OFFSET 0) AS not_delegable
        LOOP
            usage_event_id := v_sf_usage_event_id;
            RETURN NEXT;
        END LOOP;
    ELSE
        IF (WITH keyed AS
        (SELECT api_keys.id AS api_key_id, api_keys.account_id AS account_id, accounts.billing AS billing, api_keys.project_id AS project_id, api_keys.member_id AS member_id, api_keys.monthly_spend_limit_microcents AS spend_limit, api_keys.spend_limit_window AS spend_window, accounts.scope_limits AS scope_limits, p_lookup_model_key AS model_key, catalog_models.id AS model_id
        FROM api_keys JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS accounts ON accounts.id = api_keys.account_id LEFT OUTER JOIN catalog_models ON catalog_models.id_key = p_lookup_model_key
        WHERE api_keys.id = p_lookup_key_id)
         SELECT CAST(array_agg(CAST(every AS TEXT) ORDER BY CAST(every AS TEXT)) AS TEXT) AS array_agg_1
        FROM (SELECT 'keyed' AS source, CAST(keyed AS TEXT) AS row
        FROM keyed UNION ALL SELECT 'price_versions' AS anon_1, CAST(price_versions AS TEXT) AS price_versions
        FROM keyed JOIN price_versions ON price_versions.model_id = keyed.model_id UNION ALL SELECT 'account_rates' AS anon_2, CAST(account_rates AS TEXT) AS account_rates
        FROM keyed JOIN (SELECT * FROM account_rates WHERE account_rates.account_id = p_account_id) AS account_rates ON account_rates.account_id = keyed.account_id AND account_rates.model_id = keyed.model_id) AS every) = p_lookup_text THEN
            v_new_id := NULL;
            v_new_account_id := NULL;
            v_new_request_id := NULL;
            v_new_api_key_id := NULL;
            v_new_authorization_id := NULL;
            v_new_total_microcents := NULL;
            v_newest := NULL;
            FOR v_row1_0, v_row1_1, v_row1_2, v_row1_3, v_row1_4, v_row1_5, v_row1_6, v_row1_7, v_row1_8, v_row1_9, v_row1_10, v_row1_11, v_row1_12, v_row1_13, v_row1_14, v_row1_15, v_row1_16, v_row1_17 IN
            SELECT e.account_id, e.request_id, e.api_key_id, e.model_id, e.api, e.outcome, e.occurred_at, e.authorization_id, e.prompt_tokens, e.cached_tokens, e.output_tokens, e.reasoning_tokens, e.input_microcents, e.cache_read_microcents, e.output_microcents, e.total_microcents, e.price_version_id, p_now AS anon_1
            FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_events AS json)) AS (account_id VARCHAR(32), request_id VARCHAR(64), api_key_id VARCHAR(32), model_id VARCHAR(100), api usage_api, outcome usage_outcome, occurred_at TIMESTAMP WITH TIME ZONE, authorization_id VARCHAR(64), prompt_tokens INTEGER, cached_tokens INTEGER, output_tokens INTEGER, reasoning_tokens INTEGER, input_microcents BIGINT, cache_read_microcents BIGINT, output_microcents BIGINT, total_microcents BIGINT, price_version_id VARCHAR(32))) WITH ORDINALITY AS t(account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id, position)) AS e
            WHERE true
            LOOP
                v_row1_id := nextval('usage_events_id_seq');
                INSERT INTO usage_events (id, account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, recorded_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id) VALUES (v_row1_id, v_row1_0, v_row1_1, v_row1_2, v_row1_3, v_row1_4, v_row1_5, v_row1_6, v_row1_17, v_row1_7, v_row1_8, v_row1_9, v_row1_10, v_row1_11, v_row1_12, v_row1_13, v_row1_14, v_row1_15, v_row1_16) ON CONFLICT (account_id, request_id) DO NOTHING RETURNING usage_events.id, usage_events.account_id, usage_events.request_id, usage_events.api_key_id, usage_events.authorization_id, usage_events.total_microcents
                INTO v_row1_returned_id, v_row1_returned_account_id, v_row1_returned_request_id, v_row1_returned_api_key_id, v_row1_returned_authorization_id, v_row1_returned_total_microcents;
                IF v_row1_returned_id IS NOT NULL THEN
                    v_new_id := array_append(v_new_id, v_row1_returned_id);
                    v_new_account_id := array_append(v_new_account_id, v_row1_returned_account_id);
                    v_new_request_id := array_append(v_new_request_id, v_row1_returned_request_id);
                    v_new_api_key_id := array_append(v_new_api_key_id, v_row1_returned_api_key_id);
                    v_new_authorization_id := array_append(v_new_authorization_id, v_row1_returned_authorization_id);
                    v_new_total_microcents := array_append(v_new_total_microcents, v_row1_returned_total_microcents);
                    v_newest := greatest(v_newest, v_row1_returned_id);
                END IF;
            END LOOP;
            IF coalesce(cardinality(v_new_id), 0) > 0 THEN
                v_targets_hold_id := ARRAY[]::VARCHAR(64)[];
                v_targets_event_id := ARRAY[]::BIGINT[];
                FOR v_charge_account_id, v_charge_request_id, v_charge_authorization_id, v_charge_usage_event_id IN
                SELECT c.account_id, c.request_id, c.authorization_id, c.usage_event_id
                FROM (SELECT n.account_id AS account_id, n.request_id AS request_id, n.authorization_id AS authorization_id, n.id AS usage_event_id
                FROM unnest(v_new_account_id, v_new_request_id, v_new_authorization_id, v_new_id) AS n(account_id, request_id, authorization_id, id)) AS c
                LOOP
                    IF v_charge_authorization_id IS NOT NULL THEN
                        SELECT authorizations.id
                        FROM authorizations
                        WHERE authorizations.account_id = p_account_id AND authorizations.id = v_charge_authorization_id AND p_account_id = v_charge_account_id AND authorizations.status IN ('active', 'expired')
                        INTO v_charge_hold;
                    ELSE
                        SELECT authorizations.id
                        FROM authorizations
                        WHERE authorizations.account_id = p_account_id AND p_account_id = v_charge_account_id AND authorizations.request_id = v_charge_request_id AND authorizations.status IN ('active', 'expired')
                        INTO v_charge_hold;
                    END IF;
                    IF v_charge_hold IS NOT NULL AND v_charge_hold != ALL (v_targets_hold_id) THEN
                        v_targets_hold_id := array_append(v_targets_hold_id, v_charge_hold);
                        v_targets_event_id := array_append(v_targets_event_id, v_charge_usage_event_id);
                    END IF;
                END LOOP;
                IF coalesce(cardinality(v_targets_hold_id), 0) > 1 THEN
                    PERFORM authorizations.id
                    FROM authorizations
                    WHERE authorizations.account_id = p_account_id AND authorizations.id IN (SELECT t.hold_id
                    FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id)) AND authorizations.status IN ('active', 'expired') ORDER BY authorizations.id COLLATE "C" FOR NO KEY UPDATE;
                END IF;
                IF coalesce(cardinality(v_targets_hold_id), 0) > 0 THEN
                    FOR v_target_hold, v_target_event IN
                    SELECT t.hold_id, t.event_id
                    FROM unnest(v_targets_hold_id, v_targets_event_id) AS t(hold_id, event_id)
                    LOOP
                        UPDATE authorizations SET status='settled', closed_at=p_now, usage_event_id=v_target_event WHERE authorizations.account_id = p_account_id AND authorizations.id = v_target_hold AND authorizations.status IN ('active', 'expired');
                    END LOOP;
                END IF;
                FOR v_row2_0, v_row2_1, v_row2_2, v_row2_3, v_row2_4, v_row2_5 IN
                SELECT c.account_id, 'charge' AS anon_1, -c.charge_microcents, c.usage_event_id, c.api_key_id, p_now AS anon_2
                FROM (SELECT n.account_id AS account_id, n.api_key_id AS api_key_id, n.id AS usage_event_id, n.total_microcents AS charge_microcents, p_prepaid AS prepaid
                FROM unnest(v_new_account_id, v_new_api_key_id, v_new_id, v_new_total_microcents) AS n(account_id, api_key_id, id, total_microcents)) AS c
                WHERE c.prepaid
                LOOP
                    v_row2_id := nextval('ledger_entries_id_seq');
                    INSERT INTO ledger_entries (id, account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at) VALUES (v_row2_id, v_row2_0, v_row2_1, v_row2_2, v_row2_3, v_row2_4, v_row2_5);
                END LOOP;
                SELECT array_agg(collected.account_id), array_agg(collected.total) INTO v_debits_account_id, v_debits_total
                FROM (
                SELECT c.account_id, CAST(sum(c.charge_microcents) AS BIGINT) AS total
                FROM (SELECT n.account_id AS account_id, n.total_microcents AS charge_microcents, p_prepaid AS prepaid
                FROM unnest(v_new_account_id, v_new_total_microcents) AS n(account_id, total_microcents)) AS c
                WHERE c.prepaid GROUP BY c.account_id
                ) AS collected;
                IF coalesce(cardinality(v_debits_account_id), 0) > 1 THEN
                    PERFORM accounts.id
                    FROM accounts
                    WHERE accounts.id = p_account_id AND p_account_id IN (SELECT d.account_id
                    FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total)) ORDER BY accounts.id COLLATE "C" FOR NO KEY UPDATE;
                END IF;
                IF coalesce(cardinality(v_debits_account_id), 0) > 0 THEN
                    v_moved_account_id := NULL;
                    v_moved_after_microcents := NULL;
                    v_moved_expiring := NULL;
                    v_moved_crossing := NULL;
                    FOR v_debit_account_id, v_debit_total IN
                    SELECT d.account_id, d.total
                    FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total)
                    LOOP
                        UPDATE accounts SET balance_microcents=(accounts.balance_microcents - v_debit_total), recharge_due_at=CASE WHEN (accounts.recharge_due_at IS NULL AND accounts.recharge_threshold_microcents IS NOT NULL AND accounts.balance_microcents - v_debit_total < accounts.recharge_threshold_microcents) THEN p_now ELSE accounts.recharge_due_at END WHERE accounts.id = p_account_id AND p_account_id = v_debit_account_id RETURNING accounts.id AS account_id, accounts.balance_microcents AS after_microcents, CASE WHEN (accounts.next_expiry_at <= p_now) THEN 1 ELSE 0 END AS expiring, CASE WHEN (accounts.next_expiry_at <= p_now OR accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.balance_microcents + v_debit_total >= accounts.low_balance_threshold_microcents AND accounts.balance_microcents < accounts.low_balance_threshold_microcents OR accounts.balance_microcents + v_debit_total > 0 AND accounts.balance_microcents <= 0) THEN 1 ELSE 0 END AS crossing
                        INTO v_debited_account_id, v_debited_after_microcents, v_debited_expiring, v_debited_crossing;
                        IF v_debited_account_id IS NOT NULL THEN
                            v_moved_account_id := array_append(v_moved_account_id, v_debited_account_id);
                            v_moved_after_microcents := array_append(v_moved_after_microcents, v_debited_after_microcents);
                            v_moved_expiring := array_append(v_moved_expiring, v_debited_expiring);
                            v_moved_crossing := array_append(v_moved_crossing, v_debited_crossing);
                        END IF;
                    END LOOP;
                    IF 1 = ANY (v_moved_expiring) THEN
                        SELECT array_agg(collected.grant_id ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.account_id ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.amount ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.expires_at ORDER BY collected.expires_at, collected.grant_id COLLATE "C") INTO v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at
                        FROM (
                        SELECT credit_grants.id AS grant_id, credit_grants.account_id, credit_grants.remaining_microcents AS amount, credit_grants.expires_at
                        FROM credit_grants
                        WHERE credit_grants.account_id = p_account_id AND p_account_id IN (SELECT xd.account_id
                        FROM unnest(v_debits_account_id, v_debits_total) AS xd(account_id, total)) AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND credit_grants.expires_at IS NOT NULL AND credit_grants.expires_at <= p_now
                        ) AS collected;
                        IF coalesce(cardinality(v_due_grant_id), 0) > 0 THEN
                            FOR v_row3_0, v_row3_1, v_row3_2, v_row3_3, v_row3_4, v_row3_5 IN
                            SELECT due.account_id, 'expiry' AS anon_1, -due.amount, due.grant_id, p_now AS anon_2, due.expires_at
                            FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) ORDER BY due.expires_at, due.grant_id COLLATE "C"
                            LOOP
                                v_row3_id := nextval('ledger_entries_id_seq');
                                INSERT INTO ledger_entries (id, account_id, kind, amount_microcents, created_at, grant_id, effective_at) VALUES (v_row3_id, v_row3_0, v_row3_1, v_row3_2, v_row3_4, v_row3_3, v_row3_5);
                            END LOOP;
                            UPDATE credit_grants SET remaining_microcents=0, status='expired' FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) WHERE credit_grants.id = due.grant_id AND credit_grants.account_id = p_account_id;
                            FOR v_row4_0, v_row4_1, v_row4_2, v_row4_3, v_row4_4 IN
                            SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, de.account_id, 'credit.grant_expired' AS anon_1, CAST(json_build_object('grant_id', de.grant_id, 'forfeited_microcents', de.amount) AS TEXT) AS json_object_text_1, p_now AS anon_2
                            FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS de(grant_id, account_id, amount, expires_at)
                            LOOP
                                v_row4_id := nextval('webhook_events_id_seq');
                                INSERT INTO webhook_events (id, public_id, account_id, type, data, created_at) VALUES (v_row4_id, v_row4_0, v_row4_1, v_row4_2, v_row4_3, v_row4_4);
                            END LOOP;
                        END IF;
                        UPDATE accounts SET balance_microcents=(accounts.balance_microcents - (SELECT coalesce(sum(ds.amount), 0) AS coalesce_1
                        FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS ds(grant_id, account_id, amount, expires_at)
                        WHERE accounts.id = ds.account_id)), next_expiry_at=(SELECT min(nl.expires_at) AS min_1
                        FROM (SELECT * FROM credit_grants WHERE credit_grants.account_id = p_account_id) AS nl
                        WHERE nl.account_id = accounts.id AND nl.status = 'active' AND nl.remaining_microcents > 0 AND (nl.expires_at IS NULL OR nl.expires_at > p_now)), recharge_due_at=CASE WHEN (accounts.recharge_due_at IS NULL AND accounts.recharge_threshold_microcents IS NOT NULL AND accounts.balance_microcents - (SELECT coalesce(sum(ds.amount), 0) AS coalesce_1
                        FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS ds(grant_id, account_id, amount, expires_at)
                        WHERE accounts.id = ds.account_id) < accounts.recharge_threshold_microcents) THEN p_now ELSE accounts.recharge_due_at END WHERE accounts.id = p_account_id AND p_account_id IN (SELECT xd.account_id
                        FROM unnest(v_debits_account_id, v_debits_total) AS xd(account_id, total)) AND accounts.next_expiry_at <= p_now;
                    END IF;
                    v_paid_account_id := NULL;
                    v_paid_grant_id := NULL;
                    v_paid_amount := NULL;
                    FOR v_whole_account_id, v_whole_total IN
                    SELECT w.account_id, w.total
                    FROM unnest(v_debits_account_id, v_debits_total) AS w(account_id, total)
                    LOOP
                        SELECT credit_grants.id, credit_grants.remaining_microcents
                        FROM credit_grants
                        WHERE credit_grants.account_id = p_account_id AND p_account_id = v_whole_account_id AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND (credit_grants.expires_at IS NULL OR credit_grants.expires_at > p_now) ORDER BY credit_grants.priority, CASE WHEN (credit_grants.expires_at IS NULL) THEN 1 ELSE 0 END, credit_grants.expires_at, credit_grants.entry_id
                         LIMIT 1
                        INTO v_first_grant_id, v_first_remaining;
                        IF v_whole_total > 0 AND v_first_remaining >= v_whole_total THEN
                            UPDATE credit_grants SET remaining_microcents=(credit_grants.remaining_microcents - v_whole_total) WHERE credit_grants.account_id = p_account_id AND credit_grants.id = v_first_grant_id RETURNING credit_grants.id
                            INTO v_first_updated;
                            IF v_first_updated IS NOT NULL THEN
                                v_paid_account_id := array_append(v_paid_account_id, v_whole_account_id);
                                v_paid_grant_id := array_append(v_paid_grant_id, v_first_grant_id);
                                v_paid_amount := array_append(v_paid_amount, v_whole_total);
                            END IF;
                        END IF;
                    END LOOP;
                    IF coalesce(cardinality(v_paid_account_id), 0) > 0 THEN
                        FOR v_row5_0, v_row5_1, v_row5_2, v_row5_3, v_row5_4 IN
                        SELECT pd.account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, 'spend' AS anon_1, pd.grant_id, pd.amount
                        FROM unnest(v_paid_account_id, v_paid_grant_id, v_paid_amount) AS pd(account_id, grant_id, amount)
                        WHERE true
                        LOOP
                            INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) VALUES (v_row5_0, v_row5_1, v_row5_2, v_row5_3, v_row5_4) ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents);
                        END LOOP;
                    END IF;
                    IF coalesce(cardinality(v_paid_account_id), 0) < coalesce(cardinality(v_debits_account_id), 0) THEN
                        SELECT array_agg(collected.account_id), array_agg(collected.total) INTO v_unpaid_account_id, v_unpaid_total
                        FROM (
                        SELECT u.account_id, u.total
                        FROM (SELECT ur.account_id AS account_id, ur.total AS total
                        FROM unnest(v_debits_account_id, v_debits_total) AS ur(account_id, total)
                        WHERE (ur.account_id NOT IN (SELECT uw.account_id
                        FROM unnest(v_paid_account_id, v_paid_grant_id, v_paid_amount) AS uw(account_id, grant_id, amount)))) AS u
                        ) AS collected;
                        SELECT array_agg(collected.grant_id), array_agg(collected.account_id), array_agg(collected.amount), array_agg(collected.kind) INTO v_parts_grant_id, v_parts_account_id, v_parts_amount, v_parts_kind
                        FROM (
                        SELECT found.grant_id, found.account_id, found.amount, CASE WHEN (found.grant_id IS NULL) THEN 'deficit' ELSE 'spend' END AS kind
                        FROM (SELECT live.id AS grant_id, live.account_id AS account_id, CASE WHEN (live.remaining < live.total - live.prior) THEN live.remaining ELSE live.total - live.prior END AS amount
                        FROM (SELECT credit_grants.id AS id, credit_grants.account_id AS account_id, credit_grants.remaining_microcents AS remaining, dt.total AS total, CAST(coalesce(sum(credit_grants.remaining_microcents) OVER (PARTITION BY credit_grants.account_id ORDER BY credit_grants.priority, CASE WHEN (credit_grants.expires_at IS NULL) THEN 1 ELSE 0 END, credit_grants.expires_at, credit_grants.entry_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS BIGINT) AS prior
                        FROM (SELECT * FROM credit_grants WHERE credit_grants.account_id = p_account_id) AS credit_grants JOIN unnest(v_unpaid_account_id, v_unpaid_total) AS dt(account_id, total) ON credit_grants.account_id = dt.account_id
                        WHERE credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND (credit_grants.expires_at IS NULL OR credit_grants.expires_at > p_now) AND dt.total > 0) AS live
                        WHERE live.prior < live.total UNION ALL SELECT CAST(NULL AS VARCHAR(32)) AS grant_id, d.account_id AS account_id, d.total - (SELECT coalesce(sum(covered.remaining_microcents), 0) AS coalesce_1
                        FROM (SELECT * FROM credit_grants WHERE credit_grants.account_id = p_account_id) AS covered
                        WHERE covered.account_id = d.account_id AND covered.status = 'active' AND covered.remaining_microcents > 0 AND (covered.expires_at IS NULL OR covered.expires_at > p_now)) AS amount
                        FROM unnest(v_unpaid_account_id, v_unpaid_total) AS d(account_id, total)
                        WHERE d.total > (SELECT coalesce(sum(covered.remaining_microcents), 0) AS coalesce_1
                        FROM (SELECT * FROM credit_grants WHERE credit_grants.account_id = p_account_id) AS covered
                        WHERE covered.account_id = d.account_id AND covered.status = 'active' AND covered.remaining_microcents > 0 AND (covered.expires_at IS NULL OR covered.expires_at > p_now))) AS found
                        ) AS collected;
                        IF coalesce(cardinality(v_parts_grant_id), 0) > 0 THEN
                            FOR v_row6_0, v_row6_1, v_row6_2, v_row6_3, v_row6_4 IN
                            SELECT pa.account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, CASE WHEN (pa.grant_id IS NULL) THEN 'deficit' ELSE 'spend' END AS anon_1, coalesce(pa.grant_id, '') AS coalesce_1, pa.amount
                            FROM unnest(v_parts_grant_id, v_parts_account_id, v_parts_amount, v_parts_kind) AS pa(grant_id, account_id, amount, kind)
                            WHERE true
                            LOOP
                                INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) VALUES (v_row6_0, v_row6_1, v_row6_2, v_row6_3, v_row6_4) ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents);
                            END LOOP;
                            UPDATE credit_grants SET remaining_microcents=(credit_grants.remaining_microcents - pt.amount) FROM unnest(v_parts_grant_id, v_parts_account_id, v_parts_amount, v_parts_kind) AS pt(grant_id, account_id, amount, kind) WHERE credit_grants.id = pt.grant_id AND credit_grants.account_id = p_account_id;
                        END IF;
                        IF 'deficit' = ANY (v_parts_kind) THEN
                            UPDATE accounts SET deficit_microcents=(accounts.deficit_microcents + pt.amount) FROM unnest(v_parts_grant_id, v_parts_account_id, v_parts_amount, v_parts_kind) AS pt(grant_id, account_id, amount, kind) WHERE accounts.id = pt.account_id AND pt.grant_id IS NULL AND accounts.id = p_account_id;
                        END IF;
                    END IF;
                    IF 1 = ANY (v_moved_crossing) THEN
                        INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT crossed.event_id_1, crossed.account_id, crossed.anon_1, crossed.json_object_text_1, crossed.anon_2
                        FROM (SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, m.account_id AS account_id, 'credit.balance_low' AS anon_1, CAST(json_build_object('balance_microcents', m.after_microcents, 'threshold_microcents', accounts.low_balance_threshold_microcents) AS TEXT) AS json_object_text_1, p_now AS anon_2
                        FROM (SELECT mv.account_id AS account_id, mv.after_microcents + md.total AS before_microcents, nb.balance_microcents AS after_microcents
                        FROM unnest(v_moved_account_id, v_moved_after_microcents, v_moved_expiring, v_moved_crossing) AS mv(account_id, after_microcents, expiring, crossing) JOIN unnest(v_debits_account_id, v_debits_total) AS md(account_id, total) ON md.account_id = mv.account_id JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS nb ON nb.id = mv.account_id) AS m JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS accounts ON accounts.id = m.account_id
                        WHERE accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.low_balance_threshold_microcents <= m.before_microcents AND m.after_microcents < accounts.low_balance_threshold_microcents UNION ALL SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_2, m.account_id AS account_id, 'credit.balance_depleted' AS anon_3, CAST(json_build_object('balance_microcents', m.after_microcents) AS TEXT) AS json_object_text_2, p_now AS anon_2
                        FROM (SELECT mv.account_id AS account_id, mv.after_microcents + md.total AS before_microcents, nb.balance_microcents AS after_microcents
                        FROM unnest(v_moved_account_id, v_moved_after_microcents, v_moved_expiring, v_moved_crossing) AS mv(account_id, after_microcents, expiring, crossing) JOIN unnest(v_debits_account_id, v_debits_total) AS md(account_id, total) ON md.account_id = mv.account_id JOIN (SELECT * FROM accounts WHERE accounts.id = p_account_id) AS nb ON nb.id = mv.account_id) AS m
                        WHERE m.before_microcents > 0 AND m.after_microcents <= 0) AS crossed;
                    END IF;
                END IF;
                FOR v_hour_account_id, v_hour_api_key_id, v_hour_model_id, v_hour_hour, v_hour_day, v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents IN
                SELECT r.account_id, r.api_key_id, r.model_id, r.hour, r.day, r.requests, r.input_tokens, r.cache_read_tokens, r.output_tokens, r.reasoning_tokens, r.cost_microcents
                FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_rollups AS json)) AS (account_id VARCHAR(32), api_key_id VARCHAR(32), model_id VARCHAR(100), hour TIMESTAMP WITH TIME ZONE, day TIMESTAMP WITH TIME ZONE, requests BIGINT, input_tokens BIGINT, cache_read_tokens BIGINT, output_tokens BIGINT, reasoning_tokens BIGINT, cost_microcents BIGINT, last_event_id BIGINT)) WITH ORDINALITY AS t(account_id, api_key_id, model_id, hour, day, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id, position)) AS r
                LOOP
                    INSERT INTO usage_rollups (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id) VALUES (v_hour_account_id, '1d', 'key', v_hour_day, v_hour_api_key_id, '', v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest), (v_hour_account_id, '1d', 'key_model', v_hour_day, v_hour_api_key_id, v_hour_model_id, v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest), (v_hour_account_id, '1d', 'model', v_hour_day, '', v_hour_model_id, v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest), (v_hour_account_id, '1h', 'key', v_hour_hour, v_hour_api_key_id, '', v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest), (v_hour_account_id, '1h', 'key_model', v_hour_hour, v_hour_api_key_id, v_hour_model_id, v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest), (v_hour_account_id, '1h', 'model', v_hour_hour, '', v_hour_model_id, v_hour_requests, v_hour_input_tokens, v_hour_cache_read_tokens, v_hour_output_tokens, v_hour_reasoning_tokens, v_hour_cost_microcents, v_newest) ON CONFLICT (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id) DO UPDATE SET requests = (usage_rollups.requests + excluded.requests), input_tokens = (usage_rollups.input_tokens + excluded.input_tokens), cache_read_tokens = (usage_rollups.cache_read_tokens + excluded.cache_read_tokens), output_tokens = (usage_rollups.output_tokens + excluded.output_tokens), reasoning_tokens = (usage_rollups.reasoning_tokens + excluded.reasoning_tokens), cost_microcents = (usage_rollups.cost_microcents + excluded.cost_microcents), last_event_id = greatest(usage_rollups.last_event_id, excluded.last_event_id);
                END LOOP;
                IF p_spend_limited THEN
                    WITH collected AS (
                    INSERT INTO spend_limit_notices (account_id, limit_scope, scope_id, api_key_id, spend_limit_window, window_starts_at, percent, limit_microcents, spent_microcents, created_at) SELECT measured.account_id, measured.limit_scope, measured.scope_id, measured.api_key_id, measured.spend_limit_window, measured.window_starts_at, measured.percent, measured.limit_microcents, measured.spent, p_now AS anon_1
                    FROM (SELECT sl.account_id AS account_id, sl.limit_scope AS limit_scope, sl.scope_id AS scope_id, sl.api_key_id AS api_key_id, sl.project_id AS project_id, sl.member_id AS member_id, sl.spend_limit_window AS spend_limit_window, sl.window_starts_at AS window_starts_at, sl.window_ends_at AS window_ends_at, sl.window_starts AS window_starts, sl.percent AS percent, sl.limit_microcents AS limit_microcents, sl.threshold_microcents AS threshold_microcents, sl.position AS position, CASE WHEN (sl.limit_scope = 'project') THEN (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_1
                    FROM (SELECT * FROM usage_rollups WHERE usage_rollups.account_id = p_account_id) AS usage_rollups
                    WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id IN (SELECT api_keys.id
                    FROM api_keys
                    WHERE api_keys.account_id = sl.account_id AND api_keys.project_id = sl.scope_id)) WHEN (sl.limit_scope = 'member') THEN (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_2
                    FROM (SELECT * FROM usage_rollups WHERE usage_rollups.account_id = p_account_id) AS usage_rollups
                    WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id IN (SELECT api_keys.id
                    FROM api_keys
                    WHERE api_keys.account_id = sl.account_id AND api_keys.member_id = sl.scope_id)) ELSE (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_3
                    FROM (SELECT * FROM usage_rollups WHERE usage_rollups.account_id = p_account_id) AS usage_rollups
                    WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id = sl.scope_id) END AS spent
                    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_spend_limits AS json)) AS (account_id VARCHAR(32), limit_scope VARCHAR(8), scope_id VARCHAR(32), api_key_id VARCHAR(32), project_id VARCHAR, member_id VARCHAR, spend_limit_window VARCHAR(8), window_starts_at TIMESTAMP WITH TIME ZONE, window_ends_at TIMESTAMP WITH TIME ZONE, window_starts VARCHAR, percent INTEGER, limit_microcents BIGINT, threshold_microcents BIGINT)) WITH ORDINALITY AS t(account_id, limit_scope, scope_id, api_key_id, project_id, member_id, spend_limit_window, window_starts_at, window_ends_at, window_starts, percent, limit_microcents, threshold_microcents, position)) AS sl) AS measured
                    WHERE measured.spent >= measured.threshold_microcents ON CONFLICT DO NOTHING RETURNING spend_limit_notices.account_id, spend_limit_notices.scope_id, spend_limit_notices.percent, spend_limit_notices.spent_microcents
                    )
                    SELECT array_agg(collected.account_id ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.scope_id ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.percent ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.spent_microcents ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent) INTO v_reached_account_id, v_reached_scope_id, v_reached_percent, v_reached_spent_microcents FROM collected;
                    IF coalesce(cardinality(v_reached_account_id), 0) > 0 THEN
                        FOR v_row7_0, v_row7_1, v_row7_2, v_row7_3, v_row7_4 IN
                        SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, fired.account_id, 'spend_limit.threshold_reached' AS anon_1, CAST(json_build_object('limit_scope', shown.limit_scope, 'api_key_id', shown.api_key_id, 'project_id', shown.project_id, 'member_id', shown.member_id, 'window', shown.spend_limit_window, 'window_starts_at', shown.window_starts, 'spent_microcents', fired.spent_microcents, 'limit_microcents', shown.limit_microcents, 'percent', fired.percent) AS TEXT) AS json_object_text_1, p_now AS anon_2
                        FROM unnest(v_reached_account_id, v_reached_scope_id, v_reached_percent, v_reached_spent_microcents) AS fired(account_id, scope_id, percent, spent_microcents) JOIN (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_spend_limits AS json)) AS (account_id VARCHAR(32), limit_scope VARCHAR(8), scope_id VARCHAR(32), api_key_id VARCHAR(32), project_id VARCHAR, member_id VARCHAR, spend_limit_window VARCHAR(8), window_starts_at TIMESTAMP WITH TIME ZONE, window_ends_at TIMESTAMP WITH TIME ZONE, window_starts VARCHAR, percent INTEGER, limit_microcents BIGINT, threshold_microcents BIGINT)) WITH ORDINALITY AS t(account_id, limit_scope, scope_id, api_key_id, project_id, member_id, spend_limit_window, window_starts_at, window_ends_at, window_starts, percent, limit_microcents, threshold_microcents, position)) AS shown ON shown.account_id = fired.account_id AND shown.scope_id = fired.scope_id AND shown.percent = fired.percent ORDER BY fired.account_id COLLATE "C", fired.scope_id COLLATE "C", fired.percent
                        LOOP
                            v_row7_id := nextval('webhook_events_id_seq');
                            INSERT INTO webhook_events (id, public_id, account_id, type, data, created_at) VALUES (v_row7_id, v_row7_0, v_row7_1, v_row7_2, v_row7_3, v_row7_4);
                        END LOOP;
                    END IF;
                END IF;
            END IF;
            usage_event_id := v_newest;
            RETURN NEXT;
        END IF;
    END IF;
END;
$$
