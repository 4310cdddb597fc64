"""Booking a batch's charges as one server-side function on PostgreSQL.

``metering_settle_charges`` does in one round trip what ``metering.ledger.settlement`` did in
three to six statements: find the hold each charge settles, lock those holds (by id) and settle
them, append the ledger debits, lock the accounts (by id) and debit their balances. A
single-event ingest paid a round trip and SQLAlchemy's execution layer for each; the function's
statements are planned once per connection. SQLite runs the same steps in Python
(``metering.ledger.settlement``), one writer at a time.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 01:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# ``p_charges``: a JSON array of {account_id, api_key_id, request_id, event_id, amount,
# authorization_id, billed}, one per recorded usage event, in event id order.
#
# Usage that happened is always billed: every billed charge is debited in full whatever became
# of its hold. The hold a charge settles is the one it names (authorization_id, of the same
# account) or, naming none, the account's open hold with its request_id; a hold settled by
# several events of the call gets the first (lowest) event id. Voided and already settled holds
# stay as they are; an expired one is settled (it did get its usage).
#
# Row locks in one global order, so concurrent calls cannot deadlock: the holds by id, then the
# accounts by id (byte order). READ COMMITTED: each statement after a lock sees what was
# committed before it was granted, so a hold settled or voided meanwhile is left alone.
SETTLE_CHARGES = """
CREATE OR REPLACE FUNCTION metering_settle_charges(p_now timestamptz, p_charges json)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_holds text[];
    v_events bigint[];
    v_accounts text[];
    v_amounts bigint[];
BEGIN
    -- Read without locks; each hold is checked again once locked.
    WITH charges AS MATERIALIZED (
        SELECT * FROM json_to_recordset(p_charges) AS t (
            account_id text, request_id text, event_id bigint, authorization_id text)
    ), targets AS (
        SELECT h.id, c.event_id
        FROM charges AS c
        JOIN authorizations AS h ON h.id = c.authorization_id AND h.account_id = c.account_id
        WHERE h.status IN ('active', 'expired')
        UNION ALL
        SELECT h.id, c.event_id
        FROM charges AS c
        JOIN authorizations AS h
            ON h.account_id = c.account_id AND h.request_id = c.request_id
        WHERE c.authorization_id IS NULL AND h.status IN ('active', 'expired')
    )
    SELECT array_agg(id ORDER BY id COLLATE "C"), array_agg(event_id ORDER BY id COLLATE "C")
    INTO v_holds, v_events
    FROM (SELECT id, min(event_id) AS event_id FROM targets GROUP BY id) AS firsts;

    IF v_holds IS NOT NULL THEN
        IF cardinality(v_holds) > 1 THEN
            PERFORM 1 FROM authorizations
            WHERE id = ANY (v_holds) AND status IN ('active', 'expired')
            ORDER BY id COLLATE "C" FOR NO KEY UPDATE;
        END IF;
        UPDATE authorizations AS h
        SET status = 'settled', closed_at = p_now, usage_event_id = u.event_id
        FROM unnest(v_holds, v_events) AS u (id, event_id)
        WHERE h.id = u.id AND h.status IN ('active', 'expired');
    END IF;

    INSERT INTO ledger_entries
        (account_id, kind, amount_microcents, usage_event_id, api_key_id, created_at)
    SELECT t.account_id, 'charge', -t.amount, t.event_id, t.api_key_id, p_now
    FROM json_to_recordset(p_charges) AS t (
        account_id text, api_key_id text, event_id bigint, amount bigint, billed boolean)
    WHERE t.billed;

    SELECT array_agg(account_id ORDER BY account_id COLLATE "C"),
           array_agg(total ORDER BY account_id COLLATE "C")
    INTO v_accounts, v_amounts
    FROM (
        SELECT t.account_id, sum(t.amount)::bigint AS total
        FROM json_to_recordset(p_charges) AS t (account_id text, amount bigint, billed boolean)
        WHERE t.billed
        GROUP BY t.account_id
    ) AS totals;

    IF v_accounts IS NOT NULL THEN
        IF cardinality(v_accounts) > 1 THEN
            PERFORM 1 FROM accounts WHERE id = ANY (v_accounts)
            ORDER BY id COLLATE "C" FOR NO KEY UPDATE;
        END IF;
        UPDATE accounts AS a SET balance_microcents = a.balance_microcents - u.amount
        FROM unnest(v_accounts, v_amounts) AS u (id, amount)
        WHERE a.id = u.id;
    END IF;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(SETTLE_CHARGES)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION metering_settle_charges(timestamptz, json)")
