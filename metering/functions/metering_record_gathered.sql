CREATE OR REPLACE FUNCTION metering_record_gathered(p_now TIMESTAMP WITH TIME ZONE, p_events json, p_spend_limits json, p_spend_limited BOOLEAN)
RETURNS VARCHAR(64)[]
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_booked_account_id VARCHAR(32)[];
    v_booked_api_key_id VARCHAR(32)[];
    v_booked_request_id VARCHAR(64)[];
    v_booked_usage_event_id BIGINT[];
    v_booked_charge_microcents BIGINT[];
    v_booked_authorization_id VARCHAR(64)[];
    v_booked_prepaid BOOLEAN[];
    v_booked_model_id VARCHAR(100)[];
    v_booked_hour TIMESTAMP WITH TIME ZONE[];
    v_booked_day TIMESTAMP WITH TIME ZONE[];
    v_booked_requests BIGINT[];
    v_booked_input_tokens BIGINT[];
    v_booked_cache_read_tokens BIGINT[];
    v_booked_output_tokens BIGINT[];
    v_booked_reasoning_tokens BIGINT[];
    v_booked_cost_microcents BIGINT[];
    v_booked_last_event_id BIGINT[];
    v_targets_hold_id VARCHAR(64)[];
    v_targets_event_id BIGINT[];
    v_debits_account_id VARCHAR(32)[];
    v_debits_total BIGINT[];
    v_moved_account_id VARCHAR(32)[];
    v_moved_after_microcents BIGINT[];
    v_moved_expiring BIGINT[];
    v_moved_crossing BIGINT[];
    v_due_grant_id VARCHAR(32)[];
    v_due_account_id VARCHAR(32)[];
    v_due_amount BIGINT[];
    v_due_expires_at TIMESTAMP WITH TIME ZONE[];
    v_whole_account_id VARCHAR(32)[];
    v_reached_account_id VARCHAR(32)[];
    v_reached_scope_id VARCHAR(32)[];
    v_reached_percent INTEGER[];
    v_reached_spent_microcents BIGINT[];
BEGIN
    WITH gathered AS
    (SELECT g.account_id AS account_id, g.request_id AS request_id, g.api_key_id AS api_key_id, g.model_id AS model_id, g.api AS api, g.outcome AS outcome, g.occurred_at AS occurred_at, g.authorization_id AS authorization_id, g.prompt_tokens AS prompt_tokens, g.cached_tokens AS cached_tokens, g.output_tokens AS output_tokens, g.reasoning_tokens AS reasoning_tokens, g.input_microcents AS input_microcents, g.cache_read_microcents AS cache_read_microcents, g.output_microcents AS output_microcents, g.total_microcents AS total_microcents, g.price_version_id AS price_version_id, g.prepaid AS prepaid, g.hour AS hour, g.day AS day, g.requests AS requests, g.input_tokens AS input_tokens, g.cache_read_tokens AS cache_read_tokens, g.cost_microcents AS cost_microcents, g.position AS position
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_events AS json)) AS (account_id VARCHAR(32), request_id VARCHAR(64), api_key_id VARCHAR(32), model_id VARCHAR(100), api usage_api, outcome usage_outcome, occurred_at TIMESTAMP WITH TIME ZONE, authorization_id VARCHAR(64), prompt_tokens INTEGER, cached_tokens INTEGER, output_tokens INTEGER, reasoning_tokens INTEGER, input_microcents BIGINT, cache_read_microcents BIGINT, output_microcents BIGINT, total_microcents BIGINT, price_version_id VARCHAR(32), prepaid BOOLEAN, hour TIMESTAMP WITH TIME ZONE, day TIMESTAMP WITH TIME ZONE, requests BIGINT, input_tokens BIGINT, cache_read_tokens BIGINT, cost_microcents BIGINT)) WITH ORDINALITY AS t(account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id, prepaid, hour, day, requests, input_tokens, cache_read_tokens, cost_microcents, position)) AS g),
    "new" AS
    (INSERT INTO usage_events (account_id, request_id, api_key_id, model_id, api, outcome, occurred_at, authorization_id, prompt_tokens, cached_tokens, output_tokens, reasoning_tokens, input_microcents, cache_read_microcents, output_microcents, total_microcents, price_version_id, recorded_at) SELECT gathered.account_id AS account_id, gathered.request_id AS request_id, gathered.api_key_id AS api_key_id, gathered.model_id AS model_id, gathered.api AS api, gathered.outcome AS outcome, gathered.occurred_at AS occurred_at, gathered.authorization_id AS authorization_id, gathered.prompt_tokens AS prompt_tokens, gathered.cached_tokens AS cached_tokens, gathered.output_tokens AS output_tokens, gathered.reasoning_tokens AS reasoning_tokens, gathered.input_microcents AS input_microcents, gathered.cache_read_microcents AS cache_read_microcents, gathered.output_microcents AS output_microcents, gathered.total_microcents AS total_microcents, gathered.price_version_id AS price_version_id, p_now AS anon_1
    FROM gathered
    WHERE true ORDER BY gathered.position ON CONFLICT (account_id, request_id) DO NOTHING RETURNING usage_events.id, usage_events.account_id, usage_events.request_id, usage_events.api_key_id, usage_events.authorization_id, usage_events.total_microcents)
     SELECT array_agg(collected.account_id) AS array_agg_1, array_agg(collected.api_key_id) AS array_agg_2, array_agg(collected.request_id) AS array_agg_3, array_agg(collected.usage_event_id) AS array_agg_4, array_agg(collected.charge_microcents) AS array_agg_5, array_agg(collected.authorization_id) AS array_agg_6, array_agg(collected.prepaid) AS array_agg_7, array_agg(collected.model_id) AS array_agg_8, array_agg(collected.hour) AS array_agg_9, array_agg(collected.day) AS array_agg_10, array_agg(collected.requests) AS array_agg_11, array_agg(collected.input_tokens) AS array_agg_12, array_agg(collected.cache_read_tokens) AS array_agg_13, array_agg(collected.output_tokens) AS array_agg_14, array_agg(collected.reasoning_tokens) AS array_agg_15, array_agg(collected.cost_microcents) AS array_agg_16, array_agg(collected.last_event_id) AS array_agg_17
    FROM (SELECT "new".account_id AS account_id, "new".api_key_id AS api_key_id, "new".request_id AS request_id, "new".id AS usage_event_id, "new".total_microcents AS charge_microcents, "new".authorization_id AS authorization_id, gathered.prepaid AS prepaid, gathered.model_id AS model_id, gathered.hour AS hour, gathered.day AS day, gathered.requests AS requests, gathered.input_tokens AS input_tokens, gathered.cache_read_tokens AS cache_read_tokens, gathered.output_tokens AS output_tokens, gathered.reasoning_tokens AS reasoning_tokens, gathered.cost_microcents AS cost_microcents, "new".id AS last_event_id
    FROM "new" JOIN gathered ON "new".account_id = gathered.account_id AND "new".request_id = gathered.request_id) AS collected
    INTO v_booked_account_id, v_booked_api_key_id, v_booked_request_id, v_booked_usage_event_id, v_booked_charge_microcents, v_booked_authorization_id, v_booked_prepaid, v_booked_model_id, v_booked_hour, v_booked_day, v_booked_requests, v_booked_input_tokens, v_booked_cache_read_tokens, v_booked_output_tokens, v_booked_reasoning_tokens, v_booked_cost_microcents, v_booked_last_event_id;
    IF coalesce(cardinality(v_booked_account_id), 0) > 0 THEN
        SELECT array_agg(collected.hold_id), array_agg(collected.event_id) INTO v_targets_hold_id, v_targets_event_id
        FROM (
        SELECT found.hold_id, min(found.event_id) AS event_id
        FROM (SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
        FROM unnest(v_booked_account_id, v_booked_request_id, v_booked_authorization_id, v_booked_usage_event_id) AS c(account_id, request_id, authorization_id, usage_event_id) JOIN authorizations ON authorizations.id = c.authorization_id AND authorizations.account_id = c.account_id
        WHERE authorizations.status IN ('active', 'expired') UNION ALL SELECT authorizations.id AS hold_id, c.usage_event_id AS event_id
        FROM unnest(v_booked_account_id, v_booked_request_id, v_booked_authorization_id, v_booked_usage_event_id) AS c(account_id, request_id, authorization_id, usage_event_id) JOIN authorizations ON authorizations.account_id = c.account_id AND authorizations.request_id = c.request_id
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
        WITH charged AS
        (INSERT INTO ledger_entries (account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at) SELECT c.account_id AS account_id, 'charge' AS anon_1, -c.charge_microcents AS anon_2, c.usage_event_id AS usage_event_id, c.api_key_id AS api_key_id, p_now AS anon_3
        FROM unnest(v_booked_account_id, v_booked_api_key_id, v_booked_usage_event_id, v_booked_charge_microcents, v_booked_prepaid) AS c(account_id, api_key_id, usage_event_id, charge_microcents, prepaid)
        WHERE c.prepaid ORDER BY c.usage_event_id RETURNING ledger_entries.account_id, ledger_entries.amount_microcents)
         SELECT array_agg(collected.account_id) AS array_agg_1, array_agg(collected.total) AS array_agg_2
        FROM (SELECT charged.account_id AS account_id, CAST(-sum(charged.amount_microcents) AS BIGINT) AS total
        FROM charged GROUP BY charged.account_id) AS collected
        INTO v_debits_account_id, v_debits_total;
        IF coalesce(cardinality(v_debits_account_id), 0) > 1 THEN
            PERFORM accounts.id
            FROM accounts
            WHERE accounts.id IN (SELECT d.account_id
            FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total)) ORDER BY accounts.id COLLATE "C" FOR NO KEY UPDATE;
        END IF;
        IF coalesce(cardinality(v_debits_account_id), 0) > 0 THEN
            WITH collected AS (
            UPDATE accounts SET balance_microcents=(accounts.balance_microcents - d.total), recharge_due_at=CASE WHEN (accounts.recharge_due_at IS NULL AND accounts.recharge_threshold_microcents IS NOT NULL AND accounts.balance_microcents - d.total < accounts.recharge_threshold_microcents) THEN p_now ELSE accounts.recharge_due_at END FROM unnest(v_debits_account_id, v_debits_total) AS d(account_id, total) WHERE accounts.id = d.account_id RETURNING accounts.id AS account_id, accounts.balance_microcents AS after_microcents, CASE WHEN (accounts.next_expiry_at <= p_now) THEN 1 ELSE 0 END AS expiring, CASE WHEN (accounts.next_expiry_at <= p_now OR accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.balance_microcents + d.total >= accounts.low_balance_threshold_microcents AND accounts.balance_microcents < accounts.low_balance_threshold_microcents OR accounts.balance_microcents + d.total > 0 AND accounts.balance_microcents <= 0) THEN 1 ELSE 0 END AS crossing
            )
            SELECT array_agg(collected.account_id), array_agg(collected.after_microcents), array_agg(collected.expiring), array_agg(collected.crossing) INTO v_moved_account_id, v_moved_after_microcents, v_moved_expiring, v_moved_crossing FROM collected;
            IF 1 = ANY (v_moved_expiring) THEN
                SELECT array_agg(collected.grant_id ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.account_id ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.amount ORDER BY collected.expires_at, collected.grant_id COLLATE "C"), array_agg(collected.expires_at ORDER BY collected.expires_at, collected.grant_id COLLATE "C") INTO v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at
                FROM (
                SELECT credit_grants.id AS grant_id, credit_grants.account_id, credit_grants.remaining_microcents AS amount, credit_grants.expires_at
                FROM credit_grants
                WHERE credit_grants.account_id IN (SELECT xd.account_id
                FROM unnest(v_debits_account_id, v_debits_total) AS xd(account_id, total)) AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND credit_grants.expires_at IS NOT NULL AND credit_grants.expires_at <= p_now
                ) AS collected;
                IF coalesce(cardinality(v_due_grant_id), 0) > 0 THEN
                    INSERT INTO ledger_entries (account_id, kind, amount_microcents, grant_id, created_at, effective_at) SELECT due.account_id, 'expiry' AS anon_1, -due.amount, due.grant_id, p_now AS anon_2, due.expires_at
                    FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) ORDER BY due.expires_at, due.grant_id COLLATE "C";
                    UPDATE credit_grants SET remaining_microcents=0, status='expired' FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) WHERE credit_grants.id = due.grant_id;
                    INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, de.account_id, 'credit.grant_expired' AS anon_1, CAST(json_build_object('grant_id', de.grant_id, 'forfeited_microcents', de.amount) AS TEXT) AS json_object_text_1, p_now AS anon_2
                    FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS de(grant_id, account_id, amount, expires_at);
                END IF;
                UPDATE accounts SET balance_microcents=(accounts.balance_microcents - (SELECT coalesce(sum(ds.amount), 0) AS coalesce_1
                FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS ds(grant_id, account_id, amount, expires_at)
                WHERE accounts.id = ds.account_id)), next_expiry_at=(SELECT min(nl.expires_at) AS min_1
                FROM credit_grants AS nl
                WHERE nl.account_id = accounts.id AND nl.status = 'active' AND nl.remaining_microcents > 0 AND (nl.expires_at IS NULL OR nl.expires_at > p_now)), recharge_due_at=CASE WHEN (accounts.recharge_due_at IS NULL AND accounts.recharge_threshold_microcents IS NOT NULL AND accounts.balance_microcents - (SELECT coalesce(sum(ds.amount), 0) AS coalesce_1
                FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS ds(grant_id, account_id, amount, expires_at)
                WHERE accounts.id = ds.account_id) < accounts.recharge_threshold_microcents) THEN p_now ELSE accounts.recharge_due_at END WHERE accounts.id IN (SELECT xd.account_id
                FROM unnest(v_debits_account_id, v_debits_total) AS xd(account_id, total)) AND accounts.next_expiry_at <= p_now;
            END IF;
            WITH whole AS
            (SELECT w.account_id AS account_id, first.id AS grant_id, w.total AS amount
            FROM unnest(v_debits_account_id, v_debits_total) AS w(account_id, total) JOIN LATERAL (SELECT credit_grants.id AS id, credit_grants.remaining_microcents AS remaining_microcents
            FROM credit_grants
            WHERE credit_grants.account_id = w.account_id AND credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND (credit_grants.expires_at IS NULL OR credit_grants.expires_at > p_now) ORDER BY credit_grants.priority, CASE WHEN (credit_grants.expires_at IS NULL) THEN 1 ELSE 0 END, credit_grants.expires_at, credit_grants.entry_id
             LIMIT 1) AS first ON true
            WHERE w.total > 0 AND first.remaining_microcents >= w.total),
            spent AS
            (UPDATE credit_grants SET remaining_microcents=(credit_grants.remaining_microcents - whole.amount) FROM whole WHERE credit_grants.id = whole.grant_id),
            collected AS
            (INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) SELECT whole.account_id AS account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, 'spend' AS anon_1, whole.grant_id AS grant_id, whole.amount AS amount
            FROM whole
            WHERE true ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents) RETURNING credit_allocation_days.account_id)
             SELECT array_agg(collected.account_id) AS array_agg_1
            FROM collected
            INTO v_whole_account_id;
            IF coalesce(cardinality(v_whole_account_id), 0) < coalesce(cardinality(v_debits_account_id), 0) THEN
                WITH found AS
                (SELECT live.id AS grant_id, live.account_id AS account_id, CASE WHEN (live.remaining < live.total - live.prior) THEN live.remaining ELSE live.total - live.prior END AS amount
                FROM (SELECT credit_grants.id AS id, credit_grants.account_id AS account_id, credit_grants.remaining_microcents AS remaining, dt.total AS total, CAST(coalesce(sum(credit_grants.remaining_microcents) OVER (PARTITION BY credit_grants.account_id ORDER BY credit_grants.priority, CASE WHEN (credit_grants.expires_at IS NULL) THEN 1 ELSE 0 END, credit_grants.expires_at, credit_grants.entry_id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS BIGINT) AS prior
                FROM credit_grants JOIN (SELECT dtr.account_id AS account_id, dtr.total AS total
                FROM unnest(v_debits_account_id, v_debits_total) AS dtr(account_id, total)
                WHERE (dtr.account_id NOT IN (SELECT dtw.account_id
                FROM unnest(v_whole_account_id) AS dtw(account_id)))) AS dt ON credit_grants.account_id = dt.account_id
                WHERE credit_grants.status = 'active' AND credit_grants.remaining_microcents > 0 AND (credit_grants.expires_at IS NULL OR credit_grants.expires_at > p_now) AND dt.total > 0) AS live
                WHERE live.prior < live.total UNION ALL SELECT CAST(NULL AS VARCHAR(32)) AS grant_id, d.account_id AS account_id, d.total - (SELECT coalesce(sum(covered.remaining_microcents), 0) AS coalesce_1
                FROM credit_grants AS covered
                WHERE covered.account_id = d.account_id AND covered.status = 'active' AND covered.remaining_microcents > 0 AND (covered.expires_at IS NULL OR covered.expires_at > p_now)) AS amount
                FROM (SELECT dr.account_id AS account_id, dr.total AS total
                FROM unnest(v_debits_account_id, v_debits_total) AS dr(account_id, total)
                WHERE (dr.account_id NOT IN (SELECT dw.account_id
                FROM unnest(v_whole_account_id) AS dw(account_id)))) AS d
                WHERE d.total > (SELECT coalesce(sum(covered.remaining_microcents), 0) AS coalesce_1
                FROM credit_grants AS covered
                WHERE covered.account_id = d.account_id AND covered.status = 'active' AND covered.remaining_microcents > 0 AND (covered.expires_at IS NULL OR covered.expires_at > p_now))),
                spent AS
                (UPDATE credit_grants SET remaining_microcents=(credit_grants.remaining_microcents - found.amount) FROM found WHERE credit_grants.id = found.grant_id),
                owed AS
                (UPDATE accounts SET deficit_microcents=(accounts.deficit_microcents + found.amount) FROM found WHERE accounts.id = found.account_id AND found.grant_id IS NULL)
                 INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) SELECT found.account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, CASE WHEN (found.grant_id IS NULL) THEN 'deficit' ELSE 'spend' END AS anon_1, coalesce(found.grant_id, '') AS coalesce_2, found.amount
                FROM found
                WHERE true ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents);
            END IF;
            IF 1 = ANY (v_moved_crossing) THEN
                INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT crossed.event_id_1, crossed.account_id, crossed.anon_1, crossed.json_object_text_1, crossed.anon_2
                FROM (SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, m.account_id AS account_id, 'credit.balance_low' AS anon_1, CAST(json_build_object('balance_microcents', m.after_microcents, 'threshold_microcents', accounts.low_balance_threshold_microcents) AS TEXT) AS json_object_text_1, p_now AS anon_2
                FROM (SELECT mv.account_id AS account_id, mv.after_microcents + md.total AS before_microcents, nb.balance_microcents AS after_microcents
                FROM unnest(v_moved_account_id, v_moved_after_microcents, v_moved_expiring, v_moved_crossing) AS mv(account_id, after_microcents, expiring, crossing) JOIN unnest(v_debits_account_id, v_debits_total) AS md(account_id, total) ON md.account_id = mv.account_id JOIN accounts AS nb ON nb.id = mv.account_id) AS m JOIN accounts ON accounts.id = m.account_id
                WHERE accounts.low_balance_threshold_microcents IS NOT NULL AND accounts.low_balance_threshold_microcents <= m.before_microcents AND m.after_microcents < accounts.low_balance_threshold_microcents UNION ALL SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_2, m.account_id AS account_id, 'credit.balance_depleted' AS anon_3, CAST(json_build_object('balance_microcents', m.after_microcents) AS TEXT) AS json_object_text_2, p_now AS anon_2
                FROM (SELECT mv.account_id AS account_id, mv.after_microcents + md.total AS before_microcents, nb.balance_microcents AS after_microcents
                FROM unnest(v_moved_account_id, v_moved_after_microcents, v_moved_expiring, v_moved_crossing) AS mv(account_id, after_microcents, expiring, crossing) JOIN unnest(v_debits_account_id, v_debits_total) AS md(account_id, total) ON md.account_id = mv.account_id JOIN accounts AS nb ON nb.id = mv.account_id) AS m
                WHERE m.before_microcents > 0 AND m.after_microcents <= 0) AS crossed;
            END IF;
        END IF;
        INSERT INTO usage_rollups (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id) SELECT s.account_id, s.bucket_width, s.grouping, s.bucket_start, s.api_key_id, s.model_id, CAST(sum(s.requests) AS BIGINT) AS requests, CAST(sum(s.input_tokens) AS BIGINT) AS input_tokens, CAST(sum(s.cache_read_tokens) AS BIGINT) AS cache_read_tokens, CAST(sum(s.output_tokens) AS BIGINT) AS output_tokens, CAST(sum(s.reasoning_tokens) AS BIGINT) AS reasoning_tokens, CAST(sum(s.cost_microcents) AS BIGINT) AS cost_microcents, max(s.last_event_id) AS last_event_id
        FROM (SELECT r.account_id AS account_id, k.bucket_width AS bucket_width, k.grouping AS grouping, CASE WHEN (k.bucket_width = '1h') THEN r.hour ELSE r.day END AS bucket_start, CASE WHEN (k.grouping = 'model') THEN '' ELSE r.api_key_id END AS api_key_id, CASE WHEN (k.grouping = 'key') THEN '' ELSE r.model_id END AS model_id, r.requests AS requests, r.input_tokens AS input_tokens, r.cache_read_tokens AS cache_read_tokens, r.output_tokens AS output_tokens, r.reasoning_tokens AS reasoning_tokens, r.cost_microcents AS cost_microcents, r.last_event_id AS last_event_id
        FROM unnest(v_booked_account_id, v_booked_api_key_id, v_booked_model_id, v_booked_hour, v_booked_day, v_booked_requests, v_booked_input_tokens, v_booked_cache_read_tokens, v_booked_output_tokens, v_booked_reasoning_tokens, v_booked_cost_microcents, v_booked_last_event_id) AS r(account_id, api_key_id, model_id, hour, day, requests, input_tokens, cache_read_tokens, output_tokens, reasoning_tokens, cost_microcents, last_event_id) JOIN unnest(ARRAY['1d', '1d', '1d', '1h', '1h', '1h'], ARRAY['key', 'key_model', 'model', 'key', 'key_model', 'model']) AS k(bucket_width, grouping) ON true) AS s
        WHERE true GROUP BY s.account_id, s.bucket_width, s.grouping, s.bucket_start, s.api_key_id, s.model_id ORDER BY s.account_id COLLATE "C", s.bucket_width COLLATE "C", s.grouping COLLATE "C", s.bucket_start, s.api_key_id COLLATE "C", s.model_id COLLATE "C" ON CONFLICT (account_id, bucket_width, grouping, bucket_start, api_key_id, model_id) DO UPDATE SET requests = (usage_rollups.requests + excluded.requests), input_tokens = (usage_rollups.input_tokens + excluded.input_tokens), cache_read_tokens = (usage_rollups.cache_read_tokens + excluded.cache_read_tokens), output_tokens = (usage_rollups.output_tokens + excluded.output_tokens), reasoning_tokens = (usage_rollups.reasoning_tokens + excluded.reasoning_tokens), cost_microcents = (usage_rollups.cost_microcents + excluded.cost_microcents), last_event_id = greatest(usage_rollups.last_event_id, excluded.last_event_id);
        IF p_spend_limited THEN
            WITH collected AS (
            INSERT INTO spend_limit_notices (account_id, limit_scope, scope_id, api_key_id, spend_limit_window, window_starts_at, percent, limit_microcents, spent_microcents, created_at) SELECT measured.account_id, measured.limit_scope, measured.scope_id, measured.api_key_id, measured.spend_limit_window, measured.window_starts_at, measured.percent, measured.limit_microcents, measured.spent, p_now AS anon_1
            FROM (SELECT sl.account_id AS account_id, sl.limit_scope AS limit_scope, sl.scope_id AS scope_id, sl.api_key_id AS api_key_id, sl.project_id AS project_id, sl.member_id AS member_id, sl.spend_limit_window AS spend_limit_window, sl.window_starts_at AS window_starts_at, sl.window_ends_at AS window_ends_at, sl.window_starts AS window_starts, sl.percent AS percent, sl.limit_microcents AS limit_microcents, sl.threshold_microcents AS threshold_microcents, sl.position AS position, CASE WHEN (sl.limit_scope = 'project') THEN (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_1
            FROM usage_rollups
            WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id IN (SELECT api_keys.id
            FROM api_keys
            WHERE api_keys.account_id = sl.account_id AND api_keys.project_id = sl.scope_id)) WHEN (sl.limit_scope = 'member') THEN (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_2
            FROM usage_rollups
            WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id IN (SELECT api_keys.id
            FROM api_keys
            WHERE api_keys.account_id = sl.account_id AND api_keys.member_id = sl.scope_id)) ELSE (SELECT coalesce(sum(usage_rollups.cost_microcents), 0) AS coalesce_3
            FROM usage_rollups
            WHERE usage_rollups.account_id = sl.account_id AND usage_rollups.bucket_width = '1d' AND usage_rollups.grouping = 'key' AND usage_rollups.bucket_start >= sl.window_starts_at AND usage_rollups.bucket_start < sl.window_ends_at AND usage_rollups.api_key_id = sl.scope_id) END AS spent
            FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_spend_limits AS json)) AS (account_id VARCHAR(32), limit_scope VARCHAR(8), scope_id VARCHAR(32), api_key_id VARCHAR(32), project_id VARCHAR, member_id VARCHAR, spend_limit_window VARCHAR(8), window_starts_at TIMESTAMP WITH TIME ZONE, window_ends_at TIMESTAMP WITH TIME ZONE, window_starts VARCHAR, percent INTEGER, limit_microcents BIGINT, threshold_microcents BIGINT)) WITH ORDINALITY AS t(account_id, limit_scope, scope_id, api_key_id, project_id, member_id, spend_limit_window, window_starts_at, window_ends_at, window_starts, percent, limit_microcents, threshold_microcents, position)) AS sl) AS measured
            WHERE measured.spent >= measured.threshold_microcents ON CONFLICT DO NOTHING RETURNING spend_limit_notices.account_id, spend_limit_notices.scope_id, spend_limit_notices.percent, spend_limit_notices.spent_microcents
            )
            SELECT array_agg(collected.account_id ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.scope_id ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.percent ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent), array_agg(collected.spent_microcents ORDER BY collected.account_id COLLATE "C", collected.scope_id COLLATE "C", collected.percent) INTO v_reached_account_id, v_reached_scope_id, v_reached_percent, v_reached_spent_microcents FROM collected;
            IF coalesce(cardinality(v_reached_account_id), 0) > 0 THEN
                INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, fired.account_id, 'spend_limit.threshold_reached' AS anon_1, CAST(json_build_object('limit_scope', shown.limit_scope, 'api_key_id', shown.api_key_id, 'project_id', shown.project_id, 'member_id', shown.member_id, 'window', shown.spend_limit_window, 'window_starts_at', shown.window_starts, 'spent_microcents', fired.spent_microcents, 'limit_microcents', shown.limit_microcents, 'percent', fired.percent) AS TEXT) AS json_object_text_1, p_now AS anon_2
                FROM unnest(v_reached_account_id, v_reached_scope_id, v_reached_percent, v_reached_spent_microcents) AS fired(account_id, scope_id, percent, spent_microcents) JOIN (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_spend_limits AS json)) AS (account_id VARCHAR(32), limit_scope VARCHAR(8), scope_id VARCHAR(32), api_key_id VARCHAR(32), project_id VARCHAR, member_id VARCHAR, spend_limit_window VARCHAR(8), window_starts_at TIMESTAMP WITH TIME ZONE, window_ends_at TIMESTAMP WITH TIME ZONE, window_starts VARCHAR, percent INTEGER, limit_microcents BIGINT, threshold_microcents BIGINT)) WITH ORDINALITY AS t(account_id, limit_scope, scope_id, api_key_id, project_id, member_id, spend_limit_window, window_starts_at, window_ends_at, window_starts, percent, limit_microcents, threshold_microcents, position)) AS shown ON shown.account_id = fired.account_id AND shown.scope_id = fired.scope_id AND shown.percent = fired.percent ORDER BY fired.account_id COLLATE "C", fired.scope_id COLLATE "C", fired.percent;
            END IF;
        END IF;
    END IF;
    RETURN v_booked_request_id;
END;
$$
