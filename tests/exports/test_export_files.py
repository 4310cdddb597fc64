"""The export files of a day, on SQLite and PostgreSQL, with usage sent through the real ingest
route: content against totals computed here from the events, the manifest's checksums, byte
identity of a re-run, totals equal to ``GET /v1/usage``, and the ``metering export`` command."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metering.cli import main
from tests.conftest import Api
from tests.exports.helpers import (
    COLUMNS,
    DAY,
    MICRO,
    Tenant,
    day_state,
    expected_rows,
    exporter,
    manifest,
    midnight,
    newest_event_id,
    read_csv,
    read_parquet_rows,
    report_day,
    runs,
    send,
    sha256,
    tenant,
)
from tests.factories import Key, create_key

START = midnight(DAY)
AFTER_DAY = START + timedelta(days=1)


def busy_day(api: Api) -> tuple[Tenant, Tenant]:
    """A prepaid account (two keys — one named with CSV metacharacters —, two models with
    rounding-prone rates) and an unbilled one, with usage on the day, on its edges, and around."""
    paid = tenant(api, "prepaid", names=("prod", 'ci, "nightly"'))
    free = tenant(api, "unbilled", names=("lab",))
    prod, ci = paid.keys
    glm, odd = sorted(paid.models)
    send(api, paid, prod, glm, START - MICRO, 5000, 0, 50)  # the previous day
    send(api, paid, prod, glm, START, 1200, 1000, 37)  # exactly midnight: this day
    send(api, paid, prod, glm, START + timedelta(hours=3), 4508, 4352, 2000, 1500)
    send(api, paid, prod, odd, START + timedelta(hours=5), 3, 1, 1, api_name="messages")
    send(api, paid, ci, odd, START + timedelta(hours=9), 999, 998, 7, 3, api_name="responses")
    send(api, paid, ci, odd, START + timedelta(hours=9, minutes=1), 77, 0, 5, outcome="failed")
    send(api, paid, ci, glm, START + timedelta(hours=12), 0, 0, 0)  # counts as a request
    duplicate = send(api, paid, ci, glm, START + timedelta(hours=13), 10, 0, 10, request_id="dup-1")
    again = send(api, paid, ci, glm, START + timedelta(hours=13), 10, 0, 10, request_id="dup-1")
    assert (duplicate["status"], again["status"]) == ("recorded", "duplicate")
    unknown = send(api, paid, ci, "no-such-model", START + timedelta(hours=14))
    assert unknown["status"] == "quarantined"
    send(api, paid, ci, glm, AFTER_DAY - MICRO, 333, 111, 33, 11)  # the day's last instant
    send(api, paid, prod, odd, AFTER_DAY, 1, 0, 1)  # the next day
    (lab,) = free.keys
    free_model = sorted(free.models)[0]
    send(api, free, lab, free_model, START + timedelta(hours=2), 900, 100, 90, 9)
    send(api, free, lab, free_model, START + timedelta(hours=20), 100, 0, 10)
    return paid, free


def test_files_hold_each_key_and_model_of_the_day_exactly(fresh_api: Api, tmp_path: Path) -> None:
    api = fresh_api
    paid, free = busy_day(api)
    export, _ = exporter(api, tmp_path / "exports", AFTER_DAY + timedelta(minutes=20))
    result = export.export_day(DAY, trigger="scheduled")
    assert (result.outcome, result.accounts, result.files) == ("exported", 2, 4)

    directory = tmp_path / "exports" / DAY.isoformat()
    names = {f"{a}.{ext}" for a in (paid.account_id, free.account_id) for ext in ("csv", "parquet")}
    assert {p.name for p in directory.iterdir()} == names | {"manifest.json"}  # no temp files

    for t in (paid, free):
        rows = expected_rows(t, DAY)
        assert read_csv(directory / f"{t.account_id}.csv") == [COLUMNS, *rows]
        assert read_parquet_rows(directory / f"{t.account_id}.parquet") == rows
        schema = pq.read_schema(directory / f"{t.account_id}.parquet")
        assert [schema.field(c).type for c in COLUMNS] == [pa.string()] * 5 + [pa.int64()] * 6 + [
            pa.string()
        ] * 3
        assert schema.metadata is None or b"pandas" not in schema.metadata
    paid_rows = expected_rows(paid, DAY)
    assert len(paid_rows) == 4  # prod×glm, prod×odd, ci×glm, ci×odd
    # CSV quoting: the name's comma and quotes survive
    assert ',"ci, ""nightly""",' in (directory / f"{paid.account_id}.csv").read_text()

    body = manifest(directory)
    assert body["date"] == DAY.isoformat()
    assert body["generated_at"] == "2026-11-29T00:20:00Z"
    assert body["newest_event_id"] == newest_event_id(api, None, DAY)
    assert [entry["file"] for entry in body["files"]] == sorted(names)
    for entry in body["files"]:
        t = paid if entry["account_id"] == paid.account_id else free
        rows = expected_rows(t, DAY)
        assert entry["sha256"] == sha256(directory / entry["file"])
        assert entry["bytes"] == (directory / entry["file"]).stat().st_size
        assert entry["rows"] == len(rows)
        assert entry["requests"] == sum(int(r[5]) for r in rows)
        assert entry["newest_event_id"] == newest_event_id(api, t.account_id, DAY)
        if t.billed:
            assert entry["cost_status"] == "billed"
            assert entry["cost_microcents"] == sum(int(r[10]) for r in rows) > 0
        else:
            assert (entry["cost_status"], entry["cost_microcents"]) == ("not_applicable", None)

    # Every file's totals equal the real report route's for the day.
    for t in (paid, free):
        report = report_day(api, create_key(api, t.account_id).secret, DAY)
        rows = read_csv(directory / f"{t.account_id}.csv")[1:]
        totals = report["totals"]
        for column, measure in ((5, "requests"), (6, "input_tokens"), (7, "cache_read_tokens")):
            assert sum(int(r[column]) for r in rows) == totals[measure]
        assert sum(int(r[8]) for r in rows) == totals["output_tokens"]
        if t.billed:
            assert sum(int(r[10]) for r in rows) == totals["cost_microcents"]
        else:
            assert report["cost_status"] == "not_applicable"
            assert totals["cost_microcents"] is None
            assert {r[10] for r in rows} == {r[11] for r in rows} == {""}

    state = day_state(api, DAY)
    assert state is not None
    assert (state.status, state.attempts, state.requests) == ("succeeded", 1, body_requests(body))
    assert [(r.status, r.trigger, r.files) for r in runs(api, DAY)] == [
        ("succeeded", "scheduled", 4)
    ]


def test_a_keys_project_and_member_stay_in_its_rows_after_both_are_gone(
    fresh_api: Api, tmp_path: Path
) -> None:
    """The columns project_id and member_id name the key's project and member as they were
    when it spent, whatever became of them before the day was exported."""
    api = fresh_api
    t = tenant(api, "prepaid", names=("dev",))  # a key of the tenant's own member
    account = t.account_id
    made = {}
    for path, body in (
        ("projects", {"name": "research"}),
        ("members", {"email": "ada@example.com", "role": "developer"}),
    ):
        response = api.admin("POST", f"/admin/v1/accounts/{account}/{path}", json=body)
        assert response.status_code == 201, response.text
        made[path] = response.json()["id"]
    response = api.admin(
        "POST",
        f"/admin/v1/accounts/{account}/api-keys",
        json={"name": "ada", "project_id": made["projects"], "member_id": made["members"]},
    )
    assert response.status_code == 201, response.text
    ada = Key(response.json()["id"], response.json()["key"], account)
    t.keys.append(ada)
    t.key_names[ada.id] = "ada"
    t.key_members[ada.id] = made["members"]
    t.key_projects[ada.id] = made["projects"]
    glm, odd = sorted(t.models)
    (dev,) = t.keys[:1]
    send(api, t, dev, glm, START + timedelta(hours=1), 700, 0, 70)
    send(api, t, ada, glm, START + timedelta(hours=2), 1500, 300, 120)
    send(api, t, ada, odd, START + timedelta(hours=3), 90, 0, 9, api_name="messages")

    removed = api.admin("DELETE", f"/admin/v1/members/{made['members']}")
    assert removed.status_code == 200 and removed.json()["removed_at"] is not None, removed.text
    archived = api.admin("DELETE", f"/admin/v1/projects/{made['projects']}")
    assert archived.status_code == 200 and archived.json()["archived_at"] is not None
    assert archived.json()["id"] == made["projects"]

    export, _ = exporter(api, tmp_path / "exports", AFTER_DAY + timedelta(minutes=20))
    result = export.export_day(DAY, trigger="scheduled")
    assert (result.outcome, result.accounts, result.files) == ("exported", 1, 2)
    directory = tmp_path / "exports" / DAY.isoformat()
    rows = expected_rows(t, DAY)
    assert read_csv(directory / f"{account}.csv") == [COLUMNS, *rows]
    assert read_parquet_rows(directory / f"{account}.parquet") == rows
    by_key = {(row[2], row[4]): (row[12], row[13]) for row in rows}
    assert by_key == {
        (dev.id, glm): ("proj_" + account.removeprefix("acct_"), t.key_members[dev.id]),
        (ada.id, glm): (made["projects"], made["members"]),
        (ada.id, odd): (made["projects"], made["members"]),
    }


def body_requests(body: dict[str, object]) -> int:
    files = body["files"]
    assert isinstance(files, list)
    return sum(int(e["requests"]) for e in files if e["format"] == "csv")


def test_a_rerun_writes_the_same_bytes_and_moves_only_generated_at(
    fresh_api: Api, tmp_path: Path
) -> None:
    api = fresh_api
    busy_day(api)
    export, clock = exporter(api, tmp_path / "exports", AFTER_DAY + timedelta(minutes=20))
    directory = tmp_path / "exports" / DAY.isoformat()
    assert export.export_day(DAY).outcome == "exported"
    files = sorted(p for p in directory.iterdir() if p.name != "manifest.json")
    before = {p.name: p.read_bytes() for p in files}
    mtimes = {p.name: p.stat().st_mtime_ns for p in files}
    first_manifest = manifest(directory)

    clock.advance(hours=5)
    assert export.export_day(DAY).outcome == "exported"
    assert {p.name: p.read_bytes() for p in files} == before
    assert {p.name: p.stat().st_mtime_ns for p in files} == mtimes  # unchanged files untouched
    second_manifest = manifest(directory)
    assert second_manifest["generated_at"] == "2026-11-29T05:20:00Z"
    assert {**second_manifest, "generated_at": None} == {**first_manifest, "generated_at": None}

    # Rendered anew from scratch (not merely left in place): still the same bytes.
    for path in files:
        path.unlink()
    assert export.export_day(DAY).outcome == "exported"
    assert {p.name: p.read_bytes() for p in files} == before


def test_one_account_by_hand_leaves_the_others_in_the_manifest(
    fresh_api: Api, tmp_path: Path
) -> None:
    api = fresh_api
    paid, free = busy_day(api)
    export, clock = exporter(api, tmp_path / "exports", AFTER_DAY + timedelta(minutes=20))
    directory = tmp_path / "exports" / DAY.isoformat()
    assert export.export_day(DAY, trigger="scheduled").outcome == "exported"
    free_entries = [e for e in manifest(directory)["files"] if e["account_id"] == free.account_id]

    prod = paid.keys[0]
    send(api, paid, prod, sorted(paid.models)[0], START + timedelta(hours=22), 4242, 0, 42)
    clock.advance(hours=1)
    result = export.export_day(DAY, account_id=paid.account_id)
    assert (result.outcome, result.accounts, result.files) == ("exported", 1, 2)
    assert read_csv(directory / f"{paid.account_id}.csv")[1:] == expected_rows(paid, DAY)
    body = manifest(directory)
    assert [e for e in body["files"] if e["account_id"] == free.account_id] == free_entries
    for entry in body["files"]:
        assert entry["sha256"] == sha256(directory / entry["file"])
    assert body["newest_event_id"] == newest_event_id(api, None, DAY)
    # A single account's run is not the day's export: the scheduler still owes the whole day.
    assert DAY in export.due_days(AFTER_DAY + timedelta(hours=2), timedelta(minutes=15))
    assert [(r.account_id, r.trigger) for r in runs(api, DAY)] == [
        (None, "scheduled"),
        (paid.account_id, "manual"),
    ]


def test_the_export_command_backfills_a_range_and_refuses_unended_days(
    fresh_api: Api,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = fresh_api
    paid = tenant(api)
    prod = paid.keys[0]
    glm = sorted(paid.models)[0]
    first = DAY - timedelta(days=2)
    send(api, paid, prod, glm, midnight(first) + timedelta(hours=1))
    send(api, paid, prod, glm, START + timedelta(hours=1), 10, 0, 1)
    export_dir = tmp_path / "cli-exports"
    monkeypatch.setenv("METERING_DATABASE_URL", api.url)
    monkeypatch.setenv("METERING_EXPORT_DIR", str(export_dir))

    assert main(["export", "--from", first.isoformat(), "--to", DAY.isoformat()]) == 0
    out = capsys.readouterr().out
    assert f"{first}: exported 1 accounts" in out
    assert f"{first + timedelta(days=1)}: no usage to export" in out
    assert "2 of 3 days exported" in out
    for day in (first, DAY):
        rows = read_csv(export_dir / day.isoformat() / f"{paid.account_id}.csv")[1:]
        assert rows == expected_rows(paid, day)
    assert not (export_dir / (first + timedelta(days=1)).isoformat()).exists()

    assert main(["export", "--date", DAY.isoformat(), "--account", paid.account_id]) == 0
    not_ended = date(9999, 12, 30)  # whatever the real date is
    assert main(["export", "--date", not_ended.isoformat()]) == 2
    assert main(["export", "--from", DAY.isoformat()]) == 2
    assert "has not ended yet" in capsys.readouterr().err
