"""The webhook address rule (metering.notifications.addresses.is_private): every private,
reserved or special-purpose range, and every way of writing an address (IPv6 forms that embed
an IPv4 address, the numeric IPv4 forms resolvers accept), refused when saved through each of
the three routes (the admin route, an account key, the portal form) and when connecting."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpcore2
import pytest

from metering.notifications.addresses import (
    AddressRefused,
    allowed_addresses,
    check_url,
    is_private,
)
from metering.notifications.transport import GuardedBackend
from tests.conftest import APP_BACKENDS, Api, migrated_database, running_api
from tests.factories import assert_error, create_account, create_key
from tests.portal.test_portal_http import CSRF, _client, _link, _sign_in

# One address or more inside every range a webhook may not reach without
# METERING_WEBHOOK_ALLOW_PRIVATE=true (the first and last address where the edge matters).
PRIVATE_ADDRESSES = [
    "0.0.0.0",
    "0.255.255.255",
    "10.0.0.1",
    "10.255.255.255",
    "100.64.0.1",
    "100.127.255.254",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.169.254",
    "172.16.0.1",
    "172.31.255.255",
    "192.0.0.1",  # IETF protocol assignments, 192.0.0.0/24
    "192.0.0.9",
    "192.0.0.255",
    "192.0.2.1",  # TEST-NET-1
    "192.88.99.1",  # 6to4 relay anycast
    "192.88.99.255",
    "192.168.1.1",
    "198.18.0.1",  # benchmarking, 198.18.0.0/15
    "198.19.255.254",
    "198.51.100.7",  # TEST-NET-2
    "203.0.113.10",  # TEST-NET-3
    "224.0.0.1",
    "239.255.255.255",
    "240.0.0.1",  # reserved, 240.0.0.0/4
    "255.255.255.254",
    "255.255.255.255",
    "::",
    "::1",
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::c0a8:101",  # NAT64 of 192.168.1.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::808:808",  # local-use NAT64, 64:ff9b:1::/48, whatever it embeds
    "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
    "2002:a00:1::",  # 6to4 of 10.0.0.1
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:c0a8:101::",  # 6to4 of 192.168.1.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001::1",  # Teredo, 2001::/32
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:0:ffff:ffff:ffff:ffff:ffff:ffff",
    "::a00:1",  # IPv4-compatible ::10.0.0.1
    "::7f00:1",  # IPv4-compatible ::127.0.0.1
    "::ffff:0:a00:1",  # IPv4-translated ::ffff:0:10.0.0.1
    "::ffff:0:7f00:1",
    "::ffff:7f00:1",  # IPv4-mapped ::ffff:127.0.0.1
    "::ffff:a00:1",
    "::ffff:a9fe:a9fe",
    "fec0::1",  # site-local, fec0::/10
    "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
    "100::1",  # discard-only, 100::/64
    "100::ffff:ffff:ffff:ffff",
    "2001:db8::1",  # documentation, 2001:db8::/32
    "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
    "fc00::1",
    "fd12:3456::1",
    "fe80::1",
    "fe80::1%2",
    "ff02::1",
]
# Globally routable, including the IPv6 forms embedding a public IPv4 address.
PUBLIC_ADDRESSES = [
    "11.22.33.44",
    "1.1.1.1",
    "100.63.255.255",
    "100.128.0.0",
    "172.32.0.1",
    "192.0.1.1",
    "192.88.98.255",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "2a00:1450:4001::1",
    "2606:4700::1111",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]

# URLs whose host is private however it is written: the ranges above as literals, and the
# numeric IPv4 forms resolvers accept (decimal, octal, hexadecimal, shortened) and names that
# are loopback by definition.
PRIVATE_URLS = [
    *(f"https://[{a}]/hook" if ":" in a else f"https://{a}/hook" for a in PRIVATE_ADDRESSES),
    "https://2130706433/",  # 127.0.0.1 as one decimal number
    "https://0177.0.0.1/",  # octal
    "https://0x7f.0.0.1/",  # hexadecimal
    "https://0x7f000001/",
    "https://017700000001/",
    "https://127.1/",
    "https://0x7f.1/",
    "https://012.0.0.1:8443/",  # 10.0.0.1, octal
    "https://3232235777/",  # 192.168.1.1
    "https://0xa9.0xfe.0xa9.0xfe/latest/meta-data",  # 169.254.169.254
    "https://0/",
    "https://127.0.0.1./",  # a trailing dot
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:10.0.0.1]/",
    "https://[::127.0.0.1]/",
    "https://[::ffff:0:127.0.0.1]/",
    "https://[64:ff9b::127.0.0.1]/",
    "https://[64:ff9b::10.0.0.1]/",
    "https://localhost/",
    "https://localhost./",
    "https://LOCALHOST:8443/",
    "https://api.localhost./",
]


def _never_resolved(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host} needs no resolver")


class TestTheRule:
    @pytest.mark.parametrize("address", PRIVATE_ADDRESSES)
    def test_private(self, address: str) -> None:
        assert is_private(address)

    @pytest.mark.parametrize("address", PUBLIC_ADDRESSES)
    def test_public(self, address: str) -> None:
        assert not is_private(address)
        host = f"[{address}]" if ":" in address else address
        assert check_url(f"https://{host}/", False, _never_resolved) == f"https://{host}/"

    def test_a_numeric_form_out_of_range_is_not_a_url(self) -> None:
        for host in ("256.0.0.1", "4294967296", "1.2.3.256", "08.0.0.1", "1.2.65536"):
            with pytest.raises(Exception, match="not a valid URL"):
                check_url(f"https://{host}/", False, _never_resolved)


class TestRefusedAtConnect:
    """The check the delivery's connections make (transport.GuardedBackend), on the host the
    URL names: a literal needs no resolver, a name is refused on what it resolves to."""

    @pytest.mark.parametrize("url", PRIVATE_URLS)
    def test_refused(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname
        host = parts.hostname
        with pytest.raises(AddressRefused):
            allowed_addresses(host, parts.port or 443, False, _never_resolved)
        with pytest.raises(httpcore2.ConnectError, match="private"):
            GuardedBackend(False, _never_resolved).connect_tcp(host, parts.port or 443)

    def test_a_name_is_refused_on_any_private_answer(self) -> None:
        for answers in (["10.0.0.1"], ["11.22.33.44", "64:ff9b::7f00:1"], ["2002:a00:1::"]):
            with pytest.raises(AddressRefused):
                allowed_addresses("hooks.example", 443, False, lambda h, p, a=answers: a)
        asked: list[str] = []

        def resolver(host: str, port: int) -> list[str]:
            asked.append(host)
            return ["11.22.33.44"]

        assert allowed_addresses("hooks.example.", 443, False, resolver) == ["11.22.33.44"]
        assert asked == ["hooks.example"]  # resolved without its trailing dot


@pytest.fixture(scope="module", params=APP_BACKENDS)
def strict(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """The app on each backend with METERING_WEBHOOK_ALLOW_PRIVATE=false said explicitly."""
    tmp: Path = tmp_path_factory.mktemp("addresses")
    with (
        migrated_database(request.param, tmp) as url,
        running_api(request.param, url, tmp, webhook_allow_private=False) as api,
    ):
        yield api


class TestRefusedAtSave:
    def test_the_admin_route(self, strict: Api) -> None:
        account = create_account(strict)
        for url in PRIVATE_URLS:
            for body in ({"account_id": account}, {}):
                response = strict.admin(
                    "POST",
                    "/admin/v1/webhook-endpoints",
                    json={"url": url, "event_types": ["webhook.test"], **body},
                )
                assert_error(response, 400, "invalid_parameter", param="url")
        made = strict.admin(
            "POST",
            "/admin/v1/webhook-endpoints",
            json={"url": "https://11.22.33.44/", "event_types": ["webhook.test"]},
        )
        assert made.status_code == 201, made.text
        path = f"/admin/v1/webhook-endpoints/{made.json()['id']}"
        for url in PRIVATE_URLS:
            response = strict.admin("PATCH", path, json={"url": url})
            assert_error(response, 400, "invalid_parameter", param="url")
        assert strict.admin("GET", path).json()["url"] == "https://11.22.33.44/"

    def test_the_account_key_route(self, strict: Api) -> None:
        key = create_key(strict, create_account(strict))
        for url in PRIVATE_URLS:
            response = strict.as_key(
                key.secret,
                "POST",
                "/v1/webhook-endpoints",
                json={"url": url, "event_types": ["webhook.test"]},
            )
            assert_error(response, 400, "invalid_parameter", param="url")
        assert strict.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []

    def test_the_portal_form(self, strict: Api) -> None:
        account = create_account(strict)
        key = create_key(strict, account)
        client = _client(strict)
        assert _sign_in(client, _link(strict, account)).status_code == 303  # type: ignore[attr-defined]
        page = client.get("/billing/notifications")
        csrf = CSRF.search(page.text)
        assert csrf
        for url in PRIVATE_URLS:
            response = client.post(
                "/billing/notifications",
                data={"csrf_token": csrf.group(1), "url": url, "type:webhook.test": "on"},
            )
            assert response.status_code == 400, url
            assert 'role="alert"' in response.text, url
            assert "private, loopback or reserved" in response.text or (
                "not a valid URL" in response.text
            ), url
        assert strict.as_key(key.secret, "GET", "/v1/webhook-endpoints").json()["data"] == []
