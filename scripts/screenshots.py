"""Screenshots of every portal page for the docs (docs/images/portal-*.png), taken with the
test browser (headless chromium) against a real server on a fresh SQLite database with a few
days of made-up usage. Run: ``.venv/bin/python scripts/screenshots.py``."""

from __future__ import annotations

import random
import sys
import tempfile
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from selenium.webdriver.common.by import By  # noqa: E402

from metering.exports.commands import export  # noqa: E402
from tests.conftest import NOW, migrated_database  # noqa: E402
from tests.factories import (  # noqa: E402
    chat_usage,
    create_account,
    create_key,
    grant,
    ingest,
    priced_model,
    usage_event,
)
from tests.portal.browser import Browser, new_browser, serving, sign_in_link  # noqa: E402
from tests.portal.conftest import export_rollforward  # noqa: E402

PAGES = {
    "overview": "/billing",
    "usage": "/billing/usage?starting_at=2026-11-16&ending_at=2026-11-30&group_by=api_key",
    "keys": "/billing/keys",
    "activity": "/billing/activity",
    "exports": "/billing/exports",
    "notifications": "/billing/notifications",
    "models": "/billing/models",
}
OUT = ROOT / "docs" / "images"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(17)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with migrated_database("sqlite", tmp) as url, serving("sqlite", url, tmp) as api:
            account = create_account(api, name="Acme Research")
            keys = [
                create_key(api, account, limit_cents=20_000, name="production"),
                create_key(api, account, name="ci-pipeline"),
                create_key(api, account, limit_cents=5_000, name="notebook"),
            ]
            grant(api, account, 50_000)
            promotional = {
                "amount_cents": 2_500,
                "idempotency_key": "welcome",
                "category": "promotional",
                "expires_at": "2026-12-31T00:00:00Z",
                "note": "welcome credit",
            }
            api.admin("POST", f"/admin/v1/accounts/{account}/grants", json=promotional)
            api.admin(
                "PATCH",
                f"/admin/v1/accounts/{account}",
                json={"low_balance_threshold_cents": 10_000},
            )
            start = NOW - timedelta(days=60)
            models = [
                priced_model(api, start, display_name="GLM 5.3"),
                priced_model(api, start, (5_000_000, 40_000_000, 1_250_000), display_name="Flash"),
            ]
            for day in range(30):
                events = []
                for _ in range(rng.randint(20, 60) if day < 20 else rng.randint(40, 90)):
                    at = NOW - timedelta(days=day, minutes=rng.randint(1, 1400))
                    usage = chat_usage(rng.randint(200, 40_000), rng.randint(20, 4_000))
                    events.append(usage_event(rng.choice(keys), rng.choice(models), at, usage))
                ingest(api, *events)
            api.admin(
                "PATCH",
                f"/admin/v1/api-keys/{keys[2].id}",
                json={
                    "spend_limit_cents": 500,
                    "spend_limit_window": "week",
                    "allowed_models": [models[1]],
                },
            )
            endpoint = api.admin(
                "POST",
                "/admin/v1/webhook-endpoints",
                json={
                    "url": "https://hooks.acme.example/metering",
                    "event_types": ["credit.balance_low", "spend_limit.threshold_reached"],
                    "account_id": account,
                    "description": "finance alerts",
                },
            ).json()
            api.admin("POST", f"/admin/v1/webhook-endpoints/{endpoint['id']}/test")
            export(api.settings, None, date(2026, 11, 24), date(2026, 11, 28), account)
            export_rollforward(api, date(2026, 11, 29))
            driver = new_browser()
            try:
                browser = Browser(driver, str(api.client.base_url).rstrip("/"))
                driver.get(sign_in_link(api, account))
                browser.click("#confirm")
                for name, path in PAGES.items():
                    browser.open(path)
                    height = driver.execute_script("return document.body.scrollHeight")
                    driver.set_window_size(1280, min(max(int(height) + 40, 700), 1800))
                    driver.find_element(By.TAG_NAME, "h1")
                    driver.save_screenshot(str(OUT / f"portal-{name}.png"))
                    print(f"docs/images/portal-{name}.png")
            finally:
                driver.quit()


if __name__ == "__main__":
    main()
