"""Model-based test: random interleavings of everything that moves money, checked after every step
against a plain in-memory model.

A hypothesis ``RuleBasedStateMachine`` drives the real app (in process, on each backend) with
grants and adjustments (idempotency keys reused on purpose), credit grants with categories,
priorities and expiries, and their voids (the model keeps each grant's remainder and the
deficit, and spends each charge in the spending order), authorizations (fresh, retried,
conflicting, refused), voids, the clock moving past hold expiries and month ends, usage batches
(new events, duplicates, conflicts, events naming holds, and every quarantine reason), reprocess
of the quarantine, list-price and account-rate changes, and the access rules: accounts' limits on
requests in flight (429), accounts' and keys' model lists (404 vs 403), and the spend limits of
projects, members and keys (a project and a member with keys in two projects; 402
``project_spend_limit`` / ``member_spend_limit``, checked project, then member, then key). The
model is plain
Python and integer arithmetic written from docs/api.md — it does not import
``metering.pricing`` — and after every step ``GET /v1/credits`` (balance, held, available) and
``GET /v1/usage`` (totals and each day) must equal it for a prepaid and an unbilled account, and
the quarantine must hold exactly the model's entries with their codes. Every response is also
checked against the model as it comes.

Each run draws new steps and values: its seed is chosen at random and printed
(``model-based seed N``); ``METERING_MODEL_SEED=N`` replays that run. Under CI (``CI=1``) the seed
is fixed, so CI runs the same steps every time. ``make test-long`` runs many more examples of
more steps (``METERING_MODEL_EXAMPLES``, ``METERING_MODEL_STEPS``). Hypothesis also prints a
failure's steps as code and a ``@reproduce_failure(...)`` blob.

A run must reach each path that matters (``REQUIRED``: an expiry at its very instant, a hold's
and a grant's; the 429 of the concurrency limit; a key's spend limit refused in each window, and
a project's and a member's; a deficit paid off by a grant; an event quarantined then recorded by
a reprocess): a few steps steer there on purpose, and the test fails, naming what was missed,
when a run did not get there.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.conftest import APP_BACKENDS, NOW, Api, migrated_database, running_api
from tests.factories import exact_json, usage_object
from tests.security.helpers import assert_books_reconcile, assert_contract_response

IN_CI = bool(os.environ.get("CI"))
# What the runs exercised (printed by the test: `pytest -s` shows it; REQUIRED is asserted).
SEEN: Counter[str] = Counter()
EXAMPLES = int(os.environ.get("METERING_MODEL_EXAMPLES", "6"))
STEPS = int(os.environ.get("METERING_MODEL_STEPS", "50"))
SEED_VARIABLE = "METERING_MODEL_SEED"
CI_SEED = 20261129
REQUIRED = (
    "hold expiry at the instant",
    "grant expiry at the instant",
    "POST 429 concurrency_limit_exceeded",
    "spend limit day",
    "spend limit week",
    "spend limit month",
    "project spend limit",
    "member spend limit",
    "deficit paid off",
    "reprocess recorded",
)
TTL = 600  # seconds a hold counts
MICRO = 1_000_000  # microcents per cent


def seen(what: str) -> None:
    event(what)
    SEEN[what] += 1


def run_seed() -> int:
    """The seed of this run: ``METERING_MODEL_SEED``, else fixed under CI, else random."""
    given = os.environ.get(SEED_VARIABLE)
    if given:
        return int(given)
    return CI_SEED if IN_CI else secrets.randbelow(2**32)


def values(edges: list[int], low: int, high: int) -> st.SearchStrategy[int]:
    """The values that sit on an edge, or any in between."""
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


def window_of(window: str, at: datetime) -> tuple[datetime, datetime]:
    """A spend window [start, end): the UTC day, the week from Monday, or the month of ``at``."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        return day, day + timedelta(days=1)
    if window == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    return start, (start + timedelta(days=32)).replace(day=1)


# -- the model: plain integers, written from docs/api.md ------------------------------------


def half_up(numerator: int, denominator: int) -> int:
    return (2 * numerator + denominator) // (2 * denominator)


def cents_text(microcents: int) -> str:
    sign = "-" if microcents < 0 else ""
    whole, frac = divmod(abs(microcents), MICRO)
    return f"{sign}{whole}.{frac:06d}"


def iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Rates = tuple[int, int, int]  # input, output, cache read: microcents per million tokens


@dataclass(frozen=True)
class ModelSpec:
    id: str
    context_length: int
    max_output_tokens: int | None
    headroom: int


@dataclass
class Hold:
    id: str
    account: str
    key: str
    request_id: str | None
    fingerprint: tuple[Any, ...]
    estimate: int
    max_tokens: int
    expires_at: datetime
    status: str = "active"  # active | voided | settled (expiry is read from the clock)

    def status_at(self, now: datetime) -> str:
        return "expired" if self.status == "active" and self.expires_at <= now else self.status


@dataclass
class Recorded:
    account: str
    request_id: str
    content: tuple[Any, ...]  # key, model, api, counts, occurred_at, outcome
    counts: tuple[int, int, int, int]  # prompt, cached, output, reasoning
    occurred_at: datetime
    key: str
    total: int
    charge: dict[str, int]


@dataclass
class Entry:
    """A quarantined raw event: kept once per distinct raw event."""

    raw: dict[str, Any]
    code: str
    id: int | None = None  # learned from the admin list


@dataclass
class CreditGrant:
    """A grant as the model keeps it (docs/api.md#credit-ledger)."""

    id: str
    category: str
    priority: int
    expires_at: datetime | None
    order: int  # creation order
    amount: int
    remaining: int
    voided: bool = False

    def live(self, now: datetime) -> bool:
        expired = self.expires_at is not None and self.expires_at <= now
        return not self.voided and not expired and self.remaining > 0

    def status(self, now: datetime) -> str:
        if self.voided:
            return "voided"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active" if self.remaining else "depleted"


@dataclass
class Account:
    id: str
    billed: bool
    keys: dict[str, int | None] = field(default_factory=dict)  # key id -> spend limit (µ¢)
    windows: dict[str, str] = field(default_factory=dict)  # key id -> its window (month)
    # Each key's project and member (None: a service key), fixed for its life; each project's
    # and member's spend limit (µ¢, None: none) and window.
    key_project: dict[str, str] = field(default_factory=dict)
    key_member: dict[str, str | None] = field(default_factory=dict)
    limits: dict[str, tuple[int | None, str]] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    grants: dict[str, CreditGrant] = field(default_factory=dict)
    deficit: int = 0

    def live(self, now: datetime) -> list[CreditGrant]:
        """Live grants in spending order: priority, then expiry (never last), then creation."""
        return sorted(
            (g for g in self.grants.values() if g.live(now)),
            key=lambda g: (g.priority, g.expires_at is None, g.expires_at or now, g.order),
        )

    def balance_at(self, now: datetime) -> int:
        return sum(g.remaining for g in self.live(now)) - self.deficit

    def spend(self, amount: int, now: datetime) -> None:
        for grant in self.live(now):
            take = min(grant.remaining, amount)
            grant.remaining -= take
            amount -= take
        self.deficit += amount

    def credit(
        self, grant_id: str, category: str, priority: int, expires: Any, amount: int
    ) -> None:
        paid = min(self.deficit, amount)
        if paid:
            seen("deficit paid off")
        self.deficit -= paid
        self.grants[grant_id] = CreditGrant(
            grant_id, category, priority, expires, len(self.grants), amount, amount - paid
        )

    entries: dict[str, tuple[str, int, str | None]] = field(default_factory=dict)  # idem key
    overrides: dict[str, list[tuple[datetime, Rates | None]]] = field(default_factory=dict)
    # The limit on requests in flight, the account's model list and each key's (None: all).
    concurrency: int | None = None
    models: set[str] | None = None
    key_models: dict[str, set[str] | None] = field(default_factory=dict)


@dataclass
class World:
    api: Api


class Billing(RuleBasedStateMachine):
    """See the module docstring. One instance is one sequence of steps on fresh accounts."""

    world: World  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.api = self.world.api
        self.prefix = secrets.token_hex(3)
        self.counter = 0
        self.accounts: dict[str, Account] = {}
        self.key_owner: dict[str, str] = {}
        self.models: dict[str, ModelSpec] = {}
        self.list_prices: dict[str, list[tuple[datetime, Rates]]] = {}
        self.holds: list[Hold] = []
        self.recorded: dict[tuple[str, str], Recorded] = {}
        self.quarantine: dict[str, Entry] = {}  # canonical raw -> entry
        self.raws: list[dict[str, Any]] = []  # every raw event sent, for resends
        self.late_model: str | None = None
        self.hold_bodies: dict[str, dict[str, Any]] = {}  # hold id -> the request that made it
        self.raw_of_recorded: dict[tuple[str, str], dict[str, Any]] = {}
        self.seen_before = Counter(SEEN)  # what earlier examples reached

    # -- helpers ---------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        return self.api.clock.now()

    def next_id(self, what: str) -> str:
        self.counter += 1
        return f"{self.prefix}-{what}-{self.counter}"

    def check(self, response: Any, status: int, code: str | None = None) -> Any:
        seen(f"{response.request.method} {response.status_code} {code or ''}".strip())
        assert_contract_response(response)
        assert response.status_code == status, (status, code, response.text)
        if code is not None:
            assert response.json()["error"]["code"] == code, response.text
        return (
            response.json()
            if response.headers.get("content-type", "").startswith("application/json")
            else None
        )

    def price_at(self, account: Account, model_id: str, at: datetime) -> Rates | None:
        override = [r for eff, r in account.overrides.get(model_id, []) if eff <= at]
        if override and override[-1] is not None:
            return override[-1]
        listed = [r for eff, r in self.list_prices.get(model_id, []) if eff <= at]
        return listed[-1] if listed else None

    def add_list_price(self, model_id: str, at: datetime, rates: Rates) -> None:
        saved = self.now
        self.api.clock.set(min(saved, at))
        try:
            body = {
                "effective_at": iso(at),
                "input_microcents_per_million": rates[0],
                "output_microcents_per_million": rates[1],
                "cache_read_microcents_per_million": rates[2],
            }
            response = self.api.admin("POST", f"/admin/v1/models/{model_id}/prices", json=body)
        finally:
            self.api.clock.set(saved)
        self.check(response, 201)
        self.list_prices.setdefault(model_id, []).append((at, rates))

    def put_model(self, spec: ModelSpec) -> None:
        body = {
            "display_name": spec.id,
            "context_length": spec.context_length,
            "max_output_tokens": spec.max_output_tokens,
            "reasoning_headroom_tokens": spec.headroom,
        }
        self.check(self.api.admin("PUT", f"/admin/v1/models/{spec.id}", json=body), 201)
        self.models[spec.id] = spec

    # -- setup -----------------------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        self.api.clock.set(NOW)
        m1 = ModelSpec(f"M1-{self.prefix}", 131_072, None, 1000)
        m2 = ModelSpec(f"M2-{self.prefix}", 32_768, 4096, 0)
        for spec in (m1, m2):
            self.put_model(spec)
        self.add_list_price(m1.id, NOW - timedelta(days=30), (22_000_000, 339_000_000, 17_750_000))
        # M2 has no price before yesterday: older events of prepaid accounts are unpriceable.
        self.add_list_price(m2.id, NOW - timedelta(days=1), (1_000_001, 2_500_003, 333_333))
        for name, billing in (("A", "prepaid"), ("U", "unbilled")):
            response = self.api.admin(
                "POST", "/admin/v1/accounts", json={"name": name, "billing": billing}
            )
            account = Account(self.check(response, 201)["id"], billing == "prepaid")
            self.accounts[name] = account
        # A has a project P beside its Default one, and a member (Ada); no limits yet.
        a = self.accounts["A"]
        made = self.api.admin("POST", f"/admin/v1/accounts/{a.id}/projects", json={"name": "P"})
        project = self.check(made, 201)["id"]
        made = self.api.admin(
            "POST", f"/admin/v1/accounts/{a.id}/members", json={"email": f"{self.prefix}@x.io"}
        )
        ada = self.check(made, 201)["id"]
        for account in self.accounts.values():
            account.limits[self.default_project(account)] = (None, "month")
        a.limits.update({project: (None, "month"), ada: (None, "month")})
        # A's second key has a monthly limit of 30 cents; its third is Ada's in P, its fourth
        # Ada's in Default; U's key has none.
        for name, limit, owners in (
            ("A", None, {}),
            ("A", 30 * MICRO, {}),
            ("U", None, {}),
            ("A", None, {"project_id": project, "member_id": ada}),
            ("A", None, {"member_id": ada}),
        ):
            account = self.accounts[name]
            body = {"name": "k", "monthly_spend_limit_cents": None if limit is None else 30}
            created = self.check(
                self.api.admin(
                    "POST", f"/admin/v1/accounts/{account.id}/api-keys", json={**body, **owners}
                ),
                201,
            )
            account.keys[created["id"]] = limit
            account.secrets[created["id"]] = created["key"]
            account.key_project[created["id"]] = owners.get(
                "project_id", self.default_project(account)
            )
            account.key_member[created["id"]] = owners.get("member_id")
            assert (created["project_id"], created["member_id"]) == (
                account.key_project[created["id"]],
                account.key_member[created["id"]],
            )
            self.key_owner[created["id"]] = name
        self.ledger_entry("A", "grant", 60 * MICRO, False, "seed", None)

    def keys(self) -> list[str]:
        return [key for account in self.accounts.values() for key in account.keys]

    @staticmethod
    def default_project(account: Account) -> str:
        """The account's Default project (docs/api.md#projects-and-members: its id is the
        account's with ``proj_`` for ``acct_``)."""
        return "proj_" + account.id.removeprefix("acct_")

    def scopes(self, account: Account, key: str) -> list[tuple[str, str, set[str]]]:
        """The spend limits a key's requests count against, in the order they are checked:
        its project's, its member's (when it has one), its own; each as (scope, the project's,
        member's or key's id, the keys whose spend counts)."""
        project = account.key_project[key]
        member = account.key_member[key]
        found = [("project", project, {k for k, p in account.key_project.items() if p == project})]
        if member is not None:
            found.append(
                ("member", member, {k for k, m in account.key_member.items() if m == member})
            )
        return [*found, ("key", key, {key})]

    def limit_of(self, account: Account, scope: str, owner: str) -> tuple[int | None, str]:
        if scope == "key":
            return account.keys[owner], account.windows.get(owner, "month")
        return account.limits[owner]

    # -- credits ---------------------------------------------------------------------------

    @rule(
        account=st.sampled_from(["A", "A", "U"]),
        kind=st.sampled_from(["grant", "adjustment"]),
        amount=values([1, 999_999, 25 * MICRO, 100 * MICRO, 3_000 * MICRO], 1, 5_000 * MICRO),
        negative=st.booleans(),
        idempotency=st.sampled_from(["i0", "i1", "i2", "i3", "i4"]),
        note=st.sampled_from([None, "n"]),
    )
    def ledger_entry(
        self,
        account: str,
        kind: str,
        amount: int,
        negative: bool,
        idempotency: str,
        note: str | None,
    ) -> None:
        model = self.accounts[account]
        if kind == "adjustment":
            amount = -amount if negative else amount
            note = note or "r"
        text = f'{{"amount_cents": {cents_text(amount)}, "idempotency_key": "{idempotency}"'
        text += f', "{"note" if kind == "grant" else "reason"}": {json.dumps(note)}}}'
        response = self.api.client.post(
            f"/admin/v1/accounts/{model.id}/{kind}s",
            content=text.encode(),
            headers={**self.api.admin_headers, "Content-Type": "application/json"},
        )
        previous = model.entries.get(idempotency)
        if previous is None:
            body = self.check(response, 201)
            model.entries[idempotency] = (kind, amount, note)
            if amount < 0:
                model.spend(-amount, self.now)
            elif kind == "grant":
                model.credit(body["id"], "paid", 50, None, amount)
            else:
                model.credit(body["grant_id"], "adjustment", 50, None, amount)
            assert body["amount_microcents"] == amount
        elif previous == (kind, amount, note):
            assert self.check(response, 200)["amount_microcents"] == amount
        else:
            self.check(response, 409, "idempotency_conflict")

    @rule(
        account=st.sampled_from(["A", "A", "U"]),
        promotional=st.booleans(),
        priority=st.one_of(st.none(), values([0, 10, 50, 100], 0, 100)),
        expires_in=st.one_of(st.none(), values([1, TTL, 3600, 86_400], 1, 7 * 86_400)),
        amount=values([1, 999_999, 25 * MICRO, 100 * MICRO], 1, 500 * MICRO),
    )
    def credit_grant(
        self,
        account: str,
        promotional: bool,
        priority: int | None,
        expires_in: int | None,
        amount: int,
    ) -> None:
        """A grant with terms: category, priority, expiry (a fresh idempotency key: replays are
        ``ledger_entry``'s)."""
        model = self.accounts[account]
        category = "promotional" if promotional else "paid"
        body: dict[str, Any] = {"idempotency_key": self.next_id("g"), "category": category}
        if priority is not None:
            body["priority"] = priority
        expires = None if expires_in is None else self.now + timedelta(seconds=expires_in)
        if expires is not None:
            body["expires_at"] = iso(expires)
        text = json.dumps(body)
        response = self.api.client.post(
            f"/admin/v1/accounts/{model.id}/grants",
            content=f'{{"amount_cents": {cents_text(amount)}, {text[1:]}'.encode(),
            headers={**self.api.admin_headers, "Content-Type": "application/json"},
        )
        made = self.check(response, 201)
        chosen = priority if priority is not None else (10 if promotional else 50)
        model.credit(made["id"], category, chosen, expires, amount)
        assert (made["category"], made["priority"], made["amount_microcents"]) == (
            category,
            chosen,
            amount,
        )
        assert made["remaining_microcents"] == model.grants[made["id"]].remaining
        seen(f"grant {category}{' expiring' if expires else ''}")

    @precondition(lambda self: any(a.grants for a in self.accounts.values()))
    @rule(data=st.data())
    def void_grant(self, data: st.DataObject) -> None:
        grants = [
            (account, grant)
            for account in self.accounts.values()
            for grant in account.grants.values()
        ]
        _account, grant = data.draw(st.sampled_from(grants), label="grant")
        response = self.api.admin("POST", f"/admin/v1/grants/{grant.id}/void", json={})
        if grant.status(self.now) == "active":
            grant.voided, grant.remaining = True, 0
            seen("grant voided")
        else:
            seen(f"void of a {grant.status(self.now)} grant")
        body = self.check(response, 200)
        assert (body["status"], body["remaining_microcents"]) == (
            grant.status(self.now),
            grant.remaining if grant.status(self.now) in ("active", "depleted") else 0,
        )

    # -- authorizations --------------------------------------------------------------------

    def expected_estimate(
        self, spec: ModelSpec, rates: Rates, body: dict[str, Any]
    ) -> tuple[int, int] | str:
        """(effective output limit, estimate µ¢), or the 400's code."""
        api, prompt, max_tokens = body["api"], body["prompt_tokens"], body.get("max_tokens")
        context = spec.context_length
        if api == "messages" and max_tokens is None:
            return "missing_parameter"
        if prompt >= context:
            return "context_length_exceeded"
        default = (
            spec.max_output_tokens
            if spec.max_output_tokens is not None
            else (min(65_536, context // 2))
        )
        default = min(default, context - prompt)
        if max_tokens is None or max_tokens > context:
            limit = default
        else:
            limit = max_tokens
            if spec.max_output_tokens is not None:
                limit = min(limit, spec.max_output_tokens)
            if prompt + limit > context:
                if api != "chat_completions":
                    return "context_length_exceeded"
                limit = default
        reserved = (limit + (spec.headroom if body.get("reasoning") else 0)) * body.get("n", 1)
        estimate = half_up(prompt * rates[0], MICRO) + half_up(reserved * rates[1], MICRO)
        return limit, estimate

    def in_flight(self, account: Account) -> int:
        return sum(
            1 for h in self.holds if h.account == account.id and h.status_at(self.now) == "active"
        )

    def held(self, account: Account, keys: set[str] | None = None) -> int:
        return sum(
            h.estimate
            for h in self.holds
            if h.account == account.id
            and (keys is None or h.key in keys)
            and h.status_at(self.now) == "active"
        )

    def window_spent(self, keys: set[str], window: str) -> int:
        start, end = window_of(window, self.now)
        return sum(
            r.total
            for r in self.recorded.values()
            if r.key in keys and start <= r.occurred_at < end
        )

    @rule(
        data=st.data(),
        model=st.sampled_from(["M1", "M2", "m1", "none"]),
        api=st.sampled_from(["chat_completions", "responses", "messages"]),
        prompt=values([0, 1, 999, 5000, 32_768, 131_071, 131_072], 0, 140_000),
        max_tokens=st.one_of(st.none(), values([1, 100, 4000, 4096, 5000, 200_000], 1, 250_000)),
        n=values([1, 1, 2], 1, 4),
        reasoning=st.booleans(),
        request=st.sampled_from(["new", "new", "none", "retry", "conflict"]),
    )
    def authorize(
        self,
        data: st.DataObject,
        model: str,
        api: str,
        prompt: int,
        max_tokens: int | None,
        n: int,
        reasoning: bool,
        request: str,
    ) -> None:
        key = data.draw(st.sampled_from(self.keys()), label="key")
        earlier = [h for h in self.holds if h.request_id is not None]
        if request in ("retry", "conflict") and not earlier:
            request = "new"
        if request == "retry":
            # The gateway retrying: the very same request.
            hold = data.draw(st.sampled_from(earlier), label="hold")
            self.send_authorization(self.hold_bodies[hold.id], hold.key)
            return
        model_id = {
            "M1": f"M1-{self.prefix}",
            "m1": f"m1-{self.prefix}",
            "M2": f"M2-{self.prefix}",
            "none": "No-Such-Model",
        }[model]
        account = self.accounts[self.key_owner[key]]
        body: dict[str, Any] = {
            "api_key": account.secrets[key],
            "model": model_id,
            "api": api,
            "prompt_tokens": prompt,
            "n": n,
            "reasoning": reasoning,
        }
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if request == "new":
            body["request_id"] = self.next_id("auth")
        elif request == "conflict":
            # Another request under an earlier request id (in its account, when the key is).
            body["request_id"] = data.draw(st.sampled_from(earlier), label="hold").request_id
        self.send_authorization(body, key)

    def send_authorization(self, body: dict[str, Any], key: str) -> None:
        account = self.accounts[self.key_owner[key]]
        response = self.api.gateway("POST", "/v1/authorizations", json=body)
        print_ = (
            key,
            body["model"].lower(),
            body["api"],
            body["prompt_tokens"],
            body.get("max_tokens"),
            body.get("n", 1),
            body.get("reasoning", False),
        )
        request_id = body.get("request_id")
        existing = (
            next(
                (h for h in self.holds if h.account == account.id and h.request_id == request_id),
                None,
            )
            if request_id is not None
            else None
        )
        if existing is not None:
            if existing.fingerprint == print_:
                got = self.check(response, 200)
                assert (got["id"], got["status"]) == (existing.id, existing.status_at(self.now))
            else:
                self.check(response, 409, "idempotency_conflict")
            return
        spec = self.models.get(body["model"].replace("m1-", "M1-"))
        rates = self.price_at(account, spec.id, self.now) if spec else None
        sees = spec is not None and (account.models is None or spec.id in account.models)
        if spec is None or rates is None or not sees:
            self.check(response, 404, "model_not_found")
            return
        allowed = account.key_models.get(key)
        if allowed is not None and spec.id not in allowed:
            self.check(response, 403, "model_not_allowed")
            return
        outcome = self.expected_estimate(spec, rates, body)
        if isinstance(outcome, str):
            self.check(response, 400, outcome)
            return
        limit, estimate = outcome
        if account.concurrency is not None and self.in_flight(account) >= account.concurrency:
            self.check(response, 429, "concurrency_limit_exceeded")
            assert response.headers["retry-after"] == "1", response.headers
            return
        if account.billed:
            available = account.balance_at(self.now) - self.held(account)
            if estimate > available:
                self.check(response, 402, "insufficient_credits")
                return
            for scope, owner, keys in self.scopes(account, key):
                spend_limit, window = self.limit_of(account, scope, owner)
                spent = self.window_spent(keys, window) + self.held(account, keys)
                if spend_limit is not None and spent + estimate > spend_limit:
                    code = "project_spend_limit" if scope == "project" else "member_spend_limit"
                    self.check(response, 402, code)
                    error = exact_json(response)["error"]
                    assert (error["limit_scope"], error["spend_limit_window"]) == (scope, window)
                    assert error["spend_limit_cents"] == Decimal(spend_limit) / MICRO, error
                    assert error["spent_cents"] == Decimal(spent) / MICRO, (error, spent)
                    seen(f"spend limit {window}" if scope == "key" else f"{scope} spend limit")
                    return
        got = self.check(response, 200)
        seen("authorization granted")
        assert (got["estimate_microcents"], got["max_tokens"], got["status"]) == (
            estimate,
            limit,
            "active",
        ), (got, estimate, limit)
        hold = Hold(
            got["id"],
            account.id,
            key,
            request_id,
            print_,
            estimate,
            limit,
            self.now + timedelta(seconds=TTL),
        )
        self.holds.append(hold)
        self.hold_bodies[hold.id] = body

    @precondition(lambda self: bool(self.holds))
    @rule(data=st.data(), unknown=st.sampled_from([False, False, False, True]))
    def void(self, data: st.DataObject, unknown: bool) -> None:
        if unknown:
            self.check(self.api.gateway("DELETE", "/v1/authorizations/auth_nope"), 404, "not_found")
            return
        hold = data.draw(st.sampled_from(self.holds), label="hold")
        response = self.api.gateway("DELETE", f"/v1/authorizations/{hold.id}")
        if hold.status_at(self.now) == "active":
            hold.status = "voided"
        assert self.check(response, 200)["status"] == hold.status_at(self.now)

    # -- requests in flight and model access -----------------------------------------------

    @rule(account=st.sampled_from(["A", "U"]), limit=st.one_of(st.none(), st.integers(1, 4)))
    def set_concurrency(self, account: str, limit: int | None) -> None:
        model = self.accounts[account]
        response = self.api.admin(
            "PATCH", f"/admin/v1/accounts/{model.id}", json={"max_concurrent_requests": limit}
        )
        assert self.check(response, 200)["max_concurrent_requests"] == limit
        model.concurrency = limit

    @rule(account=st.sampled_from(["A", "U"]), models=st.sampled_from([None, "M1", "M2", "both"]))
    def set_model_access(self, account: str, models: str | None) -> None:
        model = self.accounts[account]
        ids = self.model_ids(models)
        response = self.api.admin(
            "PUT",
            f"/admin/v1/accounts/{model.id}/model-access",
            json={"models": None if ids is None else sorted(ids)},
        )
        shown = self.check(response, 200)["model_access"]
        assert shown == (None if ids is None else sorted(ids, key=str.encode))
        model.models = ids

    @rule(data=st.data(), models=st.sampled_from([None, "M1", "M2", "both"]))
    def set_key_models(self, data: st.DataObject, models: str | None) -> None:
        key = data.draw(st.sampled_from(self.keys()), label="key")
        account = self.accounts[self.key_owner[key]]
        ids = self.model_ids(models)
        response = self.api.admin(
            "PATCH",
            f"/admin/v1/api-keys/{key}",
            json={"allowed_models": None if ids is None else sorted(ids)},
        )
        if ids is not None and account.models is not None and not ids <= account.models:
            self.check(response, 400, "invalid_parameter")
            return
        self.check(response, 200)
        account.key_models[key] = ids

    def model_ids(self, choice: str | None) -> set[str] | None:
        m1, m2 = f"M1-{self.prefix}", f"M2-{self.prefix}"
        return {None: None, "M1": {m1}, "M2": {m2}, "both": {m1, m2}}[choice]

    @rule(
        data=st.data(),
        limit=st.one_of(st.none(), values([0, 1, 30 * MICRO, 1_000 * MICRO], 0, 2_000 * MICRO)),
        window=st.sampled_from(["day", "week", "month"]),
    )
    def set_key_limit(self, data: st.DataObject, limit: int | None, window: str) -> None:
        key = data.draw(st.sampled_from(self.keys()), label="key")
        self.put_key_limit(key, limit, window)

    def put_key_limit(self, key: str, limit: int | None, window: str) -> None:
        account = self.accounts[self.key_owner[key]]
        amount = "null" if limit is None else cents_text(limit)
        text = f'{{"spend_limit_cents": {amount}, "spend_limit_window": "{window}"}}'
        response = self.api.client.patch(
            f"/admin/v1/api-keys/{key}",
            content=text.encode(),
            headers={**self.api.admin_headers, "Content-Type": "application/json"},
        )
        body = self.check(response, 200)
        assert (body["spend_limit_microcents"], body["spend_limit_window"]) == (limit, window)
        account.keys[key] = limit
        account.windows[key] = window

    @rule(
        data=st.data(),
        limit=st.one_of(st.none(), values([0, 1, 30 * MICRO, 1_000 * MICRO], 0, 2_000 * MICRO)),
        window=st.sampled_from(["day", "week", "month"]),
    )
    def set_scope_limit(self, data: st.DataObject, limit: int | None, window: str) -> None:
        """A spend limit set on one of A's projects or on its member (or removed)."""
        owner = data.draw(st.sampled_from(sorted(self.accounts["A"].limits)), label="owner")
        self.put_scope_limit(self.accounts["A"], owner, limit, window)

    def put_scope_limit(self, account: Account, owner: str, limit: int | None, window: str) -> None:
        """``PATCH`` a project's or a member's spend limit (exact cents, as text)."""
        path = "projects" if owner.startswith("proj_") else "members"
        amount = "null" if limit is None else cents_text(limit)
        text = f'{{"spend_limit_cents": {amount}, "spend_limit_window": "{window}"}}'
        response = self.api.client.patch(
            f"/admin/v1/{path}/{owner}",
            content=text.encode(),
            headers={**self.api.admin_headers, "Content-Type": "application/json"},
        )
        body = self.check(response, 200)
        assert (body["spend_limit_microcents"], body["spend_limit_window"]) == (limit, window)
        account.limits[owner] = (limit, window)

    def open_model(self, key: str) -> str:
        """M1, made usable with ``key``: its account's and its own model lists opened when they
        leave it out."""
        name = self.key_owner[key]
        account = self.accounts[name]
        m1 = f"M1-{self.prefix}"
        if account.models is not None and m1 not in account.models:
            self.set_model_access(account=name, models=None)
        allowed = account.key_models.get(key)
        if allowed is not None and m1 not in allowed:
            response = self.api.admin(
                "PATCH", f"/admin/v1/api-keys/{key}", json={"allowed_models": None}
            )
            self.check(response, 200)
            account.key_models[key] = None
        return m1

    def small_request(self, key: str, prompt: int = 10) -> dict[str, Any]:
        account = self.accounts[self.key_owner[key]]
        return {
            "api_key": account.secrets[key],
            "request_id": self.next_id("auth"),
            "model": self.open_model(key),
            "api": "chat_completions",
            "prompt_tokens": prompt,
            "max_tokens": 100,
        }

    def spend_and_estimate(
        self, key: str, keys: set[str], window: str
    ) -> tuple[dict[str, Any], int]:
        """A's ``key`` spends (an event now; A's limit on requests in flight lifted and its
        balance topped up first); then a request of ``key`` and the room it needs under a limit
        on the spend of ``keys`` in ``window``: what they have spent there and hold, plus the
        request's estimate."""
        account = self.accounts["A"]
        model_id = self.open_model(key)
        self.set_concurrency(account="A", limit=None)
        if account.balance_at(self.now) - self.held(account) < 100 * MICRO:
            self.credit_grant(
                account="A", promotional=False, priority=None, expires_in=None, amount=500 * MICRO
            )
        spent = {
            "request_id": self.next_id("ev"),
            "api_key_id": key,
            "model": model_id,
            "api": "chat_completions",
            "usage": usage_object("chat_completions", 1000, 0, 100, 0),
            "occurred_at": iso(self.now),
            "outcome": "completed",
        }
        self.send_batch([spent])
        # 100 000 prompt tokens: at least a microcent at any of the rates used here.
        body = self.small_request(key, prompt=100_000)
        rates = self.price_at(account, model_id, self.now)
        assert rates is not None
        outcome = self.expected_estimate(self.models[model_id], rates, body)
        assert not isinstance(outcome, str) and outcome[1] > 0, outcome
        return body, self.window_spent(keys, window) + self.held(account, keys) + outcome[1]

    # -- steps that steer to the paths a run must reach (REQUIRED) ---------------------------

    @rule()
    def crowd(self) -> None:
        """U's limit on requests in flight set to what it has in flight (at least one), then
        two more requests: the second at the latest is refused (429)."""
        account = self.accounts["U"]
        key = next(iter(account.keys))
        self.set_concurrency(account="U", limit=max(1, self.in_flight(account)))
        for _ in range(2):
            self.send_authorization(self.small_request(key), key)

    @rule(which=st.integers(0, 1), window=st.sampled_from(["day", "week", "month"]))
    def spend_limit_in_window(self, which: int, window: str) -> None:
        """One of A's keys spends in ``window`` (an event now); its limit is then what it has
        spent there and holds plus an estimate, less one microcent: that request is refused
        (member_spend_limit); with the microcent back it is granted."""
        key = list(self.accounts["A"].keys)[which]
        body, room = self.spend_and_estimate(key, {key}, window)
        self.put_key_limit(key, room - 1, window)
        self.send_authorization(body, key)
        self.put_key_limit(key, room, window)
        self.send_authorization({**body, "request_id": self.next_id("auth")}, key)

    @rule(
        scope=st.sampled_from(["project", "member"]),
        window=st.sampled_from(["day", "week", "month"]),
    )
    def scope_limit_in_window(self, scope: str, window: str) -> None:
        """Ada's key in P spends in ``window`` (an event now); then, with the limits of its
        scopes checked before ``scope`` opened (none) and the key's own removed, ``scope``'s
        limit (P's, or Ada's over both of her keys) is what its keys have spent there and hold
        plus an estimate, less one microcent: that request is refused (project_spend_limit or
        member_spend_limit, naming the scope); with the microcent back it is granted."""
        account = self.accounts["A"]
        key = list(account.keys)[2]  # Ada's key in P
        order = [found[0] for found in self.scopes(account, key)]
        for _, owner, _ in self.scopes(account, key)[: order.index(scope)]:
            self.put_scope_limit(account, owner, None, "month")
        self.put_key_limit(key, None, "month")
        ((_, owner, keys),) = [found for found in self.scopes(account, key) if found[0] == scope]
        body, room = self.spend_and_estimate(key, keys, window)
        self.put_scope_limit(account, owner, room - 1, window)
        self.send_authorization(body, key)
        self.put_scope_limit(account, owner, room, window)
        self.send_authorization({**body, "request_id": self.next_id("auth")}, key)

    @rule(amount=values([1, 999_999, 25 * MICRO], 1, 100 * MICRO), share=st.integers(1, 3))
    def deficit_paid_off(self, amount: int, share: int) -> None:
        """A negative adjustment takes A ``amount`` below zero; a grant of a third, half or all
        of it (or more) pays the deficit off first."""
        account = self.accounts["A"]
        debt = account.balance_at(self.now) + amount
        if debt > 0:
            idempotency = self.next_id("adj")
            text = (
                f'{{"amount_cents": {cents_text(-debt)}, "idempotency_key": "{idempotency}", '
                '"reason": "r"}'
            )
            response = self.api.client.post(
                f"/admin/v1/accounts/{account.id}/adjustments",
                content=text.encode(),
                headers={**self.api.admin_headers, "Content-Type": "application/json"},
            )
            assert self.check(response, 201)["amount_microcents"] == -debt
            account.entries[idempotency] = ("adjustment", -debt, "r")
            account.spend(debt, self.now)
        assert account.deficit > 0
        self.credit_grant(
            account="A",
            promotional=False,
            priority=None,
            expires_in=None,
            amount=max(1, account.deficit * share // 2),
        )

    @rule()
    def quarantine_then_reprocess(self) -> None:
        """An unbilled account's event names a model not in the catalog yet (quarantined); the
        model is added, and reprocessing the event records it."""
        account = self.accounts["U"]
        key = next(iter(account.keys))
        spec = ModelSpec(f"Q{self.counter}-{self.prefix}", 8192, 1024, 0)
        raw = {
            "request_id": self.next_id("ev"),
            "api_key_id": key,
            "model": spec.id,
            "api": "chat_completions",
            "usage": usage_object("chat_completions", 100, 0, 10, 0),
            "occurred_at": iso(self.now - timedelta(seconds=1)),
            "outcome": "completed",
        }
        self.send_batch([raw])
        self.put_model(spec)
        self.learn_quarantine_ids()
        canonical = json.dumps(raw, sort_keys=True)
        self.reprocess_entries([(canonical, self.quarantine[canonical])])
        assert canonical not in self.quarantine

    @rule(what=st.sampled_from(["hold", "grant"]), lifetime=values([1, TTL], 1, 86_400))
    def expiry_at_the_instant(self, what: str, lifetime: int) -> None:
        """The clock set a microsecond before the next expiry of a hold (one placed on U when
        none is active) or of a grant (one made on A when none expiring is live), where it
        still counts, then at its very instant, where it no longer does: checked at both."""
        if what == "hold":
            if not [h for h in self.holds if h.status_at(self.now) == "active"]:
                account = self.accounts["U"]
                key = next(iter(account.keys))
                self.set_concurrency(account="U", limit=None)
                self.send_authorization(self.small_request(key), key)
            instants = [h.expires_at for h in self.holds if h.status_at(self.now) == "active"]
        else:
            if not [g for a in self.accounts.values() for g in a.live(self.now) if g.expires_at]:
                self.credit_grant(
                    account="A",
                    promotional=True,
                    priority=None,
                    expires_in=lifetime,
                    amount=self.accounts["A"].deficit + 25 * MICRO,  # live after the pay-off
                )
            instants = [
                g.expires_at
                for a in self.accounts.values()
                for g in a.live(self.now)
                if g.expires_at is not None
            ]
        assert instants, f"no {what} to expire"
        at = min(instants)
        self.api.clock.set(at - timedelta(microseconds=1))
        self.credits_and_reports_agree()
        self.api.clock.set(at)
        self.credits_and_reports_agree()
        seen(f"{what} expiry at the instant")

    # -- time and prices -------------------------------------------------------------------

    @precondition(lambda self: self.now < NOW + timedelta(days=40))
    @rule(seconds=values([1, 59, TTL - 1, TTL, TTL + 1, 3600, 86_400, 3 * 86_400], 1, 4 * 86_400))
    def advance(self, seconds: int) -> None:
        self.api.clock.advance(seconds=seconds)

    @rule(
        versioned=st.sampled_from(["list M1", "list M2", "account A M1"]),
        when=st.sampled_from(["after newest", "after newest", "now", "newest"]),
        delay=st.sampled_from([0, 1, 3600]),
        rates=st.sampled_from(
            [
                (22_000_000, 339_000_000, 17_750_000),
                (1_000_001, 2_500_003, 333_333),
                (7, 0, 1),
                None,  # on an account: ends the override; on a list price: the GLM rates
            ]
        ),
    )
    def price_change(self, versioned: str, when: str, delay: int, rates: Rates | None) -> None:
        """A new list-price or account-rate version, in force from now or later; one dated
        before now or not after the newest version is refused (price history is immutable)."""
        account = self.accounts["A"]
        model_id = f"{versioned.split()[-1]}-{self.prefix}"
        if versioned.startswith("list"):
            history: list[tuple[datetime, Any]] = self.list_prices[model_id]
            rates = rates or (22_000_000, 339_000_000, 17_750_000)
            path = f"/admin/v1/models/{model_id}/prices"
            body: dict[str, Any] = {}
        else:
            history = account.overrides.setdefault(model_id, [])
            path = f"/admin/v1/accounts/{account.id}/rates"
            body = {"model": model_id.lower()}
        newest = history[-1][0] if history else None
        if when == "newest" and newest is not None:
            at = newest
        elif when == "after newest" and newest is not None:
            at = max(self.now, newest + timedelta(seconds=1)) + timedelta(seconds=delay)
        else:
            at = self.now + timedelta(seconds=delay)
        values = rates or (None, None, None)
        body.update(
            {
                "effective_at": iso(at),
                "input_microcents_per_million": values[0],
                "output_microcents_per_million": values[1],
                "cache_read_microcents_per_million": values[2],
            }
        )
        response = self.api.admin("POST", path, json=body)
        if at < self.now or (newest is not None and at <= newest):
            self.check(response, 409, "price_history_immutable")
        else:
            self.check(response, 201)
            history.append((at, rates))

    @precondition(lambda self: self.late_model is None)
    @rule()
    def add_late_model(self) -> None:
        """M3 is named by events before it exists (quarantined), then added with a price from
        now on: reprocess records what is priceable, and an unbilled account's usage."""
        spec = ModelSpec(f"M3-{self.prefix}", 8192, 1024, 0)
        self.put_model(spec)
        self.add_list_price(spec.id, self.now, (5_000_000, 5_000_000, 5_000_000))
        self.late_model = spec.id

    # -- usage -----------------------------------------------------------------------------

    def draw_event(self, data: st.DataObject) -> dict[str, Any]:
        kind = data.draw(
            st.sampled_from(
                [
                    "new",
                    "new",
                    "new",
                    "settles",
                    "names_hold",
                    "duplicate",
                    "conflict",
                    "resend_quarantined",
                    "unknown_key",
                    "invalid_usage",
                    "late_model",
                ]
            ),
            label="event kind",
        )
        if kind == "duplicate" and self.recorded:
            original = data.draw(st.sampled_from(list(self.recorded)), label="original")
            raw = dict(self.raw_of_recorded[original])
            if data.draw(st.booleans(), label="respell model"):
                raw["model"] = raw["model"].lower()
            return raw
        if kind == "conflict" and self.recorded:
            original = data.draw(st.sampled_from(list(self.recorded)), label="original")
            raw = json.loads(json.dumps(self.raw_of_recorded[original]))
            change = data.draw(st.sampled_from(["outcome", "usage", "time", "key"]), label="chg")
            if change == "outcome":
                raw["outcome"] = "failed" if raw["outcome"] == "completed" else "completed"
            elif change == "usage":
                raw["usage"] = usage_object(raw["api"], 1, 0, 1, 0)
            elif change == "time":
                raw["occurred_at"] = iso(self.now - timedelta(seconds=7))
            else:
                owner = self.accounts[self.key_owner[raw["api_key_id"]]]
                others = [k for k in owner.keys if k != raw["api_key_id"]]
                raw["api_key_id"] = others[0] if others else raw["api_key_id"]
                raw["outcome"] = "failed" if raw["outcome"] == "completed" else "completed"
            return raw
        if kind == "resend_quarantined" and self.quarantine:
            return json.loads(data.draw(st.sampled_from(list(self.quarantine)), label="raw"))
        key = data.draw(st.sampled_from(self.keys()), label="key")
        model = data.draw(st.sampled_from(["M1", "M2", "m2"]), label="model")
        model_id = {"M1": f"M1-{self.prefix}", "M2": f"M2-{self.prefix}"}.get(
            model, f"m2-{self.prefix}"
        )
        api = data.draw(st.sampled_from(["chat_completions", "responses", "messages"]), label="api")
        prompt = data.draw(values([0, 1, 1000, 123_457], 0, 200_000), label="prompt")
        cached = data.draw(values([0, prompt // 3, prompt], 0, prompt), label="cached")
        output = data.draw(values([0, 1, 777, 50_001], 0, 60_000), label="output")
        reasoning = (
            0
            if api == "messages"
            else data.draw(values([0, output // 2, output], 0, output), label="reasoning")
        )
        if kind == "invalid_usage":
            cached = prompt + 1
        offsets = [-3 * 86_400, -86_400 - 1, -3600, -1, 0, 240, 300, 301, 900]
        offset = data.draw(values(offsets, -4 * 86_400, 900), label="offset seconds")
        occurred_at = self.now + timedelta(seconds=offset)
        boundaries = [
            at
            for history in (*self.list_prices.values(), *self.accounts["A"].overrides.values())
            for at, _ in history
            if self.now - timedelta(days=3) <= at <= self.now + timedelta(minutes=5)
        ]
        if boundaries and data.draw(st.booleans(), label="at a price boundary"):
            occurred_at = data.draw(st.sampled_from(sorted(boundaries)), label="boundary")
        raw: dict[str, Any] = {
            "request_id": self.next_id("ev"),
            "api_key_id": key,
            "model": model_id,
            "api": api,
            "usage": usage_object(api, prompt, cached, output, reasoning),
            "occurred_at": iso(occurred_at),
            "outcome": data.draw(st.sampled_from(["completed", "failed"]), label="outcome"),
        }
        if kind == "unknown_key":
            raw["api_key_id"] = "key_" + secrets.token_hex(10)
        if kind == "late_model":
            raw["model"] = f"M3-{self.prefix}"
        if kind in ("settles", "names_hold") and self.holds:
            hold = data.draw(st.sampled_from(self.holds), label="hold")
            if kind == "names_hold":
                raw["authorization_id"] = hold.id
            elif hold.request_id is not None:
                raw["request_id"] = hold.request_id
            raw["api_key_id"] = hold.key if data.draw(st.booleans(), label="same key") else key
        return raw

    def classify(self, raws: list[dict[str, Any]]) -> list[tuple[str, Any]]:
        """The result of each event of one batch, in order; applies it to the model."""
        results: list[tuple[str, Any]] = []
        recorded_now: list[Recorded] = []
        for raw in raws:
            key = raw["api_key_id"]
            owner = self.key_owner.get(key)
            if owner is None:
                results.append(("quarantined", "unknown_api_key"))
                continue
            account = self.accounts[owner]
            occurred_at = datetime.fromisoformat(raw["occurred_at"].replace("Z", "+00:00"))
            if occurred_at > self.now + timedelta(minutes=5):
                results.append(("quarantined", "invalid_timestamp"))
                continue
            usage = raw["usage"]
            if raw["api"] == "chat_completions":
                counts = (
                    usage["prompt_tokens"],
                    usage["prompt_tokens_details"]["cached_tokens"],
                    usage["completion_tokens"],
                    usage["completion_tokens_details"]["reasoning_tokens"],
                )
            elif raw["api"] == "responses":
                counts = (
                    usage["input_tokens"],
                    usage["input_tokens_details"]["cached_tokens"],
                    usage["output_tokens"],
                    usage["output_tokens_details"]["reasoning_tokens"],
                )
            else:
                counts = (
                    usage["input_tokens"],
                    usage["cache_read_input_tokens"],
                    usage["output_tokens"],
                    0,
                )
            if counts[1] > counts[0] or counts[3] > counts[2]:
                results.append(("quarantined", "invalid_usage"))
                continue
            model_id = next((m for m in self.models if m.lower() == raw["model"].lower()), None)
            if model_id is None:
                results.append(("quarantined", "model_not_found"))
                continue
            if account.billed:
                rates = self.price_at(account, model_id, occurred_at)
                if rates is None:
                    results.append(("quarantined", "price_not_found"))
                    continue
            else:
                rates = (0, 0, 0)
            content = (key, model_id, raw["api"], counts, occurred_at, raw["outcome"])
            original = self.recorded.get((account.id, raw["request_id"]))
            if original is not None:
                if original.content == content:
                    results.append(("duplicate", original.charge))
                else:
                    results.append(("quarantined", "idempotency_conflict"))
                continue
            prompt, cached, output, _ = counts
            charge = {
                "input_microcents": half_up((prompt - cached) * rates[0], MICRO),
                "cache_read_microcents": half_up(cached * rates[2], MICRO),
                "output_microcents": half_up(output * rates[1], MICRO),
            }
            total = sum(charge.values())
            charge["total_microcents"] = total
            entry = Recorded(
                account.id, raw["request_id"], content, counts, occurred_at, key, total, charge
            )
            self.recorded[(account.id, raw["request_id"])] = entry
            self.raw_of_recorded[(account.id, raw["request_id"])] = raw
            recorded_now.append(entry)
            if account.billed:
                account.spend(total, self.now)
            results.append(("recorded", charge))
            self.settle(account, raw)
        return results

    def settle(self, account: Account, raw: dict[str, Any]) -> None:
        """The hold the event names (in its own account), else the account's open hold with
        the event's request_id, becomes settled; voided and settled holds stay as they are."""
        named = raw.get("authorization_id")
        for hold in self.holds:
            if hold.account != account.id or hold.status != "active":
                continue
            if (named and hold.id == named) or (not named and hold.request_id == raw["request_id"]):
                hold.status = "settled"
                seen("hold settled")

    def keep(self, raws: list[dict[str, Any]], results: list[tuple[str, Any]]) -> None:
        for raw, (status, code) in zip(raws, results, strict=True):
            if status == "quarantined":
                canonical = json.dumps(raw, sort_keys=True)
                entry = self.quarantine.setdefault(canonical, Entry(raw, code))
                entry.code = code

    @rule(data=st.data(), size=st.integers(1, 6))
    def ingest(self, data: st.DataObject, size: int) -> None:
        raws = [self.draw_event(data) for _ in range(size)]
        if data.draw(st.booleans(), label="repeat an event in the batch") and raws:
            raws.append(dict(raws[0]))
        self.send_batch(raws)

    def send_batch(self, raws: list[dict[str, Any]]) -> None:
        response = self.api.gateway("POST", "/v1/usage/events", json={"events": raws})
        body = self.check(response, 200)
        expected = self.classify(raws)
        for status, detail in expected:
            seen(f"event {status} {detail if isinstance(detail, str) else ''}".strip())
        self.keep(raws, expected)
        got = [
            (r["status"], r["error"]["code"] if r["error"] else r["charge"]) for r in body["data"]
        ]
        trimmed = [
            (status, {k: v for k, v in detail.items() if k in _CHARGE_FIELDS})
            if isinstance(detail, dict)
            else (status, detail)
            for status, detail in got
        ]
        assert trimmed == expected, (raws, got, expected)
        self.check_quarantine()

    @precondition(lambda self: bool(self.quarantine))
    @rule(data=st.data(), everything=st.booleans())
    def reprocess(self, data: st.DataObject, everything: bool) -> None:
        self.learn_quarantine_ids()
        # Drawn in the model's own (insertion) order, so a replay picks the same entries; sent
        # and processed by the service in id order.
        entries = list(self.quarantine.items())
        if not everything:
            chosen = data.draw(
                st.lists(
                    st.sampled_from(entries), min_size=1, max_size=4, unique_by=lambda e: e[0]
                ),
                label="entries",
            )
            entries = chosen
        self.reprocess_entries(entries)

    def reprocess_entries(self, entries: list[tuple[str, Entry]]) -> None:
        entries = sorted(entries, key=lambda item: item[1].id or 0)
        body = {"ids": [entry.id for _, entry in entries]}
        response = self.api.admin("POST", "/admin/v1/quarantine/reprocess", json=body)
        got = self.check(response, 200)
        expected = self.classify([entry.raw for _, entry in entries])
        for status, detail in expected:
            seen(f"reprocess {status} {detail if isinstance(detail, str) else ''}".strip())
        for (canonical, entry), (status, detail) in zip(entries, expected, strict=True):
            if status == "quarantined":
                entry.code = detail
            else:
                del self.quarantine[canonical]
        statuses = [(item["id"], item["status"]) for item in got["data"]]
        assert statuses == [
            (entry.id, status) for (_, entry), (status, _) in zip(entries, expected, strict=True)
        ]
        self.check_quarantine()

    def learn_quarantine_ids(self) -> dict[str, str]:
        listed = self.api.admin("GET", "/admin/v1/quarantine?limit=1000").json()["data"]
        mine = {}
        for item in listed:
            if not str(item["request_id"]).startswith(self.prefix):
                continue
            canonical = json.dumps(item["event"], sort_keys=True)
            entry = self.quarantine.get(canonical)
            assert entry is not None, ("unexpected quarantine entry", item)
            entry.id = item["id"]
            mine[canonical] = item["code"]
        return mine

    def check_quarantine(self) -> None:
        assert self.learn_quarantine_ids() == {
            canonical: entry.code for canonical, entry in self.quarantine.items()
        }

    # -- what must always agree ------------------------------------------------------------

    @invariant()
    def credits_and_reports_agree(self) -> None:
        if not self.accounts:
            return
        start = NOW.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=4)
        end = self.now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=2)
        for account in self.accounts.values():
            secret = next(iter(account.secrets.values()))
            credits = exact_json(self.api.as_key(secret, "GET", "/v1/credits"))
            held = self.held(account)
            balance = account.balance_at(self.now)
            assert (
                credits["balance_microcents"],
                credits["held_microcents"],
                credits["available_microcents"],
                credits["deficit_microcents"],
            ) == (balance, held, balance - held, account.deficit), credits
            assert (credits["balance_cents"], credits["available_cents"]) == (
                Decimal(cents_text(balance)),
                Decimal(cents_text(balance - held)),
            )
            assert [(g["id"], g["remaining_microcents"]) for g in credits["grants"]] == [
                (g.id, g.remaining) for g in account.live(self.now)
            ]
            report = self.api.as_key(
                secret,
                "GET",
                f"/v1/usage?starting_at={start:%Y-%m-%d}&ending_at={end:%Y-%m-%d}",
            )
            assert report.status_code == 200, report.text
            got = report.json()
            days: dict[datetime, list[int]] = {}
            for r in self.recorded.values():
                if r.account == account.id and start <= r.occurred_at < end:
                    day = r.occurred_at.replace(hour=0, minute=0, second=0, microsecond=0)
                    sums = days.setdefault(day, [0, 0, 0, 0, 0])
                    for index, value in enumerate(
                        (1, r.counts[0], r.counts[1], r.counts[2], r.total)
                    ):
                        sums[index] += value
            totals = [sum(s[i] for s in days.values()) for i in range(5)]
            cost = totals[4] if account.billed else None
            assert [
                got["totals"][m]
                for m in ("requests", "input_tokens", "cache_read_tokens", "output_tokens")
            ] + [got["totals"]["cost_microcents"]] == [*totals[:4], cost], (got["totals"], totals)
            for bucket in got["data"]:
                day = datetime.fromisoformat(bucket["starting_at"].replace("Z", "+00:00"))
                sums = days.get(day, [0, 0, 0, 0, 0])
                assert bucket["requests"] == sums[0], (bucket, sums)
                assert bucket["cost_microcents"] == (sums[4] if account.billed else None)

    def teardown(self) -> None:
        if not self.accounts:
            return
        # Each example ends by steering, from the state its random steps left, to every path a
        # run must reach that they did not reach (hypothesis switches rules off at random in
        # each example, the steering ones too); the model is checked after each.
        steer = {
            "hold expiry at the instant": lambda: self.expiry_at_the_instant("hold", TTL),
            "grant expiry at the instant": lambda: self.expiry_at_the_instant("grant", 3600),
            "POST 429 concurrency_limit_exceeded": self.crowd,
            "spend limit day": lambda: self.spend_limit_in_window(0, "day"),
            "spend limit week": lambda: self.spend_limit_in_window(1, "week"),
            "spend limit month": lambda: self.spend_limit_in_window(1, "month"),
            "project spend limit": lambda: self.scope_limit_in_window("project", "week"),
            "member spend limit": lambda: self.scope_limit_in_window("member", "day"),
            "deficit paid off": lambda: self.deficit_paid_off(999_999, 1),
            "reprocess recorded": self.quarantine_then_reprocess,
        }
        for what in REQUIRED:
            if SEEN[what] == self.seen_before[what]:
                SEEN["steered to " + what] += 1
                steer[what]()
                self.credits_and_reports_agree()
        assert_books_reconcile(self.api)


_CHARGE_FIELDS = (
    "input_microcents",
    "cache_read_microcents",
    "output_microcents",
    "total_microcents",
)


@pytest.fixture(params=APP_BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    with (
        migrated_database(request.param, tmp_path) as url,
        running_api(request.param, url, tmp_path, hold_ttl_seconds=TTL) as api,
    ):
        yield World(api)


def test_the_service_agrees_with_a_plain_model(world: World) -> None:
    Billing.world = world
    SEEN.clear()
    chosen = run_seed()
    replay = f"{SEED_VARIABLE}={chosen} replays this run"
    print(f"\nmodel-based seed {chosen} ({replay})")
    try:
        run_state_machine_as_test(
            seed(chosen)(Billing),
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                print_blob=True,
            ),
        )
    finally:
        print("\n".join(f"{count:5d} {what}" for what, count in sorted(SEEN.items())))
    missed = [what for what in REQUIRED if not SEEN[what]]
    assert not missed, f"the run never reached {missed} ({replay})"
