"""Validation of the X-Sandbox-* routing headers (upstream sandbox-router's rules)."""

from __future__ import annotations

import ipaddress
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..protocol import runtime_auth

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "default"
DEFAULT_PORT = 8888
DNS_LABEL = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
# origin-form (RFC 9112 3.2.1): "/" and then visible ASCII, but not "//" first (read as
# "//host" by URL parsers), no "\\" (read as "/" by some) and no "#" (never on the wire).
ORIGIN_FORM = re.compile(r"^/(?!/)[\x21-\x7e]*$")
NOT_IN_TARGET = frozenset("#\\")
NOT_ORIGIN_FORM = (
    "the request target must be a path starting with a single '/' (origin-form); "
    "absolute URLs, host:port, '*' and anything before the path are not proxied"
)

RUNTIME_TOKEN = runtime_auth.HEADER.lower()
ROUTING_HEADERS = frozenset(
    {
        "x-sandbox-id",
        "x-sandbox-namespace",
        "x-sandbox-port",
        "x-sandbox-pod-ip",
        "x-sandbox-timeout",
    }
)
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
WEBSOCKET_HANDSHAKE = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "sec-websocket-accept",
    }
)


class RoutingError(ValueError):
    """The routing headers are missing or malformed (400)."""


@dataclass(frozen=True)
class Route:
    name: str
    namespace: str
    port: int
    pod_ip: str | None
    timeout: float | None = None  # X-Sandbox-Timeout: this request's proxy timeout


def origin_form(target: str | None) -> tuple[str, str]:
    """The path and query of an origin-form request target; RoutingError otherwise.

    Only these go upstream: the sandbox's authority is the router's to choose, so a
    target such as ``@host:port/`` or ``http://host/`` must never reach URL building.
    """
    if not target or not ORIGIN_FORM.match(target) or NOT_IN_TARGET.intersection(target):
        raise RoutingError(NOT_ORIGIN_FORM)
    path, _, query = target.partition("?")
    return path, query


def parse_route(headers: Mapping[str, str], default_namespace: str = DEFAULT_NAMESPACE) -> Route:
    name = headers.get("X-Sandbox-ID")
    if not name:
        raise RoutingError("X-Sandbox-ID header is required.")
    if not DNS_LABEL.match(name):
        raise RoutingError("Invalid sandbox ID format.")
    namespace = headers.get("X-Sandbox-Namespace") or default_namespace
    if not DNS_LABEL.match(namespace):
        raise RoutingError("Invalid namespace format.")
    raw_port = headers.get("X-Sandbox-Port") or str(DEFAULT_PORT)
    if not raw_port.isdigit() or not 1 <= int(raw_port) <= 65535:
        raise RoutingError("Invalid port format.")
    pod_ip = headers.get("X-Sandbox-Pod-IP") or None
    if pod_ip is not None:
        try:
            ip = ipaddress.ip_address(pod_ip)
        except ValueError:
            raise RoutingError("Invalid target IP address format.") from None
        if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
            raise RoutingError("Invalid target IP address.")
        pod_ip = str(ip)
    return Route(
        name=name,
        namespace=namespace,
        port=int(raw_port),
        pod_ip=pod_ip,
        timeout=_timeout(headers.get("X-Sandbox-Timeout")),
    )


def _timeout(raw: str | None) -> float | None:
    """X-Sandbox-Timeout as upstream reads it: a positive number, else ignored."""
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        log.warning("ignoring X-Sandbox-Timeout=%r: not a number", raw[:40])
        return None
    if not math.isfinite(value) or value <= 0:
        log.warning("ignoring X-Sandbox-Timeout=%r: not a positive number", raw[:40])
        return None
    return value


def hop_by_hop(headers: Mapping[str, str]) -> set[str]:
    names = set(HOP_BY_HOP)
    for token in (headers.get("Connection") or "").split(","):
        if token.strip():
            names.add(token.strip().lower())
    return names


def forward_headers(
    headers: Mapping[str, str], *, websocket: bool = False, runtime_token: str = ""
) -> dict[str, str]:
    """Request headers to send upstream: no routing, hop-by-hop, Host or Authorization,
    and never a caller's own runtime token; the sandbox's, when it has one."""
    drop = ROUTING_HEADERS | hop_by_hop(headers) | {"host", "authorization", RUNTIME_TOKEN}
    if websocket:
        drop |= WEBSOCKET_HANDSHAKE
    out = {k: v for k, v in headers.items() if k.lower() not in drop}
    if runtime_token:
        out[runtime_auth.HEADER] = runtime_token
    return out


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    drop = hop_by_hop(headers) | {"content-length", "server", "date"}
    return {k: v for k, v in headers.items() if k.lower() not in drop}
