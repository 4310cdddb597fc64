CREATE OR REPLACE FUNCTION metering_spend_credit_of_account(p_account_id VARCHAR, p_now TIMESTAMP WITH TIME ZONE, p_debits json)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
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
    v_paid_account_id VARCHAR(32)[];
    v_paid_grant_id VARCHAR(32)[];
    v_paid_amount BIGINT[];
    v_whole_account_id VARCHAR(32);
    v_whole_total BIGINT;
    v_first_grant_id VARCHAR(32);
    v_first_remaining BIGINT;
    v_first_updated VARCHAR(32);
    v_unpaid_account_id VARCHAR(32)[];
    v_unpaid_total BIGINT[];
    v_parts_grant_id VARCHAR(32)[];
    v_parts_account_id VARCHAR(32)[];
    v_parts_amount BIGINT[];
    v_parts_kind allocation_kind[];
BEGIN
    v_shard := get_shard_id_for_distribution_column('accounts', p_account_id);
    PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
    SELECT array_agg(collected.account_id ORDER BY collected.account_id COLLATE "C"), array_agg(collected.total ORDER BY collected.account_id COLLATE "C") INTO v_debits_account_id, v_debits_total
    FROM (
    SELECT g.account_id, g.total
    FROM (SELECT * FROM ROWS FROM (json_to_recordset(CAST(p_debits AS json)) AS (account_id VARCHAR(32), total BIGINT)) WITH ORDINALITY AS t(account_id, total, position)) AS g
    ) AS collected;
    IF coalesce(cardinality(v_debits_account_id), 0) > 1 THEN
        PERFORM accounts.id
        FROM accounts
        WHERE accounts.id = p_account_id AND p_account_id IN (SELECT ld.account_id
        FROM unnest(v_debits_account_id, v_debits_total) AS ld(account_id, total)) ORDER BY accounts.id COLLATE "C" FOR NO KEY UPDATE;
    END IF;
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
            INSERT INTO ledger_entries (account_id, kind, amount_microcents, grant_id, created_at, effective_at) SELECT due.account_id, 'expiry' AS anon_1, -due.amount, due.grant_id, p_now AS anon_2, due.expires_at
            FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) ORDER BY due.expires_at, due.grant_id COLLATE "C";
            UPDATE credit_grants SET remaining_microcents=0, status='expired' FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS due(grant_id, account_id, amount, expires_at) WHERE credit_grants.id = due.grant_id AND credit_grants.account_id = p_account_id;
            INSERT INTO webhook_events (public_id, account_id, type, data, created_at) SELECT 'evt_' || replace(CAST(gen_random_uuid() AS TEXT), '-', '') AS event_id_1, de.account_id, 'credit.grant_expired' AS anon_1, CAST(json_build_object('grant_id', de.grant_id, 'forfeited_microcents', de.amount) AS TEXT) AS json_object_text_1, p_now AS anon_2
            FROM unnest(v_due_grant_id, v_due_account_id, v_due_amount, v_due_expires_at) AS de(grant_id, account_id, amount, expires_at);
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
        INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) SELECT pd.account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, 'spend' AS anon_1, pd.grant_id, pd.amount
        FROM unnest(v_paid_account_id, v_paid_grant_id, v_paid_amount) AS pd(account_id, grant_id, amount)
        WHERE true ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents);
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
            INSERT INTO credit_allocation_days (account_id, allocation_date, kind, grant_id, amount_microcents) SELECT pa.account_id, CAST(timezone('UTC', p_now) AS DATE) AS timezone_1, CASE WHEN (pa.grant_id IS NULL) THEN 'deficit' ELSE 'spend' END AS anon_1, coalesce(pa.grant_id, '') AS coalesce_1, pa.amount
            FROM unnest(v_parts_grant_id, v_parts_account_id, v_parts_amount, v_parts_kind) AS pa(grant_id, account_id, amount, kind)
            WHERE true ON CONFLICT (account_id, allocation_date, kind, grant_id) DO UPDATE SET amount_microcents = (credit_allocation_days.amount_microcents + excluded.amount_microcents);
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
END;
$$
