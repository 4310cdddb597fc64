"""The statements behind an authorization, per backend: the resolving read, the check-and-hold,
the void.

**Check-and-hold.** Each account row keeps ``held_microcents``, the sum of its *counted* holds,
beside its balance, so the check is O(1) whatever the number of holds in flight. Placing a hold
counts it; releasing one (void, settlement, tidy-up) only changes the hold's status and never
waits for the account's lock. The account's next check-and-hold, holding that lock, first stops
counting the holds released since and those past their ``expires_at`` (which become
'expired': lazy expiry, no sweeper needed), then compares. So an active hold always counts, a
released one never does by the time it matters, and the counter always equals the sum of the
holds it counts (``metering verify`` checks it).

* **PostgreSQL:** the check-and-hold is one call of the server-side function
  ``metering_place_holds`` (migration 0005) on an autocommit connection: one round trip, and
  the account's row lock is held only while the function runs and commits. Each statement in
  it takes a fresh snapshot after the lock (READ COMMITTED), so it sees every hold, release and
  charge committed before; keys with a monthly limit read their month's charges there too.
  The resolving read before it takes no lock. Each process remembers the last resolution
  it read per key and model (migration 0010): the next authorization is estimated from it
  and sent straight to the check-and-hold, which recomputes the resolution under the lock
  and places the hold only if it is unchanged ('stale' otherwise, and the process reads
  afresh). One round trip instead of two, and nothing decided on process memory: a revoked
  key, a new price, limit, billing mode or model change applies to the next request.
  Statements are plain SQL sent through psycopg's async connection on the event loop
  (``Database.async_driver_autocommit``; psycopg prepares them after a few uses):
  SQLAlchemy's per-statement work and the thread-pool hop of a sync route were each a
  visible share of the hot path's CPU.
  While a process has a check-and-hold in flight, its next holds (of any account) wait for
  it and then go in one call together (``_Queue``: group commit, one round trip and one
  durable commit for several holds, each account locked once, in the order settlement locks
  accounts, and each hold decided as if alone).
* **SQLite:** the same steps in Python inside the unit of work, whose BEGIN IMMEDIATE
  serialises every writer.

No deadlock: settlement locks holds, then accounts (in byte order of id); the check-and-hold
locks its accounts in that same order, and after each the released holds it stops counting,
but skips any hold locked by someone else instead of waiting (a hold being settled or tidied up
at that very moment counts until the account's next check: never more credit than there is). A
void and the tidy-up lock holds only, and the tidy-up skips locked ones too.
"""

from metering.ledger.placement.postgres import Confirm, PostgresHolds
from metering.ledger.placement.rows import (
    BODY_COLUMNS,
    HOLD_VALUES,
    ModelRow,
    Placement,
    Resolved,
    rates_in_force,
)
from metering.ledger.placement.sqlite import SqliteHolds

__all__ = [
    "BODY_COLUMNS",
    "HOLD_VALUES",
    "Confirm",
    "ModelRow",
    "Placement",
    "PostgresHolds",
    "Resolved",
    "SqliteHolds",
    "rates_in_force",
]
