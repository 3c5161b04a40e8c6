"""What the router's handlers share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from tornado.simple_httpclient import SimpleAsyncHTTPClient

from .tokens import TokenAuthority
from .upstreams import UnixSocketResolver, UpstreamLookup

DEFAULT_PROXY_TIMEOUT = 180.0
DEFAULT_MAX_WS_MESSAGE = 256 * 1024 * 1024


def proxy_timeout_from_env() -> float:
    raw = os.environ.get("PROXY_TIMEOUT_SECONDS", "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_PROXY_TIMEOUT
    return value if value > 0 else DEFAULT_PROXY_TIMEOUT


@dataclass
class RouterContext:
    lookup: UpstreamLookup
    authority: TokenAuthority | None
    default_namespace: str = "default"
    proxy_timeout: float = field(default_factory=proxy_timeout_from_env)
    connect_timeout: float = 10.0
    max_ws_message: int = DEFAULT_MAX_WS_MESSAGE
    max_clients: int = 1000
    resolver: UnixSocketResolver = field(default_factory=UnixSocketResolver)
    http_client: SimpleAsyncHTTPClient = field(init=False)

    def __post_init__(self) -> None:
        self.http_client = SimpleAsyncHTTPClient(
            force_instance=True,
            resolver=self.resolver,
            max_clients=self.max_clients,
            max_body_size=1 << 40,
            max_buffer_size=64 * 1024 * 1024,
        )
