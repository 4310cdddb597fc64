"""PostgreSQL's ``hashtext``, computed in the process (metering.kit.pghash), against the
database's own: the oracle is the server."""

from __future__ import annotations

import random
import string
import uuid

import psycopg
import pytest
from sqlalchemy.engine import make_url

from metering.kit.pghash import hashtext
from tests.conftest import PG_MAINTENANCE_URL, require_postgresql

pytestmark = pytest.mark.usefixtures("needs_postgresql")


def values() -> list[str]:
    """Every length up to past four of lookup3's 12-byte blocks, every tail length, ASCII and
    several-byte UTF-8, and ids of the shapes accounts have."""
    rng = random.Random(20261207)
    alphabet = string.printable + "éü€中𝄞"
    found = ["", "a", "acct_0", str(uuid.UUID(int=0)), "x" * 11, "x" * 12, "x" * 13]
    found += [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(200)]
    found += [f"acct_{rng.getrandbits(64):x}" for _ in range(200)]
    for length in range(60):
        found += ["".join(rng.choice(alphabet) for _ in range(length)) for _ in range(20)]
    return found


def test_hashtext_is_postgresqls() -> None:
    require_postgresql()
    sent = values()
    libpq = make_url(PG_MAINTENANCE_URL).set(drivername="postgresql")
    with psycopg.connect(libpq.render_as_string(False)) as connection:
        answered = connection.execute(
            "SELECT v, hashtext(v) FROM unnest(%s::text[]) WITH ORDINALITY AS t(v, n) ORDER BY n",
            (sent,),
        ).fetchall()
    assert [v for v, _ in answered] == sent
    wrong = [(v, h, hashtext(v)) for v, h in answered if hashtext(v) != h]
    assert not wrong, wrong[:5]
    assert any(h < 0 for _, h in answered) and any(h > 0 for _, h in answered)
