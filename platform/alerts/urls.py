"""Where webhooks may point. http and https only. A receiver inside the operator's network is a
server-side request forgery risk (the admin key could make the server probe internal services), so
a host that resolves to a private, loopback, link-local or otherwise non-public address is refused
unless it is listed in ``alerts.allowed_hosts`` or ``alerts.allow_private_hosts`` is set. The check
runs at registration and again before every delivery (a name may resolve elsewhere later).

DNS rebinding: a name can answer a public address to the check and a private one to the
connection a moment later. ``pinned_target`` therefore resolves ONCE, checks every address of that
answer, and returns the one to connect to; the dispatcher connects to that address and sends the
name as ``Host`` (and as TLS SNI, against which the certificate is verified), so the connection
never resolves the name again. ``Resolver`` is the seam: the tests answer a name as an attacker's
DNS server would."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

from loraplex.platform.errors import BadRequest
from loraplex.platform.settings import AlertSettings


class UnsafeUrl(BadRequest):
    code = "invalid_webhook_url"


# host -> the addresses it resolves to (as strings); raises OSError when it does not resolve
Resolver = Callable[[str], list[str]]


def system_resolver(host: str) -> list[str]:
    return [str(info[4][0]).split("%")[0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)]


@dataclass(frozen=True)
class PinnedTarget:
    """Where a delivery connects: ``url`` with its host replaced by the checked address, plus the
    ``Host`` header and the TLS server name of the original URL."""

    url: str
    host_header: str
    sni_hostname: str | None  # https only


def pinned_target(url: str, settings: AlertSettings, resolver: Resolver = system_resolver) -> PinnedTarget:
    """Resolve ``url``'s host once, check every address (unless the host is allowed), and pin the
    first: raise ``UnsafeUrl`` as ``check_url`` does."""
    parts = _parts(url)
    host = parts.hostname or ""
    addrs = _addresses(host, True, resolver)
    if not addrs:
        raise UnsafeUrl(f"{host} resolves to no address", param="url")
    if not _allowed(host, settings):
        _check_addresses(host, addrs)
    addr = addrs[0]
    literal = f"[{addr}]" if addr.version == 6 else str(addr)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    pinned = urlunsplit(SplitResult(parts.scheme, netloc, parts.path, parts.query, ""))
    host_header = parts.netloc.rpartition("@")[2]
    return PinnedTarget(pinned, host_header, host.strip("[]") if parts.scheme == "https" else None)


def check_url(url: str, settings: AlertSettings, *, resolve: bool = True, resolver: Resolver = system_resolver) -> None:
    """Raise ``UnsafeUrl`` (400, param "url") unless ``url`` may receive webhooks."""
    parts = _parts(url)
    host = parts.hostname or ""
    if _allowed(host, settings):
        return
    _check_addresses(host, _addresses(host, resolve, resolver))


def _allowed(host: str, settings: AlertSettings) -> bool:
    return settings.allow_private_hosts or host.lower() in {h.lower() for h in settings.allowed_hosts}


def _check_addresses(host: str, addrs: list[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> None:
    for addr in addrs:
        if not addr.is_global or not all(v4.is_global for v4 in _embedded_v4(addr)):
            raise UnsafeUrl(
                f"{host} resolves to a non-public address ({addr}); list it in alerts.allowed_hosts to allow it",
                param="url",
            )


def _parts(url: str) -> SplitResult:
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
    return parts


def _addresses(host: str, resolve: bool, resolver: Resolver) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if not resolve:
        return []
    try:
        answers = resolver(host)
    except OSError as exc:
        raise UnsafeUrl(f"cannot resolve {host}: {exc}", param="url") from None
    try:
        return [ipaddress.ip_address(a.split("%")[0]) for a in answers]
    except ValueError as exc:  # a resolver answering something that is not an address
        raise UnsafeUrl(f"cannot resolve {host}: {exc}", param="url") from None


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
