"""Liveness of running sandboxes: a runtime that stops answering is restarted.

A process can be alive and useless (stopped with SIGSTOP from inside, wedged in
a loop): the claim would stay Ready while every request times out. Like a
kubelet's liveness probe, the daemon asks each ready runtime for ``/healthz``
and restarts one that fails several times in a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tornado import httpclient
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from ...router.upstreams import UnixSocketResolver, Upstream

PERIOD_SECONDS = 5.0
TIMEOUT_SECONDS = 5.0
FAILURE_THRESHOLD = 3


@dataclass
class LivenessProbe:
    """Consecutive failures per sandbox, and the HTTP client that probes them."""

    failures: dict[str, int] = field(default_factory=dict)
    _resolver: UnixSocketResolver = field(default_factory=UnixSocketResolver)
    _http: SimpleAsyncHTTPClient | None = None

    async def healthy(self, socket: Path) -> bool:
        upstream = Upstream(unix_socket=str(socket))
        self._resolver.register(upstream)
        if self._http is None:
            self._http = SimpleAsyncHTTPClient(
                force_instance=True, resolver=self._resolver, max_clients=64
            )
        request = httpclient.HTTPRequest(
            f"http://{upstream.authority()}/healthz",
            connect_timeout=TIMEOUT_SECONDS,
            request_timeout=TIMEOUT_SECONDS,
        )
        try:
            response = await self._http.fetch(request, raise_error=False)
        except (OSError, httpclient.HTTPClientError):  # refused, or timed out
            return False
        return response.code == 200

    async def failed(self, name: str, socket: Path) -> bool:
        """Probe once; True when ``name`` has now failed FAILURE_THRESHOLD times in a row."""
        if await self.healthy(socket):
            self.failures.pop(name, None)
            return False
        count = self.failures[name] = self.failures.get(name, 0) + 1
        if count >= FAILURE_THRESHOLD:
            self.failures.pop(name, None)
            return True
        return False

    def forget(self, name: str) -> None:
        self.failures.pop(name, None)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
