"""Where a sandbox's runtime listens, and how tornado clients reach Unix sockets."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tornado.netutil import DefaultLoopResolver, Resolver

UNIX_DOMAIN = "sandbox-unix.invalid"


@dataclass(frozen=True)
class Upstream:
    """A runtime address: ``host:port`` over TCP, or a Unix socket path."""

    host: str = ""
    port: int = 0
    unix_socket: str = ""

    def authority(self) -> str:
        if self.unix_socket:
            digest = hashlib.sha1(self.unix_socket.encode()).hexdigest()[:16]
            return f"{digest}.{UNIX_DOMAIN}:80"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


# (namespace, name, port) -> Upstream, or None when no such sandbox is known.
UpstreamLookup = Callable[[str, str, int], Awaitable[Upstream | None]]


class UnixSocketResolver(Resolver):
    """Resolves the synthetic host names of Unix-socket upstreams; others go to DNS."""

    def initialize(self, **kwargs: Any) -> None:  # tornado's Configurable hook
        self._paths: dict[str, str] = {}
        self._fallback = DefaultLoopResolver()

    def register(self, upstream: Upstream) -> None:
        if upstream.unix_socket:
            host = upstream.authority().rsplit(":", 1)[0]
            self._paths[host] = upstream.unix_socket

    async def resolve(  # type: ignore[override]
        self, host: str, port: int, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[tuple[int, Any]]:
        path = self._paths.get(host)
        if path is not None:
            return [(socket.AF_UNIX, path)]
        if host.endswith(UNIX_DOMAIN):
            raise OSError(f"unknown sandbox socket {host}")
        return await self._fallback.resolve(host, port, family)
