"""RFC 6455 frames: binary messages written by a server straight to its stream,
and the frame headers a client reads.

tornado's ``write_message`` copies a message twice (its framing joins header and
payload), takes only ``bytes``, and wraps every write in a task of its own,
which at a kernel's message rate costs more than the write. A server sends
unmasked frames and, with no compression negotiated, a single final binary
frame is exactly what ``write_message`` would write: here a small message is
written as one buffer (header and payload), a large one as its header and its
pieces, each kept by reference in the stream's buffer.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from tornado import websocket
from tornado.iostream import StreamClosedError

# Below this size joining the pieces costs less than writing them one by one.
JOIN_BELOW_BYTES = 64 * 1024

OPCODE_CONTINUATION = 0x0
OPCODE_BINARY = 0x2
MAX_CONTROL_PAYLOAD = 125  # close, ping and pong frames carry at most this much
_LENGTH_16 = struct.Struct("!H")
_LENGTH_64 = struct.Struct("!Q")


class FrameHeader(NamedTuple):
    fin: bool
    rsv: int  # the three reserved bits, as they stand in the first byte
    opcode: int
    masked: bool
    start: int  # where the payload (after any masking key) starts
    size: int  # of the payload

    @property
    def control(self) -> bool:
        """A close, ping or pong frame (opcodes 0x8 and up)."""
        return bool(self.opcode & 0x8)


def parse_header(data: bytes, pos: int) -> FrameHeader | None:
    """The header of the frame at ``data[pos:]``; None while it is incomplete."""
    available = len(data) - pos
    if available < 2:
        return None
    first, second = data[pos], data[pos + 1]
    size = second & 0x7F
    start = pos + 2
    if size == 126:
        if available < 4:
            return None
        (size,) = _LENGTH_16.unpack_from(data, start)
        start += 2
    elif size == 127:
        if available < 10:
            return None
        (size,) = _LENGTH_64.unpack_from(data, start)
        start += 8
    masked = bool(second & 0x80)
    if masked:
        if len(data) < start + 4:
            return None
        start += 4
    return FrameHeader(bool(first & 0x80), first & 0x70, first & 0x0F, masked, start, size)


def frame_header(size: int) -> bytes:
    """RFC 6455 header of one final, unmasked binary frame of ``size`` bytes."""
    first = 0x80 | OPCODE_BINARY
    if size < 126:
        return struct.pack("!BB", first, size)
    if size < 1 << 16:
        return struct.pack("!BBH", first, 126, size)
    return struct.pack("!BBQ", first, 127, size)


def write_binary(
    handler: websocket.WebSocketHandler, pieces: Sequence[bytes | bytearray | memoryview]
) -> None:
    """Send ``pieces`` as one binary message from the server side of ``handler``.

    The pieces must not change until written. Only for handlers that never
    negotiate compression (``get_compression_options()`` is None).
    """
    connection = handler.ws_connection
    if connection is None or connection.is_closing():
        return
    stream = getattr(connection, "stream", None)
    if stream is None:
        return
    size = sum(len(piece) for piece in pieces)
    # A client that went away fails these writes' futures, which tornado marks as
    # retrieved; its close handler cleans up.
    try:
        if size < JOIN_BELOW_BYTES:
            stream.write(b"".join((frame_header(size), *pieces)))
            return
        for piece in (frame_header(size), *pieces):
            stream.write(piece)
    except StreamClosedError:
        return
