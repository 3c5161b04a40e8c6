"""The runtime's shared state: its kernel, its message hub and its workspace."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from .hub import ChannelHub
from .kernel_host import KernelHost, KernelState
from .kernel_state import KEY_FILE, has_state

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
        # Open sandbox terminals, and the hang-ups still under way (kept from the GC).
        self.terminals: set[object] = set()
        self.terminals_closing: set[asyncio.Future[None]] = set()
        self.kernel = KernelHost(
            kernel_name=kernel_name,
            cwd=kernel_cwd or workspace,
            runtime_dir=runtime_dir,
            env=env,
            on_message=self.hub.publish,
            on_state=self._on_kernel_state,
            # A resume: the suspended runtime's key, so its clients' key stays valid.
            key=load_key(self.state_dir) if has_state(self.state_dir) else None,
        )

    def _on_kernel_state(self, _state: KernelState) -> None:
        self.hub.send_event(self.event_payload())

    def event_payload(self, *, with_key: bool = False) -> bytes:
        event: dict[str, Any] = {
            "event": "kernel_state",
            "runtime_id": self.kernel.runtime_id,
            "kernel": self.kernel.state.to_json(),
        }
        if with_key:
            event["key"] = self.kernel.key.decode("ascii")
        return json.dumps(event).encode()

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


def save_key(directory: str, key: bytes) -> None:
    """Keep the kernel key beside the saved variables, for the runtime that loads them."""
    path = os.path.join(directory, KEY_FILE)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key)


def load_key(directory: str) -> bytes | None:
    """The key ``save_key`` kept, if it is one (hex digits and dashes), else None."""
    try:
        with open(os.path.join(directory, KEY_FILE), "rb") as handle:
            key = handle.read(256).strip()
    except OSError:
        return None
    if key and all(c in b"0123456789abcdef-" for c in key):
        return key
    return None
