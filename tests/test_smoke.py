"""The app answers on every backend, with a request id on every response."""

import re

from tests.conftest import Api


def test_healthz_and_readyz(api: Api) -> None:
    for path in ("/healthz", "/readyz"):
        response = api.client.get(path)
        assert response.status_code == 200
        assert re.fullmatch(r"[0-9a-f]{12}", response.headers["x-request-id"])
