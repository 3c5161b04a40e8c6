"""SocketPump: every message is received, and sends keep their order, on real ZMQ sockets.

libzmq's descriptor is edge-triggered: a send may take the edge that announced an
incoming message, and a pump that only waited for the descriptor would then sleep
until later traffic. A send that meets a full queue must wait, in order.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import zmq

from jupyter_sandbox.protocol.zmqpump import SocketPump


async def wait_until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_a_message_that_lands_during_a_send_is_still_received(tmp_path: Path) -> None:
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/edge"
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"dealer")
    dealer.bind(endpoint)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.connect(endpoint)
    received: list[bytes] = []
    pump = SocketPump(dealer, lambda frames: received.append(frames[0].bytes))
    try:
        deadline = time.monotonic() + 5
        while True:  # until the router knows the dealer
            try:
                router.send_multipart([b"dealer", b"hello"])
                break
            except zmq.ZMQError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
        await wait_until(lambda: received == [b"hello"])
        for round_ in range(20):
            router.send_multipart([b"dealer", b"reply %d" % round_])
            time.sleep(0.02)  # noqa: ASYNC251 -- it lands while the loop is not looking
            pump.send([b"request"])  # and the send takes its edge
            await wait_until(lambda expected=round_ + 2: len(received) == expected)
            assert received[-1] == b"reply %d" % round_
            assert router.recv_multipart() == [b"dealer", b"request"]
    finally:
        pump.close()
        router.close(linger=0)
        ctx.term()


async def test_sends_refused_by_a_full_queue_go_out_later_in_order(tmp_path: Path) -> None:
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/later"
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 1)
    dealer.connect(endpoint)  # nobody there yet: the queue takes little or nothing
    pump = SocketPump(dealer, lambda frames: None)
    router = ctx.socket(zmq.ROUTER)
    try:
        for number in range(50):
            pump.send([b"part one", b"message %d" % number])
        assert pump.queued > 0, "the socket took all 50 with no peer"
        router.bind(endpoint)
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 50:
            assert time.monotonic() < deadline, f"only {len(got)} arrived"
            if router.poll(10):
                _identity, first, second = router.recv_multipart()
                assert first == b"part one"
                got.append(second)
            await asyncio.sleep(0)  # let the pump hear that the queue has room
        assert got == [b"message %d" % number for number in range(50)]
        assert pump.queued == 0
    finally:
        pump.close()
        router.close(linger=0)
        ctx.term()


async def test_a_closed_pump_closes_its_socket_and_refuses_sends(tmp_path: Path) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.bind(f"ipc://{tmp_path}/closed")
    pump = SocketPump(sock, lambda frames: None)
    pump.close()
    assert sock.closed
    try:
        pump.send([b"late"])
    except zmq.ZMQError:
        pass
    else:
        raise AssertionError("a closed pump took a message")
    ctx.term()
