"""Notifications: signed webhooks from a transactional outbox (docs/api.md#webhooks).

* ``outbox``: the event types and the one way to write an event (``emit``, and the balance
  crossings as steps of the settlement programs), inside the transaction that causes it;
* ``spend_limits``: ``spend_limit.threshold_reached``, steps of the usage programs;
* ``secrets``: signing secrets, encrypted at rest with a key derived from METERING_SECRET_KEY;
* ``addresses``: which addresses a webhook may reach (checked at save and at connect time);
* ``delivery``: the scheduler's delivery loop (fan-out, claim, sign, send, retry);
* ``service``/``endpoints``: endpoint management, deliveries listing, resend.
"""
