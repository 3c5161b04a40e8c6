"""``/api/sandbox/kernels/<id>/terminal``: a terminal inside a sandboxed kernel's sandbox.

The browser speaks terminado's protocol (JupyterLab's terminal widget) to this
WebSocket; this server opens one to the runtime's ``/api/terminal`` (through the
router, or the runtime's own socket as the kernel channels do) and passes
messages both ways. Every message is checked and re-encoded on the way: nothing
but the protocol's shapes, within its sizes, passes in either direction, and the
runtime's side is read only as fast as the browser takes it.

Entitlement is the kernel's: who may execute in the kernel (``execute`` on
``kernels``) may open a shell in its sandbox, which can do no more than the
kernel's own code. Keystrokes count as the kernel's activity, so the idle cull
does not suspend a sandbox while someone types in its terminal.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server._tz import utcnow
from jupyter_server.auth.decorator import ws_authenticated
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.base.websocket import WebSocketMixin
from jupyter_server.utils import url_path_join
from tornado import httpclient, web, websocket

from ..control_plane.base import ClaimError
from ..kernel_provisioner import ws_client
from ..kernel_provisioner.bridge import runtime_websocket_request
from ..protocol import terminal as messages
from .handlers import AUTH_RESOURCE, sandbox_provisioner

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 20.0


class SandboxTerminalHandler(WebSocketMixin, websocket.WebSocketHandler, JupyterHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE

    _upstream: websocket.WebSocketClientConnection | None = None
    _relay: asyncio.Task[None] | None = None
    _kernel: Any = None

    def set_default_headers(self) -> None:
        """No JupyterHandler defaults (a CSP and the like) on a WebSocket."""

    def get_compression_options(self) -> dict[str, Any] | None:
        return self.settings.get("websocket_compression_options", None)  # type: ignore[no-any-return]

    @ws_authenticated  # type: ignore[misc]
    async def get(self, kernel_id: str) -> None:
        user = self.current_user
        if not await ensure_async(self.authorizer.is_authorized(self, user, "execute", "kernels")):
            raise web.HTTPError(403, "you may not execute code in this kernel")
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            raise web.HTTPError(400, "the sandbox terminal is a WebSocket")
        provisioner = sandbox_provisioner(self.kernel_manager, kernel_id)
        session = provisioner.session
        if session is None or session.released:
            raise web.HTTPError(409, f"kernel {kernel_id} has no sandbox now")
        if session.suspended:
            try:
                await provisioner.resume()
            except ClaimError as exc:
                raise web.HTTPError(exc.status, f"the sandbox did not resume: {exc}") from None
        if session.endpoint is None:
            raise web.HTTPError(409, f"kernel {kernel_id}'s sandbox is not reachable yet")
        request, resolver = runtime_websocket_request(session.endpoint, "api/terminal")
        try:
            self._upstream = await asyncio.wait_for(
                ws_client.websocket_connect(
                    request,
                    resolver=resolver,
                    max_message_size=messages.MAX_OUTPUT_BYTES,
                    ping_interval=20,
                    ping_timeout=20,
                ),
                CONNECT_TIMEOUT,
            )
        except httpclient.HTTPClientError as exc:  # the runtime or the router said no
            if exc.code == 429:
                full = "this sandbox has as many terminals open as it may"
                raise web.HTTPError(429, full) from None
            raise web.HTTPError(502, f"the sandbox's terminal refused: {exc}") from None
        except (OSError, TimeoutError, websocket.WebSocketError) as exc:
            raise web.HTTPError(502, f"the sandbox's terminal did not answer: {exc}") from None
        self._kernel = self.kernel_manager.get_kernel(kernel_id)
        try:
            await super().get(kernel_id)
        finally:
            if self.ws_connection is None:  # the browser's upgrade failed
                self.on_close()

    def open(self, kernel_id: str) -> None:  # type: ignore[override]
        super().open()  # the ping loop with the browser
        self.set_nodelay(True)
        assert self._upstream is not None
        self._relay = asyncio.create_task(self._from_sandbox(self._upstream))

    async def _from_sandbox(self, upstream: websocket.WebSocketClientConnection) -> None:
        """The runtime's messages to the browser, one at a time, each once written."""
        try:
            while (message := await upstream.read_message()) is not None:
                try:
                    output = messages.parse_output(message)
                except messages.TerminalMessageError as exc:
                    log.warning("dropping a message from the sandbox's terminal: %s", exc)
                    continue
                await self.write_message(messages.encode_output(output))
        except websocket.WebSocketClosedError:
            pass
        finally:
            upstream.close()
            if self.ws_connection is not None:
                self.close(1000, "the sandbox's terminal closed")

    def on_message(self, message: str | bytes) -> None:
        upstream = self._upstream
        if upstream is None:
            return
        parsed = messages.accept_input(message, log)
        if parsed is None:
            return
        if isinstance(parsed, messages.Stdin) and self._kernel is not None:
            self._kernel.last_activity = self.kernel_manager.last_kernel_activity = utcnow()
        try:
            upstream.write_message(messages.encode_input(parsed))
        except websocket.WebSocketClosedError:
            self.close(1000, "the sandbox's terminal closed")

    def on_close(self) -> None:
        if self._relay is not None:
            self._relay.cancel()
        if self._upstream is not None:
            self._upstream.close()
            self._upstream = None


def terminal_handlers(base_url: str) -> list[tuple[str, Any]]:
    path = url_path_join(base_url, "api/sandbox/kernels/(?P<kernel_id>[^/]+)/terminal")
    return [(path, SandboxTerminalHandler)]
