"""The runtime's shared state: its kernel, its message hub and its workspace."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from .hub import ChannelHub
from .kernel_host import KernelHost, KernelState

STATE_DIR = ".sandbox-state"


class RuntimeState:
    def __init__(
        self,
        *,
        workspace: str,
        runtime_dir: str,
        kernel_name: str,
        env: dict[str, str],
        kernel_cwd: str | None = None,
    ) -> None:
        self.workspace = workspace
        # Saved kernel variables wait here, in the workspace, for the next runtime.
        self.state_dir = os.path.join(workspace, STATE_DIR)
        self.started_at = time.time()
        self.hub = ChannelHub()
        self.command_env = dict(env)
        self.kernel = KernelHost(
            kernel_name=kernel_name,
            cwd=kernel_cwd or workspace,
            runtime_dir=runtime_dir,
            env=env,
            on_message=self.hub.publish,
            on_state=self._on_kernel_state,
        )

    def _on_kernel_state(self, _state: KernelState) -> None:
        self.hub.send_event(self.event_payload())

    def event_payload(self) -> bytes:
        return json.dumps(
            {
                "event": "kernel_state",
                "runtime_id": self.kernel.runtime_id,
                "kernel": self.kernel.state.to_json(),
            }
        ).encode()

    def describe(self) -> dict[str, Any]:
        return {
            "runtime_id": self.kernel.runtime_id,
            "kernel": self.kernel.state.to_json(),
            "clients": self.hub.connected,
            "workspace": self.workspace,
            "kernel_cwd": self.kernel.cwd,
            "pid": os.getpid(),
            "uptime": time.time() - self.started_at,
        }
