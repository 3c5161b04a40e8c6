"""RFC 6455 frame headers, as the kernel WebSocket client reads them."""

from __future__ import annotations

import struct

import pytest

from jupyter_sandbox.protocol.ws_frames import FrameHeader, frame_header, parse_header

MASK = b"\x01\x02\x03\x04"


@pytest.mark.parametrize(
    ("data", "pos", "expected"),
    [
        (b"", 0, None),
        (b"\x82", 0, None),
        (b"\x82\x05hello", 0, FrameHeader(True, 0, 2, False, 2, 5)),
        (b"xx\x82\x00", 2, FrameHeader(True, 0, 2, False, 4, 0)),
        # a fragment (no FIN), a continuation, a ping, a close
        (b"\x02\x03abc", 0, FrameHeader(False, 0, 2, False, 2, 3)),
        (b"\x80\x03abc", 0, FrameHeader(True, 0, 0, False, 2, 3)),
        (b"\x89\x00", 0, FrameHeader(True, 0, 9, False, 2, 0)),
        (b"\x88\x02\x03\xe8", 0, FrameHeader(True, 0, 8, False, 2, 2)),
        # 16- and 64-bit lengths, whole and cut short
        (b"\x82\x7e" + struct.pack("!H", 300), 0, FrameHeader(True, 0, 2, False, 4, 300)),
        (b"\x82\x7e\x01", 0, None),
        (b"\x82\x7f" + struct.pack("!Q", 1 << 33), 0, FrameHeader(True, 0, 2, False, 10, 1 << 33)),
        (b"\x82\x7f" + b"\x00" * 7, 0, None),
        # reserved bits (compression) and a masked frame: the reader refuses both
        (b"\xc2\x01a", 0, FrameHeader(True, 0x40, 2, False, 2, 1)),
        (b"\x82\x81" + MASK + b"a", 0, FrameHeader(True, 0, 2, True, 6, 1)),
        (b"\x82\x81\x01\x02", 0, None),
    ],
)
def test_parse_header(data: bytes, pos: int, expected: FrameHeader | None) -> None:
    assert parse_header(data, pos) == expected


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 50_000_000])
def test_the_headers_we_write_read_back(size: int) -> None:
    header = frame_header(size)
    assert parse_header(header, 0) == FrameHeader(True, 0, 2, False, len(header), size)
