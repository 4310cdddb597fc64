"""The life cycles of the service's records, one state machine per module: its diagram, its
states as an enum, the legal transitions as data, the Python rule beside its SQL forms, and the
table's check constraint and partial-index predicates written from the same enum.

* ``holds``: a credit hold (active → settled | voided | expired);
* ``grants``: a credit grant (active → expired | voided; depleted as read);
* ``deliveries``: a webhook delivery (pending → delivered | failed | dropped; resent: pending);
* ``exports``: a day's export (pending → succeeded | failed, again at every run).
* ``payments``: a payment (pending → succeeded | failed) and a refund (the same), beside the
  statuses Stripe reports for a PaymentIntent and a refund.

They import nothing of the service but ``metering.kit``: the tables (``metering.models``) and
every domain that moves a record take their states from here.
"""

from collections.abc import Iterable


def listed(subject: str, values: Iterable[str]) -> str:
    """The DDL condition that ``subject`` is one of ``values``: ``subject IN ('a', 'b', …)``."""
    return f"{subject} IN (" + ", ".join(f"'{value}'" for value in values) + ")"
