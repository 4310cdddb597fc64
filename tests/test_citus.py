"""The service on a Citus cluster (docs/citus.md). ``metering migrate`` on a coordinator places
every table by the one rule (account data sharded by account and colocated, the rest reference
tables, the audit log on the coordinator) and migrating again changes nothing; each gateway and
account-key request sends the workers statements that touch its account's shard only. Needs
``citus`` in METERING_TEST_BACKENDS (``make citus``)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from alembic.command import upgrade as alembic_upgrade
from sqlalchemy import Text, bindparam, create_engine, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.sql.selectable import Exists, ScalarSelect
from sqlalchemy.sql.visitors import iterate

from metering import citus, migrate, nodes
from metering import programs as p
from metering.citus import shard_forms
from metering.citus.apart import read_apart
from metering.ledger.placement.program import VOID_OF_ACCOUNT
from metering.ledger.resolution import AT, MODEL_KEY, SECRET_HASH, resolution_text_apart
from metering.models import Base
from metering.notifications import delivery
from tests.conftest import CITUS, NOW, Api, fresh_citus_database, running_api
from tests.factories import (
    Key,
    authorize,
    create_account,
    create_key,
    grant,
    priced_model,
    usage_event,
)
from tests.payments.conftest import stripe_settings
from tests.payments.localstripe import (
    CARD_OK,
    SECRET_KEY,
    LocalStripe,
    event,
    running_localstripe,
    sign,
)
from tests.threads import Workers


@pytest.fixture
def citus_api(_shared_apis: dict[str, Api]) -> Iterator[Api]:
    """The shared app on the Citus cluster; fails, never skips, when Citus is left out."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    yield _shared_apis["citus"]


def rows(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql), params)]
    finally:
        engine.dispose()


def citus_tables(url: str) -> dict[str, tuple[str, str, int]]:
    """Each table Citus holds: (its type, its distribution column, its colocation group)."""
    return {
        name: (kind, column, colocation)
        for name, kind, column, colocation in rows(
            url,
            "SELECT table_name::text, citus_table_type, distribution_column, colocation_id "
            "FROM citus_tables",
        )
    }


class TestOneAccountStatements:
    """How ``text_of_account`` limits a statement to the account's shard: a statement of one
    sharded table in its own WHERE, the sharding column named once and compared with the
    account (Citus' fast path, whose plans it keeps between calls); any other by a subquery
    of the account's rows in place of each sharded table."""

    @staticmethod
    def text(statement: Any) -> str:
        """The statement's text on one line, without psycopg's casts of parameters."""
        return " ".join(citus.text_of_account(statement).replace("::VARCHAR", "").split())

    HOLDS = Base.metadata.tables["authorizations"]
    ACCOUNTS = Base.metadata.tables["accounts"]
    KEYS = Base.metadata.tables["api_keys"]

    def test_a_select_of_one_table_compares_the_account_instead(self) -> None:
        statement = select(self.HOLDS.c.id).where(
            self.HOLDS.c.account_id == bindparam("v_account_id"),
            self.HOLDS.c.request_id == bindparam("v_request_id"),
        )
        assert self.text(statement) == (
            "SELECT authorizations.id FROM authorizations"
            " WHERE authorizations.account_id = %(p_account_id)s"
            " AND %(p_account_id)s = %(v_account_id)s"
            " AND authorizations.request_id = %(v_request_id)s"
        )

    def test_an_alias_and_a_list_of_accounts(self) -> None:
        locked = self.HOLDS.alias("locked")
        statement = select(locked.c.id).where(
            locked.c.account_id.in_(select(self.KEYS.c.account_id).scalar_subquery())
        )
        assert self.text(statement) == (
            "SELECT locked.id FROM authorizations AS locked"
            " WHERE locked.account_id = %(p_account_id)s"
            " AND %(p_account_id)s IN (SELECT api_keys.account_id FROM api_keys)"
        )

    def test_an_update_of_one_table(self) -> None:
        statement = (
            update(self.ACCOUNTS)
            .where(self.ACCOUNTS.c.id == bindparam("v_account_id"))
            .values(held_count=0)
        )
        assert self.text(statement) == (
            "UPDATE accounts SET held_count=0"
            " WHERE accounts.id = %(p_account_id)s AND %(p_account_id)s = %(v_account_id)s"
        )

    def test_other_uses_of_the_column_and_joins_keep_the_subquery(self) -> None:
        limited = (
            "(SELECT * FROM authorizations WHERE authorizations.account_id = %(p_account_id)s)"
        )
        otherwise = select(self.HOLDS.c.id).where(self.HOLDS.c.account_id > bindparam("v_after"))
        joined = select(self.HOLDS.c.id).join_from(
            self.HOLDS, self.KEYS, self.KEYS.c.id == self.HOLDS.c.api_key_id
        )
        for statement in (otherwise, joined):
            assert limited in self.text(statement)


class TestReadApart:
    """A join read one table at a time (metering.citus.apart): the remembered resolution's
    confirmation on a shard is statements of one table each (Citus' fast path, planned once),
    and a join whose table could match several rows is refused, not read apart."""

    @staticmethod
    def fetches(steps: Any) -> Iterator[Any]:
        for step in steps:
            if isinstance(step, p.When):
                yield from TestReadApart.fetches((*step.then, *step.otherwise))
            elif isinstance(step, p.Fetch):
                yield step

    @pytest.mark.parametrize("scoped", [True, False])
    def test_the_confirmation_reads_one_table_per_statement(self, scoped: bool) -> None:
        current = p.Var("v_resolution", Text())
        steps = resolution_text_apart(SECRET_HASH, MODEL_KEY, AT, current, scoped=scoped)
        read = [fetch.statement for fetch in self.fetches(steps)]
        tables = [[str(f.name) for f in statement.get_final_froms()] for statement in read]
        assert all(len(names) == 1 for names in tables), tables
        expected = {"api_keys", "accounts", "model", "account_rates", "override"}
        expected |= {"price_versions", "account_models", "api_key_models"}
        if scoped:
            expected |= {"projects", "members", "project_models"}
        assert {names[0] for names in tables} == expected
        # The latest list price is read with its row, by one statement (its subquery's own).
        assert [names[0] for names in tables].count("price_versions") == 1
        assert not any(
            isinstance(e, ScalarSelect | Exists) for s in read for e in iterate(s.whereclause)
        )
        assert isinstance(steps[-1], p.Assign) and steps[-1].into == current

    def test_a_table_that_could_match_several_rows_is_refused(self) -> None:
        keys, projects = self.KEYS, Base.metadata.tables["projects"]
        by_account = keys.join(projects, projects.c.account_id == keys.c.account_id)
        columns = {"id": keys.c.id, "project": projects.c.id}
        with pytest.raises(AssertionError, match="projects is not read by a unique key"):
            read_apart(columns, by_account, keys.c.id == bindparam("key"), "t")

    def test_a_subquery_of_the_table_it_reads_is_refused(self) -> None:
        keys, accounts = self.KEYS, Base.metadata.tables["accounts"]
        projects = Base.metadata.tables["projects"]
        # The account read by a subquery of its own row: nothing read before it could say.
        own = select(projects.c.account_id).where(projects.c.name == accounts.c.name).limit(1)
        joined = keys.join(accounts, accounts.c.id == own.scalar_subquery())
        columns = {"id": keys.c.id, "billing": accounts.c.billing}
        with pytest.raises(AssertionError, match="reads the join's"):
            read_apart(columns, joined, keys.c.id == bindparam("key"), "t")

    KEYS = Base.metadata.tables["api_keys"]


@pytest.mark.parametrize(
    ("name", "not_null", "triggers", "expected"),
    [
        ("accounts", {"id"}, False, citus.Placement("accounts", "distributed", "id")),
        (
            "usage_events",
            {"id", "account_id"},
            False,
            citus.Placement("usage_events", "distributed", "account_id"),
        ),
        ("api_keys", {"id", "account_id"}, False, citus.Placement("api_keys", "reference")),
        ("webhook_events", {"id"}, False, citus.Placement("webhook_events", "reference")),
        ("catalog_models", {"id"}, False, citus.Placement("catalog_models", "reference")),
        ("audit_events", {"seq"}, True, citus.Placement("audit_events", "local")),
    ],
)
def test_the_rule(name: str, not_null: set[str], triggers: bool, expected: Any) -> None:
    """Account data (a NOT NULL account) sharded by it, a key found by its secret's hash on
    every node, a table with triggers on the coordinator, anything else on every node."""
    assert citus.placement(citus.TableFacts(name, frozenset(not_null), triggers)) == expected


class TestPlacement:
    def test_account_tables_are_sharded_by_account_and_the_rest_are_reference_tables(
        self, citus_api: Api
    ) -> None:
        placed = citus_tables(citus_api.url)
        assert set(placed) == set(Base.metadata.tables), "every table of the schema is placed"
        for name, table in Base.metadata.tables.items():
            kind, column, _ = placed[name]
            account = table.columns.get("account_id")
            if name == "accounts":
                assert (kind, column) == ("distributed", "id")
            elif name == "audit_events":  # its append-only triggers keep it on the coordinator
                assert kind == "local"
            elif (
                account is not None
                and not account.nullable
                and name
                not in (
                    "api_keys",
                    "portal_sessions",
                    "portal_sign_in_tokens",
                )
            ):
                assert (kind, column) == ("distributed", "account_id"), name
            else:
                assert kind == "reference", name
        # The gateway's tables by name, so the rule cannot drift unseen.
        assert placed["usage_events"][:2] == ("distributed", "account_id")
        assert placed["authorizations"][:2] == ("distributed", "account_id")
        assert placed["ledger_entries"][:2] == ("distributed", "account_id")
        assert placed["usage_rollups"][:2] == ("distributed", "account_id")
        assert placed["api_keys"][0] == "reference"  # found by the secret's hash, no fan-out
        assert placed["catalog_models"][0] == "reference"
        assert placed["price_versions"][0] == "reference"

    def test_every_account_table_is_colocated_with_accounts(self, citus_api: Api) -> None:
        placed = citus_tables(citus_api.url)
        groups = {group for kind, _, group in placed.values() if kind == "distributed"}
        assert groups == {placed["accounts"][2]}

    def test_one_accounts_rows_of_every_table_are_on_one_node(self, citus_api: Api) -> None:
        """The shard of an account holds it in every account table: one placement per shard
        index, all on the same worker."""
        nodes = rows(
            citus_api.url,
            "SELECT s.shardminvalue, count(DISTINCT p.nodeport) FROM pg_dist_shard s "
            "JOIN pg_dist_placement pl ON pl.shardid = s.shardid "
            "JOIN pg_dist_node p ON p.groupid = pl.groupid "
            "JOIN citus_tables t ON t.table_name = s.logicalrelid "
            "WHERE t.citus_table_type = 'distributed' GROUP BY s.shardminvalue",
        )
        assert nodes and all(count == 1 for _, count in nodes)
        workers = rows(
            citus_api.url,
            "SELECT DISTINCT p.nodeport FROM pg_dist_placement pl "
            "JOIN pg_dist_node p ON p.groupid = pl.groupid "
            "JOIN pg_dist_shard s ON s.shardid = pl.shardid "
            "WHERE s.logicalrelid = 'accounts'::regclass",
        )
        assert len(workers) == 2, "the accounts are spread over both workers"

    def test_migrating_again_changes_nothing(self, citus_api: Api) -> None:
        def schema() -> tuple[Any, ...]:
            return (
                citus_tables(citus_api.url),
                rows(
                    citus_api.url,
                    "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
                    "FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
                ),
                rows(
                    citus_api.url,
                    "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
                ),
                rows(citus_api.url, "SELECT count(*) FROM pg_dist_shard"),
            )

        before = schema()
        done = migrate.upgrade(citus_api.url)
        assert (done.applied, done.installed, done.dropped) == ([], [], [])
        assert citus.distribute(citus_api.url) == citus.Distribution()
        assert schema() == before


def test_a_table_the_rule_now_puts_elsewhere_is_placed_anew() -> None:
    """A migration that makes a nullable account column NOT NULL (as the webhook outbox's
    became) changes the rule's answer: ``migrate`` on a cluster distributed before it takes the
    two reference tables back and shards them by account, their rows with them (an
    operator-wide event under ``''``), their keys and foreign keys widened."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database() as url:
        # The outbox as it was: its account column nullable, so the rule made both tables
        # reference tables.
        alembic_upgrade(migrate.alembic_config(url), "head")
        _outbox_account_column(url, nullable=True)
        citus.distribute(url)
        placed = citus_tables(url)
        assert placed["webhook_events"][0] == placed["webhook_deliveries"][0] == "reference"
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO webhook_endpoints (id, account_id, url, event_types, "
                        "enabled, secret_sealed, created_at) VALUES ('we_1', NULL, "
                        "'https://hooks.example/', '[]', true, 'sealed', now())"
                    )
                )
                for account in ("acct_a", None):
                    event = connection.execute(
                        text(
                            "INSERT INTO webhook_events (public_id, account_id, type, data, "
                            "created_at, dispatched) VALUES (:p, :a, 'webhook.test', '{}', "
                            "now(), true) RETURNING id"
                        ),
                        {"p": f"evt_{account}", "a": account},
                    ).scalar_one()
                    connection.execute(
                        text(
                            "INSERT INTO webhook_deliveries (event_id, endpoint_id, account_id, "
                            "status, attempts, created_at) VALUES (:e, 'we_1', :a, 'pending', "
                            "0, now())"
                        ),
                        {"e": event, "a": account},
                    )
        finally:
            engine.dispose()

        # The migration that made it account data (an event of no account under '').
        _outbox_account_column(url, nullable=False)
        assert citus.distribute(url).moved == ["webhook_deliveries", "webhook_events"]
        placed = citus_tables(url)
        for name in ("webhook_events", "webhook_deliveries"):
            assert placed[name][:2] == ("distributed", "account_id"), name
            assert placed[name][2] == placed["accounts"][2], "colocated with the accounts"
        assert rows(
            url,
            "SELECT e.public_id, e.account_id, d.endpoint_id FROM webhook_events e "
            "JOIN webhook_deliveries d ON d.account_id = e.account_id AND d.event_id = e.id "
            "ORDER BY 1",
        ) == [("evt_None", "", "we_1"), ("evt_acct_a", "acct_a", "we_1")]
        constraints = dict(
            rows(
                url,
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conrelid = 'webhook_deliveries'::regclass AND contype IN ('p', 'f')",
            )
        )
        assert constraints["pk_webhook_deliveries"] == "PRIMARY KEY (account_id, id)"
        assert (
            constraints["fk_webhook_deliveries_event_id_webhook_events"]
            == "FOREIGN KEY (account_id, event_id) REFERENCES webhook_events(account_id, id)"
        )
        assert citus.distribute(url) == citus.Distribution(), "and migrating again does nothing"


def _outbox_account_column(url: str, *, nullable: bool) -> None:
    """``webhook_events.account_id`` and ``webhook_deliveries.account_id`` made nullable, or
    NOT NULL again with ``''`` for the rows of no account."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for table in ("webhook_events", "webhook_deliveries"):
                if nullable:
                    connection.execute(
                        text(f"ALTER TABLE {table} ALTER COLUMN account_id DROP NOT NULL")
                    )
                else:
                    connection.execute(
                        text(f"UPDATE {table} SET account_id = '' WHERE account_id IS NULL")
                    )
                    connection.execute(
                        text(f"ALTER TABLE {table} ALTER COLUMN account_id SET NOT NULL")
                    )
    finally:
        engine.dispose()


# --- Routing: what the coordinator sends the workers, read from its log ---------------------------

# One log record: "<time> [<pid>] db=<database> <LEVEL>:  <message>", continued on lines that do
# not start with a time (citus.sh's log_line_prefix).
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[(?P<pid>\d+)\] "
    r"db=(?P<db>\S*) (?P<level>[A-Z]+):\s+"
    r"(?P<message>.*?)(?=^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\Z)",
    re.MULTILINE | re.DOTALL,
)
SHARD_NAME = re.compile(r"\b([a-z_]+)_(\d{6,})\b")
WRITE = re.compile(r"^(?:INSERT INTO|UPDATE|DELETE FROM) (?:public\.)?([a-z_]+)_(\d{6,})\b")
WORKER = re.compile(r"on server \S+@\S+:(\d+) ")
# A worker's transaction block, as the coordinator opens it: its distributed transaction number.
TRANSACTION = re.compile(r"^BEGIN\b.*assign_distributed_transaction_id\(\d+, (\d+),", re.DOTALL)
ENDS = ("COMMIT", "ROLLBACK")  # COMMIT, COMMIT PREPARED '…', ROLLBACK, ROLLBACK PREPARED '…'


@dataclass
class RemoteCommands:
    """A node's log of one database: each command it sent a worker (with the worker's port) and,
    with ``local`` (a worker's log), each it ran on its own shards (port None), from the
    position ``mark()`` last noted."""

    url: str
    database: str
    offset: int = 0
    local: bool = False

    def mark(self) -> None:
        [(size,)] = rows(self.url, "SELECT size FROM pg_stat_file(pg_current_logfile())")
        self.offset = size

    def since_mark(self) -> list[tuple[str, int | None]]:
        [(size,)] = rows(self.url, "SELECT size FROM pg_stat_file(pg_current_logfile())")
        [(chunk,)] = rows(
            self.url,
            "SELECT pg_read_file(pg_current_logfile(), :offset, :length)",
            offset=self.offset,
            length=size - self.offset,
        )
        commands: list[tuple[str, int | None]] = []
        records = [r for r in RECORD.finditer(chunk) if r["db"] == self.database]
        for index, record in enumerate(records):
            message = record["message"]
            if record["level"] != "NOTICE":
                continue
            if message.startswith("issuing "):
                # Its DETAIL: the next record of the same backend (others' may come between).
                following = next(
                    (r for r in records[index + 1 :] if r["pid"] == record["pid"]), None
                )
                detail = following["message"] if following is not None else ""
                if RELAYED.match(detail):
                    continue  # a worker's notice, passed on to its caller (the worker's log has it)
                port = WORKER.search(detail)
                assert port is not None, f"no worker named for {message!r}: {detail!r}"
                commands.append((message.removeprefix("issuing ").strip(), int(port[1])))
            elif self.local and message.startswith(LOCALLY):
                commands.append((message.removeprefix(LOCALLY).strip(), None))
            elif self.local and (copied := COPIED_LOCALLY.match(message)) is not None:
                # Rows computed first, then copied into a shard of its own (an INSERT … SELECT
                # Citus could not send whole): named here as a command on that shard.
                commands.append((f"COPY shard {copied[1]}", None))
        return commands


LOCALLY = "executing the command locally: "
COPIED_LOCALLY = re.compile(r"executing the copy locally for (?:colocated file with )?shard (\d+)")
COPIED_SHARD = re.compile(r"^COPY shard (\d+)$")
# The DETAIL of a notice a node passed on from a worker it called ("from localhost:9721").
RELAYED = re.compile(r"from \S+:\d+\s*$")


@dataclass
class Shards:
    """Each shard of the database: its table, and its hash range's start (one per colocated
    shard group), None for a reference table's."""

    of: dict[int, tuple[str, int | None]]

    @classmethod
    def read(cls, url: str) -> Shards:
        return cls(
            {
                shard: (table, None if low is None else int(low))
                for shard, table, low in rows(
                    url,
                    "SELECT shardid, logicalrelid::regclass::text, shardminvalue "
                    "FROM pg_dist_shard",
                )
            }
        )

    def writes_every_node(self, command: str) -> str | None:
        """The reference table a command writes (every node holds its shard: the write is a
        transaction of every node), if it writes one."""
        written = WRITE.match(command)
        if written is None:
            return None
        known = self.of.get(int(written[2]))
        return (
            written[1]
            if known is not None and known[0] == written[1] and known[1] is None
            else None
        )

    def groups_in(self, command: str) -> set[int]:
        """The colocated shard groups a command touches (reference tables' shards left out:
        every node has them)."""
        groups = set()
        named = SHARD_NAME.findall(command)
        copied = COPIED_SHARD.match(command)
        if copied is not None and int(copied[1]) in self.of:
            named.append((self.of[int(copied[1])][0], copied[1]))
        for table, shard in named:
            known = self.of.get(int(shard))
            if known is not None and known[0] == table and known[1] is not None:
                groups.add(known[1])
        return groups


@dataclass
class Cluster:
    """The routed app's nodes' logs: the coordinator's, and each worker's (by port)."""

    coordinator: RemoteCommands
    workers: dict[int, RemoteCommands]

    def mark(self) -> None:
        for log in (self.coordinator, *self.workers.values()):
            log.mark()


def accounts_on_two_workers(api: Api) -> tuple[str, str]:
    """Two prepaid accounts whose shards are on different workers, in byte order of id."""
    made: dict[int, str] = {}
    while len(made) < 2:
        account = create_account(api)
        made.setdefault(holder(api.url, account)[1], account)
    first, second = sorted(made.values())
    return first, second


@dataclass
class Sent:
    """A command the coordinator sent a worker: the shard groups it touches, and the
    distributed transaction it ran in (None: a statement of its own)."""

    command: str
    port: int | None
    groups: set[int]
    transaction: int | None


def sent(shards: Shards, commands: list[tuple[str, int | None]]) -> list[Sent]:
    """The coordinator's ``commands`` with their shard groups and transactions (one connection
    per worker)."""
    open_on: dict[int | None, int | None] = {}
    found = []
    for command, port in commands:
        begun = TRANSACTION.match(command)
        if begun is not None:
            open_on[port] = int(begun[1])
        found.append(Sent(command, port, shards.groups_in(command), open_on.get(port)))
        if command.startswith(ENDS):
            open_on[port] = None
    return found


@pytest.fixture(scope="module")
def routed_stripe() -> Iterator[LocalStripe]:
    """localstripe for the routed app (its payments on: Stripe's webhook routes too)."""
    with running_localstripe() as server:
        yield server


@pytest.fixture(scope="module")
def routed(session_tmp: Path, routed_stripe: LocalStripe) -> Iterator[tuple[Api, Cluster]]:
    """The real app on a Citus database of its own whose nodes log every command they send a
    worker (``citus.log_remote_commands``) and, on the workers, every command they run on their
    own shards (``citus.log_local_commands``: the statements of a delegated function call).
    Payments are on (Stripe: ``routed_stripe``); nothing on the gateway's path depends on it."""
    if not CITUS:
        pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
    with fresh_citus_database() as url:
        migrate.upgrade(url)
        # Every call through Citus, whose commands the nodes log: no shard forms (their
        # statements, which Citus never sees, are shown on the account's shards apart:
        # TestShardForms).
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                shard_forms.make(connection, groups=[])
        finally:
            engine.dispose()
        database = make_url(url).database
        assert database is not None
        ports = [
            port for (port,) in rows(url, "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0")
        ]
        nodes = [url, *(make_url(url).set(port=port).render_as_string(False) for port in ports)]
        for node in nodes:
            engine = create_engine(node, isolation_level="AUTOCOMMIT")
            try:
                with engine.connect() as connection:
                    # A worker refuses to propagate the setting (and need not): its own only.
                    connection.execute(text("SET citus.enable_ddl_propagation = off"))
                    for setting in (
                        "citus.log_remote_commands = on",
                        "citus.log_local_commands = on",
                        "log_min_messages = notice",
                    ):
                        connection.execute(text(f'ALTER DATABASE "{database}" SET {setting}'))
            finally:
                engine.dispose()
        cluster = Cluster(
            RemoteCommands(url, database),
            {
                port: RemoteCommands(node, database, local=True)
                for port, node in zip(ports, nodes[1:], strict=True)
            },
        )
        with running_api("citus", url, session_tmp, **stripe_settings(routed_stripe)) as api:
            yield api, cluster


def holder(url: str, account: str) -> tuple[int, int]:
    """The account's shard group (its hash range's start) and the port of the worker holding it."""
    [(low, port)] = rows(
        url,
        "SELECT s.shardminvalue, n.nodeport FROM pg_dist_shard s "
        "JOIN pg_dist_placement p ON p.shardid = s.shardid "
        "JOIN pg_dist_node n ON n.groupid = p.groupid "
        "WHERE s.shardid = get_shard_id_for_distribution_column('accounts', CAST(:a AS text))",
        a=account,
    )
    return int(low), int(port)


DELEGATED = re.compile(r"\bmetering_\w+_of_account\(")
# Rows Citus computed for a statement first (a CTE or subquery it could not send with the
# statement), copied to the nodes that run the rest: those of the account's worker only.
INTERMEDIATE = re.compile(r'COPY "\d+_\d+" FROM STDIN')


class TestRouting:
    """Each gateway and account-key request sends the workers statements that each touch one
    shard group of the account (or reference tables, which every node holds), or a call of a
    one-account function, delegated to the worker that holds the account; and that worker runs
    on its own shards of that group only."""

    def assert_routed(
        self,
        api: Api,
        cluster: Cluster,
        account: str,
        send: Any,
        configures: frozenset[str] = frozenset(),
    ) -> Any:
        """``send()``'s answer, and the commands it had the account's worker run; ``configures``:
        the reference tables the request may write (configuration, on every node)."""
        shards = Shards.read(api.url)
        group, node = holder(api.url, account)
        cluster.mark()
        response = send()
        sent = cluster.coordinator.since_mark()
        routed = []
        for command, port in sent:
            groups = shards.groups_in(command)
            assert groups <= {group}, f"a statement touching other shards: {command}"
            written = shards.writes_every_node(command)
            assert written in (None, *configures), f"a write of every node: {command}"
            if groups or DELEGATED.search(command) or INTERMEDIATE.match(command):
                assert port == node, f"sent to {port}, the account is on {node}: {command}"
                routed.append(command)
        for port, log in cluster.workers.items():
            for command, to in log.since_mark():
                groups = shards.groups_in(command)
                assert groups <= {group}, f"worker {port} touched other shards: {command}"
                assert not groups or port == node, f"worker {port} holds no such shard: {command}"
                # A worker's own statements run on its shards (to: None); a command it sends
                # another node makes the account's work a transaction of two nodes.
                assert to is None, f"worker {port} sent {to}: {command}"
                written = shards.writes_every_node(command)
                assert written in (None, *configures), f"worker {port} wrote {command}"
                if groups:
                    routed.append(command)  # run by a delegated call, on the account's shards
        return response, routed

    def test_account_key_routes(self, routed: tuple[Api, Cluster]) -> None:
        api, cluster = routed
        account = create_account(api, billing="unbilled")
        key = create_key(api, account)
        priced_model(api, NOW - timedelta(days=1))  # a model for /v1/models to list
        sent = []
        for path, params in (
            ("/v1/credits", None),
            ("/v1/usage", {"starting_at": "2026-11-01"}),
            ("/v1/api-keys", None),
            ("/v1/models", None),
        ):
            response, commands = self.assert_routed(
                api,
                cluster,
                account,
                lambda path=path, params=params: api.as_key(key.secret, "GET", path, params=params),
            )
            assert response.status_code == 200, (path, response.text)
            sent.extend(commands)
        # The capture is real: the account's shard was asked (its rows are on a worker).
        assert sent, "no statement reached a worker"

    def test_account_key_webhook_routes(self, routed: tuple[Api, Cluster]) -> None:
        """An account's own webhook endpoints: their reads, a test message (its event and
        delivery written on the account's shard) and its deliveries touch the account's shard
        alone. An endpoint's configuration is a reference table's row (an operator's endpoint,
        of no account, receives every account's events: each account's fan-out reads them all
        where it runs), so creating, changing, rotating or deleting one writes every node: a
        change of configuration, like the catalog's, never a step of the gateway's requests."""
        api, cluster = routed
        account = create_account(api, billing="unbilled")
        key = create_key(api, account)
        config = frozenset({"webhook_endpoints"})

        def call(
            method: str, path: str, configures: frozenset[str] = frozenset(), **kw: Any
        ) -> Any:
            response, commands = self.assert_routed(
                api,
                cluster,
                account,
                lambda: api.as_key(key.secret, method, f"/v1/webhook-endpoints{path}", **kw),
                configures,
            )
            assert response.status_code in (200, 201), (method, path, response.text)
            return response.json(), commands

        created, _ = call(
            "POST",
            "",
            config,
            json={"url": "https://hooks.example/metering", "event_types": ["credit.balance_low"]},
        )
        path = f"/{created['id']}"
        listed, _ = call("GET", "")
        assert [e["id"] for e in listed["data"]] == [created["id"]]
        call("GET", path)
        call("PATCH", path, config, json={"description": "ours"})
        call("POST", f"{path}/rotate-secret", config)
        message, commands = call("POST", f"{path}/test")
        assert message["account_id"] == account
        written = {c.split(" ")[2].rsplit("_", 1)[0] for c in commands if c.startswith("INSERT")}
        assert written == {"public.webhook_events", "public.webhook_deliveries"}, commands
        deliveries, commands = call("GET", f"{path}/deliveries")
        assert [d["event_id"] for d in deliveries["data"]] == [message["id"]]
        assert commands, "read from the account's shard"
        _, commands = call("DELETE", path, config)
        assert any(c.startswith("UPDATE public.webhook_deliveries_") for c in commands)

    def test_authorizations_and_voids(self, routed: tuple[Api, Cluster]) -> None:
        """A fresh read (the key, then its account's resolution), a remembered one (the
        check-and-hold alone), a void, a replay, and an unbilled account's hold."""
        api, cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        grant(api, account, 10_000)
        key = create_key(api, account)
        for _ in range(2):  # read afresh, then remembered
            response, commands = self.assert_routed(
                api, cluster, account, lambda: authorize(api, key, model, max_tokens=100)
            )
            assert response.status_code == 200, response.text
            calls = [c for c in commands if "metering_place_holds_of_account(" in c]
            assert len(calls) == 1, "the check-and-hold is one call, sent to the account's worker"
            # ... where its statements ran on the account's shards (the hold's insert among them)
            assert any(c.startswith("INSERT INTO public.authorizations_") for c in commands)
        hold_id = response.json()["id"]
        response, commands = self.assert_routed(
            api,
            cluster,
            account,
            lambda: api.gateway("DELETE", f"/v1/authorizations/{hold_id}"),
        )
        assert response.status_code == 200 and response.json()["status"] == "voided"
        calls = [c for c in commands if "metering_void_of_account(" in c]
        assert len(calls) == 1, "the void is one call, sent to the account's worker"
        assert any(c.startswith("UPDATE public.authorizations_") for c in commands), commands
        response, _ = self.assert_routed(
            api,
            cluster,
            account,
            lambda: authorize(api, key, model, max_tokens=100, request_id="req-routed"),
        )
        assert response.status_code == 200, response.text
        replayed, _ = self.assert_routed(
            api,
            cluster,
            account,
            lambda: authorize(api, key, model, max_tokens=100, request_id="req-routed"),
        )
        assert replayed.json()["id"] == response.json()["id"]

        unbilled = create_account(api, billing="unbilled")
        unbilled_key = create_key(api, unbilled)
        response, commands = self.assert_routed(
            api, cluster, unbilled, lambda: authorize(api, unbilled_key, model, max_tokens=100)
        )
        assert response.status_code == 200, response.text
        assert commands, "the hold was written on the account's shard"

    def test_a_statement_without_the_account_is_seen_as_a_fan_out(
        self, routed: tuple[Api, Cluster]
    ) -> None:
        """The check itself can fail: a read of every account's rows touches every shard."""
        api, cluster = routed
        shards = Shards.read(api.url)
        cluster.mark()
        engine = create_engine(api.url)
        try:
            with engine.connect() as connection:
                connection.execute(text("SELECT count(*) FROM accounts"))
        finally:
            engine.dispose()
        sent = cluster.coordinator.since_mark()
        groups = set().union(*(shards.groups_in(command) for command, _ in sent))
        assert len(groups) == 4, groups  # the tests' four shards

    def test_the_schedulers_work_of_one_account(self, routed: tuple[Api, Cluster]) -> None:
        """The tidy-up (holds past their expiry marked, expired ones announced) and the notices
        of expiring grants, for one account (the scheduler's transaction of that account): each
        statement on the account's shard alone, row locks included."""
        from metering.ledger.authorizations import expire_holds, notice_expired_unused
        from metering.ledger.credit_grants import notice_expiring

        api, cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        grant(api, account, 10_000)
        expiring = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/grants",
            json={
                "amount_cents": 5,
                "idempotency_key": f"expiring-{account}",
                "category": "promotional",
                "expires_at": "2026-12-01T00:00:00Z",
            },
        )
        assert expiring.status_code == 201, expiring.text
        key = create_key(api, account)
        assert authorize(api, key, model, max_tokens=100).status_code == 200
        later = NOW + timedelta(hours=2)  # past the hold's expiry, the grant within notice days

        def work() -> tuple[int, int, int]:
            with api.database.unit_of_work() as session:
                done = (
                    expire_holds(session, later, account),
                    notice_expired_unused(session, later, account_id=account),
                    notice_expiring(session, later, timedelta(days=7), account_id=account),
                )
                session.commit()
            return done

        done, commands = self.assert_routed(api, cluster, account, work)
        assert done == (1, 1, 1)
        assert any("SKIP LOCKED" in c for c in commands), "the row locks, taken on the shard"

    def test_the_webhook_loop_of_one_account(self, routed: tuple[Api, Cluster]) -> None:
        """The delivery loop's work for one account (its transaction of that account on a
        cluster): the fan-out of its events, the claim of its due deliveries and the record of
        their outcomes, each statement on the account's shard alone, row locks included."""
        from metering.notifications.delivery import Deliverer, Outcome

        api, cluster = routed
        account = create_account(api)
        hook = api.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={
                "url": "https://hooks.example/metering",
                "event_types": ["credit.balance_low"],
                "account_id": account,
            },
        )
        assert hook.status_code == 201, hook.text
        threshold = api.admin(
            "PATCH", f"/admin/v1/accounts/{account}", json={"low_balance_threshold_cents": 2}
        )
        assert threshold.status_code == 200, threshold.text
        grant(api, account, 3)  # above the threshold; then 1 cent, below it: credit.balance_low
        adjusted = api.admin(
            "POST",
            f"/admin/v1/accounts/{account}/adjustments",
            json={"amount_cents": -2, "reason": "below the threshold", "idempotency_key": account},
        )
        assert adjusted.status_code == 201, adjusted.text
        deliverer = Deliverer(api.database, api.settings, api.clock)
        try:
            now = api.clock.now()
            fanned, commands = self.assert_routed(
                api, cluster, account, lambda: deliverer.fan_out_of(now, account)
            )
            assert fanned == 1
            assert any("SKIP LOCKED" in c for c in commands), "the row locks, taken on the shard"
            due = (
                delivery.DELIVERIES.c.status == "pending",
                delivery.DELIVERIES.c.next_attempt_at <= now,
            )
            claimed, commands = self.assert_routed(
                api, cluster, account, lambda: deliverer.claim_of(now, due, account, 50)
            )
            assert [item.account_id for item in claimed] == [account]
            assert b'"credit.balance_low"' in claimed[0].payload
            _, commands = self.assert_routed(
                api,
                cluster,
                account,
                lambda: deliverer.record_all([(claimed[0], Outcome(204, None))]),
            )
            assert any(c.startswith("UPDATE public.webhook_deliveries_") for c in commands)
        finally:
            deliverer.close()
        [(status,)] = rows(
            api.url, "SELECT status FROM webhook_deliveries WHERE account_id = :a", a=account
        )
        assert status == "delivered"

    def test_stripes_card_events(
        self, routed: tuple[Api, Cluster], routed_stripe: LocalStripe
    ) -> None:
        """Stripe's ``setup_intent.succeeded`` (a card saved by the portal's "add a card") and
        ``payment_method.detached`` (that card forgotten): each webhook request's statements
        touch the card's account's shard alone. The detached card names no customer any more:
        its account is the one its metadata names (set when it was saved), never found by a
        search of every account's cards."""
        from metering.payments.flows import Payments

        api, cluster = routed
        stripe = routed_stripe
        payments = Payments(api.database, api.settings, api.clock)
        account = create_account(api)

        def post(body: dict[str, Any]) -> Any:
            payload = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Stripe-Signature": sign(payload)}
            return api.client.post("/v1/stripe/webhook", content=payload, headers=headers)

        setup_id, client_secret = payments.setup_for(account, None, save_card=True)
        answer = stripe.confirm_card_setup(client_secret, CARD_OK)
        assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
        saved = event("setup_intent.succeeded", stripe.get(f"/v1/setup_intents/{setup_id}"))
        response, commands = self.assert_routed(api, cluster, account, lambda: post(saved))
        assert response.status_code == 200 and response.json() == {"received": True}
        assert any(c.startswith("UPDATE public.payment_profiles_") for c in commands), commands
        method = payments.saved_method(account)
        assert method is not None

        detached = stripe._request(
            "POST",
            f"/v1/payment_methods/{method}/detach",
            headers={"Authorization": f"Bearer {SECRET_KEY}"},
        )
        assert detached.status_code == 200, detached.text
        gone = event("payment_method.detached", detached.json())
        response, commands = self.assert_routed(api, cluster, account, lambda: post(gone))
        assert response.status_code == 200 and response.json() == {"received": True}
        assert any(c.startswith("UPDATE public.payment_profiles_") for c in commands), commands
        assert any(c.startswith("INSERT INTO public.stripe_events_") for c in commands), commands
        assert payments.card_of(account) is None

    def test_ingest(self, routed: tuple[Api, Cluster]) -> None:
        """``POST /v1/usage/events``: a single event's statements touch its account's shard
        alone (its key's account is read from ``api_keys``, which the coordinator holds too); a
        batch over two accounts on two workers records each account's events on that account's
        worker and shard only (its lookup and its record, each a call delegated there, the record
        a transaction of that worker's): no statement, and no transaction, spans the two."""
        api, cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        first, second = accounts_on_two_workers(api)
        keys = {account: create_key(api, account) for account in (first, second)}
        where = {account: holder(api.url, account) for account in (first, second)}

        event = usage_event(keys[first], model, NOW)
        response, commands = self.assert_routed(
            api,
            cluster,
            first,
            lambda: api.gateway("POST", "/v1/usage/events", json={"events": [event]}),
        )
        assert response.status_code == 200, response.text
        assert response.json()["recorded"] == 1
        assert commands, "no statement reached a worker"

        shards = Shards.read(api.url)
        cluster.mark()
        batch = [usage_event(keys[account], model, NOW) for account in (second, first) * 2]
        response = api.gateway("POST", "/v1/usage/events", json={"events": batch})
        assert response.status_code == 200, response.text
        assert response.json()["recorded"] == 4
        found = sent(shards, cluster.coordinator.since_mark())
        assert all(len(command.groups) <= 1 for command in found), "a statement of two shards"
        # Each account's statements on its shard, on its worker: its lookup and its record,
        # each a call naming the account (Citus sends it whole to the worker holding it).
        touched = {(group, command.port) for command in found for group in command.groups}
        assert touched <= {where[first], where[second]}, found
        for account in (first, second):
            calls = {
                name: [c.port for c in found if f"{name}('{account}'" in c.command]
                for name in (
                    "metering_lookup_pairs_of_account",
                    "metering_record_gathered_of_account",
                )
            }
            assert all(ports == [where[account][1]] for ports in calls.values()), found
        # No transaction spans two workers.
        ports: dict[int, set[int | None]] = {}
        for command in found:
            if command.transaction is not None:
                ports.setdefault(command.transaction, set()).add(command.port)
        assert all(len(each) == 1 for each in ports.values()), found

    @pytest.mark.parametrize(
        ("grants_cents", "kinds", "events"),
        [
            ([10_000], ["spend"], []),
            ([], ["deficit"], []),
            ([Decimal("0.01"), 10_000], ["spend", "spend"], []),
            (
                [Decimal("0.01")],
                ["deficit", "spend"],
                ["credit.balance_depleted", "credit.balance_low"],
            ),
        ],
        ids=["the-first-grant", "owed", "two-grants", "crossing-thresholds"],
    )
    def test_a_single_event_is_one_delegated_call(
        self,
        routed: tuple[Api, Cluster],
        grants_cents: list[Any],
        kinds: list[str],
        events: list[str],
    ) -> None:
        """The single event: its account's lookup, then the program's call, each sent whole to
        the worker holding the account (a call outside a transaction block), and nothing else; the
        worker runs every statement of the call on its own shards, its charge (55,900
        microcents) paid by the account's first grant, owed, or taken from two grants; or
        taking the balance (10,000) below the account's low-balance threshold (0) and to zero
        or less, whose two webhook events are written on the account's shard too."""
        api, cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        for cents in grants_cents:
            grant(api, account, cents)
        if events:
            threshold = api.admin(
                "PATCH",
                f"/admin/v1/accounts/{account}",
                json={"low_balance_threshold_cents": 0},
            )
            assert threshold.status_code == 200, threshold.text
        key = create_key(api, account)
        _group, port = holder(api.url, account)
        event = usage_event(key, model, NOW)
        response, commands = self.assert_routed(
            api,
            cluster,
            account,
            lambda: api.gateway("POST", "/v1/usage/events", json={"events": [event]}),
        )
        assert response.status_code == 200, response.text
        assert response.json()["recorded"] == 1
        found = sent(Shards.read(api.url), cluster.coordinator.since_mark())
        assert [command.port for command in found] == [port, port], found
        lookup, call = found
        assert (
            lookup.command.startswith(
                "SELECT kind, a, b, c, at, price_version_id, input_microcents_per_million,"
            )
            and f"FROM public.metering_lookup_of_account('{account}'" in lookup.command
        ), lookup
        assert call.command.startswith(
            f"SELECT public.metering_record_usage_of_account('{account}'"
        )
        # each the worker's own transaction, not the coordinator's
        assert lookup.transaction is None and call.transaction is None
        # ... where the event's insert and its charge ran on the account's shard
        for table in ("usage_events", "ledger_entries"):
            assert any(c.startswith(f"INSERT INTO public.{table}_") for c in commands), table
        allocated = rows(
            api.url,
            "SELECT kind FROM credit_allocation_days WHERE account_id = :a ORDER BY kind",
            a=account,
        )
        assert [kind for (kind,) in allocated] == kinds
        written = rows(
            api.url,
            "SELECT type FROM webhook_events WHERE account_id = :a ORDER BY type",
            a=account,
        )
        assert [type_ for (type_,) in written] == events
        if events:  # written by the call, on the account's shard
            shards = Shards.read(api.url)
            copied = {shards.of[int(c[1])][0] for c in map(COPIED_SHARD.match, commands) if c}
            assert "webhook_events" in copied, commands

    def test_a_single_event_of_a_lookup_remembered_is_one_call_confirming_it(
        self, routed: tuple[Api, Cluster]
    ) -> None:
        """A key's next single event, its pair's lookup remembered by the process: one call,
        sent whole to the worker holding the account, that confirms the lookup and records the
        event (metering.usage.lookup_apart), every statement on the account's shards; charged
        as the first."""
        api, cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        grant(api, account, 10_000)
        key = create_key(api, account)
        _group, port = holder(api.url, account)
        first = api.gateway(
            "POST", "/v1/usage/events", json={"events": [usage_event(key, model, NOW)]}
        )
        assert first.status_code == 200 and first.json()["recorded"] == 1, first.text
        event = usage_event(key, model, NOW)
        response, commands = self.assert_routed(
            api,
            cluster,
            account,
            lambda: api.gateway("POST", "/v1/usage/events", json={"events": [event]}),
        )
        assert response.status_code == 200 and response.json()["recorded"] == 1, response.text
        [call] = sent(Shards.read(api.url), cluster.coordinator.since_mark())
        assert call.port == port, call
        assert f"public.metering_record_usage_confirmed_of_account('{account}'" in call.command
        assert call.transaction is None
        for table in ("usage_events", "ledger_entries"):
            assert any(c.startswith(f"INSERT INTO public.{table}_") for c in commands), table
        credits = api.as_key(key.secret, "GET", "/v1/credits")
        assert credits.json()["balance_microcents"] == 10_000 * 1_000_000 - 2 * 55_900


class TestWorkerMemory:
    def test_a_worker_backend_keeps_no_plan_per_delegated_call(
        self, routed: tuple[Api, Cluster]
    ) -> None:
        """A worker's backend runs one-account calls again and again (the coordinator keeps its
        connection) and must not grow with them: Citus 13.2.2 appended a plan of each fast-path
        statement to the function's kept plan at every call (docs/citus.md), about 350 kB per
        single event. The lookup's call, run on the worker that holds the account 40 times in
        one session, leaves that session's memory as it was after the first 10."""
        api, _cluster = routed
        model = priced_model(api, NOW - timedelta(days=1))
        account = create_account(api)
        key = create_key(api, account)
        _group, port = holder(api.url, account)
        worker = make_url(api.url).set(port=port).render_as_string(False)
        engine = create_engine(worker, isolation_level="AUTOCOMMIT")
        call = text("SELECT count(*) FROM metering_lookup_of_account(:a, :k, :m)")
        used = text("SELECT sum(total_bytes) FROM pg_backend_memory_contexts")
        try:
            with engine.connect() as connection:
                sizes = []
                for calls in (10, 30):
                    for _ in range(calls):
                        found = connection.execute(
                            call, {"a": account, "k": key.id, "m": model.lower()}
                        ).scalar_one()
                        assert found == 4  # the text of what it reads, the key, model, price
                    sizes.append(connection.execute(used).scalar_one())
        finally:
            engine.dispose()
        after_10, after_40 = sizes
        assert after_40 - after_10 < 256 * 1024, sizes


def events_in(url: str, account: str) -> int:
    [(count,)] = rows(
        url, "SELECT count(*) FROM usage_events WHERE account_id = :account", account=account
    )
    return int(count)


class TestIngestPerAccount:
    def test_each_account_commits_while_the_next_one_waits(self, citus_api: Api) -> None:
        """A batch over two accounts commits per account (docs/citus.md#what-runs-on-a-cluster):
        while the second account's row is locked elsewhere, the first account's events are already
        committed and visible, the second's are not; once the lock goes, the answer says each event
        was recorded. (One transaction for the batch, as on one server, would show neither.)"""
        api = citus_api
        model = priced_model(api, NOW - timedelta(days=1))
        first, second = accounts_on_two_workers(api)
        keys: dict[str, Key] = {account: create_key(api, account) for account in (first, second)}
        batch = [usage_event(keys[account], model, NOW) for account in (second, first, second)]
        answer: dict[str, Any] = {}

        def send() -> None:
            answer["response"] = api.gateway("POST", "/v1/usage/events", json={"events": batch})

        engine = create_engine(api.url)
        try:
            with engine.connect() as holder:
                holder.execute(
                    text("SELECT id FROM accounts WHERE id = :account FOR UPDATE"),
                    {"account": second},
                )
                sender = Workers()
                sender.start(send)
                try:
                    deadline = time.monotonic() + 30
                    while events_in(api.url, first) == 0 and time.monotonic() < deadline:
                        time.sleep(0.05)
                    assert events_in(api.url, first) == 1, "the first account's events wait"
                    assert events_in(api.url, second) == 0
                    assert sender.alive(), "the batch did not wait for the locked account"
                finally:
                    holder.rollback()
                    sender.join(60)
        finally:
            engine.dispose()
        response = answer["response"]
        assert response.status_code == 200, response.text
        assert [r["status"] for r in response.json()["data"]] == ["recorded"] * 3
        assert events_in(api.url, second) == 2


# A FROM, JOIN, UPDATE or INSERT target of a statement, and the relation it names.
_TARGET = re.compile(r"\b(?:FROM|JOIN|UPDATE|INTO)\s+([a-z_][a-z0-9_]*)")


class TestShardForms:
    """Each delegated one-account function's shard forms (metering.citus.shard_forms): its
    statements on the shard group's own tables, which Citus does not plan or log."""

    def test_a_shard_form_names_its_groups_tables_only(self) -> None:
        """Made for a group (here one of made-up shard names), a form's every statement reads
        and writes that group's tables, or a reference table's shard: no table Citus plans,
        no mark left."""
        tables = {table.name for table in Base.metadata.sorted_tables}
        group = shard_forms.ShardGroup(4242, {name: f"{name}_4242" for name in tables})
        variables = {"collected", "unnest", "gathered", "keyed"}  # and the CTEs' names
        for name in shard_forms.forms():
            form = shard_forms.shard_form(name, group)
            assert citus.one_account.SHARD_MARK not in form, name
            assert form.startswith(f"CREATE OR REPLACE FUNCTION {name[: -len('_of_account')]}")
            named = {
                target
                for target in _TARGET.findall(form)
                if not target.startswith("v_") and target not in variables
            }
            assert named, name
            assert named <= set(group.tables.values()), (name, named - set(group.tables.values()))

    def test_the_dispatcher_finds_every_shard_by_halves(self) -> None:
        ids = [102008 + 3 * i for i in range(7)]
        dispatcher = shard_forms.dispatcher("metering_void_of_account", ids)
        for shard in ids:
            assert dispatcher.count(f"IF p_shard = {shard} THEN") == 1
            assert f"metering_void_of_shard_{shard}(p_account_id, " in dispatcher
        assert "RAISE EXCEPTION 'no shard form of this shard'" in dispatcher

    def test_forms_are_made_for_every_delegated_program_or_for_none(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A process that has not every delegated program's form (it did not import one) makes
        only the question, which answers no, so that no delegated call asks a dispatcher that is
        not there; with every form it makes them all again."""
        if not CITUS:
            pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
        with fresh_citus_database() as url:
            migrate.upgrade(url)
            [(shard,)] = rows(
                url,
                "SELECT min(shardid) FROM pg_dist_shard WHERE logicalrelid = 'accounts'::regclass",
            )
            missing = sorted(shard_forms.forms())[0]
            partial = dict(shard_forms.forms())
            del partial[missing]
            engine = create_engine(url)
            try:
                with engine.begin() as connection:
                    every = set(shard_forms.wanted(shard_forms.shard_groups(connection)))
                    monkeypatch.setattr(shard_forms, "SHARD_FORMS", partial)
                    done = shard_forms.make(connection)
                    assert done.written == [shard_forms.HERE]
                    assert set(done.dropped) == every - {shard_forms.HERE}
                    asked = connection.execute(
                        text(f"SELECT {shard_forms.HERE}(:shard)"), {"shard": shard}
                    )
                    assert asked.scalar_one() is False
                monkeypatch.undo()
                with engine.begin() as connection:
                    done = shard_forms.make(connection)
                    assert set(done.written) == every and done.dropped == []
            finally:
                engine.dispose()

    def test_a_form_whose_settings_differ_is_made_again(self) -> None:
        """A shard form whose settings are not its program's (one made before its program had
        them) is written again by the next ``make``: its body is the same, its settings its
        program's; then nothing more."""
        if not CITUS:
            pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
        with fresh_citus_database() as url:
            migrate.upgrade(url)
            engine = create_engine(url)
            held = text("SELECT proconfig FROM pg_proc WHERE proname = :name")
            try:
                with engine.begin() as connection:
                    [group, *_] = shard_forms.shard_groups(connection)
                    name = f"metering_record_gathered_of_shard_{group.shard_id}"
                    assert connection.execute(held, {"name": name}).scalar_one() == [
                        "plan_cache_mode=force_generic_plan"
                    ]
                    connection.execute(text(f"ALTER FUNCTION {name} RESET ALL"))
                with engine.begin() as connection:
                    assert shard_forms.make(connection).written == [name]
                    assert connection.execute(held, {"name": name}).scalar_one() == [
                        "plan_cache_mode=force_generic_plan"
                    ]
                with engine.begin() as connection:
                    assert shard_forms.make(connection).written == []
            finally:
                engine.dispose()

    def test_the_gateways_calls_run_the_shard_forms_of_the_accounts_group(
        self, session_tmp: Path
    ) -> None:
        """An authorization, its void, a single event and a batch, on a database with its
        shard forms: the account's worker runs the forms of the account's shard (PostgreSQL's
        count of each function's calls, ``track_functions``), the other worker none, and each
        answer is as before."""
        if not CITUS:
            pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
        with fresh_citus_database() as url:
            migrate.upgrade(url)
            database = make_url(url).database
            ports = [
                p for (p,) in rows(url, "SELECT nodeport FROM pg_dist_node WHERE groupid <> 0")
            ]
            workers = {port: make_url(url).set(port=port).render_as_string(False) for port in ports}
            for node in workers.values():
                engine = create_engine(node, isolation_level="AUTOCOMMIT")
                try:
                    with engine.connect() as connection:
                        connection.execute(text("SET citus.enable_ddl_propagation = off"))
                        connection.execute(
                            text(f'ALTER DATABASE "{database}" SET track_functions = pl')
                        )
                finally:
                    engine.dispose()
            with running_api("citus", url, session_tmp) as api:
                model = priced_model(api, NOW - timedelta(days=1))
                account = create_account(api)
                grant(api, account, 10_000)
                key = create_key(api, account)
                held = authorize(api, key, model, max_tokens=100)
                assert held.status_code == 200, held.text
                voided = api.gateway("DELETE", f"/v1/authorizations/{held.json()['id']}")
                assert voided.status_code == 200 and voided.json()["status"] == "voided"
                # Two single events: the first reads the lookup, the second's record confirms
                # it (metering.usage.lookup_apart).
                for _ in range(2):
                    recorded = api.gateway(
                        "POST", "/v1/usage/events", json={"events": [usage_event(key, model, NOW)]}
                    )
                    assert recorded.status_code == 200 and recorded.json()["recorded"] == 1
                batch = [usage_event(key, model, NOW) for _ in range(2)]
                recorded = api.gateway("POST", "/v1/usage/events", json={"events": batch})
                assert recorded.status_code == 200 and recorded.json()["recorded"] == 2
                credits = api.as_key(key.secret, "GET", "/v1/credits")
                assert credits.status_code == 200, credits.text
                # 10,000 cents granted, each event's 55,900 microcents charged (as through
                # Citus: TestRouting), nothing held
                assert credits.json()["balance_microcents"] == 10_000 * 1_000_000 - 4 * 55_900
                assert (
                    credits.json()["available_microcents"] == credits.json()["balance_microcents"]
                )
                [(shard,)] = rows(
                    url,
                    "SELECT get_shard_id_for_distribution_column('accounts', CAST(:a AS text))",
                    a=account,
                )
                _group, port = holder(url, account)
                wanted = {
                    f"{name[: -len('_of_account')]}_of_shard_{shard}"
                    for name in shard_forms.forms()
                }
                # A backend reports its counts when it goes idle, within seconds.
                deadline = time.monotonic() + 30
                while True:
                    called = _calls_of_shard_forms(workers[port])
                    if wanted <= set(called) or time.monotonic() > deadline:
                        break
                    time.sleep(0.5)
                assert wanted <= set(called), called
                assert set(called) == wanted, "the forms of the account's shard only"
                for other, node in workers.items():
                    if other != port:
                        assert _calls_of_shard_forms(node) == {}, other

    def test_a_call_on_its_accounts_node_is_planned_once_per_backend(self) -> None:
        """A void sent to the worker holding its account as the service sends it there
        (``nodes.ON_ITS_NODE``): after the plan cache's first calls, no statement of it is
        planned again, neither the call nor the calls it makes of its dispatcher and shard form
        (``log_planner_stats``: a line each time the planner runs). The call as it is, which
        Citus takes for one it might delegate, is planned at every call."""
        if not CITUS:
            pytest.fail("this test needs Citus (METERING_TEST_BACKENDS excludes it; `make citus`)")
        call = VOID_OF_ACCOUNT.call_sql
        with fresh_citus_database() as url:
            migrate.upgrade(url)
            account = "acct_planned_once"
            _group, port = holder(url, account)
            worker = make_url(url).set(port=port, drivername="postgresql")
            params = {"p_account_id": account, "p_hold_id": "auth_none", "p_now": NOW}
            planned: list[str] = []
            with psycopg.connect(worker.render_as_string(False), autocommit=True) as connection:
                connection.add_notice_handler(
                    lambda notice: planned.append(notice.message_primary or "")
                )
                connection.execute("SET log_planner_stats = on")
                connection.execute("SET client_min_messages = log")

                def plans(statement: str) -> int:
                    # psycopg prepares it after five executions, the plan cache then plans its
                    # next five (and each of its statements its first five) for their values.
                    for _ in range(15):
                        connection.execute(statement, params).fetchall()
                    planned.clear()
                    for _ in range(5):
                        assert connection.execute(statement, params).fetchall() == []
                    return sum("PLANNER STATISTICS" in line for line in planned)

                assert plans(nodes.ON_ITS_NODE[call]) == 0
                assert plans(call) >= 5


def _calls_of_shard_forms(url: str) -> dict[str, int]:
    """Each shard form's calls on that node, as PostgreSQL counts them so far."""
    return {
        name: calls
        for name, calls in rows(
            url,
            "SELECT funcname, calls FROM pg_stat_user_functions "
            "WHERE funcname ~ '^metering_.*_of_shard_[0-9]+$'",
        )
    }
