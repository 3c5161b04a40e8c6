"""The runtime's kernel relay (KernelHost) around a real ipykernel, without a sandbox.

Its own requests (readiness probes, state saves) share the kernel's shell channel
with the clients' requests; an answer that comes after the runtime stopped waiting
must neither reach a client nor stop the relay.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.protocol.messages import parent_msg_id, sign
from jupyter_sandbox.runtime.kernel_host import KernelHost, KernelState


class Relay:
    """A KernelHost and everything it passed on to clients."""

    def __init__(self, tmp_path: Path) -> None:
        self.messages: list[tuple[str, dict[str, Any], str | None]] = []
        self.host = KernelHost(
            kernel_name="python3",
            cwd=str(tmp_path),
            runtime_dir=str(tmp_path / "runtime"),
            env={},
            on_message=self._on_message,
            on_state=self._on_state,
        )

    def _on_message(self, channel: str, parts: list[bytes | memoryview], signature: bytes) -> None:
        assert signature == sign(self.host.key, parts), "the kernel signs with the runtime's key"
        self.messages.append((channel, json.loads(bytes(parts[0])), parent_msg_id(parts)))

    def _on_state(self, state: KernelState) -> None:
        pass

    def request(self, msg_type: str, content: dict[str, Any]) -> str:
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "client",
            "session": "client-session",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": "5.3",
        }
        self.host.send(
            "shell", [json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]
        )
        return msg_id

    async def reply_to(self, msg_id: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for channel, head, parent in self.messages:
                if channel == "shell" and parent == msg_id:
                    return head
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no reply to {msg_id}")


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[Relay]:
    relay = Relay(tmp_path)
    await relay.host.start()
    try:
        yield relay
    finally:
        await relay.host.shutdown()


async def test_a_late_answer_to_an_internal_request_is_hidden_and_the_relay_goes_on(
    relay: Relay,
) -> None:
    with pytest.raises(TimeoutError):
        await relay.host.evaluate("__import__('time').sleep(1.5) or '1'", timeout=0.2)
    # The kernel answers the timed-out request while this one waits its turn.
    msg_id = relay.request("kernel_info_request", {})
    reply = await relay.reply_to(msg_id)
    assert reply["msg_type"] == "kernel_info_reply"
    await asyncio.sleep(0.5)  # the idle status of the late request
    client_parents = {parent for _, _, parent in relay.messages}
    assert client_parents <= {msg_id, None}, relay.messages
    # And the runtime's own requests still work afterwards.
    assert await relay.host.evaluate("'\"ok\"'", timeout=30) == "ok"


async def test_many_timed_out_probes_leave_the_shell_relay_working(relay: Relay) -> None:
    for _ in range(5):
        with pytest.raises(TimeoutError):
            await relay.host.evaluate("__import__('time').sleep(0.3) or '1'", timeout=0.01)
    msg_id = relay.request("execute_request", {"code": "1 + 1", "silent": False})
    reply = await relay.reply_to(msg_id)
    assert reply["msg_type"] == "execute_reply"
