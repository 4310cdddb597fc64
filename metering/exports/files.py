"""The export files of one account-day (CSV and Parquet, built with pandas) and the day's
manifest, rendered to bytes deterministically, and written atomically.

No float anywhere: counts and ``cost_microcents`` are int64 columns, ``cost_usd`` is exact
decimal text (a string column in Parquet too). An unbilled account's cost columns are empty
(null), as ``GET /v1/usage`` reports them null with ``cost_status: not_applicable``.

Determinism: the same rows give the same bytes. The CSV has fixed columns, quoting and line
ends; the Parquet file is written from an explicit Arrow schema with the pandas metadata (which
names the pandas version) stripped, fixed compression, one row group and no timestamps, so only
the ``created_by`` string of the pinned pyarrow version is left, and it does not vary by run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from metering.kit.money import usd_text
from metering.kit.timeutil import format_timestamp

COLUMNS = (
    "date",
    "account_id",
    "api_key_id",
    "api_key_name",
    "model",
    "requests",
    "input_tokens",
    "cache_read_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_microcents",
    "cost_usd",
    # The key's project and member (fixed for its life; the member empty for a service key),
    # after the columns that were there before them.
    "project_id",
    "member_id",
)
COUNTS = ("requests", "input_tokens", "cache_read_tokens", "output_tokens", "reasoning_tokens")

# cost columns are nullable: null for unbilled accounts (cost not applicable).
PARQUET_SCHEMA = pa.schema(
    [
        pa.field("date", pa.string(), nullable=False),
        pa.field("account_id", pa.string(), nullable=False),
        pa.field("api_key_id", pa.string(), nullable=False),
        pa.field("api_key_name", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        *(pa.field(name, pa.int64(), nullable=False) for name in COUNTS),
        pa.field("cost_microcents", pa.int64(), nullable=True),
        pa.field("cost_usd", pa.string(), nullable=True),
        pa.field("project_id", pa.string(), nullable=True),
        pa.field("member_id", pa.string(), nullable=True),
    ]
)
MANIFEST = "manifest.json"
TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True, slots=True)
class Line:
    """One api key × model of one account-day, as the '1d' key_model rollup row has it."""

    api_key_id: str
    api_key_name: str
    model: str
    requests: int
    input_tokens: int  # cache reads included
    cache_read_tokens: int
    output_tokens: int  # reasoning included
    reasoning_tokens: int
    cost_microcents: int
    last_event_id: int
    project_id: str | None = None
    member_id: str | None = None  # None: a service key


@dataclass(frozen=True, slots=True)
class AccountDay:
    day: date
    account_id: str
    billed: bool  # False: an unbilled account; its costs are not applicable (empty)
    lines: tuple[Line, ...]  # ordered by api key id, then model (code point = byte order)

    @property
    def requests(self) -> int:
        return sum(line.requests for line in self.lines)

    @property
    def cost_microcents(self) -> int | None:
        return sum(line.cost_microcents for line in self.lines) if self.billed else None

    @property
    def newest_event_id(self) -> int:
        return max(line.last_event_id for line in self.lines)


def ordered(lines: Sequence[Line]) -> tuple[Line, ...]:
    """Key, then model, by code point (UTF-8 byte order): the same on every backend."""
    return tuple(sorted(lines, key=lambda line: (line.api_key_id, line.model)))


def frame(account_day: AccountDay) -> pd.DataFrame:
    """The export rows as a DataFrame with explicit dtypes (int64, nullable Int64, str)."""
    lines, billed = account_day.lines, account_day.billed
    text = {
        "date": [account_day.day.isoformat()] * len(lines),
        "account_id": [account_day.account_id] * len(lines),
        "api_key_id": [line.api_key_id for line in lines],
        "api_key_name": [line.api_key_name for line in lines],
        "model": [line.model for line in lines],
    }
    columns: dict[str, Any] = {name: pd.array(values, dtype="str") for name, values in text.items()}
    for name in COUNTS:
        columns[name] = pd.array([getattr(line, name) for line in lines], dtype="int64")
    columns["cost_microcents"] = pd.array(
        [line.cost_microcents if billed else None for line in lines], dtype="Int64"
    )
    columns["cost_usd"] = pd.array(
        [usd_text(line.cost_microcents) if billed else None for line in lines], dtype="str"
    )
    for name in ("project_id", "member_id"):
        columns[name] = pd.array([getattr(line, name) for line in lines], dtype="str")
    return pd.DataFrame(columns, columns=list(COLUMNS))


def csv_bytes(data: pd.DataFrame) -> bytes:
    """UTF-8, a header row, ``\\n`` line ends, minimal quoting; nulls are empty cells."""
    return data.to_csv(index=False, lineterminator="\n", na_rep="").encode("utf-8")


def parquet_bytes(data: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(data, schema=PARQUET_SCHEMA, preserve_index=False)
    table = table.replace_schema_metadata(None)  # pandas' metadata names its version
    out = io.BytesIO()
    pq.write_table(
        table,
        out,
        compression="zstd",
        compression_level=3,
        use_dictionary=True,
        write_statistics=True,
        row_group_size=max(1, table.num_rows),
    )
    return out.getvalue()


@dataclass(frozen=True, slots=True)
class RenderedFile:
    name: str
    format: str  # csv | parquet
    content: bytes
    account_day: AccountDay

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def manifest_entry(self) -> dict[str, Any]:
        account_day = self.account_day
        return {
            "file": self.name,
            "format": self.format,
            "account_id": account_day.account_id,
            "rows": len(account_day.lines),
            "requests": account_day.requests,
            "cost_status": "billed" if account_day.billed else "not_applicable",
            "cost_microcents": account_day.cost_microcents,
            "newest_event_id": account_day.newest_event_id,
            "bytes": len(self.content),
            "sha256": self.sha256,
        }


def render(account_day: AccountDay) -> list[RenderedFile]:
    """``<account_id>.csv`` and ``<account_id>.parquet`` of one account-day."""
    data = frame(account_day)
    account_id = account_day.account_id
    return [
        RenderedFile(f"{account_id}.csv", "csv", csv_bytes(data), account_day),
        RenderedFile(f"{account_id}.parquet", "parquet", parquet_bytes(data), account_day),
    ]


def manifest_bytes(day: date, entries: Sequence[dict[str, Any]], generated_at: datetime) -> bytes:
    """The day's manifest: every file (by name) with rows, cost, sha256, and the newest event
    included by ingest order. Only ``generated_at`` differs between two runs on the same data."""
    files = sorted(entries, key=lambda entry: str(entry["file"]))
    usage = [entry for entry in files if "account_id" in entry]  # not the credit roll-forward
    newest = max((int(entry["newest_event_id"]) for entry in usage), default=None)
    body = {
        "date": day.isoformat(),
        "generated_at": format_timestamp(generated_at),
        "newest_event_id": newest,
        "accounts": len({entry["account_id"] for entry in usage}),
        "files": files,
    }
    return (json.dumps(body, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def read_manifest_entries(directory: Path) -> list[dict[str, Any]]:
    """The file entries of the day's current manifest (none when there is no manifest)."""
    path = directory / MANIFEST
    if not path.exists():
        return []
    files = json.loads(path.read_text("utf-8")).get("files", [])
    return [entry for entry in files if isinstance(entry, dict) and "file" in entry]


def write_atomic(path: Path, content: bytes) -> bool:
    """Write ``content`` to ``path`` so readers see the old file or the new one, never a part:
    a temp file in the same directory, flushed to disk, then ``os.replace``. A file that already
    holds exactly these bytes is left alone (returns False)."""
    try:
        if path.read_bytes() == content:
            return False
    except FileNotFoundError:
        pass
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, 0o644)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_directory(path.parent)
    return True


def remove_stale_temp_files(directory: Path) -> None:
    """Temp files a crashed run left behind. Only the holder of the day's lock calls this, so
    no live writer's temp file is in the directory."""
    for leftover in directory.glob(f".*{TEMP_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class AccountFile:
    """One of an account's export files, as its day's manifest lists it."""

    day: date
    name: str
    format: str
    rows: int
    cost_microcents: int | None
    bytes: int
    sha256: str
    path: Path


def account_files(export_dir: Path, account_id: str, limit_days: int = 93) -> list[AccountFile]:
    """An account's export files of its newest ``limit_days`` exported days, newest first, from
    each day's manifest (the files it names exist: they are written before it)."""
    found: list[AccountFile] = []
    for directory in day_directories(export_dir):
        if len({f.day for f in found}) >= limit_days:
            break
        for entry in read_manifest_entries(directory):
            if entry.get("account_id") != account_id:
                continue
            name = str(entry["file"])
            found.append(
                AccountFile(
                    day=date.fromisoformat(directory.name),
                    name=name,
                    format=str(entry.get("format", "")),
                    rows=int(entry.get("rows", 0)),
                    cost_microcents=entry.get("cost_microcents"),
                    bytes=int(entry.get("bytes", 0)),
                    sha256=str(entry.get("sha256", "")),
                    path=directory / name,
                )
            )
    return found


def day_directories(export_dir: Path) -> list[Path]:
    """The export directory's day directories (``YYYY-MM-DD``), newest first."""
    if not export_dir.is_dir():
        return []
    return sorted(
        (p for p in export_dir.iterdir() if p.is_dir() and _is_day(p.name)),
        key=lambda p: p.name,
        reverse=True,
    )


def _is_day(name: str) -> bool:
    try:
        return date.fromisoformat(name).isoformat() == name
    except ValueError:
        return False
