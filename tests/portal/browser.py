"""A real browser for the portal's tests: Debian's chromium, headless, driven by Selenium
through /usr/bin/chromedriver (installed by ``make browser``, which ``make test`` runs), and a
real HTTP server (uvicorn in a thread) serving the app, with the test's clock."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import uvicorn
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from metering.app import create_app
from metering.db import Database
from metering.kit.clock import FrozenClock
from tests.conftest import NOW, Api, make_settings
from tests.servers import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
AXE = Path(__file__).parent / "vendor" / "axe-core-4.11.0" / "axe.min.js"


@contextmanager
def serving(backend: str, url: str, tmp_dir: Path, **settings: Any) -> Iterator[Api]:
    """The app on a real loopback port; ``Api.client`` talks to it over HTTP."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = make_settings(url, tmp_dir, public_base_url=base, **settings)
    clock = FrozenClock(NOW)
    database = Database.from_url(url, pool_size=5)
    app = create_app(config, database=database, clock=clock)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the portal's test server did not start")
        time.sleep(0.05)
    client = httpx.Client(base_url=base, timeout=30)
    try:
        yield Api(client, backend, url, clock, database, config)  # type: ignore[arg-type]
    finally:
        client.close()
        server.should_exit = True
        thread.join(15)
        database.dispose()


def new_browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@dataclass
class Browser:
    driver: webdriver.Chrome
    base: str

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def text(self, selector: str) -> str:
        return str(self.driver.find_element(By.CSS_SELECTOR, selector).text)

    def console_errors(self) -> list[dict[str, Any]]:
        """The page's console errors since the last call (a CSP refusal, a script error, a
        failed load all land here)."""
        return [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]

    def cookie(self, name: str) -> dict[str, Any] | None:
        return self.driver.get_cookie(name)

    def table_rows(self, table_id: str, row_class: str = "result") -> list[list[str]]:
        rows = self.driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr.{row_class}")
        return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]

    def chart_source(self, chart_id: str) -> dict[str, Any]:
        script = self.driver.find_element(By.ID, f"{chart_id}-data")
        return dict(json.loads(script.get_attribute("textContent") or "{}"))

    def chart_painted(self, chart_id: str) -> dict[str, Any]:
        """What Chart.js drew on the canvas: its dataset count and how many pixels are not
        blank."""
        return dict(
            self.driver.execute_script(
                """
                const canvas = document.getElementById(arguments[0]);
                const chart = window.Chart && Chart.getChart(canvas);
                const ctx = canvas.getContext('2d');
                const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
                let painted = 0;
                for (let i = 3; i < pixels.length; i += 4) { if (pixels[i] !== 0) painted++; }
                return {datasets: chart ? chart.data.datasets.length : -1, painted: painted,
                        width: canvas.width, height: canvas.height};
                """,
                chart_id,
            )
        )

    def axe_violations(self) -> list[dict[str, Any]]:
        """axe-core's violations of its wcag2a and wcag2aa rules on the current page."""
        self.driver.execute_script(AXE.read_text())
        result = self.driver.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa']}})
               .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact,
                     nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}))))
               .catch(e => done([{id: 'axe-error', impact: String(e), nodes: []}]));
            """
        )
        return list(result)

    def click(self, selector: str) -> None:
        """Click, then wait for the page it leads to (a form's POST and its 303)."""
        before = self.driver.find_element(By.TAG_NAME, "html")
        self.driver.find_element(By.CSS_SELECTOR, selector).click()
        self.wait_for_new_page(before)

    def wait_for_new_page(self, before: Any) -> None:
        def replaced(driver: webdriver.Chrome) -> bool:
            try:
                before.is_enabled()
            except StaleElementReferenceException:
                try:
                    return driver.execute_script("return document.readyState") == "complete"
                except WebDriverException:
                    return False  # the new page is still being committed
            except WebDriverException:
                # Mid-navigation Chrome may answer for the old node with an inspector error
                # ("Node with given id does not belong to the document") instead of "stale":
                # the page is being replaced, so look again.
                return False
            return False

        WebDriverWait(self.driver, 15).until(replaced)

    def csrf(self) -> str:
        field = self.driver.find_element(By.CSS_SELECTOR, "input[name=csrf_token]")
        return str(field.get_attribute("value"))


def sign_in_link(api: Api, account_id: str) -> str:
    response = api.admin("POST", f"/admin/v1/accounts/{account_id}/portal-sessions")
    assert response.status_code == 201, response.text
    url = str(response.json()["url"])
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/billing/sign-in/[A-Za-z0-9_-]{43}", url), url
    return url
