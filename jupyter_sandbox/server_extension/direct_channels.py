"""A browser's kernel channels carried straight to the sandbox, without ZMQ.

jupyter_server relays a kernel WebSocket through four ZMQ streams. For a
sandboxed kernel those streams lead to the bridge, which relays them again over
its WebSocket to the runtime: every message crosses a ZMQ socket, a thread and
two signatures more than with a plain kernel. A ``DirectLink`` is one WebSocket
from the Jupyter server's own loop to the runtime (the bridge's route: the
runtime's socket or the router), and its ``DirectStream``s stand in for the
ZMQ streams jupyter_server drives, so its connection logic (nudge, buffering
for a tab that reconnects, rate limits, traceback hiding, restart statuses)
runs unchanged.

The runtime's frames are already the browser's v1 frames: they are passed on
as they came unless jupyter_server rewrites one (an error without tracebacks).
The bridge stays, for ZMQ clients and for the server's own (activity, restarts).

A suspended sandbox resumes on the first request, as through the bridge: the
link asks the session whether the request may resume it, says ``restarting``
(which the connection turns into words), waits for the new kernel, says
``idle``, then sends what was asked meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from tornado import websocket

from ..kernel_provisioner import ws_client
from ..kernel_provisioner.bridge import MAX_PENDING, MAX_ROUTES, MAX_WS_MESSAGE, channels_request
from ..kernel_provisioner.session import SandboxSession
from ..protocol import framing
from ..protocol.messages import DELIM, parent_msg_id, split_zmq
from ..utils.background import background

log = logging.getLogger(__name__)

CHANNELS = ("iopub", "shell", "control", "stdin")
CONNECT_TIMEOUT = 10.0
SUSPENDED_POLL = 0.5  # seconds between looks at a suspended sandbox
# Contents jupyter_server may decode (rate limits, hidden tracebacks): handed over as bytes,
# as are all replies (a failed request's reply may hide its traceback).
DECODED_TYPES = frozenset({"status", "error"})


class RelayedMessage(list):  # type: ignore[type-arg]
    """``[DELIM, signature, *parts]`` as a ZMQ stream delivers it, plus the runtime's frame.

    ``frame`` is the v1 frame the browser gets when nothing rewrote ``parts``.
    """

    def __init__(self, parts: list[Any], frame: bytes | None) -> None:
        super().__init__([DELIM, b"", *parts])
        self.parts = parts
        self.frame = frame

    @classmethod
    def synthesized(cls, channel: str, parts: list[Any]) -> RelayedMessage:
        return cls(parts, framing.encode(channel, parts))


class _SocketState:
    """What jupyter_server reads of a stream's ``socket`` (``stream.socket.closed``)."""

    def __init__(self, stream: DirectStream) -> None:
        self._stream = stream

    @property
    def closed(self) -> bool:
        return self._stream.closed()


class DirectStream:
    """One channel of a ``DirectLink``, shaped like the ZMQStream jupyter_server drives.

    As with ZMQ, messages that arrive while nobody listens wait for the next
    ``on_recv``: jupyter_server listens only once its nudge is done.
    """

    def __init__(self, link: DirectLink, channel: str) -> None:
        self.link = link
        self.channel = channel
        self.socket = _SocketState(self)
        self._callback: Callable[[RelayedMessage], Any] | None = None
        self._waiting: deque[RelayedMessage] = deque(maxlen=MAX_PENDING)
        self._closed = False

    def on_recv(self, callback: Callable[[Any], Any] | None, copy: bool = True) -> None:
        self._callback = callback
        if callback is not None and self._waiting:
            asyncio.get_running_loop().call_soon(self._drain)

    def on_recv_stream(self, callback: Callable[[Any, Any], Any] | None, copy: bool = True) -> None:
        if callback is None:
            self.on_recv(None)
        else:
            self.on_recv(lambda message: callback(self, message))

    def stop_on_recv(self) -> None:
        self.on_recv(None)

    def send_multipart(self, frames: list[Any], *_: Any, **__: Any) -> None:
        parts = split_zmq(frames)[2]  # the runtime signs with the kernel's key
        self.link.send(self.channel, parts)

    def flush(self, *_: Any, **__: Any) -> int:
        return 0  # nothing waits in a socket: messages are handed over as they arrive

    def closed(self) -> bool:
        return self._closed

    def close(self, linger: int | None = None) -> None:
        if not self._closed:
            self._closed = True
            self._callback = None
            self._waiting.clear()
            self.link.stream_closed()

    def deliver(self, message: RelayedMessage) -> None:
        if self._closed:
            return
        if self._callback is None or self._waiting:
            self._waiting.append(message)
            return
        self._callback(message)

    def _drain(self) -> None:
        while self._waiting and self._callback is not None and not self._closed:
            self._callback(self._waiting.popleft())


class DirectLink:
    """One WebSocket from this server to a sandbox's runtime, for one browser connection."""

    def __init__(self, session: SandboxSession) -> None:
        self.session = session
        self.streams = {channel: DirectStream(self, channel) for channel in CHANNELS}
        self._ws: ws_client.KernelWebSocket | None = None
        self._connector: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._pending: deque[bytes] = deque()  # frames waiting for the connection
        self._held: deque[tuple[bytes, str, dict[str, Any]]] = deque()  # while suspended
        self._resumer: asyncio.Task[None] | None = None
        self._requests: OrderedDict[str, None] = OrderedDict()  # msg_ids this link sent
        self._last_msg_id: str | None = None
        self._closing = False
        self._status_session = uuid.uuid4().hex

    async def open(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Connect; raises when the runtime cannot be reached in time."""
        self._start_connecting()
        try:
            await asyncio.wait_for(self._connected.wait(), timeout)
        except TimeoutError:
            self.close()
            raise

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    # -- to the sandbox ------------------------------------------------------

    def send(self, channel: str, parts: list[Any]) -> None:
        if channel not in ("shell", "control", "stdin") or self._closing:
            return
        frame = framing.encode(channel, parts)
        try:
            head = json.loads(bytes(parts[0]))
        except (ValueError, IndexError):
            return
        msg_id = head.get("msg_id")
        if isinstance(msg_id, str):
            self._requests[msg_id] = None
            while len(self._requests) > MAX_ROUTES:
                self._requests.popitem(last=False)
        if self.session.suspended or self._resumer is not None:
            self._held.append((frame, channel, head))
            if self._resumer is None:
                self._resumer = asyncio.create_task(self._resume())
            return
        self._write(frame)

    def _write(self, frame: bytes) -> None:
        ws = self._ws
        if ws is not None and self._connected.is_set():
            try:
                ws.write_binary(frame)
                return
            except websocket.WebSocketClosedError:
                pass
        self._start_connecting()
        if len(self._pending) >= MAX_PENDING:
            log.error("kernel connection queue full: dropping the oldest request")
            self._pending.popleft()
        self._pending.append(frame)

    def _flush(self) -> None:
        ws = self._ws
        while ws is not None and self._connected.is_set() and self._pending:
            ws.write_binary(self._pending.popleft())

    async def _resume(self) -> None:
        """Requests to a suspended sandbox: resume it (when they may), then send them."""
        announced = False
        try:
            while self._held:
                frame, channel, head = self._held.popleft()
                if self.session.suspended:
                    # The session decides, as for the bridge's clients: an interrupt or
                    # a shutdown does not resume a sandbox.
                    if not await background().run(self.session.admit_request(channel, head)):
                        continue
                    if not announced:
                        self._deliver_status("restarting")
                        announced = True
                self._pending.append(frame)
                if not self._held and self.session.suspended:
                    await background().run(self.session.resume())
            if announced:
                self._last_msg_id = None  # a new runtime: nothing of the old one to replay
                if not self._connected.is_set():
                    if self._connector is not None:
                        self._connector.cancel()  # it may be waiting out a poll interval
                    self._connector = None
                    self._start_connecting()
                await asyncio.wait_for(self._connected.wait(), CONNECT_TIMEOUT)
                self._deliver_status("idle")
        except Exception as exc:
            log.error("resuming the sandbox for a kernel connection failed: %s", exc)
            self._pending.clear()
            self._held.clear()
        finally:
            self._resumer = None
        self._flush()

    # -- from the sandbox -------------------------------------------------------

    def _start_connecting(self) -> None:
        if self._connected.is_set():
            return
        if self._connector is None or self._connector.done():
            self._connector = asyncio.create_task(self._connect_loop())

    async def _connect_loop(self) -> None:
        delay = 0.05
        while not self._closing:
            session = self.session
            if session.released:
                return
            if session.suspended or session.endpoint is None:
                # A request of ours resumes it (see send); another client's may too.
                await asyncio.sleep(SUSPENDED_POLL)
                continue
            request, resolver = channels_request(session.endpoint, self._last_msg_id)
            try:
                ws = await ws_client.websocket_connect(
                    request,
                    resolver=resolver,
                    subprotocols=[framing.SUBPROTOCOL],
                    max_message_size=MAX_WS_MESSAGE,
                    on_message_callback=self._from_sandbox,
                    ping_interval=20,
                    ping_timeout=20,
                )
            except asyncio.CancelledError:
                return
            except Exception as exc:  # refused, 404/502 from the router, timeouts
                log.info("kernel connection to the sandbox failed (%s); retry in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if self._closing:
                ws.close()
                return
            self._ws = ws
            self._connected.set()
            if self._resumer is None:
                self._flush()
            return

    def _from_sandbox(self, message: str | bytes | None) -> None:
        if message is None:
            self._connected.clear()
            self._ws = None
            if not self._closing:
                self._start_connecting()  # with ?last=: the runtime replays what we missed
            return
        if isinstance(message, str):
            return
        try:
            channel, views = framing.decode_views(message)
        except framing.FramingError as exc:
            log.warning("bad frame from the sandbox: %s", exc)
            return
        stream = self.streams.get(channel)
        if stream is None or len(views) < 4:
            return  # runtime events: the bridge follows the kernel's state
        try:
            head = json.loads(bytes(views[0]))
        except ValueError:
            return
        msg_id = head.get("msg_id")
        if isinstance(msg_id, str) and msg_id:
            self._last_msg_id = msg_id
        if channel != "iopub":
            # A replay after a reconnect also carries answers to other clients.
            if parent_msg_id(views) not in self._requests:
                return
        decoded = (
            channel != "iopub" or head.get("msg_type") in DECODED_TYPES or len(views[3]) < 65536
        )
        parts: list[Any] = [
            bytes(views[0]),
            bytes(views[1]),
            bytes(views[2]),
            bytes(views[3]) if decoded else views[3],
            *views[4:],
        ]
        stream.deliver(RelayedMessage(parts, message))

    def _deliver_status(self, state: str) -> None:
        head = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "status",
            "username": "sandbox",
            "session": self._status_session,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
            "version": "5.3",
        }
        parts: list[Any] = [
            json.dumps(head).encode(),
            b"{}",
            b"{}",
            json.dumps({"execution_state": state}).encode(),
        ]
        self.streams["iopub"].deliver(RelayedMessage.synthesized("iopub", parts))

    # -- closing ---------------------------------------------------------------

    def stream_closed(self) -> None:
        """jupyter_server closes streams one by one; the link goes with the last."""
        if not self._closing and all(stream.closed() for stream in self.streams.values()):
            self.close()

    def close(self) -> None:
        self._closing = True
        for task in (self._connector, self._resumer):
            if task is not None and not task.done():
                task.cancel()
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        self._connected.clear()
        for stream in self.streams.values():
            if not stream.closed():
                stream.close()
