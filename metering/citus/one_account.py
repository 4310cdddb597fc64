"""One account's statements and programs on a Citus cluster: the one-account compiler.

Every statement of an account's unit of work is compiled so that the cluster sends it, whole, to
the one shard that holds the account: every table of ``SCOPE`` (metering.citus.placement) read in
a FROM is read as ``(SELECT * FROM t WHERE t.<column> = <account>)`` under its own name (or
alias), and every UPDATE or DELETE of one is limited to the account's rows. A restriction on the
sharding column of every sharded table the statement names is what lets Citus plan it for one
shard (its "router" plans); outer joins keep their meaning, as the limit sits inside the joined
relation. Its callers pass rows of that account alone: the limit then changes no result.

A statement of one sharded table and no other (a SELECT from it alone, an UPDATE or DELETE of it
with no FROM) is limited in its own WHERE instead: ``t.<column> = <account>`` joins its
conditions, and a condition of theirs that compares that column (``t.<column> = x``,
``t.<column> IN (…)``) compares the account instead (``<account> = x``: the same rows, as only
the account's pass the limit). The sharding column then appears once, compared with a
parameter: Citus' cheapest plan, its fast path (fast_path_router_planner.c), which a subquery
in the FROM or the column named twice forgo. On the worker the fast path's statement is
planned by Citus as a placeholder, its shard chosen when it runs (deferred pruning), then its
shard query planned once by the local execution, where every other shape is planned in full
twice: by Citus, then its deparsed text by the local execution (docs/citus.md). A condition that
uses the column otherwise keeps the subquery.

* ``text_of_account`` (``compiled_of_account``): a statement's psycopg text, the account its
  ``%(p_account_id)s`` parameter;
* ``of_account``: a program's one-account form (``…_of_account``), the account its first
  parameter (``ACCOUNT``), which the cluster distributes the function by (metering.citus
  .distribution): a call is delegated to the node holding the account and runs there as one
  local transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import count
from typing import Any

from sqlalchemy import BigInteger, String, Table, func, literal_column, null, select
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.sql import ClauseElement, Insert, Select, operators
from sqlalchemy.sql.elements import BinaryExpression, BooleanClauseList
from sqlalchemy.sql.selectable import Alias
from sqlalchemy.sql.visitors import iterate

from metering import programs as p
from metering.citus.placement import SCOPE
from metering.nodes import ON_ITS_NODE, ROUTED_BY
from metering.programs.plpgsql import PlpgsqlCompiler, PsycopgCompiler, function_params

# The argument a one-account program is sent to the account's node by (its first), by Citus and
# by the service's routing (metering.nodes).
ACCOUNT = p.Var(ROUTED_BY, String())


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
        source = self._named(table)
        return f"(SELECT * FROM {source} WHERE {name}.{self.preparer.quote(column)} = {account})"

    def _named(self, table: Any) -> str:
        """The table as a FROM names it, under its own name."""
        return str(self.preparer.quote(table.name))

    def _as_is(self, table: Any, aliased: bool, rendered: Any) -> str:
        """A table a FROM or an UPDATE names as it is (not limited by a subquery)."""
        return str(rendered)

    def visit_table(  # type: ignore[override]
        self,
        table: Any,
        asfrom: bool = False,
        iscrud: bool = False,
        enclosing_alias: Any = None,
        **kw: Any,
    ) -> str:
        limited_in_place = kw.pop(_LIMITED_IN_PLACE, None)
        rendered = super().visit_table(
            table, asfrom=asfrom, iscrud=iscrud, enclosing_alias=enclosing_alias, **kw
        )
        if not asfrom:
            return str(rendered)
        aliased = enclosing_alias is not None and enclosing_alias.element is table
        if iscrud:
            return self._as_is(table, aliased, rendered)
        if limited_in_place is not None and _same(
            limited_in_place, enclosing_alias if aliased else table
        ):
            return self._as_is(table, aliased, rendered)  # its WHERE limits it (visit_select)
        limited = self._account_rows(table)
        if limited is None:
            return self._as_is(table, aliased, rendered)
        if aliased:
            return limited  # the alias names it
        return f"{limited} AS {self.preparer.quote(table.name)}"

    def _limited_in_place(self, statement: Any, source: Any) -> Any | None:
        """``statement`` (of the one table ``source``, a sharded table or its alias) limited
        to the account's rows in its own WHERE, each top-level condition comparing the sharding
        column comparing the account instead (see the module); None when a condition uses the
        column otherwise."""
        table = getattr(source, "element", source)
        column = self.dialect.scope.get(getattr(table, "name", None))
        if column is None or not isinstance(table, Table):
            return None
        sharding, account = source.c[column], self.dialect.account.ref
        conditions = []
        for condition in _conjuncts(statement._where_criteria):
            compared = _comparing(condition, sharding)
            if compared is not None:
                conditions.append(compared(account))
            elif any(element is sharding for element in iterate(condition)):
                return None
            else:
                conditions.append(condition)
        limited = statement._generate()
        limited._where_criteria = (sharding == account, *conditions)
        return limited

    def _limited(self, statement: Any) -> Any:
        column = self.dialect.scope.get(statement.table.name)
        if column is None:
            return statement
        if not statement._compile_state_factory(statement, self)._extra_froms:
            in_place = self._limited_in_place(statement, statement.table)
            if in_place is not None:
                return in_place
        return statement.where(statement.table.c[column] == self.dialect.account.ref)

    def visit_select(self, select_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        kw.pop(_LIMITED_IN_PLACE, None)  # an enclosing statement's, not this one's
        froms = select_stmt.get_final_froms()
        if len(froms) == 1 and isinstance(froms[0], Table | Alias):
            limited = self._limited_in_place(select_stmt, froms[0])
            if limited is not None:
                kw[_LIMITED_IN_PLACE] = froms[0]
                return str(super().visit_select(limited, **kw))
        return str(super().visit_select(select_stmt, **kw))

    def visit_update(self, update_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        kw.pop(_LIMITED_IN_PLACE, None)
        return str(super().visit_update(self._limited(update_stmt), **kw))

    def visit_delete(self, delete_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        kw.pop(_LIMITED_IN_PLACE, None)
        return str(super().visit_delete(self._limited(delete_stmt), **kw))


# The compiler's keyword naming the one FROM a SELECT limits in its own WHERE (visit_select).
_LIMITED_IN_PLACE = "account_limited_in_place"


def _same(one: Any, other: Any) -> bool:
    """Whether two FROMs are one (a subquery's statement may hold an annotated copy)."""
    return bool(one._deannotate() is other._deannotate())


def _conjuncts(conditions: Any) -> list[Any]:
    """A WHERE's conditions, ANDs taken apart."""
    found: list[Any] = []
    for condition in conditions:
        if isinstance(condition, BooleanClauseList) and condition.operator is operators.and_:
            found += _conjuncts(condition.clauses)
        else:
            found.append(condition)
    return found


def _comparing(condition: Any, column: Any) -> Any | None:
    """For ``column = x`` or ``x = column`` (x not naming ``column``), or ``column IN (…)``:
    that condition with another operand in place of ``column``."""
    if not isinstance(condition, BinaryExpression):
        return None
    left, right, operator = condition.left, condition.right, condition.operator
    if operator in (operators.eq, operators.in_op) and left is column:
        other = right
        if any(element is column for element in iterate(other)):
            return None
        return lambda value: BinaryExpression(value, other, operator, type_=condition.type)
    if operator is operators.eq and right is column:
        if any(element is column for element in iterate(left)):
            return None
        return lambda value: BinaryExpression(left, value, operator, type_=condition.type)
    return None


class _PlpgsqlOfAccount(_AccountScoped, PlpgsqlCompiler):
    pass


class _PsycopgOfAccount(_AccountScoped, PsycopgCompiler):
    pass


class _PlpgsqlOfShard(_PlpgsqlOfAccount):
    """A shard form's statements (metering.citus.shard_forms): as the one-account form's, every
    table named by its mark (``<table>__shard__``, replaced by the shard group's table when the
    form is made for it) under its own name, or its alias."""

    def _marked(self, table: Any) -> str:
        return str(self.preparer.quote(f"{table.name}{SHARD_MARK}"))

    def _named(self, table: Any) -> str:
        return f"{self._marked(table)} AS {self.preparer.quote(table.name)}"

    def _as_is(self, table: Any, aliased: bool, rendered: Any) -> str:
        return self._marked(table) if aliased else self._named(table)

    def visit_insert(self, insert_stmt: Any, **kw: Any) -> str:  # type: ignore[override]
        insert_stmt = _id_drawn(insert_stmt)
        rendered = str(super().visit_insert(insert_stmt, **kw))
        into = f"INSERT INTO {self.preparer.quote(insert_stmt.table.name)} "
        assert rendered.startswith(into), rendered
        return f"INSERT INTO {self._named(insert_stmt.table)} {rendered[len(into) :]}"


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


class _PlpgsqlOfShardDialect(_PlpgsqlOfAccountDialect):
    statement_compiler = _PlpgsqlOfShard


_PLPGSQL_OF_SHARD = _PlpgsqlOfShardDialect(ACCOUNT, SCOPE)


def text_of_account(statement: ClauseElement) -> str:
    """A statement's psycopg text for one account's rows on a cluster (``ACCOUNT``: its
    ``%(p_account_id)s`` parameter), every sharded table limited to the account's shard."""
    return str(statement.compile(dialect=_PSYCOPG))


def compiled_of_account(statement: ClauseElement) -> Any:
    """``text_of_account`` compiled, with the statement's own bound values (``.params``): for
    statements built per call (a limit, a list of ids, each rendered as a parameter of its
    own)."""
    return statement.compile(dialect=_PSYCOPG, compile_kwargs={"render_postcompile": True})


# The account's shard (of ``accounts``; its colocated tables' shards are the same group's): what
# the lock below locks, and which shard forms a delegated call runs (metering.citus.shard_forms).
SHARD = p.Var("v_shard", BigInteger())
SHARD_OF_ACCOUNT = p.Assign(
    SHARD, func.get_shard_id_for_distribution_column(literal_column("'accounts'"), ACCOUNT.ref)
)

# PostgreSQL's ShareLock: the mode in which Citus' own writes lock a shard's metadata.
SHARE_LOCK = 5

# Every one-account form's step after its shard's id: the shard's metadata locked as Citus' own
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
        func.lock_shard_metadata(literal_column(str(SHARE_LOCK)), array([SHARD.ref])).label(
            "shard_locked"
        )
    )
)


# The plan cache's mode, which a one-account form leaves to Citus (``of_account``) but where
# Citus' own local plans pile up (``delegated_settings``).
PLAN_CACHE_MODE = "plan_cache_mode"

# The Citus releases that keep no local plan of a fast-path statement and pile one up at every
# call instead (read in each release tag's local_plan_cache.c): for a statement whose shard it
# chooses when it runs (deferred pruning: a PL/pgSQL statement comparing the sharding column with
# a variable, every ``INSERT … VALUES``), ``CacheLocalPlanForShardQuery`` asks
# ``GetCachedLocalPlan`` for the plan it kept, which since Citus pull request 8371 answers none
# unless the kept plan's task list has one task, and a deferred-pruning plan's has none
# (multi_router_planner.c ``RouterJob``: the tasks are made on each execution's copy). So at
# every call the shard query is deparsed, parsed and planned again and appended to the kept
# plan's list, in its memory context: a worker's backend grew about 350 kB per single event,
# without bound (docs/citus.md). Citus pull request 8824 fixes it upstream; a build of one of
# those releases that carries a fix names itself otherwise (the local cluster's
# ``13.2.2+metering.1``: scripts/citus-patches) and keeps its plans.
PLANS_PILE_UP = frozenset({"12.1.11", "12.1.12", "13.2.1", "13.2.2", "14.0.0", "14.0.1"})

# The node's Citus release as its build names itself: ``13.2.2``, or with what its build added
# (configure's ``--with-extra-version``: ``13.2.2+metering.1``).
CITUS_RELEASE = "substring(citus_version() FROM 'Citus ([^ ]+)')"


def delegated_settings(citus_release: str) -> dict[str, str]:
    """The settings ``metering migrate`` gives the delegated one-account functions on a
    cluster of that Citus release (``13.2.2``), beyond their programs': where local plans pile
    up, each statement planned for its call (``force_custom_plan``). Such a plan is run once and
    freed, and Citus makes no local plan to keep for it (``IsLocalPlanCachingSupported`` wants a
    plan executed before); its fast-path statements cost what they cost (their shard query was
    planned at every call anyway), the others a plan per call. Elsewhere the mode stays Citus'
    (a release without the growth keeps those local plans between calls)."""
    return {PLAN_CACHE_MODE: "force_custom_plan"} if citus_release in PLANS_PILE_UP else {}


# A call of a function Citus has propagated (every function ``metering migrate`` makes on a
# cluster) whose arguments hold a parameter is planned at every call: Citus' planner, taking it
# for a call it might delegate, makes the plan's cost too high to keep (function_call_delegation
# .c, ``DissuadePlannerFromUsingPlan``), before it asks whether the function is one it delegates
# at all. It looks only at a statement's own ``FROM`` (one function) and select list, not into a
# subquery, so the same call as a subquery that is never pulled up (``OFFSET 0``) is planned
# once per backend, as on one server; it is then never delegated either (docs/citus.md).
NOT_DELEGABLE = "not_delegable"


def not_delegable(call: Select[Any]) -> Any:
    """``call`` (a statement of one function call) as a subquery Citus takes for no call it
    might delegate: planned once per backend."""
    return call.offset(0).subquery(NOT_DELEGABLE)


def not_delegable_sql(call_sql: str) -> str:
    """``not_delegable`` of a call's text (a ``SELECT`` of one function call)."""
    return f"SELECT * FROM ({call_sql} OFFSET 0) AS {NOT_DELEGABLE}"


def of_account(
    program: p.Program, *, delegated: bool = True, shard_settings: Mapping[str, str] | None = None
) -> p.Program:
    """A program's form on a Citus cluster (``…_of_account``): the same program for one
    account's rows, ``ACCOUNT`` first among its parameters, every statement built for
    ``programs.ONE_SHARD`` and limited to the account's shard (see the module); the account's
    shard locked against a move's switch-over first (``LOCK_ACCOUNT_SHARD``). A delegated form
    then runs its shard form where this node holds the account's shard (metering.citus
    .shard_forms: the same steps on the shard group's tables, registered in ``SHARD_FORMS``;
    called through its dispatcher, each call ``not_delegable``), its own statements otherwise.
    Its call as the service sends it to the node holding the account is registered in
    ``nodes.ON_ITS_NODE`` (``not_delegable_sql``). A shard form's statements are plain
    PostgreSQL's, so its inserts of a program's rows stay one ``INSERT … SELECT`` each, as one
    server's (a loop of rows costs a statement per row there), each row's id drawn by the
    SELECT (``_id_drawn``).

    ``delegated``: the form is called on its own, so Citus sends the call whole to the account's
    node and its statements run there, where an insert of a program's rows is a loop of
    ``INSERT … VALUES`` (``_row_by_row``). A form called inside a transaction of the
    coordinator's (``delegated=False``: a batch's settlement, a spend in an operator's unit of
    work) runs on the coordinator instead, each of its statements a command to the worker: there
    a loop would be a command per row, so its inserts stay one statement each.

    Its settings are the program's but the plan cache's mode (RECORD_USAGE's
    ``force_generic_plan``): Citus plans an ``INSERT … SELECT`` into a distributed table (an
    event's insert from its JSON rows) only with its parameters' values; without them it makes
    no plan and counts on the plan cache to choose a custom one (distributed_planner.c,
    ``REPLAN_WITH_BOUND_PARAMETERS``). Forced generic, the statement fails on the worker
    instead ("could not create distributed plan": a single event's delegated call failed, and
    the event took its account's transaction, metering.usage.single). ``shard_settings``: its
    shard form's (plain tables, planned by PostgreSQL alone), none by default: measured per
    program (a single event's record costs a worker fewer instructions with the plan cache's
    default than forced generic, as RECORD_USAGE is on one server; an account's part of a
    batch fewer forced generic)."""
    build = program.build
    params = (ACCOUNT, *program.params)
    form = replace(
        program,
        name=f"{program.name}_of_account",
        params=params,
        settings={k: v for k, v in program.settings.items() if k != PLAN_CACHE_MODE},
        plpgsql_backend=p.ONE_SHARD,
        plpgsql_dialect=_PLPGSQL,
    )
    if not delegated:
        return replace(form, build=lambda on: (SHARD_OF_ACCOUNT, LOCK_ACCOUNT_SHARD, *build(on)))
    shard_form = replace(
        form,
        name=f"{program.name}{OF_SHARD}",
        build=build,
        settings=dict(shard_settings or {}),
        plpgsql_dialect=_PLPGSQL_OF_SHARD,
    )
    generic = replace(
        form,
        build=lambda on: (
            SHARD_OF_ACCOUNT,
            LOCK_ACCOUNT_SHARD,
            p.When(
                func.metering_shard_forms_here(SHARD.ref),
                _dispatched(program.name, params, program.returned_columns),
                otherwise=_row_by_row(build(on), count(1)),
            ),
        ),
    )
    SHARD_FORMS[generic.name] = shard_form
    ON_ITS_NODE[generic.call_sql] = not_delegable_sql(generic.call_sql)
    return generic


# A delegated form's statements against its shard group's own tables (metering.citus
# .shard_forms): each one-account program's, by the name of its generic form.
SHARD_FORMS: dict[str, p.Program] = {}

# How a shard form's name ends (before its shard's id), and its dispatcher's.
OF_SHARD = "_of_shard"
OF_SHARDS = "_of_shards"

# How a table's name ends in a shard form's text, until the form is made for one shard group.
SHARD_MARK = "__shard__"


def _dispatched(
    name: str, params: tuple[p.Var | p.Records, ...], columns: p.RowColumns | None
) -> tuple[p.Step, ...]:
    """The delegated form's call of its shard form for the account's shard (by the shard's
    dispatcher, ``<program>_of_shards``), its rows emitted or its value returned."""
    args = [
        SHARD.ref,
        *(literal_column(n) for param in params for n, _ in function_params(param)),
    ]
    call = getattr(func, f"{name}{OF_SHARDS}")(*args)
    if columns is None:
        return (p.Return(call),)
    into = tuple(p.Var(f"v_sf_{column}", kind) for column, kind in columns)
    rows = call.table_valued(*(column for column, _ in columns), name="shard_form")
    called = not_delegable(select(*(rows.c[column] for column, _ in columns)))
    return (
        p.ForEach(
            select(*(called.c[column] for column, _ in columns)),
            into=into,
            steps=(p.Emit(tuple(v.ref for v in into)),),
        ),
    )


def _row_by_row(steps: Iterable[p.Step], numbers: Iterator[int]) -> tuple[p.Step, ...]:
    """``steps`` with each INSERT of rows no sharded table gives (a program's JSON rows or
    arrays: ``_rows_inserted``) made a loop over those rows, an INSERT … VALUES of each.

    Citus runs an ``INSERT … SELECT`` whose SELECT reads no distributed table "through the
    coordinator" (insert_select_planner.c): planned at every call (it needs its parameters'
    values), the SELECT's rows written as an intermediate result, then an insert from that
    result deparsed, parsed and planned again by the local execution. An ``INSERT … VALUES``
    takes the fast path instead: the shard chosen when it runs and its shard query planned
    once, by the local execution.
    The rows are the same, inserted in the same order; ``ON CONFLICT`` acts on each in turn, as
    the SELECT's rows never repeat a key (an upsert that met a key twice in one statement would
    fail instead). Measured on the local cluster: 2.36 ms of a worker's CPU per call for two
    such inserts of one row, 0.42 ms as loops (docs/citus.md)."""
    done: list[p.Step] = []
    for step in steps:
        if isinstance(step, p.Run) and _rows_inserted(step.statement):
            done.append(_each_row(step.statement, next(numbers)))
        elif isinstance(step, p.Collect) and _rows_inserted(step.statement, collected=step):
            done += _each_row_collected(step, next(numbers))
        elif isinstance(step, p.When):
            done.append(
                replace(
                    step,
                    then=_row_by_row(step.then, numbers),
                    otherwise=_row_by_row(step.otherwise, numbers),
                )
            )
        elif isinstance(step, p.ForEach):
            done.append(replace(step, steps=_row_by_row(step.steps, numbers)))
        else:
            done.append(step)
    return tuple(done)


def _rows_inserted(statement: Any, collected: p.Collect | None = None) -> bool:
    """An INSERT into a sharded table of a SELECT that reads no sharded table: returning
    nothing, or (``collected``) the rows a ``Collect`` keeps in its statement's order, a
    column of them never null (a row returned is a row inserted)."""
    if not (
        isinstance(statement, Insert)
        and statement.table.name in SCOPE
        and isinstance(statement.select, Select)
        and not any(
            isinstance(element, Table) and element.name in SCOPE
            for element in iterate(statement.select)
        )
    ):
        return False
    if collected is None:
        return not statement._returning
    returned = {str(getattr(column, "key", "")) for column in statement._returning}
    return (
        not collected.order_by
        and returned == {name for name, _ in collected.into.columns}
        and _inserted_mark(statement) is not None
    )


def _inserted_mark(statement: Any) -> str | None:
    """A column the INSERT returns that is never null."""
    for column in statement._returning:
        if column.key in statement.table.c and not statement.table.c[column.key].nullable:
            return str(column.key)
    return None


def _row_values(
    statement: Any, number: int
) -> tuple[Any, tuple[p.Var, ...], tuple[p.Step, ...], Any]:
    """An ``INSERT … SELECT``'s SELECT, a variable for each of its columns, the steps that
    number the row (``_numbered``) and the INSERT of those variables by VALUES (its ``ON
    CONFLICT`` and ``RETURNING`` kept)."""
    rows = statement.select
    into = tuple(
        p.Var(f"v_row{number}_{index}", column.type)
        for index, column in enumerate(rows.selected_columns)
    )
    each = statement._generate()
    each._select_names, each.select = None, None
    names = [str(name) for name in statement._select_names]
    values = {n: v.ref for n, v in zip(names, into, strict=True)}
    numbering = _numbered(statement.table, names, number)
    values.update({name: step.into.ref for name, step in numbering})
    return rows, into, tuple(step for _, step in numbering), each.values(values)


def _numbered(table: Any, names: list[str], number: int) -> tuple[tuple[str, p.Assign], ...]:
    """The row's id drawn from its column's sequence by a step of its own, when the INSERT
    leaves it to the column's default (``nextval``, the sequence of this node: its own range,
    docs/citus.md): a statement with a volatile function has its functions evaluated by Citus
    first, its rows' values then sent as constants, where an ``INSERT … VALUES`` of parameters
    alone is run by the local execution as it stands. The same id the default would have
    drawn."""
    drawn = _default_id(table, names)
    if drawn is None:
        return ()
    name, value = drawn
    var = p.Var(f"v_row{number}_{name}", table.c[name].type)
    return ((name, p.Assign(var, value)),)


def _default_id(table: Any, names: Sequence[str]) -> tuple[str, Any] | None:
    """The id column an INSERT of columns ``names`` leaves to its default, and that default
    (``nextval`` of its sequence); None when it leaves none."""
    column = table._autoincrement_column
    if column is None or column.name in names:
        return None
    sequence = f"{table.name}_{column.name}_seq"  # PostgreSQL's name for a serial's sequence
    assert len(sequence) < 64, sequence
    return column.name, func.nextval(literal_column(f"'{sequence}'"))


def _id_drawn(statement: Any) -> Any:
    """An ``INSERT … SELECT`` that leaves its row's id to the column's default, with the id
    drawn by its SELECT instead (the same ``nextval``): a shard form writes the shard's own
    table, which Citus makes without the distributed table's defaults. Any other statement as
    it is."""
    if not isinstance(statement.select, Select):
        return statement
    drawn = _default_id(statement.table, [str(name) for name in statement._select_names])
    if drawn is None:
        return statement
    name, value = drawn
    each = statement._generate()
    each._select_names = [*statement._select_names, name]
    each.select = statement.select.add_columns(value.label(name))
    return each


def _each_row(statement: Any, number: int) -> p.ForEach:
    """An ``INSERT … SELECT`` as a loop over the SELECT's rows, each inserted by VALUES."""
    rows, into, numbering, each = _row_values(statement, number)
    return p.ForEach(rows, into=into, steps=(*numbering, p.Run(each)))


def _each_row_collected(step: p.Collect, number: int) -> tuple[p.Step, ...]:
    """A ``Collect`` of an ``INSERT … SELECT … RETURNING`` as a loop over the SELECT's rows,
    each inserted by VALUES, what each returns appended to the collected arrays (null when
    none, as ``array_agg`` of no row) and compared with the largest."""
    statement: Any = step.statement
    rows, into, numbering, each = _row_values(statement, number)
    kinds = dict(step.into.columns)
    returned = {
        column.key: p.Var(f"v_row{number}_returned_{column.key}", kinds[column.key])
        for column in statement._returning
    }
    mark = returned[str(_inserted_mark(statement))]
    appended: list[p.Step] = [*step.into.appended({n: var.ref for n, var in returned.items()})]
    start: list[p.Step] = [*step.into.emptied()]
    if step.largest is not None:
        name, largest = step.largest
        start.append(p.Assign(largest, null()))
        appended.append(p.Assign(largest, func.greatest(largest.ref, returned[name].ref)))
    return (
        *start,
        p.ForEach(
            rows,
            into=into,
            steps=(
                *numbering,
                p.Fetch(each, into=tuple(returned.values())),
                p.When(mark.ref.isnot(None), tuple(appended)),
            ),
        ),
    )
