"""Recording one usage event as one server-side function on PostgreSQL.

``metering_record_usage`` inserts a priced event (``ON CONFLICT DO NOTHING``), and only when it
was new settles its charge (``metering_settle_charges``) and adds it to its rollup rows, in that
order (the contended rows last, as the batch path does): one statement, one transaction. It
returns the new event's id, or NULL when the request_id was already taken, in which case nothing
was written and the caller classifies the event the general way (duplicate or conflict).

The single-event request of ``POST /v1/usage/events`` (its most frequent shape) calls it in
autocommit on the event loop after one lookup: two round trips instead of six (BEGIN, lookup,
insert, settlement, rollups, COMMIT) through a worker thread.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 02:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EVENT_COLUMNS = (
    ("account_id", "text"),
    ("request_id", "text"),
    ("api_key_id", "text"),
    ("model_id", "text"),
    ("api", "text"),
    ("outcome", "text"),
    ("occurred_at", "timestamptz"),
    ("authorization_id", "text"),
    ("prompt_tokens", "integer"),
    ("cached_tokens", "integer"),
    ("output_tokens", "integer"),
    ("reasoning_tokens", "integer"),
    ("input_microcents", "bigint"),
    ("cache_read_microcents", "bigint"),
    ("output_microcents", "bigint"),
    ("total_microcents", "bigint"),
    ("price_version_id", "text"),
)
_ROLLUP_KEY = ("account_id", "bucket_width", "grouping", "bucket_start", "api_key_id", "model_id")
_COUNTERS = (
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
)


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


_EVENT_NAMES = [name for name, _ in _EVENT_COLUMNS]
_ROLLUP_NAMES = [*_ROLLUP_KEY, *_COUNTERS]
_ADD = ", ".join(f'"{c}" = usage_rollups."{c}" + EXCLUDED."{c}"' for c in _COUNTERS)

# ``p_event``: a JSON array of one event (the batch path's row format); ``p_rollups``: its rollup
# rows (usage_rollups' columns; last_event_id is set here, to the new id).
RECORD_USAGE = f"""
CREATE OR REPLACE FUNCTION metering_record_usage(
    p_now timestamptz, p_event json, p_billed boolean, p_rollups json)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
    v_account text;
    v_key text;
    v_request text;
    v_hold text;
    v_amount bigint;
BEGIN
    INSERT INTO usage_events ({_quoted(_EVENT_NAMES)}, recorded_at)
    SELECT {", ".join(f"t.{name}" for name in _EVENT_NAMES)}, p_now
    FROM json_to_recordset(p_event) AS t ({", ".join(f"{n} {t}" for n, t in _EVENT_COLUMNS)})
    ON CONFLICT (account_id, request_id) DO NOTHING
    RETURNING id, account_id, api_key_id, request_id, authorization_id, total_microcents
    INTO v_id, v_account, v_key, v_request, v_hold, v_amount;
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;

    PERFORM metering_settle_charges(p_now, json_build_array(json_build_object(
        'account_id', v_account, 'api_key_id', v_key, 'request_id', v_request,
        'event_id', v_id, 'amount', v_amount, 'authorization_id', v_hold,
        'billed', p_billed)));

    INSERT INTO usage_rollups ({_quoted(_ROLLUP_NAMES)}, last_event_id)
    SELECT {_quoted(_ROLLUP_NAMES)}, v_id
    FROM json_populate_recordset(NULL::usage_rollups, p_rollups)
    ON CONFLICT ({_quoted(_ROLLUP_KEY)}) DO UPDATE SET {_ADD},
        last_event_id = GREATEST(usage_rollups.last_event_id, EXCLUDED.last_event_id);
    RETURN v_id;
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(RECORD_USAGE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION metering_record_usage(timestamptz, json, boolean, json)")
