"""PostgreSQL's ``hashtext``: the hash Citus places a text distribution column's value by.

A Citus cluster keeps each account's rows in the shard whose hash range holds ``hashtext`` of
its id (``pg_dist_shard``'s ``shardminvalue`` .. ``shardmaxvalue``, signed 32-bit). Computed
here, a process knows which node holds an account without asking (metering.db's routing):
Bob Jenkins' lookup3 ``hashlittle``, as PostgreSQL's ``hash_bytes`` (src/common/hashfn.c) runs
it on a little-endian machine, over the value's UTF-8 bytes (a deterministic collation: the
default). Checked against the database's own ``hashtext`` (tests/test_routing.py)."""

from __future__ import annotations

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _MASK
    a ^= _rot(c, 4)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rot(a, 6)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rot(b, 8)
    b = (b + a) & _MASK
    a = (a - c) & _MASK
    a ^= _rot(c, 16)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rot(a, 19)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    c ^= b
    c = (c - _rot(b, 14)) & _MASK
    a ^= c
    a = (a - _rot(c, 11)) & _MASK
    b ^= a
    b = (b - _rot(a, 25)) & _MASK
    c ^= b
    c = (c - _rot(b, 16)) & _MASK
    a ^= c
    a = (a - _rot(c, 4)) & _MASK
    b ^= a
    b = (b - _rot(a, 14)) & _MASK
    c ^= b
    c = (c - _rot(b, 24)) & _MASK
    return c


def hash_bytes(key: bytes) -> int:
    """PostgreSQL's ``hash_bytes`` of ``key``, unsigned."""
    length = len(key)
    a = b = c = (0x9E3779B9 + length + 3923095) & _MASK
    offset = 0
    while length - offset >= 12:
        a = (a + int.from_bytes(key[offset : offset + 4], "little")) & _MASK
        b = (b + int.from_bytes(key[offset + 4 : offset + 8], "little")) & _MASK
        c = (c + int.from_bytes(key[offset + 8 : offset + 12], "little")) & _MASK
        a, b, c = _mix(a, b, c)
        offset += 12
    rest = key[offset:]
    # The last 11 bytes or fewer: a and b take theirs whole, c from its second byte on (its
    # lowest byte is left to the length, which the start already added).
    a = (a + int.from_bytes(rest[0:4], "little")) & _MASK
    b = (b + int.from_bytes(rest[4:8], "little")) & _MASK
    c = (c + (int.from_bytes(rest[8:11], "little") << 8)) & _MASK
    return _final(a, b, c)


def hashtext(value: str) -> int:
    """``hashtext(value)`` as PostgreSQL answers it: a signed 32-bit integer."""
    unsigned = hash_bytes(value.encode())
    return unsigned - (1 << 32) if unsigned & 0x80000000 else unsigned
