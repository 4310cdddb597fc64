"""The ``metering`` command: catalog import, migrate, and a real first start of ``serve``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect

from metering.catalog.importer import SHIPPED_CATALOG
from metering.cli import main
from metering.models import Base
from tests.conftest import (
    BACKENDS,
    SECRET_KEY,
    Api,
    fresh_database,
    migrated_database,
    require_postgresql,
    running_api,
)

SHIPPED: dict[str, Any] = json.loads(SHIPPED_CATALOG.read_text())
METERING = Path(sys.executable).with_name("metering")


@pytest.fixture(autouse=True)
def _no_metering_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the METERING_* variables it means (Settings reads them at call time)."""
    for name in list(os.environ):
        if name.startswith("METERING_") and not name.startswith("METERING_TEST_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=BACKENDS)
def db_url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A migrated, empty database that ``metering`` is pointed at."""
    with migrated_database(request.param, tmp_path) as url:
        monkeypatch.setenv("METERING_DATABASE_URL", url)
        yield url


def catalog_state(api: Api) -> dict[str, Any]:
    """Every model with its metadata and price history, as the admin API shows them."""
    state = {}
    for model in api.admin("GET", "/admin/v1/models", params={"limit": 1000}).json()["data"]:
        full = api.admin("GET", f"/admin/v1/models/{model['id']}").json()
        for volatile in ("created_at", "updated_at"):
            full.pop(volatile)
        for version in full["prices"]:
            version.pop("id")
            version.pop("created_at")
        state[model["id"]] = full
    return state


def in_force_now(prices: list[dict[str, Any]]) -> dict[str, Any] | None:
    now = datetime.now(UTC)
    started = [p for p in prices if datetime.fromisoformat(p["effective_at"]) <= now]
    return max(started, key=lambda p: datetime.fromisoformat(p["effective_at"]), default=None)


def write_catalog(path: Path, models: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"models": models}))
    return path


def shipped_model(model_id: str) -> dict[str, Any]:
    return json.loads(json.dumps(next(m for m in SHIPPED["models"] if m["id"] == model_id)))


class TestShippedCatalog:
    def test_shipped_catalog_has_the_cases_billing_depends_on(self) -> None:
        models = SHIPPED["models"]
        assert len(models) >= 5
        ids = [m["id"].lower() for m in models]
        assert len(set(ids)) == len(ids)
        current = {m["id"]: in_force_now(m["prices"]) for m in models}
        assert all(current.values()), "every model has a price in force"
        assert any(
            p and p["cache_read_microcents_per_million"] % 1_000_000 for p in current.values()
        )
        assert any(m["max_output_tokens"] for m in models)
        assert any(m["reasoning_headroom_tokens"] > 0 for m in models)
        assert any(m["hidden"] for m in models)
        assert any(not m["hidden"] for m in models)
        for model in models:
            assert model["max_output_tokens"] is None or (
                model["max_output_tokens"] <= model["context_length"]
            )


class TestCatalogImport:
    def test_shipped_catalog_imports_and_reimport_changes_nothing(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        versions = sum(len(m["prices"]) for m in SHIPPED["models"])
        assert main(["catalog", "import"]) == 0
        out = capsys.readouterr().out
        assert f"models created: {len(SHIPPED['models'])} " in out
        assert f"price versions added: {versions}, changed: 0, unchanged: 0" in out

        with running_api("any", db_url, tmp_path) as api:
            state = catalog_state(api)
        assert set(state) == {m["id"] for m in SHIPPED["models"]}
        for model in SHIPPED["models"]:
            shown = state[model["id"]]
            for field in ("display_name", "context_length", "max_output_tokens", "hidden"):
                assert shown[field] == model[field], (model["id"], field)
            assert shown["reasoning_headroom_tokens"] == model["reasoning_headroom_tokens"]
            assert shown["deprecation_date"] == model["deprecation_date"]
            assert [
                (
                    datetime.fromisoformat(v["effective_at"]),
                    v["input_microcents_per_million"],
                    v["output_microcents_per_million"],
                    v["cache_read_microcents_per_million"],
                )
                for v in shown["prices"]
            ] == sorted(
                (
                    datetime.fromisoformat(p["effective_at"]),
                    p["input_microcents_per_million"],
                    p["output_microcents_per_million"],
                    p["cache_read_microcents_per_million"],
                )
                for p in model["prices"]
            )

        assert main(["catalog", "import", str(SHIPPED_CATALOG)]) == 0
        out = capsys.readouterr().out
        assert "models created: 0\n" in out and "models updated: 0\n" in out
        assert f"price versions added: 0, changed: 0, unchanged: {versions}" in out
        with running_api("any", db_url, tmp_path) as api:
            assert catalog_state(api) == state

    def test_changed_metadata_and_new_versions_are_applied(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["catalog", "import"]) == 0
        glm = shipped_model("GLM-5.3")
        glm["display_name"] = "GLM 5.3 (renamed)"
        glm["prices"].append(
            {
                "effective_at": "2030-01-01T00:00:00Z",
                "input_microcents_per_million": 20_000_000,
                "output_microcents_per_million": 300_000_000,
                "cache_read_microcents_per_million": 15_000_000,
            }
        )
        capsys.readouterr()
        assert main(["catalog", "import", str(write_catalog(tmp_path / "c.json", [glm]))]) == 0
        out = capsys.readouterr().out
        assert "models updated: 1 GLM-5.3" in out
        assert "price versions added: 1, changed: 0, unchanged: 2" in out
        with running_api("any", db_url, tmp_path) as api:
            shown = api.admin("GET", "/admin/v1/models/glm-5.3").json()
        assert shown["display_name"] == "GLM 5.3 (renamed)"
        assert shown["prices"][-1]["effective_at"] == "2030-01-01T00:00:00Z"

    @pytest.mark.parametrize(
        "case",
        [
            "malformed-json",
            "models-not-a-list",
            "missing-fields",
            "not-an-object",
            "output-above-context",
            "negative-rate",
            "bad-timestamp",
            "reserved-id",
        ],
    )
    def test_invalid_file_is_refused_and_changes_nothing(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
    ) -> None:
        assert main(["catalog", "import"]) == 0
        with running_api("any", db_url, tmp_path) as api:
            before = catalog_state(api)
        path = tmp_path / "bad.json"
        raw = {
            "malformed-json": '{"models": [',
            "models-not-a-list": '{"models": {}}',
            "missing-fields": '{"models": [{"id": "X"}]}',
            "not-an-object": "[]",
        }
        if case in raw:
            path.write_text(raw[case])
        else:
            # A valid new model and a valid change first: neither may be applied.
            new, glm = shipped_model("GLM-5.3-Flash"), shipped_model("GLM-5.3")
            new["id"] = "Brand-New"
            glm["display_name"] = "changed"
            broken = shipped_model("Qwen3.8-27B")
            if case == "output-above-context":
                broken["max_output_tokens"] = broken["context_length"] + 1
            elif case == "negative-rate":
                broken["prices"][0]["input_microcents_per_million"] = -1
            elif case == "bad-timestamp":
                broken["prices"][0]["effective_at"] = "2026-06-16 00:00"
            else:
                broken["id"] = "Unavailable"
            write_catalog(path, [new, glm, broken])
        capsys.readouterr()
        assert main(["catalog", "import", str(path)]) != 0
        assert "refused, nothing changed" in capsys.readouterr().err
        with running_api("any", db_url, tmp_path) as api:
            assert catalog_state(api) == before

    @pytest.mark.parametrize("twin", ["Brand-New", "BRAND-NEW"])
    def test_duplicate_model_is_refused_and_changes_nothing(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], twin: str
    ) -> None:
        first = shipped_model("GLM-5.3-Flash")
        first["id"] = "Brand-New"
        second = json.loads(json.dumps(first))
        second["id"] = twin
        path = write_catalog(tmp_path / "dup.json", [first, shipped_model("GLM-5.3"), second])
        assert main(["catalog", "import", str(path)]) != 0
        err = capsys.readouterr().err
        assert "refused, nothing changed" in err and twin in err
        with running_api("any", db_url, tmp_path) as api:
            assert catalog_state(api) == {}

    def test_two_versions_at_one_instant_are_refused(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        glm = shipped_model("GLM-5.3")
        glm["prices"].append({**glm["prices"][0], "effective_at": "2026-06-16T02:00:00+02:00"})
        path = write_catalog(tmp_path / "twice.json", [glm])
        assert main(["catalog", "import", str(path)]) != 0
        assert "refused, nothing changed" in capsys.readouterr().err
        with running_api("any", db_url, tmp_path) as api:
            assert catalog_state(api) == {}

    def test_missing_file(
        self, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["catalog", "import", str(tmp_path / "nope.json")]) != 0
        assert "nope.json" in capsys.readouterr().err


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


class TestMigrate:
    @pytest.mark.parametrize("backend", BACKENDS)
    def test_migrate_makes_the_schema_idempotently(
        self,
        backend: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        with fresh_database(backend, tmp_path) as url:
            monkeypatch.setenv("METERING_DATABASE_URL", url)
            assert _tables(url) == set()
            assert main(["migrate"]) == 0
            assert "newest migration" in capsys.readouterr().out
            expected = set(Base.metadata.tables) | {"alembic_version"}
            assert _tables(url) == expected
            assert main(["migrate"]) == 0
            assert _tables(url) == expected

    def test_migrate_embedded_creates_the_data_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        data = tmp_path / "fresh" / "data"
        monkeypatch.setenv("METERING_DATA_DIR", str(data))
        assert main(["migrate"]) == 0
        assert "accounts" in _tables(f"sqlite:///{data / 'metering.sqlite3'}")

    def test_serve_refuses_a_server_database_that_is_not_migrated(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        require_postgresql()
        with fresh_database("postgresql", tmp_path) as url:
            monkeypatch.setenv("METERING_DATABASE_URL", url)
            monkeypatch.setenv("METERING_ADMIN_TOKENS", "a")
            monkeypatch.setenv("METERING_GATEWAY_TOKENS", "g")
            monkeypatch.setenv("METERING_SECRET_KEY", SECRET_KEY)
            assert main(["serve"]) == 1
            assert "metering migrate" in capsys.readouterr().err

    @pytest.mark.parametrize("command", ["serve", "migrate", "verify", "scheduler"])
    def test_an_unreachable_database_is_one_clear_line_not_a_traceback(
        self,
        command: str,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"postgresql+psycopg://metering:s3cret@127.0.0.1:{port}/nowhere"
        monkeypatch.setenv("METERING_DATABASE_URL", url)
        monkeypatch.setenv("METERING_ADMIN_TOKENS", "a")
        monkeypatch.setenv("METERING_GATEWAY_TOKENS", "g")
        monkeypatch.setenv("METERING_SECRET_KEY", SECRET_KEY)
        assert main([command, "--once"] if command == "scheduler" else [command]) == 1
        err = capsys.readouterr().err
        assert f"cannot use the database postgresql+psycopg://metering:***@127.0.0.1:{port}" in err
        assert "Traceback" not in err and "s3cret" not in err


def _clean_env(**extra: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(
    port: int, path: str, token: str | None = None, method: str = "GET", body: Any = None
) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, data=data, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


class Server:
    """``metering serve`` as a user runs it: a subprocess in its own directory."""

    def __init__(self, cwd: Path, name: str, **env: str) -> None:
        self.port = _free_port()
        self.stdout = cwd / f"{name}.out"
        self.stderr = cwd / f"{name}.err"
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [str(METERING), "serve", "--port", str(self.port)],
                cwd=cwd,
                env=_clean_env(**env),
                stdout=out,
                stderr=err,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                if _get(self.port, "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"server did not start:\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _expected_listing() -> list[str]:
    today = datetime.now(UTC).date()
    return sorted(
        (
            m["id"]
            for m in SHIPPED["models"]
            if not m["hidden"]
            and in_force_now(m["prices"])
            and (m["deprecation_date"] is None or today < date.fromisoformat(m["deprecation_date"]))
        ),
        key=str.encode,
    )


def test_first_start_then_restart(tmp_path: Path) -> None:
    server = Server(tmp_path, "first")
    try:
        status, models = _get(server.port, "/v1/models")
        assert status == 200
        assert [card["id"] for card in models["data"]] == _expected_listing()
        glm = next(card for card in models["data"] if card["id"] == "GLM-5.3")
        current = in_force_now(shipped_model("GLM-5.3")["prices"])
        assert current is not None
        pricing = glm["wafer"]["pricing"]
        assert (
            pricing["cache_read_microcents_per_million"]
            == current["cache_read_microcents_per_million"]
        )

        out = server.stdout.read_text()
        admin = re.search(r"admin token:\s+(\S+)", out)
        gateway = re.search(r"gateway token:\s+(\S+)", out)
        assert admin and gateway, out
        admin_token, gateway_token = admin.group(1), gateway.group(1)
        assert admin_token != gateway_token

        tokens_file = tmp_path / "data" / "dev-tokens.env"
        assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
        kept = dict(line.split("=", 1) for line in tokens_file.read_text().splitlines())
        assert set(kept.values()) == {admin_token, gateway_token}

        status, account = _get(
            server.port, "/admin/v1/accounts", admin_token, "POST", {"name": "first customer"}
        )
        assert status == 201, account
        status, error = _get(server.port, "/admin/v1/accounts", gateway_token)
        assert (status, error["error"]["code"]) == (401, "invalid_api_key")
    finally:
        server.stop()
    # Printed to the terminal, never through the logger.
    assert admin_token not in server.stderr.read_text()
    assert gateway_token not in server.stderr.read_text()

    again = Server(tmp_path, "second")
    try:
        status, fetched = _get(again.port, f"/admin/v1/accounts/{account['id']}", admin_token)
        assert (status, fetched) == (200, account)
        status, listed = _get(again.port, "/v1/models")
        assert [card["id"] for card in listed["data"]] == _expected_listing()
    finally:
        again.stop()
    output = again.output()
    assert admin_token not in output and gateway_token not in output
    assert "dev-tokens.env" in again.stdout.read_text()
    assert "models created" not in output  # the catalog was imported once


def test_a_sqlite_database_named_by_its_url_is_the_embedded_one(tmp_path: Path) -> None:
    """No token, secret key or public address asked for: SQLite is embedded however named."""
    named = tmp_path / "named.sqlite3"
    server = Server(tmp_path, "named", METERING_DATABASE_URL=f"sqlite:///{named}")
    try:
        admin = re.search(r"admin token:\s+(\S+)", server.stdout.read_text())
        assert admin, server.output()
        status, account = _get(
            server.port, "/admin/v1/accounts", admin.group(1), "POST", {"name": "n"}
        )
        assert status == 201, account
    finally:
        server.stop()
    assert "server database" not in server.output()
    assert named.exists() and not (tmp_path / "data" / "metering.sqlite3").exists()


def test_serve_on_a_server_database_without_tokens_exits_with_a_clear_message(
    pg_url: str, tmp_path: Path
) -> None:
    for tokens in ({}, {"METERING_ADMIN_TOKENS": "only-admin"}):
        result = subprocess.run(
            [str(METERING), "serve", "--port", str(_free_port())],
            cwd=tmp_path,
            env=_clean_env(METERING_DATABASE_URL=pg_url, **tokens),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0
        assert (
            "METERING_ADMIN_TOKENS" in result.stderr and "METERING_GATEWAY_TOKENS" in result.stderr
        )
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "data" / "dev-tokens.env").exists()
