"""``/docs`` and ``/redoc`` load everything from the service: every URL the pages name is a
local path, and each one loads."""

from __future__ import annotations

import re

import pytest

from tests.conftest import Api
from tests.factories import assert_error

URLS = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*'([^']+)'|spec-url="([^"]+)\"""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_references_only_local_urls_that_load(api: Api, page: str) -> None:
    response = api.client.get(page)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    urls = [next(group for group in match if group) for match in URLS.findall(html)]
    assert len(urls) >= 3, urls
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url
        loaded = api.client.get(url)
        assert loaded.status_code == 200, url
        assert len(loaded.content) > 100, url
    if page == "/docs":
        assert '"validatorUrl": null' in html
        assert "/openapi.json" in urls
        script = api.client.get("/docs/assets/swagger-ui-bundle.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert "SwaggerUIBundle" in script.text


def test_only_the_pages_assets_are_served(api: Api) -> None:
    for name in ("core.py", "swagger-ui-bundle.js.map", "__init__.py"):
        assert_error(api.client.get(f"/docs/assets/{name}"), 404, "not_found", param="name")
    assert_error(api.client.get("/docs/assets/..%2F__init__.py"), 404, "not_found")
