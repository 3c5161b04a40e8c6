"""tornado's WebSocket client with a frame reader for a kernel's message rate.

tornado reads every frame with two or three awaited stream reads (header,
length, payload), each a future, and then leaves the socket unwatched until the
next read asks again, so each message costs several loop passes and a
deregistration and registration of the socket. Here a connection reads what has
arrived in one go and handles every whole frame in it before asking for more.
A payload of DIRECT_READ_BYTES and more is read with ``read_into`` straight into
one buffer of its final size (from ``receive_buffers``, a pool, when given),
not through tornado's 64 KiB chunks and two more copies. Control frames,
writing, pings and the closing handshake stay tornado's.

``on_open`` sees the connection as soon as it is upgraded, before any message
has been passed on: what the server chose (its subprotocol) decides how the
very first message is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import Future
from collections.abc import Callable
from typing import Any

from tornado import httpclient, httputil, websocket
from tornado.iostream import StreamClosedError

from ..protocol import ws_frames
from .receive_buffers import ReceiveBuffers, lazy_buffer

log = logging.getLogger(__name__)

DIRECT_READ_BYTES = 256 * 1024
READ_CHUNK_BYTES = 64 * 1024
# Handle at most this many bytes of frames that were already waiting before
# letting other callbacks run (tornado's own reader yields the same way).
YIELD_AFTER_BYTES = 1024 * 1024
# What a frame costs at least towards that: a flood of empty frames from a hostile
# runtime must not keep the Jupyter server's shared loop to itself.
FRAME_CHARGE_BYTES = 1024
# Control frames (pings are answered with a pong each) a runtime may send in a burst,
# refilled at this rate per second; beyond it the connection is closed.
CONTROL_BURST = 64
CONTROL_PER_SECOND = 16.0
TOO_BIG = "message too big"
CONTROL_FLOOD = "too many control frames"


class _FrameReader(websocket.WebSocketProtocol13):
    """Reads frames from whatever has arrived; never negotiates compression."""

    _control_tokens = float(CONTROL_BURST)
    _control_checked = 0.0

    async def _receive_frame_loop(self) -> None:
        assert self.stream is not None
        data = b""
        pos = 0  # the first byte of ``data`` not yet handled
        work = 0
        try:
            while not self.client_terminated:
                head = ws_frames.parse_header(data, pos)
                if head is None:  # no whole header: wait for more
                    chunk = await self.stream.read_bytes(READ_CHUNK_BYTES, partial=True)
                    self._wire_bytes_in += len(chunk)
                    data = data[pos:] + chunk if pos < len(data) else chunk
                    pos = 0
                    continue
                problem = self._refuse(head)
                if problem:
                    log.warning("closing a kernel WebSocket: %s", problem)
                    if problem in CLOSE_CODES:
                        self.close(CLOSE_CODES[problem], problem)
                    self._abort()
                    return
                end = head.start + head.size
                if end <= len(data):
                    payload: bytes | memoryview = data[head.start : end]
                    pos = end
                else:
                    payload = await self._read_rest(data, head.start, head.size)
                    data, pos = b"", 0
                await self._on_frame(head, payload)
                work += max(head.size, FRAME_CHARGE_BYTES)
                if work >= YIELD_AFTER_BYTES:
                    work = 0
                    await asyncio.sleep(0)
        except StreamClosedError:
            self._abort()
        finally:
            self.handler.on_ws_connection_close(self.close_code, self.close_reason)

    def _refuse(self, head: ws_frames.FrameHeader) -> str:
        """Why this frame ends the connection ('' when it does not)."""
        if head.rsv or head.masked:
            return "reserved bits or a masked frame from the server"
        if head.control and (head.size > ws_frames.MAX_CONTROL_PAYLOAD or not head.fin):
            return "a control frame too long or fragmented"
        if head.control and not self._spend_control_token():
            return CONTROL_FLOOD
        size = head.size
        if self._fragmented_message_buffer is not None:
            size += len(self._fragmented_message_buffer)
        return TOO_BIG if size > self.params.max_message_size else ""

    def _spend_control_token(self) -> bool:
        now = time.monotonic()
        elapsed, self._control_checked = now - self._control_checked, now
        self._control_tokens = min(
            float(CONTROL_BURST), self._control_tokens + elapsed * CONTROL_PER_SECOND
        )
        if self._control_tokens < 1:
            return False
        self._control_tokens -= 1
        return True

    async def _read_rest(self, data: bytes, start: int, size: int) -> bytes | memoryview:
        """The payload that starts at ``data[start:]`` and goes on in the stream."""
        assert self.stream is not None
        have = len(data) - start
        if size < DIRECT_READ_BYTES:
            rest = await self.stream.read_bytes(size - have)
            self._wire_bytes_in += len(rest)
            return data[start:] + rest
        pool = getattr(self.handler, "receive_buffers", None)
        buffer = pool.take(size) if pool is not None else lazy_buffer(size)
        buffer[:have] = data[start:]
        await self.stream.read_into(buffer[have:])  # type: ignore[arg-type]  # any writable buffer
        self._wire_bytes_in += size - have
        return buffer  # the receivers take views

    async def _on_frame(self, head: ws_frames.FrameHeader, payload: bytes | memoryview) -> None:
        """As tornado's frame reader does once it has a whole frame."""
        opcode = head.opcode
        if head.control:
            pass  # control frames may come between the fragments of a message
        elif opcode == ws_frames.OPCODE_CONTINUATION:
            if self._fragmented_message_buffer is None:
                self._abort()
                return
            self._fragmented_message_buffer.extend(payload)
            if not head.fin:
                return
            opcode = self._fragmented_message_opcode  # type: ignore[assignment]  # set below
            payload = bytes(self._fragmented_message_buffer)
            self._fragmented_message_buffer = None
        elif self._fragmented_message_buffer is not None:
            self._abort()  # a new message before the last one ended
            return
        elif not head.fin:
            self._fragmented_message_opcode = opcode  # type: ignore[assignment]  # tornado's None
            self._fragmented_message_buffer = bytearray(payload)
            return
        handled = self._handle_message(opcode, payload)  # type: ignore[arg-type]
        if handled is not None:
            await handled


CLOSE_CODES = {TOO_BIG: 1009, CONTROL_FLOOD: 1008}

OpenCallback = Callable[[websocket.WebSocketClientConnection], None]


class KernelWebSocket(websocket.WebSocketClientConnection):
    receive_buffers: ReceiveBuffers | None = None
    on_open: OpenCallback | None = None

    async def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        await super().headers_received(start_line, headers)
        # tornado has only scheduled its frame loop yet: no message was read.
        if self.protocol is not None and self.on_open is not None:
            self.on_open(self)

    def get_websocket_protocol(self) -> websocket.WebSocketProtocol:
        return _FrameReader(self, mask_outgoing=True, params=self.params)

    def write_binary(self, payload: bytes) -> None:
        """Send one binary message, like ``write_message(payload, binary=True)``.

        Without the task tornado wraps around every write (nobody here awaits
        it); a closed connection raises ``WebSocketClosedError`` all the same.
        """
        protocol = self.protocol
        if protocol is None or protocol.client_terminated:
            raise websocket.WebSocketClosedError()
        assert isinstance(protocol, websocket.WebSocketProtocol13)
        try:
            protocol._write_frame(True, ws_frames.OPCODE_BINARY, payload)
        except StreamClosedError as exc:
            raise websocket.WebSocketClosedError() from exc
        protocol._message_bytes_out += len(payload)


def websocket_connect(
    request: httpclient.HTTPRequest,
    receive_buffers: ReceiveBuffers | None = None,
    on_open: OpenCallback | None = None,
    **options: Any,
) -> Future[KernelWebSocket]:
    """Like ``tornado.websocket.websocket_connect`` (same keyword options)."""
    if options.get("compression_options") is not None:
        raise ValueError("kernel WebSockets are not compressed")
    request.headers = httputil.HTTPHeaders(request.headers)
    # As tornado's own websocket_connect does: fill in the request defaults.
    proxy = httpclient._RequestProxy(request, httpclient.HTTPRequest._DEFAULTS)
    connection = KernelWebSocket(proxy, **options)  # type: ignore[arg-type]
    connection.receive_buffers = receive_buffers
    connection.on_open = on_open
    return connection.connect_future  # type: ignore[return-value]
