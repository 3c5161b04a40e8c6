"""Tripwires for what we use of other libraries that they do not promise to keep.

Each override below reaches past a library's public API; pyproject.toml pins the
library's major version, and these tests fail by name, at once, when a release
moves what we rely on, instead of a kernel hanging somewhere far from the cause.
(pyzmq's ``_schedule_remaining_events`` has its own test in test_zmqsend.py.)
"""

from __future__ import annotations

import inspect

import pytest
from jupyter_client.multikernelmanager import MultiKernelManager
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import MappingKernelManager
from tornado import httpclient, websocket


def _source_mentions(obj: object, name: str) -> bool:
    return name in inspect.getsource(obj)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("what", "check"),
    [
        # kernel_provisioner/ws_client.py: its own frame reader, tornado's handling
        (
            "tornado WebSocketProtocol13._receive_frame_loop is a coroutine method",
            lambda: inspect.iscoroutinefunction(websocket.WebSocketProtocol13._receive_frame_loop),
        ),
        (
            "tornado WebSocketProtocol13._handle_message(opcode, data) handles a whole message",
            lambda: (
                list(inspect.signature(websocket.WebSocketProtocol13._handle_message).parameters)
                == ["self", "opcode", "data"]
            ),
        ),
        (
            "tornado WebSocketProtocol13._write_frame(fin, opcode, data) frames and masks",
            lambda: (
                list(inspect.signature(websocket.WebSocketProtocol13._write_frame).parameters)[:4]
                == ["self", "fin", "opcode", "data"]
            ),
        ),
        *[
            (
                f"tornado WebSocketProtocol13 keeps {name}",
                lambda name=name: _source_mentions(websocket.WebSocketProtocol13, name),
            )
            for name in (
                "self._wire_bytes_in",
                "self._message_bytes_out",
                "self._fragmented_message_buffer",
                "self._fragmented_message_opcode",
            )
        ],
        (
            "tornado WebSocketClientConnection.get_websocket_protocol",
            lambda: callable(websocket.WebSocketClientConnection.get_websocket_protocol),
        ),
        (
            "tornado httpclient._RequestProxy and HTTPRequest._DEFAULTS",
            lambda: (
                callable(httpclient._RequestProxy)
                and isinstance(httpclient.HTTPRequest._DEFAULTS, dict)
            ),
        ),
        # runtime/handlers.py: big frames written to the protocol's stream directly
        (
            "tornado WebSocketProtocol keeps its IOStream as .stream",
            lambda: _source_mentions(websocket.WebSocketProtocol, "self.stream"),
        ),
        # server_extension/connection.py: resume before talking, notice, TCP_NODELAY
        *[
            (
                f"jupyter_server ZMQChannelsWebsocketConnection.{name}",
                lambda name=name: callable(getattr(ZMQChannelsWebsocketConnection, name, None)),
            )
            for name in ("prepare", "connect", "handle_incoming_message", "handle_outgoing_message")
        ],
        (
            "jupyter_server's kernel WebSocket handler can set TCP_NODELAY",
            lambda: callable(websocket.WebSocketHandler.set_nodelay),
        ),
        # kernel_provisioner/manager.py: the culler and shutdown see the sandbox
        (
            "jupyter_server MappingKernelManager.cull_kernel_if_idle",
            lambda: inspect.iscoroutinefunction(MappingKernelManager.cull_kernel_if_idle),
        ),
        (
            "jupyter_client MultiKernelManager keeps its managers in _kernels",
            lambda: _source_mentions(MultiKernelManager, "self._kernels"),
        ),
        # server_extension/events.py: claim progress of kernels still starting
        (
            "jupyter_client MultiKernelManager.kernel_manager_factory",
            lambda: "kernel_manager_factory" in MultiKernelManager.class_traits(),
        ),
    ],
)
def test_what_we_override_is_still_there(what: str, check: object) -> None:
    assert callable(check)
    assert check(), f"{what}: changed upstream; see the override before raising the pin"
