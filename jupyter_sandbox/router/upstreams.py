"""Where a sandbox's runtime listens, and how tornado clients reach Unix sockets."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import yarl
from tornado.netutil import DefaultLoopResolver, Resolver

UNIX_DOMAIN = "sandbox-unix.invalid"
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def is_host(host: str) -> bool:
    """An IP address or a DNS name: nothing that could carry a port, user or path."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return HOST_NAME.fullmatch(host) is not None
    return True


@dataclass(frozen=True)
class Upstream:
    """A runtime address: ``host:port`` over TCP, or a Unix socket path, and the
    token its runtime asks for (protocol/runtime_auth.py; "": none)."""

    host: str = ""
    port: int = 0
    unix_socket: str = ""
    runtime_token: str = field(default="", repr=False)

    def url_host(self) -> str:
        """The host of URLs to this upstream: IPv6 in brackets, a made-up name for a socket."""
        if self.unix_socket:
            digest = hashlib.sha1(self.unix_socket.encode()).hexdigest()[:16]
            return f"{digest}.{UNIX_DOMAIN}"
        return f"[{self.host}]" if ":" in self.host else self.host

    def url_port(self) -> int:
        return 80 if self.unix_socket else self.port

    def authority(self) -> str:
        return f"{self.url_host()}:{self.url_port()}"

    def http_url(self, path: str, query: str = "") -> yarl.URL:
        """``path?query`` on this upstream, built from parts so that nothing a caller
        sends can name another host or port.  The path goes up byte for byte
        (encoded: not re-quoted, dot-segments not folded); it must be origin-form
        (``routing.origin_form``)."""
        if not self.unix_socket and not is_host(self.host):
            raise ValueError(f"not a host name or address: {self.host!r}")
        return yarl.URL.build(
            scheme="http",
            host=self.url_host(),
            port=self.url_port(),
            path=path,
            query_string=query,
            encoded=True,
        )


# (namespace, name, port) -> Upstream, or None when no such sandbox is known.
UpstreamLookup = Callable[[str, str, int], Awaitable[Upstream | None]]


class UnixSocketResolver(Resolver):
    """Resolves the synthetic host names of Unix-socket upstreams; others go to DNS."""

    def initialize(self, **kwargs: Any) -> None:  # tornado's Configurable hook
        self._paths: dict[str, str] = {}
        self._fallback = DefaultLoopResolver()

    def register(self, upstream: Upstream) -> None:
        if upstream.unix_socket:
            self._paths[upstream.url_host()] = upstream.unix_socket

    async def resolve(  # type: ignore[override]
        self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[tuple[int, Any]]:
        path = self._paths.get(host)
        if path is not None:
            return [(socket.AF_UNIX, path)]
        if host.endswith(UNIX_DOMAIN):
            raise OSError(f"unknown sandbox socket {host}")
        return await self._fallback.resolve(host, port, family)
