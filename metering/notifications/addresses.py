"""Which addresses a webhook may reach (docs/api.md#endpoints), checked when an endpoint is saved
and again when connecting (the address actually connected to, so DNS cannot be used to rebind past
the check).

One rule, ``is_private``: an address that is not globally routable is private, and so is an IPv6
address whose embedded IPv4 address (NAT64, 6to4, IPv4-mapped, -compatible or -translated) is.
``allowed_addresses`` applies it to a URL's host at save and at connect.

A ``Resolver`` maps a host and port to addresses; tests inject their own.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from metering.kit.errors import InvalidRequest

Resolver = Callable[[str, int], list[str]]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Not globally routable, named here so the rule does not depend on the Python release's idea of
# ``is_global`` (which has changed between patch releases); ``is_global`` covers the rest.
RESERVED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",  # CGNAT
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # TEST-NET-1
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # TEST-NET-2
        "203.0.113.0/24",  # TEST-NET-3
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
        "::/128",
        "::1/128",
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard-only
        "2001::/32",  # Teredo
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated)
        "ff00::/8",  # multicast
    )
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")

# The numeric IPv4 forms resolvers accept (inet_aton): 1 to 4 parts, each decimal, octal (0…)
# or hexadecimal (0x…), the last filling the remaining bytes: 2130706433, 0177.0.0.1, 0x7f.1.
_NUMERIC_PART = r"(?:0[xX][0-9a-fA-F]*|[0-9]+)"
_NUMERIC_HOST = re.compile(rf"{_NUMERIC_PART}(?:\.{_NUMERIC_PART}){{0,3}}\.?")
_LOCALHOST = re.compile(r"(?:.+\.)?localhost\.?", re.IGNORECASE)


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, if it is one of the forms that carry one."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64 or ip in IPV4_TRANSLATED or ip in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_private(address: str | IPAddress) -> bool:
    """Whether a webhook may reach ``address`` only with METERING_WEBHOOK_ALLOW_PRIVATE=true."""
    ip = address if not isinstance(address, str) else ipaddress.ip_address(address.split("%")[0])
    if not ip.is_global or any(ip in n for n in RESERVED_NETWORKS if n.version == ip.version):
        return True
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        return inner is not None and is_private(inner)
    return False


def _numeric_ipv4(host: str) -> ipaddress.IPv4Address:
    values = []
    for part in host.removesuffix(".").split("."):
        if part[:2] in ("0x", "0X"):
            values.append(int(part[2:] or "0", 16))
        elif len(part) > 1 and part.startswith("0"):
            values.append(int(part[1:], 8))  # ValueError for 08, 09
        else:
            values.append(int(part))
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (5 - len(values))):
        raise ValueError(f"{host} is not an IPv4 address")
    number = last
    for position, value in enumerate(head):
        number |= value << (8 * (3 - position))
    return ipaddress.IPv4Address(number)


def literal_address(host: str) -> IPAddress | None:
    """The address a host names without a resolver: an IP literal or a numeric IPv4 form
    (ValueError for a numeric form out of range); None for a name."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(host):
        return _numeric_ipv4(host)
    return None


class AddressRefused(OSError):
    """The host resolves to an address webhooks may not reach."""


def allowed_addresses(host: str, port: int, allow_private: bool, resolver: Resolver) -> list[str]:
    """The addresses to connect to: every resolved one must be allowed (one bad answer refuses
    the host: a name that mixes public and private answers is not trusted). A name is resolved
    without its trailing dot (``localhost.`` is ``localhost``); ``localhost`` and its subdomains
    are loopback whatever a resolver says."""
    try:
        literal = literal_address(host)
    except ValueError as exc:
        raise AddressRefused(str(exc)) from exc
    if literal is not None:
        addresses = [str(literal)]
    elif _LOCALHOST.fullmatch(host):
        addresses = ["127.0.0.1"]
    else:
        addresses = resolver(host[:-1] if host.endswith(".") else host, port)
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    if not allow_private and any(is_private(a) for a in addresses):
        raise AddressRefused(f"{host} resolves to a private, loopback or reserved address")
    return addresses


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
    try:
        literal_address(parts.hostname)
    except ValueError as exc:
        raise InvalidRequest(f"{param} is not a valid URL", param=param) from exc
    try:
        allowed_addresses(parts.hostname, port or 443, allow_private, resolver)
    except AddressRefused as exc:
        raise InvalidRequest(
            f"{param} resolves to a private, loopback or reserved address "
            "(allowed only with METERING_WEBHOOK_ALLOW_PRIVATE=true)",
            param=param,
        ) from exc
    except OSError:
        pass  # not resolvable now: checked again when delivering
    return url
