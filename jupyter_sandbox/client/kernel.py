"""``Sandbox.kernel()``: a jupyter_client KernelClient on the sandbox's own kernel.

The provisioner's bridge does the work: it binds ordinary ZMQ sockets on
127.0.0.1 and relays them over one WebSocket (through the router) to the runtime's
kernel. It lives on the process-wide background loop, so it keeps relaying while
a blocking client waits. No claim is made here: the sandbox already has one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from ..control_plane.base import Endpoint
from ..control_plane.runtime_client import RuntimeCallError, call
from ..kernel_provisioner.bridge import Bridge, KernelIdentity
from ..utils.background import background

log = logging.getLogger(__name__)


class KernelTunnel:
    """One bridge to one sandbox's kernel. Every method runs on the background loop."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.key = secrets.token_hex(32).encode()
        self.kernel: dict[str, Any] = {}
        self._changed = asyncio.Event()
        self.bridge = Bridge(
            key=self.key,
            on_kernel_state=self._on_kernel_state,
            on_client_request=self._on_client_request,
            on_disconnected=self._on_disconnected,
        )
        self.ports: dict[str, int] = {}

    def _on_kernel_state(self, identity: KernelIdentity, kernel: dict[str, Any]) -> None:
        self.kernel = kernel
        self.bridge.kernel_alive = bool(kernel.get("alive"))
        self._changed.set()

    async def _on_client_request(self, channel: str, head: dict[str, Any]) -> bool:
        return True

    async def _on_disconnected(self, failures: int) -> None:
        log.info("kernel bridge to %s: %d failed connects", self.endpoint.name, failures)

    async def start(self, timeout: float) -> dict[str, Any]:
        """Bind, connect and wait for a live kernel; start one if the runtime has none."""
        self.ports = self.bridge.bind()
        self.bridge.connect(self.endpoint)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        started = False
        while not (self.kernel.get("alive") and self.kernel.get("ready")):
            if self.kernel and not self.kernel.get("alive") and not started:
                started = True
                try:
                    await call(self.endpoint, "POST", "api/kernel/start", timeout=timeout)
                except RuntimeCallError as exc:
                    log.info("starting the sandbox kernel: %s", exc)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"the kernel of sandbox {self.endpoint.name} is not ready")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass
        # The kernel's own key, when the runtime tells it: signatures then pass as they are.
        self.key = self.bridge.adopt_runtime_key() or self.key
        return self.connection_info()

    def connection_info(self) -> dict[str, Any]:
        return {
            **self.bridge.connection_info(),
            "key": self.key.decode(),
            "signature_scheme": "hmac-sha256",
        }

    async def close(self) -> None:
        await self.bridge.close()


async def open_tunnel(endpoint: Endpoint, timeout: float) -> tuple[KernelTunnel, dict[str, Any]]:
    """Create and start a tunnel on the background loop, from any loop."""

    async def make() -> tuple[KernelTunnel, dict[str, Any]]:
        tunnel = KernelTunnel(endpoint)
        try:
            info = await tunnel.start(timeout)
        except BaseException:
            await tunnel.close()
            raise
        return tunnel, info

    return await background().run(make())


async def close_tunnel(tunnel: KernelTunnel) -> None:
    await background().run(tunnel.close())
