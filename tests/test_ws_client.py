"""The kernel WebSocket client's frame reader against a real tornado server.

The server writes raw RFC 6455 frames to its stream, cut and batched the way a
network delivers them, and the client must hand on exactly the messages sent:
frames batched in one read, headers and payloads cut anywhere, fragments with a
ping between them, large payloads read straight into a pooled buffer, and the
frames a client must refuse.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tornado import httpclient, httpserver, testing, web, websocket

from jupyter_sandbox.kernel_provisioner import ws_client
from jupyter_sandbox.kernel_provisioner.receive_buffers import ReceiveBuffers
from jupyter_sandbox.protocol.ws_frames import frame_header


def frame(payload: bytes, *, opcode: int = 2, fin: bool = True, mask: bytes = b"") -> bytes:
    first = (0x80 if fin else 0) | opcode
    masked = 0x80 if mask else 0
    size = len(payload)
    if size < 126:
        head = struct.pack("!BB", first, masked | size)
    elif size < 1 << 16:
        head = struct.pack("!BBH", first, masked | 126, size)
    else:
        head = struct.pack("!BBQ", first, masked | 127, size)
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + payload


class RawServer(websocket.WebSocketHandler):
    """Writes the test's byte pieces to the connection's stream, pausing between them."""

    script: list[bytes] = []
    received: list[bytes] = []
    pongs: list[bytes] = []

    async def open(self, *args: Any, **kwargs: Any) -> None:
        stream = self.ws_connection.stream  # type: ignore[union-attr]
        for piece in self.script:
            await stream.write(piece)
            await asyncio.sleep(0.005)

    def on_message(self, message: str | bytes) -> None:
        self.received.append(message if isinstance(message, bytes) else message.encode())

    def on_pong(self, data: bytes) -> None:
        self.pongs.append(data)


@pytest.fixture
async def server() -> AsyncIterator[str]:
    RawServer.script, RawServer.received, RawServer.pongs = [], [], []
    sock, port = testing.bind_unused_port()
    http = httpserver.HTTPServer(web.Application([("/ws", RawServer)]))
    http.add_sockets([sock])
    yield f"ws://127.0.0.1:{port}/ws"
    http.stop()


async def connect(
    url: str, *, max_message_size: int = 1 << 30, pool: ReceiveBuffers | None = None
) -> tuple[ws_client.KernelWebSocket, asyncio.Queue[bytes | None]]:
    messages: asyncio.Queue[bytes | None] = asyncio.Queue()

    def on_message(message: str | bytes | None) -> None:
        messages.put_nowait(None if message is None else bytes(message))  # type: ignore[arg-type]

    ws = await ws_client.websocket_connect(
        httpclient.HTTPRequest(url),
        receive_buffers=pool,
        on_message_callback=on_message,
        max_message_size=max_message_size,
    )
    return ws, messages


async def receive(messages: asyncio.Queue[bytes | None], count: int) -> list[bytes | None]:
    return [await asyncio.wait_for(messages.get(), 10) for _ in range(count)]


async def test_frames_batched_in_one_write_are_each_delivered(server: str) -> None:
    payloads = [f"message {i}".encode() * (i + 1) for i in range(50)]
    RawServer.script = [b"".join(frame(p) for p in payloads)]
    _, messages = await connect(server)
    assert await receive(messages, 50) == payloads


@pytest.mark.parametrize("size", [5, 300, 70_000, 200_000])
async def test_a_frame_cut_anywhere_arrives_whole(server: str, size: int) -> None:
    payload = bytes(range(256)) * (size // 256) + b"end"
    raw = frame(payload) + frame(b"next")
    # cut inside the header, right after it, and in the payload
    cuts = sorted({1, 3, len(frame_header(len(payload))), len(raw) // 2, len(raw) - 3})
    RawServer.script = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    _, messages = await connect(server)
    assert await receive(messages, 2) == [payload, b"next"]


async def test_a_large_payload_goes_straight_into_a_pooled_buffer(server: str) -> None:
    size = 3 * ws_client.DIRECT_READ_BYTES + 7
    payload = bytes(i % 251 for i in range(size))
    raw = frame(payload)
    RawServer.script = [raw[:1000], raw[1000:300_000], raw[300_000:]]
    pool = ReceiveBuffers()
    _, messages = await connect(server, pool=pool)
    assert await receive(messages, 1) == [payload]
    assert pool.allocated == 1


async def test_fragments_with_a_ping_between_make_one_message(server: str) -> None:
    RawServer.script = [
        frame(b"one ", fin=False),
        frame(b"are you there", opcode=0x9),
        frame(b"message", opcode=0x0, fin=False) + frame(b"!", opcode=0x0),
        frame(b"after"),
    ]
    _, messages = await connect(server)
    assert await receive(messages, 2) == [b"one message!", b"after"]
    for _ in range(100):
        if RawServer.pongs:
            break
        await asyncio.sleep(0.01)
    assert RawServer.pongs == [b"are you there"]


@pytest.mark.parametrize(
    "bad",
    [
        frame(b"masked", mask=b"\x01\x02\x03\x04"),  # a client must refuse masked frames
        frame(b"compressed?", opcode=0x42),  # a reserved bit nobody negotiated
        frame(b"x" * 126, opcode=0x9),  # a control frame too long
        frame(b"ping", opcode=0x9, fin=False),  # a fragmented control frame
        frame(b"orphan", opcode=0x0),  # a continuation of nothing
        frame(b"too", fin=False) + frame(b"new"),  # a new message inside a fragmented one
    ],
    ids=["masked", "reserved bit", "long control", "fragmented control", "orphan", "interleaved"],
)
async def test_a_frame_a_client_must_refuse_closes_the_connection(server: str, bad: bytes) -> None:
    RawServer.script = [frame(b"good"), bad, frame(b"never")]
    _, messages = await connect(server)
    assert await receive(messages, 2) == [b"good", None]


async def test_a_message_over_the_size_limit_closes_the_connection(server: str) -> None:
    RawServer.script = [frame(b"small"), frame(b"y" * 2000)]
    _, messages = await connect(server, max_message_size=1000)
    assert await receive(messages, 2) == [b"small", None]


async def test_a_close_frame_ends_the_connection_with_its_code(server: str) -> None:
    RawServer.script = [frame(b"last"), frame(struct.pack("!H", 4001) + b"bye", opcode=0x8)]
    ws, messages = await connect(server)
    assert await receive(messages, 2) == [b"last", None]
    assert (ws.close_code, ws.close_reason) == (4001, "bye")


async def test_write_binary_reaches_the_server_and_fails_once_closed(server: str) -> None:
    ws, _ = await connect(server)
    ws.write_binary(b"\x00request")
    ws.write_binary(b"z" * 100_000)
    for _ in range(200):
        if len(RawServer.received) == 2:
            break
        await asyncio.sleep(0.01)
    assert RawServer.received == [b"\x00request", b"z" * 100_000]
    ws.close()
    with pytest.raises(websocket.WebSocketClosedError):
        ws.write_binary(b"late")


async def test_a_flood_of_empty_frames_lets_the_loop_run_between_them(server: str) -> None:
    """A hostile runtime answered with empty frames faster than they were handled:
    the reader counted payload bytes only, never yielded, and stalled the Jupyter
    server's loop (and every other kernel's messages on it) for as long as it liked."""
    count = 60_000
    RawServer.script = [frame(b"") * count]
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    _, messages = await connect(server)
    task = asyncio.create_task(ticker())
    got = await receive(messages, count)
    stop = True
    await task
    assert got == [b""] * count
    # every frame counts FRAME_CHARGE_BYTES towards a yield: about 58 here
    expected = count * ws_client.FRAME_CHARGE_BYTES // ws_client.YIELD_AFTER_BYTES
    assert ticks >= expected // 2, (ticks, expected)


async def test_a_ping_flood_closes_the_connection(server: str) -> None:
    RawServer.script = [frame(b"before"), frame(b"p", opcode=0x9) * 1000, frame(b"never")]
    ws, messages = await connect(server)
    assert await receive(messages, 2) == [b"before", None]
    assert len(RawServer.pongs) <= ws_client.CONTROL_BURST
    assert ws.close_code in (1008, None)


async def test_a_declared_size_costs_nothing_until_its_bytes_arrive(server: str) -> None:
    """A 10-byte header declaring 400 MiB, and then nothing: the host allocated and
    zeroed the whole buffer at once."""
    import psutil

    size = 400 * 1024 * 1024
    RawServer.script = [frame_header(size) + b"x" * 1000]
    before = psutil.Process().memory_info().rss
    ws, _ = await connect(server, max_message_size=1 << 30)
    await asyncio.sleep(0.5)  # the reader is now waiting for the rest of the payload
    grown = psutil.Process().memory_info().rss - before
    ws.close()
    assert grown < 64 * 1024 * 1024, f"the reader committed {grown >> 20} MiB for nothing"
