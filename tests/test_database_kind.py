"""Which database a ``Database`` works on is decided once: when it is made, or, for a server
started before its database answers, by the first connection that reaches it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress

from sqlalchemy import text
from sqlalchemy.engine import make_url

from metering.db import Database, Kind, kind_of


@contextmanager
def _forwarder(listener: socket.socket, port: int) -> Iterator[None]:
    """Forwards every connection accepted on ``listener`` to 127.0.0.1:``port``."""
    stop = threading.Event()

    def pipe(source: socket.socket, target: socket.socket) -> None:
        # Either side may close first (the test's end disposes the pool): that ends the pipe.
        with closing(source), closing(target), suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", port))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class TestDecidedLater:
    def test_kind_unknown_while_down_then_decided_once_it_answers(self, pg_url: str) -> None:
        real = make_url(pg_url)
        # What the same database is, decided at once while it answers.
        answering = Database.from_url(pg_url)
        expected = answering.kind
        answering.dispose()
        assert expected in (Kind.POSTGRESQL, Kind.CITUS)
        # A port the OS gave and nobody listens on yet: connections are refused.
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        down = real.set(host="127.0.0.1", port=port, query={"connect_timeout": "2"})
        database = Database.from_url(down.render_as_string(hide_password=False))
        try:
            assert database.decided.kind is None
            listener.listen()
            with _forwarder(listener, real.port or 5432):
                with database.unit_of_work() as session:
                    assert session.execute(text("SELECT 1")).scalar() == 1
                    kind = kind_of(session)
                assert kind is expected
                assert database.kind is expected
                assert database.decided.kind is expected
        finally:
            database.dispose()
            listener.close()
