"""METERING_SECRET_KEY (docs/operations.md#configuration): required with a server database,
generated for the embedded default (kept 0600 in the data directory), at least 32 characters,
several for rotation."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import ValidationError

from metering.notifications import secrets
from metering.runtime import runtime_settings
from metering.settings import Settings

PG = "postgresql+psycopg://u@127.0.0.1:1/db"


def test_a_server_database_needs_a_secret_key(tmp_path: Path) -> None:
    settings = Settings(
        database_url=PG, data_dir=tmp_path, admin_tokens=["a" * 8], gateway_tokens=["g" * 8]
    )
    with pytest.raises(SystemExit) as stopped:
        runtime_settings(settings)
    assert "METERING_SECRET_KEY" in str(stopped.value)
    # (the billing portal's public address is required beside it: issue 17)
    configured = settings.model_copy(
        update={"secret_key": ["k" * 32], "public_base_url": "https://billing.example.com"}
    )
    assert runtime_settings(configured).secret_key == ["k" * 32]


def test_the_embedded_default_generates_one_and_keeps_it(tmp_path: Path) -> None:
    first = runtime_settings(Settings(data_dir=tmp_path))
    (key,) = first.secret_key
    assert len(key) >= 32
    path = tmp_path / "secret-key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert runtime_settings(Settings(data_dir=tmp_path)).secret_key == [key]


def test_short_keys_are_refused_and_several_are_a_list() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(secret_key="too-short")  # type: ignore[arg-type]
    assert "at least 32 characters" in str(refused.value)
    assert "too-short" not in str(refused.value).split("input_value")[0]
    keys = Settings(secret_key=f"{'n' * 32},{'o' * 32}")  # type: ignore[arg-type]
    assert keys.secret_key == ["n" * 32, "o" * 32]


def test_sealed_secrets_open_with_any_configured_key_and_only_for_their_endpoint() -> None:
    old, new = "o" * 32, "n" * 32
    secret = secrets.new_secret()
    sealed = secrets.seal([old], secret, "whep_1")
    assert secret not in sealed and secret.removeprefix("whsec_") not in sealed
    assert secrets.open_sealed([new, old], sealed, "whep_1") == secret  # rotation: old still opens
    with pytest.raises(secrets.SecretUnreadable):
        secrets.open_sealed([new], sealed, "whep_1")
    with pytest.raises(secrets.SecretUnreadable):
        secrets.open_sealed([old], sealed, "whep_2")  # copied to another row: refused


@pytest.mark.parametrize("scheme", ["sqlite", "sqlite+pysqlite", "SQLite"])
def test_a_sqlite_url_is_the_embedded_database_however_named(tmp_path: Path, scheme: str) -> None:
    named = Settings(database_url=f"{scheme}:///{tmp_path}/named.sqlite3", data_dir=tmp_path)
    assert named.is_embedded and named.webhooks_may_reach_private
    settings = runtime_settings(named)  # no token, key or public address asked for
    assert settings.secret_key and settings.admin_tokens and settings.gateway_tokens
    assert settings.public_base_url == "http://127.0.0.1:8000"
    assert settings.effective_database_url == f"{scheme}:///{tmp_path}/named.sqlite3"
    assert not Settings(database_url=PG).is_embedded
