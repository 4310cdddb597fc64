CREATE OR REPLACE FUNCTION metering_place_holds_of_node(p_now TIMESTAMP WITH TIME ZONE, p_holds json)
RETURNS TABLE (hold_id VARCHAR, outcome VARCHAR, available BIGINT, spent BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_shard BIGINT;
    v_part JSON;
    v_sf_hold_id VARCHAR;
    v_sf_outcome VARCHAR;
    v_sf_available BIGINT;
    v_sf_spent BIGINT;
    v_account VARCHAR;
    v_account_part JSON;
BEGIN
    FOR v_shard, v_part IN
    SELECT get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id') AS part_key, json_agg(given.value ORDER BY given.position) AS part_rows
    FROM json_array_elements(p_holds) WITH ORDINALITY AS given(value, position) GROUP BY get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id') ORDER BY get_shard_id_for_distribution_column('accounts', given.value ->> 'account_id')
    LOOP
        PERFORM lock_shard_metadata(5, ARRAY[v_shard]) AS shard_locked;
        IF metering_shard_forms_here(v_shard) THEN
            FOR v_sf_hold_id, v_sf_outcome, v_sf_available, v_sf_spent IN
            SELECT not_delegable.hold_id, not_delegable.outcome, not_delegable.available, not_delegable.spent
            FROM (SELECT shard_form.hold_id AS hold_id, shard_form.outcome AS outcome, shard_form.available AS available, shard_form.spent AS spent
            FROM metering_place_holds_of_shards(v_shard, CAST(NULL AS VARCHAR), p_now, v_part) AS shard_form
             LIMIT ALL OFFSET 0) AS not_delegable
            LOOP
                hold_id := v_sf_hold_id;
                outcome := v_sf_outcome;
                available := v_sf_available;
                spent := v_sf_spent;
                RETURN NEXT;
            END LOOP;
        ELSE
            FOR v_account, v_account_part IN
            SELECT given.value ->> 'account_id' AS part_key, json_agg(given.value ORDER BY given.position) AS part_rows
            FROM json_array_elements(v_part) WITH ORDINALITY AS given(value, position) GROUP BY given.value ->> 'account_id' ORDER BY (given.value ->> 'account_id') COLLATE "C"
            LOOP
                FOR v_sf_hold_id, v_sf_outcome, v_sf_available, v_sf_spent IN
                SELECT not_delegable.hold_id, not_delegable.outcome, not_delegable.available, not_delegable.spent
                FROM (SELECT account_form.hold_id AS hold_id, account_form.outcome AS outcome, account_form.available AS available, account_form.spent AS spent
                FROM metering_place_holds_of_account(v_account, p_now, v_account_part) AS account_form
                 LIMIT ALL OFFSET 0) AS not_delegable
                LOOP
                    hold_id := v_sf_hold_id;
                    outcome := v_sf_outcome;
                    available := v_sf_available;
                    spent := v_sf_spent;
                    RETURN NEXT;
                END LOOP;
            END LOOP;
        END IF;
    END LOOP;
END;
$$
