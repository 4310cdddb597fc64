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

SQLite keeps the models' forms. Both forms are rendered by ``metering.models.ledger``
(``amount_sign_check``, ``kind_check``) from the kinds of this migration's time (no ``refund``).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 04:00:00
"""

from collections.abc import Sequence

from alembic import op

from metering.models.ledger import amount_sign_check, kind_check

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The ledger's kinds with their amounts' signs, and the allocation days' kinds, at this time.
ENTRY_SIGNS = {
    "grant": (1,),
    "adjustment": (1, -1),
    "charge": (0, -1),
    "expiry": (-1,),
    "void": (-1,),
}
ALLOCATION_KINDS = ("spend", "deficit", "payoff")

# table, check, its compact form, its form before (the baseline's)
CHECKS = (
    (
        "ledger_entries",
        "ck_ledger_entries_amount_sign",
        amount_sign_check(ENTRY_SIGNS, compact=True),
        amount_sign_check(ENTRY_SIGNS, compact_kinds=True),
    ),
    (
        "credit_allocation_days",
        "ck_credit_allocation_days_kind",
        kind_check(ALLOCATION_KINDS, compact=True),
        kind_check(ALLOCATION_KINDS),
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
