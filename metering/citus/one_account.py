"""One account's statements and programs on a Citus cluster: the one-account compiler.

Every statement of an account's unit of work is compiled so that the cluster sends it, whole, to
the one shard that holds the account: every table of ``SCOPE`` (metering.citus.placement) read in
a FROM is read as ``(SELECT * FROM t WHERE t.<column> = <account>)`` under its own name (or
alias), and every UPDATE or DELETE of one is limited to the account's rows. A restriction on the
sharding column of every sharded table the statement names is what lets Citus plan it for one
shard (its "router" plans); outer joins keep their meaning, as the limit sits inside the joined
relation. Its callers pass rows of that account alone: the limit then changes no result.

* ``text_of_account`` (``compiled_of_account``): a statement's psycopg text, the account its
  ``%(p_account_id)s`` parameter;
* ``of_account``: a program's one-account form (``…_of_account``), the account its first
  parameter (``ACCOUNT``), which the cluster distributes the function by (metering.citus
  .distribution): a call is delegated to the node holding the account and runs there as one
  local transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import String, func, literal_column, select
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.sql import ClauseElement

from metering import programs as p
from metering.citus.placement import SCOPE
from metering.programs.plpgsql import PlpgsqlCompiler, PsycopgCompiler

# The argument a one-account program is sent to the account's node by (its first).
ACCOUNT = p.Var("p_account_id", String())


class _AccountScoped(PGCompiler_psycopg):
    """A compiler mixin for one account's statements: see the module. The dialect names the
    account (a ``Var``) and the scope (each sharded table and its sharding column)."""

    dialect: Any

    def _account_rows(self, table: Any, **kw: Any) -> str | None:
        column = self.dialect.scope.get(table.name)
        if column is None:
            return None
        name = self.preparer.quote(table.name)
        account = self.process(self.dialect.account.ref, **kw)
        return f"(SELECT * FROM {name} WHERE {name}.{self.preparer.quote(column)} = {account})"

    def visit_table(  # type: ignore[override]
        self,
        table: Any,
        asfrom: bool = False,
        iscrud: bool = False,
        enclosing_alias: Any = None,
        **kw: Any,
    ) -> str:
        rendered = super().visit_table(
            table, asfrom=asfrom, iscrud=iscrud, enclosing_alias=enclosing_alias, **kw
        )
        if not asfrom or iscrud:
            return str(rendered)
        limited = self._account_rows(table)
        if limited is None:
            return str(rendered)
        if enclosing_alias is not None and enclosing_alias.element is table:
            return limited  # the alias names it
        return f"{limited} AS {self.preparer.quote(table.name)}"

    def _limited(self, statement: Any) -> Any:
        column = self.dialect.scope.get(statement.table.name)
        if column is None:
            return statement
        return statement.where(statement.table.c[column] == self.dialect.account.ref)

    def visit_update(self, update_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        return str(super().visit_update(self._limited(update_stmt), **kw))

    def visit_delete(self, delete_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        return str(super().visit_delete(self._limited(delete_stmt), **kw))


class _PlpgsqlOfAccount(_AccountScoped, PlpgsqlCompiler):
    pass


class _PsycopgOfAccount(_AccountScoped, PsycopgCompiler):
    pass


class _PlpgsqlOfAccountDialect(PGDialect_psycopg):
    statement_compiler = _PlpgsqlOfAccount

    def __init__(self, account: p.Var, scope: Mapping[str, str]) -> None:
        super().__init__(paramstyle="named")
        self.account, self.scope = account, dict(scope)


class _PsycopgOfAccountDialect(PGDialect_psycopg):
    statement_compiler = _PsycopgOfAccount

    def __init__(self, account: p.Var, scope: Mapping[str, str]) -> None:
        super().__init__()
        self.account, self.scope = account, dict(scope)


_PLPGSQL = _PlpgsqlOfAccountDialect(ACCOUNT, SCOPE)
_PSYCOPG = _PsycopgOfAccountDialect(ACCOUNT, SCOPE)


def text_of_account(statement: ClauseElement) -> str:
    """A statement's psycopg text for one account's rows on a cluster (``ACCOUNT``: its
    ``%(p_account_id)s`` parameter), every sharded table limited to the account's shard."""
    return str(statement.compile(dialect=_PSYCOPG))


def compiled_of_account(statement: ClauseElement) -> Any:
    """``text_of_account`` compiled, with the statement's own bound values (``.params``): for
    statements built per call (a limit, a list of ids, each rendered as a parameter of its
    own)."""
    return statement.compile(dialect=_PSYCOPG, compile_kwargs={"render_postcompile": True})


# PostgreSQL's ShareLock: the mode in which Citus' own writes lock a shard's metadata.
SHARE_LOCK = 5

# The first step of every one-account form: the account's shard's metadata locked as Citus' own
# writes lock it, for the rest of the transaction. A shard moves (citus_rebalance_start,
# citus_move_shard_placement) by logical replication while it takes writes; for the switch-over
# the move locks the shard group's metadata in ExclusiveLock on the coordinator and on every
# worker (BlockWritesToShardList: ``lock_shard_metadata(7, …)``), waits for the copy to catch up,
# points the placements at the new node and commits. Each write statement takes the ShareLock
# before it runs, but reads take none: a call that read the account's row (its balance, its held
# sum) on the old placement before the switch-over, then wrote after it, could write those values
# on the new placement over what calls committed there meanwhile (a lost update; reasoned from
# Citus' locking, not seen in tests/reliability/test_citus_rebalance.py's runs). Locked first,
# a call either finishes before the switch-over (which waits for it; its writes replicate) or
# starts after it, every statement on the new placement (a call delegated to the old node just
# before is sent on from there): its writes replicated only if its commit is synchronous
# (``REBALANCE``).
LOCK_ACCOUNT_SHARD = p.Run(
    select(
        func.lock_shard_metadata(
            literal_column(str(SHARE_LOCK)),
            array(
                [
                    func.get_shard_id_for_distribution_column(
                        literal_column("'accounts'"), ACCOUNT.ref
                    )
                ]
            ),
        ).label("shard_locked")
    )
)


# The plan cache's mode, which a one-account form leaves to Citus (``of_account``).
PLAN_CACHE_MODE = "plan_cache_mode"


def of_account(program: p.Program) -> p.Program:
    """A program's form on a Citus cluster (``…_of_account``): the same program for one
    account's rows, ``ACCOUNT`` first among its parameters, every statement built for
    ``programs.ONE_SHARD`` and limited to the account's shard (see the module); the account's
    shard locked against a move's switch-over first (``LOCK_ACCOUNT_SHARD``).

    Its settings are the program's but the plan cache's mode (RECORD_USAGE's
    ``force_generic_plan``): Citus plans an ``INSERT … SELECT`` into a distributed table (an
    event's insert from its JSON rows) only with its parameters' values; without them it makes
    no plan and counts on the plan cache to choose a custom one (distributed_planner.c,
    ``REPLAN_WITH_BOUND_PARAMETERS``). Forced generic, the statement fails on the worker
    instead ("could not create distributed plan": a single event's delegated call failed, and
    the event took its account's transaction, metering.usage.single)."""
    build = program.build
    return replace(
        program,
        name=f"{program.name}_of_account",
        params=(ACCOUNT, *program.params),
        build=lambda on: (LOCK_ACCOUNT_SHARD, *build(on)),
        settings={k: v for k, v in program.settings.items() if k != PLAN_CACHE_MODE},
        plpgsql_backend=p.ONE_SHARD,
        plpgsql_dialect=_PLPGSQL,
    )
