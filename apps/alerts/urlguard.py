"""Where alerts may be POSTed (a server-side request forgery guard). A subscription's URL is checked when it is
saved and again at every delivery, on the addresses its host resolves to then:

* link-local addresses (169.254.0.0/16, where cloud metadata services answer, and fe80::/10) are always refused;
* loopback, private (RFC 1918, unique-local IPv6) and other non-public addresses are refused unless
  ``DAY0_ALERTS_ALLOW_PRIVATE_URLS`` is on (off by default; on for a portal whose receivers live on its own
  network, and in the tests, whose receiver listens on 127.0.0.1).

At delivery the connection goes to the very address that was checked (the host's name still names the TLS
certificate and the Host header), so a name that resolves elsewhere between the check and the connection
(DNS rebinding) cannot redirect the signed POST. A host that does not resolve when saved is accepted: it is
resolved and checked at each delivery."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from day0portal.env import env_bool

ALLOW_PRIVATE_ENV = "DAY0_ALERTS_ALLOW_PRIVATE_URLS"
METADATA_RANGE = ipaddress.ip_network("169.254.0.0/16")
MAX_ADDRESSES = 32  # a host's resolved addresses checked (each must pass)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class DestinationRefused(Exception):
    """The URL's host is, or resolves to, an address alerts must not be sent to; the message names the rule."""


class Unresolvable(Exception):
    """The URL's host does not resolve (now)."""


def allow_private() -> bool:
    return env_bool(ALLOW_PRIVATE_ENV, False)


def refusal(address: Address) -> str | None:
    """Why alerts may not go to ``address``, or None when they may."""
    ip = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped else address
    if ip.is_link_local or ip in METADATA_RANGE:
        return (f"{address} is a link-local address (169.254.0.0/16 holds cloud metadata services; fe80::/10): "
                "alerts are never sent there")
    if ip.is_loopback:
        kind = "loopback"
    elif ip.is_unspecified:
        kind = "unspecified (this host)"
    elif ip.is_private:
        kind = "private"
    elif ip.is_multicast or ip.is_reserved or not ip.is_global:
        kind = "non-public"
    else:
        return None
    if allow_private():
        return None
    return f"{address} is a {kind} address: refused unless {ALLOW_PRIVATE_ENV} is on"


def _port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def resolve(url: str) -> list[Address]:
    """Every address the URL's host stands for (a literal address is itself); ``Unresolvable`` otherwise."""
    host, port = _port(url)
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise Unresolvable(f"host {host!r} does not resolve: {exc}") from None
    addresses: list[Address] = []
    for info in infos[:MAX_ADDRESSES]:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])  # an IPv6 zone id is not part of the address
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise Unresolvable(f"host {host!r} resolves to no address")
    return addresses


def check(url: str) -> list[Address]:
    """The URL's addresses, each allowed; ``DestinationRefused`` naming the first one refused and the rule."""
    addresses = resolve(url)
    host = _port(url)[0]
    for address in addresses:
        reason = refusal(address)
        if reason is not None:
            named = "" if str(address) == host else f"host {host!r} resolves to "
            raise DestinationRefused(named + reason)
    return addresses


def check_at_save(url: str) -> None:
    """A URL being saved: refused when its host is, or resolves to, a refused address; a host that does not
    resolve now passes (it is checked at each delivery)."""
    try:
        check(url)
    except Unresolvable:
        pass


def _pinned(connection_class: type[http.client.HTTPConnection], address: Address) -> Any:
    """``connection_class`` whose socket goes to ``address`` (checked) instead of resolving the host again."""

    def build(host: str, **kwargs: Any) -> http.client.HTTPConnection:
        connection = connection_class(host, **kwargs)

        def connect(target: tuple[str, int], *args: Any, **kw: Any) -> socket.socket:
            return socket.create_connection((str(address), target[1]), *args, **kw)

        connection._create_connection = connect  # type: ignore[attr-defined]  # http.client's own hook
        return connection

    return build


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, address: Address) -> None:
        super().__init__()
        self.address = address

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_pinned(http.client.HTTPConnection, self.address), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, address: Address) -> None:
        super().__init__()
        self.address = address

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_pinned(http.client.HTTPSConnection, self.address), req, context=self._context)


def pinned_handlers(url: str) -> list[urllib.request.BaseHandler]:
    """urllib handlers that connect to the URL's checked address (``DestinationRefused`` / ``Unresolvable``
    first); no proxy from the environment (the checked address is the one connected to)."""
    address = check(url)[0]
    return [urllib.request.ProxyHandler({}), _PinnedHTTPHandler(address), _PinnedHTTPSHandler(address)]
