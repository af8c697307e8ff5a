"""Where webhooks may point. http and https only. A receiver inside the operator's network is a
server-side request forgery risk (the admin key could make the server probe internal services), so
a host that resolves to a private, loopback, link-local or otherwise non-public address is refused
unless it is listed in ``alerts.allowed_hosts`` or ``alerts.allow_private_hosts`` is set. The check
runs at registration and again before every delivery (a name may resolve elsewhere later)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from loraplex.platform.errors import BadRequest
from loraplex.platform.settings import AlertSettings


class UnsafeUrl(BadRequest):
    code = "invalid_webhook_url"


def check_url(url: str, settings: AlertSettings, *, resolve: bool = True) -> None:
    """Raise ``UnsafeUrl`` (400, param "url") unless ``url`` may receive webhooks."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise UnsafeUrl(f"not a valid URL: {exc}", param="url") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl("a webhook URL must be http:// or https://", param="url")
    if not host:
        raise UnsafeUrl("a webhook URL needs a host", param="url")
    if parts.username or parts.password:
        raise UnsafeUrl("a webhook URL must not carry credentials (sign with the secret instead)", param="url")
    if settings.allow_private_hosts or host.lower() in {h.lower() for h in settings.allowed_hosts}:
        return
    for addr in _addresses(host, resolve):
        if not addr.is_global or not all(v4.is_global for v4 in _embedded_v4(addr)):
            raise UnsafeUrl(
                f"{host} resolves to a non-public address ({addr}); list it in alerts.allowed_hosts to allow it",
                param="url",
            )


def _addresses(host: str, resolve: bool) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if not resolve:
        return []
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        raise UnsafeUrl(f"cannot resolve {host}: {exc}", param="url") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPAT = ipaddress.ip_network("::/96")


def _embedded_v4(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 address an IPv6 one carries and a translator or tunnel may deliver to: NAT64
    (64:ff9b::a9fe:a9fe is 169.254.169.254 behind a NAT64 gateway, and Python calls it global),
    IPv4-compatible (::127.0.0.1), 6to4 and Teredo."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    found = [a for a in (addr.sixtofour, addr.teredo[1] if addr.teredo else None) if a is not None]
    if addr in _NAT64 or addr in _V4_COMPAT:
        found.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return found
