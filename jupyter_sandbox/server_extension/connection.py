"""Kernel WebSocket connections that resume a suspended sandbox before talking to it.

JupyterLab takes an iopub ``restarting`` status for an automatic restart after
a crash: it says the kernel "appears to have died", drops its pending requests
and reconnects. So no resume is ever announced that way. A connection opened to
a suspended sandbox (a notebook reopened or reloaded after a cull) resumes it
before jupyter_server's set-up (kernel_info, then the iopub "nudge"); on a
connection that is already live, the request that arrives resumes it and the
``restarting`` status the bridge or the direct link says is swallowed. Either
way the user is told in words, on stdout, in the output of the first execution
after the resume.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_binary_message,
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from ..kernel_provisioner.provisioner import SandboxProvisioner
from ..protocol import framing, ws_frames
from .direct_channels import DirectLink, RelayedMessage

V1 = framing.SUBPROTOCOL


def resumed_notice(kernel: dict[str, Any]) -> str:
    """What a user is told, in the output of the cell that resumed the sandbox."""
    restored = kernel.get("restored")
    if isinstance(restored, dict) and restored.get("summary"):
        kept = f"files are kept; {restored['summary']}"
    elif isinstance(restored, dict) and restored.get("error"):
        kept = f"files are kept; variables {restored['error']}"
    else:
        kept = "files are kept, variables from before are gone"
    return (
        "[sandbox] Resumed after suspension: this is a new kernel process in the same "
        f"workspace; {kept}.\n"
    )


class SandboxWebsocketConnection(ZMQChannelsWebsocketConnection):  # type: ignore[misc]
    """jupyter_server's kernel connection, straight to the sandbox for v1 clients.

    JupyterLab's connections (the v1 protocol) get a ``DirectLink`` instead of
    ZMQ streams to the bridge; the JSON protocol keeps the ZMQ streams.
    """

    _resumed_before_open = False
    _resume_request: dict[str, Any] | None = None
    _notice_parent: dict[str, Any] | None = None
    _link: DirectLink | None = None

    @property
    def sandbox_provisioner(self) -> SandboxProvisioner | None:
        provisioner = getattr(self.kernel_manager, "provisioner", None)
        return provisioner if isinstance(provisioner, SandboxProvisioner) else None

    async def prepare(self) -> None:
        provisioner = self.sandbox_provisioner
        if provisioner is not None:
            session = provisioner.session
            if session is not None and session.suspended:
                await provisioner.resume()
                self._resumed_before_open = True
        await super().prepare()
        if provisioner is not None and self._will_speak_v1():
            await self._open_link(provisioner)

    def _will_speak_v1(self) -> bool:
        """The subprotocol the handler will choose (it chooses after ``prepare``)."""
        handler = self.websocket_handler
        offered = handler.request.headers.get("Sec-WebSocket-Protocol", "")
        protocols = [name.strip() for name in offered.split(",") if name.strip()]
        return bool(handler.select_subprotocol(protocols) == V1)

    async def _open_link(self, provisioner: SandboxProvisioner) -> None:
        session = provisioner.session
        if session is None or session.suspended:
            return
        link = DirectLink(session)
        try:
            await link.open()
        except Exception as exc:  # the bridge's route still works, or fails as before
            self.log.warning("kernel %s: no direct connection (%s); using ZMQ", self.kernel_id, exc)
            return
        self._link = link

    def create_stream(self) -> None:
        link, self._link = self._link, None
        if link is None or self.subprotocol != V1:
            if link is not None:
                link.close()
            super().create_stream()
            return
        self.channels = dict(link.streams)

    def connect(self) -> Any:
        # jupyter_server leaves Nagle's algorithm on for kernel WebSockets: a client
        # that delays its ACKs (browsers do) then waits about 40 ms for each small
        # message written behind another, such as a cell's reply and idle status.
        self.websocket_handler.set_nodelay(True)
        connected = super().connect()
        if self._link is not None:
            # A tab reconnecting took over its buffered streams: the new link is spare.
            self._link.close()
            self._link = None
        return connected

    # -- a live connection whose sandbox resumes ---------------------------------

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        provisioner = self.sandbox_provisioner
        session = provisioner.session if provisioner is not None else None
        if self._resumed_before_open and session is not None:
            channel, header = self._peek_incoming(incoming_msg)
            if channel == "shell" and header.get("msg_type") == "execute_request":
                self._resumed_before_open = False
                self._send_resume_notice(session.kernel, header)
        if session is not None and session.suspended and self.channels:
            channel, header = self._peek_incoming(incoming_msg)
            if channel in ("shell", "control") and header.get("msg_type") not in (
                None,
                "shutdown_request",
            ):
                # This request resumes the sandbox (the bridge does it on receipt).
                self._resume_request = header
        super().handle_incoming_message(incoming_msg)

    def handle_outgoing_message(self, stream: str, outgoing_msg: list[Any]) -> None:
        state, parent = self._relayed_status(stream, outgoing_msg)
        if state == "restarting":
            # Swallowed; the words follow once the new kernel is there (and has
            # said what it got back of the old one's variables).
            self._notice_parent, self._resume_request = self._resume_request, None
            return
        if state == "idle" and not parent and self._notice_parent is not None:
            provisioner = self.sandbox_provisioner
            session = provisioner.session if provisioner is not None else None
            kernel = session.kernel if session is not None else {}
            self._send_resume_notice(kernel, self._notice_parent)
            self._notice_parent = None
        if isinstance(outgoing_msg, RelayedMessage):
            self._relay(stream, outgoing_msg)
        else:
            super().handle_outgoing_message(stream, outgoing_msg)

    def _relay(self, stream: Any, message: RelayedMessage) -> None:
        """jupyter_server's v1 path for a frame from a ``DirectLink``.

        The same checks (hidden tracebacks, IOPub rate limits); the runtime's
        frame goes out as it came unless they rewrote the message.
        """
        if stream.closed():
            self.log.warning("kernel message arrived on a closed channel")
            self.disconnect()
            return
        channel = stream.channel
        parts = list(message.parts)
        msg: dict[str, Any] = {"header": None, "parent_header": None, "content": None}
        self._on_error(channel, msg, parts)
        if self._limit_rate(channel, msg, parts):
            return
        if message.frame is None or parts[3] is not message.parts[3]:
            self.write_message(framing.encode(channel, parts), binary=True)
        elif self.websocket_handler.get_compression_options() is None:
            ws_frames.write_binary(self.websocket_handler, [message.frame])
        else:
            self.write_message(bytes(message.frame), binary=True)

    def _on_error(self, channel: str, msg: dict[str, Any], msg_list: list[Any]) -> None:
        """Hide tracebacks when the server says so (``allow_tracebacks=False``).

        jupyter_server's own version reads the replacement text off the kernel's
        manager, which does not have it (the MappingKernelManager does): the
        error output is dropped with an AttributeError, for any kernel. And it
        leaves the traceback in the failed request's reply on shell. Here both
        are rewritten.
        """
        manager = self.multi_kernel_manager
        if manager.allow_tracebacks or channel not in ("iopub", "shell"):
            return
        msg["header"] = self.get_part("header", msg["header"], msg_list)
        if channel == "iopub" and msg["header"].get("msg_type") != "error":
            return
        msg["content"] = self.get_part("content", msg["content"], msg_list)
        if channel == "shell" and msg["content"].get("status") != "error":
            return
        msg["content"].update(
            ename="ExecutionError",
            evalue="Execution error",
            traceback=[manager.traceback_replacement_message],
        )
        if self.subprotocol == V1:
            msg_list[3] = self.session.pack(msg["content"])

    def _send_resume_notice(self, kernel: dict[str, Any], parent: dict[str, Any]) -> None:
        # stdout: this is news, not an error (stderr renders as a red box).
        notice = {"name": "stdout", "text": resumed_notice(kernel)}
        self._send_iopub("stream", notice, parent)

    def _peek_incoming(self, incoming_msg: Any) -> tuple[str | None, dict[str, Any]]:
        try:
            if self.subprotocol == V1:
                channel, msg_list = deserialize_msg_from_ws_v1(incoming_msg)
                return channel, dict(self.session.unpack(msg_list[0]))
            if isinstance(incoming_msg, bytes):
                msg = deserialize_binary_message(incoming_msg)
            else:
                msg = json.loads(incoming_msg)
            return msg.get("channel"), dict(msg.get("header") or {})
        except Exception:
            return None, {}

    def _relayed_status(self, stream: Any, outgoing_msg: list[Any]) -> tuple[str | None, str]:
        """An iopub status message's execution state and parent msg_id (else None, "")."""
        channel = stream if isinstance(stream, str) else getattr(stream, "channel", None)
        if channel != "iopub":
            return None, ""
        try:
            _, fed = self.session.feed_identities(outgoing_msg)
            header = self.session.unpack(fed[1])
            if header.get("msg_type") != "status":
                return None, ""
            parent = self.session.unpack(fed[2])
            content = self.session.unpack(fed[4])
        except Exception:
            return None, ""
        return content.get("execution_state"), str(parent.get("msg_id") or "")

    def _send_iopub(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
        msg = self.session.msg(msg_type, content, parent=parent)
        if self.subprotocol == V1:
            self.write_message(serialize_msg_to_ws_v1(msg, "iopub", self.session.pack), binary=True)
        else:
            msg["channel"] = "iopub"
            self.write_message(json.dumps(msg, default=str))
