"""What the router's handlers share."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import aiohttp

from .authorization import Authorizer, OwnerLookup
from .hub_auth import HubIdentity
from .tokens import TokenAuthority
from .upstreams import UnixSocketResolver, Upstream, UpstreamLookup

DEFAULT_PROXY_TIMEOUT = 180.0
DEFAULT_MAX_WS_MESSAGE = 256 * 1024 * 1024
# How long a connection may sit without a complete request head: both the wait for
# the headers of a new connection (a client that connects and trickles or sends
# nothing) and the idle keep-alive wait between requests.  Above the 15 s after
# which aiohttp's pools drop idle connections, so pooled clients close first.
DEFAULT_IDLE_TIMEOUT = 20.0
# Overrides, in seconds (positive numbers; anything else keeps the default).
PROXY_TIMEOUT_ENV = "PROXY_TIMEOUT_SECONDS"
IDLE_TIMEOUT_ENV = "ROUTER_IDLE_TIMEOUT_SECONDS"
# A request body may take as long as the exchange it belongs to: the proxy timeout
# unless set apart.  Not bounded, the upload of a stalled client is held forever.
BODY_TIMEOUT_ENV = "ROUTER_BODY_TIMEOUT_SECONDS"


def seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


def proxy_timeout_from_env() -> float:
    return seconds_from_env(PROXY_TIMEOUT_ENV, DEFAULT_PROXY_TIMEOUT)


def idle_timeout_from_env() -> float:
    return seconds_from_env(IDLE_TIMEOUT_ENV, DEFAULT_IDLE_TIMEOUT)


@dataclass
class RouterContext:
    lookup: UpstreamLookup
    authority: TokenAuthority | None
    hub: HubIdentity | None = None
    owner_of: OwnerLookup | None = None
    default_namespace: str = "default"
    proxy_timeout: float = field(default_factory=proxy_timeout_from_env)
    idle_timeout: float = field(default_factory=idle_timeout_from_env)
    body_timeout: float | None = None  # None: BODY_TIMEOUT_ENV, else the proxy timeout
    connect_timeout: float = 10.0
    max_ws_message: int = DEFAULT_MAX_WS_MESSAGE
    max_clients: int = 1000
    resolver: UnixSocketResolver = field(default_factory=UnixSocketResolver)
    auth: Authorizer = field(init=False)
    _tcp: aiohttp.ClientSession | None = field(default=None, init=False)
    _unix: dict[str, aiohttp.ClientSession] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.auth = Authorizer(self.authority, self.hub, self.owner_of)
        if self.body_timeout is None:
            self.body_timeout = seconds_from_env(BODY_TIMEOUT_ENV, self.proxy_timeout)

    def server_options(self) -> dict[str, float | None]:
        """Timeouts for the tornado HTTPServer in front of the router app.

        ``idle_connection_timeout`` bounds the wait for a request head (tornado's
        header timeout) and between keep-alive requests; ``body_timeout`` the whole
        read of a request body.  Neither applies to a WebSocket once it is upgraded:
        the tunnel detaches the connection from the HTTP server.
        """
        return {"idle_connection_timeout": self.idle_timeout, "body_timeout": self.body_timeout}

    def session_for(self, upstream: Upstream) -> aiohttp.ClientSession:
        """A pooled keep-alive client: one for TCP upstreams, one per Unix socket."""
        if upstream.unix_socket:
            session = self._unix.get(upstream.unix_socket)
            if session is None or session.closed:
                unix = aiohttp.UnixConnector(path=upstream.unix_socket, limit=self.max_clients)
                session = aiohttp.ClientSession(connector=unix, auto_decompress=False)
                self._unix[upstream.unix_socket] = session
            return session
        if self._tcp is None or self._tcp.closed:
            connector = aiohttp.TCPConnector(limit=self.max_clients, ttl_dns_cache=10)
            self._tcp = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        return self._tcp

    async def forget(self, unix_socket: str) -> None:
        """Drop the pool of a socket whose sandbox is gone."""
        session = self._unix.pop(unix_socket, None)
        if session is not None:
            await session.close()

    async def prune(self) -> None:
        """Close the pools of Unix sockets that no longer exist (sandboxes gone)."""
        for path in [p for p in self._unix if not os.path.exists(p)]:
            await self.forget(path)

    async def close(self) -> None:
        for session in [*self._unix.values(), *([self._tcp] if self._tcp else [])]:
            await session.close()
        self._unix.clear()
        self._tcp = None
        await self.auth.close()
