"""The daemon's own HTTP calls to its sandboxes' runtimes, over their Unix sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tornado import httpclient
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from ...router.upstreams import UnixSocketResolver, Upstream


class RuntimeCalls:
    """One pooled client for every runtime socket the daemon talks to."""

    def __init__(self) -> None:
        self._resolver = UnixSocketResolver()
        self._http: SimpleAsyncHTTPClient | None = None

    async def call(
        self, socket: Path, method: str, path: str, *, body: Any = None, timeout: float
    ) -> tuple[int, Any]:
        """``(status, JSON body)``; status 599 when the runtime did not answer in time."""
        upstream = Upstream(unix_socket=str(socket))
        self._resolver.register(upstream)
        if self._http is None:
            self._http = SimpleAsyncHTTPClient(
                force_instance=True, resolver=self._resolver, max_clients=64
            )
        request = httpclient.HTTPRequest(
            f"http://{upstream.authority()}{path}",
            method=method,
            body=json.dumps(body) if body is not None else None,
            headers={"Content-Type": "application/json"},
            connect_timeout=timeout,
            request_timeout=timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await self._http.fetch(request, raise_error=False)
        except (OSError, httpclient.HTTPClientError):  # refused, or timed out
            return 599, None
        try:
            return response.code, json.loads(response.body or b"null")
        except ValueError:
            return response.code, None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
