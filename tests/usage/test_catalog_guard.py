"""``metering catalog import`` never reprices a recorded charge (docs/api.md#catalog): changing a
version that priced charges, or inserting one inside a period that has charges, is refused and
nothing changes. Versions away from any charge still import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from metering.cli import main
from tests.conftest import NOW, Api
from tests.factories import (
    chat_usage,
    create_account,
    create_key,
    ingest,
    priced_model,
    usage_event,
)
from tests.usage.helpers import events_of

RATES = {
    "input_microcents_per_million": 22_000_000,
    "output_microcents_per_million": 339_000_000,
    "cache_read_microcents_per_million": 17_750_000,
}


def import_versions(
    api: Api,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    prices: list[dict[str, Any]],
) -> int:
    catalog = {
        "models": [{"id": model, "display_name": model, "context_length": 131072, "prices": prices}]
    }
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(catalog))
    monkeypatch.setenv("METERING_DATABASE_URL", api.url)
    return main(["catalog", "import", str(path)])


def history(api: Api, model: str) -> list[tuple[str, int]]:
    prices = api.admin("GET", f"/admin/v1/models/{model}").json()["prices"]
    return [(p["effective_at"], p["input_microcents_per_million"]) for p in prices]


@pytest.fixture
def charged(api: Api) -> str:
    """A model priced from 2026-11-20 with one charge at 2026-11-25T00:00Z."""
    key = create_key(api, create_account(api))
    model = priced_model(api, NOW.replace(day=20, hour=0))
    event = usage_event(key, model, NOW.replace(day=25, hour=0), chat_usage(1000, 100))
    assert ingest(api, event)["recorded"] == 1
    return model


def test_changing_a_version_that_priced_a_charge_is_refused(
    api: Api, charged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = history(api, charged)
    changed = {**RATES, "input_microcents_per_million": 1}
    code = import_versions(
        api, tmp_path, monkeypatch, charged, [{"effective_at": "2026-11-20T00:00:00Z", **changed}]
    )
    assert code == 1
    assert history(api, charged) == before


@pytest.mark.parametrize("at", ["2026-11-21T00:00:00Z", "2026-11-25T00:00:00Z"])
def test_inserting_a_version_inside_a_charged_period_is_refused(
    api: Api, charged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    before = history(api, charged)
    prices = [
        {"effective_at": "2026-11-20T00:00:00Z", **RATES},
        {"effective_at": at, **RATES, "input_microcents_per_million": 1},
    ]
    assert import_versions(api, tmp_path, monkeypatch, charged, prices) == 1
    assert history(api, charged) == before


def test_versions_that_reprice_nothing_are_imported(
    api: Api, charged: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = [
        {"effective_at": "2026-11-01T00:00:00Z", **RATES},  # before every charge
        {"effective_at": "2026-11-20T00:00:00Z", **RATES},  # unchanged
        {"effective_at": "2026-11-25T00:00:00.000001Z", **RATES, "input_microcents_per_million": 5},
    ]
    assert import_versions(api, tmp_path, monkeypatch, charged, prices) == 0
    assert [at for at, _ in history(api, charged)] == [
        "2026-11-01T00:00:00Z",
        "2026-11-20T00:00:00Z",
        "2026-11-25T00:00:00.000001Z",
    ]


def test_an_unbilled_charge_does_not_pin_a_version(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_key(api, create_account(api, billing="unbilled"))
    model = priced_model(api, NOW.replace(day=20, hour=0))
    ingest(api, usage_event(key, model, NOW.replace(day=25, hour=0)))
    assert [e.total_microcents for e in events_of(api, key.account_id)] == [0]
    changed = {**RATES, "input_microcents_per_million": 1}
    code = import_versions(
        api, tmp_path, monkeypatch, model, [{"effective_at": "2026-11-20T00:00:00Z", **changed}]
    )
    assert code == 0
