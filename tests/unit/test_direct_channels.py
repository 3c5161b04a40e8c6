"""The streams a direct link hands jupyter_server: ZMQStream's behaviour, minus ZMQ."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from jupyter_client.session import Session

from jupyter_sandbox.protocol import framing
from jupyter_sandbox.protocol.messages import DELIM
from jupyter_sandbox.server_extension.direct_channels import (
    CHANNELS,
    DirectLink,
    RelayedMessage,
)

PARTS = [b'{"msg_id": "a", "msg_type": "stream"}', b"{}", b"{}", b'{"text": "hi"}']


def link() -> DirectLink:
    session = SimpleNamespace(suspended=False, released=True, endpoint=None)
    return DirectLink(session)  # type: ignore[arg-type]


def message(n: int) -> RelayedMessage:
    parts = [*PARTS[:3], f'{{"n": {n}}}'.encode()]
    return RelayedMessage(parts, framing.encode("iopub", parts))


async def test_messages_wait_for_a_listener_and_keep_their_order() -> None:
    stream = link().streams["iopub"]
    got: list[Any] = []
    stream.deliver(message(1))
    stream.deliver(message(2))
    stream.on_recv(got.append)
    stream.deliver(message(3))  # behind the two waiting: not before them
    await asyncio.sleep(0)
    assert [m.parts[3] for m in got] == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    stream.stop_on_recv()
    stream.deliver(message(4))
    assert len(got) == 3, "stopped: the message waits"
    stream.on_recv_stream(lambda s, m: got.append((s, m)))
    await asyncio.sleep(0)
    assert got[-1][0] is stream and got[-1][1].parts[3] == b'{"n": 4}'


async def test_closing_every_stream_closes_the_link() -> None:
    direct = link()
    for channel in CHANNELS[:-1]:
        direct.streams[channel].close()
        assert not direct._closing
    direct.streams[CHANNELS[-1]].close()
    assert direct._closing
    assert all(stream.socket.closed for stream in direct.streams.values())
    direct.streams["iopub"].deliver(message(1))  # ignored, not an error


@pytest.mark.parametrize(
    ("frames", "sent"),
    [
        ([DELIM, b"signature", *PARTS], PARTS),
        ([b"identity", DELIM, b"signature", *PARTS, b"buffer"], [*PARTS, b"buffer"]),
    ],
)
def test_a_sent_message_loses_its_envelope(frames: list[bytes], sent: list[bytes]) -> None:
    direct = link()
    seen: list[tuple[str, list[Any]]] = []
    direct.send = lambda channel, parts: seen.append((channel, parts))  # type: ignore[method-assign]
    direct.streams["shell"].send_multipart(frames)
    assert seen == [("shell", sent)]


def test_a_relayed_message_reads_like_a_zmq_one() -> None:
    relayed = message(7)
    idents, fed = Session().feed_identities(relayed)
    assert idents == []
    assert fed[1:] == relayed.parts
    assert framing.decode(relayed.frame or b"") == ("iopub", relayed.parts)
