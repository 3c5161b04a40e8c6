"""The ``v1.kernel.websocket.jupyter.org`` binary framing.

A frame is ``n`` (uint64 LE), then ``n`` offsets (uint64 LE), then the channel name
and the message parts (header, parent_header, metadata, content, *buffers) laid end
to end. Offsets point at the start of each part; the last one is the end of the
frame. The parts are carried as raw bytes: nothing is JSON re-encoded on the way.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

SUBPROTOCOL = "v1.kernel.websocket.jupyter.org"
# The same framing between the bridge and the runtime, where every kernel message's
# parts start with its HMAC signature (hex; empty: not signed). When the bridge
# holds the kernel's own key, it relays the kernel's signatures instead of signing
# each message again, which for a 50 MB buffer is a pass over all 50 MB.
SIGNED_SUBPROTOCOL = "v1.signed.kernel.websocket.jupyter-sandbox"

# Channels a kernel message may travel on. "sandbox" carries runtime events
# (kernel started/exited) from the runtime to the bridge; it is never relayed to a kernel.
KERNEL_CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})
EVENT_CHANNEL = "sandbox"


class FramingError(ValueError):
    """A WebSocket message is not a valid v1 frame."""


@dataclass(frozen=True)
class Pieces:
    """A frame as its pieces (offset table and channel, then the parts themselves), for
    writers that can send it without first copying everything into one buffer."""

    pieces: list[bytes | memoryview]
    size: int  # of the whole frame


def encode(channel: str, parts: Sequence[bytes | memoryview]) -> bytes:
    """Pack a channel name and message parts into one binary frame."""
    return b"".join(encode_pieces(channel, parts).pieces)


def encode_pieces(channel: str, parts: Sequence[bytes | memoryview]) -> Pieces:
    """Like ``encode``, but the parts are not copied into one buffer."""
    chan = channel.encode("utf-8")
    count = len(parts) + 2  # start of channel, one per part, end of frame
    offset = 8 * (count + 1)
    offsets = [offset]
    offset += len(chan)
    offsets.append(offset)
    for part in parts:
        offset += len(part)
        offsets.append(offset)
    head = struct.pack(f"<{count + 1}Q", count, *offsets)
    return Pieces([head + chan, *parts], offset)  # the last offset is the frame's end


def decode(frame: bytes) -> tuple[str, list[bytes]]:
    """Unpack a binary frame into its channel name and message parts (copies)."""
    channel, views = decode_views(frame)
    return channel, [bytes(view) for view in views]


def decode_views(frame: bytes) -> tuple[str, list[memoryview]]:
    """Like ``decode``, but the parts are views into ``frame``: nothing is copied.

    Large outputs (a 50 MB buffer) pass through the bridge this way untouched.
    """
    size = len(frame)
    if size < 8:
        raise FramingError("frame shorter than its offset count")
    (count,) = struct.unpack_from("<Q", frame, 0)
    if count < 2 or 8 * (count + 1) > size:
        raise FramingError(f"bad offset count {count}")
    offsets = struct.unpack_from(f"<{count}Q", frame, 8)
    previous = 8 * (count + 1)
    if offsets[0] != previous:
        raise FramingError("first offset does not follow the offset table")
    for value in offsets:
        if value < previous or value > size:
            raise FramingError("offsets are not ascending within the frame")
        previous = value
    view = memoryview(frame)
    try:
        channel = bytes(view[offsets[0] : offsets[1]]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FramingError("channel name is not UTF-8") from exc
    # Bytes after the last offset belong to no part (jupyter_server's encoder never writes any).
    return channel, [view[offsets[i] : offsets[i + 1]] for i in range(1, count - 1)]
