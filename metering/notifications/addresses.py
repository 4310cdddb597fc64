"""Which addresses a webhook may reach (docs/api.md#endpoints), checked when an endpoint is saved
and again when connecting (the address actually connected to, so DNS cannot be used to rebind past
the check).

A ``Resolver`` maps a host and port to addresses; tests inject their own.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from metering.kit.errors import InvalidRequest

Resolver = Callable[[str, int], list[str]]

# Reachable only with METERING_WEBHOOK_ALLOW_PRIVATE=true.
PRIVATE_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "224.0.0.0/4",  # multicast
        "255.255.255.255/32",
        "::/128",
        "::1/128",
        "::ffff:0:0/96",  # IPv4-mapped
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
)


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_private(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return any(ip in network for network in PRIVATE_NETWORKS if network.version == ip.version)


def literal_address(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def check_url(url: str, allow_private: bool, resolver: Resolver, param: str = "url") -> str:
    """The URL if an endpoint may use it; 400 ``invalid_parameter`` otherwise. A hostname that
    does not resolve now is accepted (it is checked again, and fails, at delivery)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"{param} is not a valid URL", param=param) from exc
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidRequest(f"{param} must be an https:// URL", param=param)
    if parts.username or parts.password:
        raise InvalidRequest(f"{param} must not carry credentials", param=param)
    if parts.scheme == "http" and not allow_private:
        raise InvalidRequest(
            f"{param} must be https:// (http:// needs METERING_WEBHOOK_ALLOW_PRIVATE=true)",
            param=param,
        )
    if allow_private:
        return url
    host = parts.hostname
    literal = literal_address(host)
    try:
        addresses = [literal] if literal else resolver(host, port or 443)
    except OSError:
        return url  # not resolvable now: checked again when delivering
    if any(is_private(a) for a in addresses):
        raise InvalidRequest(
            f"{param} resolves to a private, loopback or reserved address "
            "(allowed only with METERING_WEBHOOK_ALLOW_PRIVATE=true)",
            param=param,
        )
    return url


class AddressRefused(OSError):
    """The host resolves to an address webhooks may not reach."""


def allowed_addresses(host: str, port: int, allow_private: bool, resolver: Resolver) -> list[str]:
    """The addresses to connect to: every resolved one must be allowed (one bad answer refuses
    the host: a name that mixes public and private answers is not trusted)."""
    literal = literal_address(host)
    addresses = [literal] if literal else resolver(host, port)
    if not addresses:
        raise AddressRefused(f"{host} resolves to no address")
    if not allow_private:
        refused = [a for a in addresses if is_private(a)]
        if refused:
            raise AddressRefused(f"{host} resolves to a private or reserved address")
    return addresses
