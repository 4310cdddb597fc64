"""The service on a Citus cluster: account data sharded by account, each account's unit of work
a single-node transaction.

* metering.citus.placement: where each table sits (the one rule, and the facts it reads);
* metering.citus.one_account: one account's statements and programs, each sent whole to the
  shard that holds the account (the one-account compiler);
* metering.citus.operations: operator-wide work, account by account;
* metering.citus.distribution: the schema placed by the rule (``metering migrate``).

Whether a database is a cluster is decided once, when its ``Database`` is made
(metering.db.Kind).
"""

from metering.citus.distribution import (
    ASYNCHRONOUS_COMMITS,
    REBALANCE,
    Distribution,
    distribute,
    placements,
)
from metering.citus.one_account import ACCOUNT, of_account, text_of_account
from metering.citus.operations import (
    EXPORT_DAY_LOCK,
    QUARANTINE_REPROCESS_LOCK,
    SIGN_IN_MAIL_LOCK,
    accounts_with,
    by_account,
    execute_of_account,
    lock,
    one_snapshot,
    per_account,
)
from metering.citus.placement import SCOPE, Placement, TableFacts, facts_of, placement

__all__ = [
    "ACCOUNT",
    "ASYNCHRONOUS_COMMITS",
    "EXPORT_DAY_LOCK",
    "QUARANTINE_REPROCESS_LOCK",
    "REBALANCE",
    "SCOPE",
    "SIGN_IN_MAIL_LOCK",
    "Distribution",
    "Placement",
    "TableFacts",
    "accounts_with",
    "by_account",
    "distribute",
    "execute_of_account",
    "facts_of",
    "lock",
    "of_account",
    "one_snapshot",
    "per_account",
    "placement",
    "placements",
    "text_of_account",
]
