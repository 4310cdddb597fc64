"""On a Citus cluster whose every node ``METERING_DATABASE_URL`` names: each one-account call sent
to the node that holds the account (docs/citus.md#connections-to-every-node).

Any node plans a one-account call and hands it to the worker holding the account's shard (a
delegated call: one more connection and round trip, the call planned twice). Sent to that
worker itself, the call runs there with no hop: Citus does not delegate a call to the node it is
on, and the call's shard forms (metering.citus.shard_forms) run its statements on the shard's
own tables. So a process keeps Citus' map of which node holds each hash range of ``accounts``
(``pg_dist_shard``, ``pg_dist_placement``, ``pg_dist_node``: the same on every node), re-read
every ``ROUTES_SECONDS``, and hashes each account's id as Citus does (metering.kit.pghash).

A call sent to the node that holds its account goes as a statement Citus does not take for a
call it might delegate (``ON_ITS_NODE``): Citus would plan the call as it is at every call
(metering.citus.one_account ``not_delegable``), and there it has nowhere to delegate it.

Nothing is decided on the map. A call sent to a node that no longer holds the account (a shard
moved since the map was read) runs there, its statements sent by Citus to the node that holds the
shard now, exactly, as a call in a transaction block runs; a call of an account whose node the
URL does not name goes as it is, to any node, which delegates it. Either pays its hops until the
map is read again.

``RoutedConnection`` is what a unit of work's statements run on (``Database.run``): a statement
whose parameters name an account (``ROUTED_BY``) on a connection to that account's node, any
other on a connection the unit already holds, else on one to a node libpq picks at random (the
URL as given: a node that does not answer is passed over); at most one connection per node,
each returned to its pool when the unit ends."""

from __future__ import annotations

import asyncio
import bisect
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from metering.kit.kept import Kept
from metering.kit.pghash import hashtext

log = logging.getLogger(__name__)

# The parameter by which a one-account statement names its account (metering.citus.one_account's
# ``ACCOUNT``): what a statement is routed by.
ROUTED_BY = "p_account_id"
# Each one-account call that runs whole on the node holding its account (a delegated form of
# metering.citus.one_account), as sent to that node: a statement Citus plans once per backend
# there, where it would plan the call as it is at every call, as a call it might delegate.
ON_ITS_NODE: dict[str, str] = {}
# How long a process keeps the map before reading it again (a shard moved meanwhile costs its
# calls a hop, nothing else).
ROUTES_SECONDS = 10.0
# A node as the URL names it: host and port.
Node = tuple[str, int]

# The node holding each hash range of ``accounts`` (with which every account table is
# colocated); none before the schema is distributed.
_MAP = (
    "SELECT s.shardminvalue::integer AS first_hash, s.shardmaxvalue::integer AS last_hash, "
    "n.nodename::text AS host, n.nodeport AS port "
    "FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid "
    "JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary' AND n.isactive "
    "WHERE s.logicalrelid = to_regclass('accounts') ORDER BY 1"
)


class Executes(Protocol):
    """What a unit of work's statements run on: a psycopg ``AsyncConnection`` in autocommit,
    or a ``RoutedConnection``."""

    async def execute(
        self, query: Any, params: Mapping[str, Any] | None = None
    ) -> psycopg.AsyncCursor[Any]: ...


def listed_nodes(connect_kwargs: Mapping[str, Any]) -> list[Node] | None:
    """The nodes a spread URL names (libpq's ``host`` and ``port`` lists, with
    ``load_balance_hosts``), in order; None for any other."""
    if "load_balance_hosts" not in connect_kwargs:
        return None
    hosts = str(connect_kwargs.get("host") or "").split(",")
    ports = str(connect_kwargs.get("port") or "5432").split(",")
    if len(hosts) < 2:
        return None
    if len(ports) == 1:
        ports *= len(hosts)
    return [(host, int(port)) for host, port in zip(hosts, ports, strict=True)]


def node_kwargs(connect_kwargs: Mapping[str, Any], node: Node) -> dict[str, Any]:
    """A spread URL's connection arguments for one of its nodes."""
    kwargs = {k: v for k, v in connect_kwargs.items() if k != "load_balance_hosts"}
    return {**kwargs, "host": node[0], "port": str(node[1])}


@dataclass(frozen=True)
class ShardMap:
    """Which listed node holds each hash range: ``first_hashes`` ascending, each range's last
    hash and node (None: a node the URL does not name)."""

    first_hashes: Sequence[int]
    last_hashes: Sequence[int]
    nodes: Sequence[Node | None]

    def node_of_hash(self, value: int) -> Node | None:
        index = bisect.bisect_right(self.first_hashes, value) - 1
        if index < 0 or value > self.last_hashes[index]:
            return None
        return self.nodes[index]


_EMPTY = ShardMap((), (), ())


class Routes:
    """A process's map of the cluster (``ShardMap``), over the nodes its URL names: read on
    first use and again every ``ROUTES_SECONDS`` by whichever unit of work finds it due."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = list(nodes)
        self._map = _EMPTY
        self._due = 0.0  # monotonic time when the map is read again
        self._hashes: Kept[str, int] = Kept()  # each account's, kept (a miss: 8 µs)
        self._addresses: dict[str, frozenset[str]] = {}
        self._unlisted_warned: set[Node] = set()

    def due(self) -> bool:
        return time.monotonic() >= self._due

    def node_of(self, account_id: str) -> Node | None:
        """The listed node holding the account, as the map read last says; None when none
        does (the map not read yet, or a node the URL does not name)."""
        value = self._hashes.get(account_id)
        if value is None:
            value = hashtext(account_id)
            self._hashes.keep(account_id, value)
        return self._map.node_of_hash(value)

    async def refresh(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Read the map on ``connection`` (any node's: each holds Citus' metadata). A failed read
        keeps the map it had, and is tried again after ``ROUTES_SECONDS``."""
        self._due = time.monotonic() + ROUTES_SECONDS
        try:
            cursor = await connection.execute(_MAP)
            rows = await cursor.fetchall()
        except psycopg.Error as error:
            log.warning("the cluster's shard map could not be read: %s", error)
            return
        nodes = [await self._listed(str(row[2]), int(row[3])) for row in rows]
        self._map = ShardMap([row[0] for row in rows], [row[1] for row in rows], nodes)

    async def _listed(self, host: str, port: int) -> Node | None:
        """The URL's node that is the cluster's node ``host:port``: the same name, or a name of
        the same address (the cluster may name a node ``localhost`` where the URL says
        ``127.0.0.1``), and the same port."""
        for node in self.nodes:
            if node == (host, port):
                return node
        ours = await self._resolved(host)
        for node in self.nodes:
            if node[1] == port and ours & await self._resolved(node[0]):
                return node
        if (host, port) not in self._unlisted_warned:
            self._unlisted_warned.add((host, port))
            log.warning(
                "the cluster's node %s:%s is not among METERING_DATABASE_URL's hosts: the calls "
                "of its accounts go through another node (docs/citus.md)",
                host,
                port,
            )
        return None

    async def _resolved(self, host: str) -> frozenset[str]:
        found = self._addresses.get(host)
        if found is None:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, None)
                found = frozenset(str(info[4][0]) for info in infos)
            except (OSError, socket.gaierror):
                found = frozenset()
            self._addresses[host] = found
        return found


class RoutedConnection:
    """A unit of work's statements over the cluster's nodes (see the module): ``checkout(node)``
    enters a connection of that node's pool (None: of the pool spread over every node) for the
    rest of the unit."""

    def __init__(
        self,
        routes: Routes,
        checkout: Callable[[Node | None], Awaitable[psycopg.AsyncConnection[Any]]],
    ) -> None:
        self._routes = routes
        self._checkout = checkout
        self._held: dict[Node | None, psycopg.AsyncConnection[Any]] = {}

    async def execute(
        self, query: Any, params: Mapping[str, Any] | None = None
    ) -> psycopg.AsyncCursor[Any]:
        account = params.get(ROUTED_BY) if params else None
        node = None
        if account is not None:
            if self._routes.due():
                await self._routes.refresh(await self._any())
            node = self._routes.node_of(str(account))
        if node is None:
            return await (await self._any()).execute(query, params)
        if isinstance(query, str):
            query = ON_ITS_NODE.get(query, query)
        return await (await self._on(node)).execute(query, params)

    async def _on(self, node: Node | None) -> psycopg.AsyncConnection[Any]:
        connection = self._held.get(node)
        if connection is None:
            connection = self._held[node] = await self._checkout(node)
        return connection

    async def _any(self) -> psycopg.AsyncConnection[Any]:
        if self._held:
            return next(iter(self._held.values()))
        return await self._on(None)
