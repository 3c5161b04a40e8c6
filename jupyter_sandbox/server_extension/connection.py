"""Kernel WebSocket connections that resume a suspended sandbox before talking to it.

jupyter_server's connection set-up (kernel_info, then the iopub "nudge") swallows
the iopub messages exchanged on the way, so a status sent by the bridge while it
resumes would never reach a browser that has just connected. This connection
resumes first and, once the socket is live, tells the browser the kernel is new.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from ..kernel_provisioner.provisioner import SandboxProvisioner


class SandboxWebsocketConnection(ZMQChannelsWebsocketConnection):  # type: ignore[misc]
    _announce_restart = False

    async def prepare(self) -> None:
        provisioner = getattr(self.kernel_manager, "provisioner", None)
        if isinstance(provisioner, SandboxProvisioner):
            session = provisioner.session
            if session is not None and session.suspended:
                await provisioner.resume()
                self._announce_restart = True
        await super().prepare()

    def connect(self) -> asyncio.Future[None] | None:
        future: Any = super().connect()
        if self._announce_restart and future is not None:
            self._announce_restart = False

            def announce(_: Any) -> None:
                self._send_status_message("restarting")

            future.add_done_callback(announce)
        return future  # type: ignore[no-any-return]
