"""PostgreSQL: two checks that every single usage event's statements read, in compact forms — the
same names, the same rows allowed.

PostgreSQL keeps a check as the text of its expression tree and reads that text back at every
statement that writes the table: the single event's record paid about 440k instructions for its
checks, more than a tenth of its database work (docs/performance.md), most of it for these two.

* ``ck_ledger_entries_amount_sign`` (every charge): the kind and the sign of the amount as one
  text, among the pairs allowed (grant: positive; adjustment: not zero; charge: zero or negative;
  expiry and void: negative): one comparison with one ``text[]`` constant instead of four
  alternatives of two comparisons each. Its tree's text: 3,909 characters, then 1,439. (A NULL
  amount, which the column refuses, passes both.)
* ``ck_credit_allocation_days_kind`` (the day's spend row): ``kind::text = ANY ('{…}'::text[])``
  as the baseline wrote the other checks of the gateway's path, in place of the
  ``ARRAY['spend'::varchar, …]::text[]`` that ``IN (…)`` becomes.

SQLite keeps the models' forms (``ENTRY_SIGNS``, ``kind IN (…)``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 04:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table, check, its compact form, its form before
CHECKS = (
    (
        "ledger_entries",
        "ck_ledger_entries_amount_sign",
        "kind::text || sign(amount_microcents)::text = ANY "
        "('{grant1,adjustment1,adjustment-1,charge0,charge-1,expiry-1,void-1}'::text[])",
        "kind::text = 'grant' AND amount_microcents > 0"
        " OR kind::text = 'adjustment' AND amount_microcents <> 0"
        " OR kind::text = 'charge' AND amount_microcents <= 0"
        " OR kind::text = ANY ('{expiry,void}'::text[]) AND amount_microcents < 0",
    ),
    (
        "credit_allocation_days",
        "ck_credit_allocation_days_kind",
        "kind::text = ANY ('{spend,deficit,payoff}'::text[])",
        "kind IN ('spend', 'deficit', 'payoff')",
    ),
)


def _replace(compact: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, name, short, long in CHECKS:
        op.drop_constraint(op.f(name), table, type_="check")
        op.create_check_constraint(op.f(name), table, short if compact else long)


def upgrade() -> None:
    _replace(compact=True)


def downgrade() -> None:
    _replace(compact=False)
