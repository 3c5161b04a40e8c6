"""send_now: a direct send on a zmq.asyncio socket must not strand a pending receive.

libzmq's notification fd is edge-triggered: a send that bypasses zmq.asyncio can
consume the edge that announced an incoming message, and the receive that waits
on the event loop would then sleep until some later traffic (the cause of shell
replies going missing after a kernel restart under load).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import zmq
import zmq.asyncio

from jupyter_sandbox.protocol.zmqsend import send_now


async def test_a_receive_pending_during_a_direct_send_still_completes(tmp_path: Path) -> None:
    ctx = zmq.asyncio.Context()
    sync_ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path}/edge"
    router = sync_ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.IDENTITY, b"dealer")
        dealer.bind(endpoint)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.connect(endpoint)
        deadline = time.monotonic() + 5
        while True:  # wait until the router knows the dealer
            try:
                router.send_multipart([b"dealer", b"hello"])
                break
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        assert await asyncio.wait_for(dealer.recv_multipart(), 5) == [b"hello"]

        for round_ in range(20):
            pending = asyncio.ensure_future(dealer.recv_multipart())
            await asyncio.sleep(0)  # the receive now waits on the event loop
            router.send_multipart([b"dealer", b"reply %d" % round_])
            time.sleep(0.02)  # noqa: ASYNC251 -- the message lands while the loop is not looking
            send_now(dealer, [b"request"])  # and a direct send takes its edge
            assert await asyncio.wait_for(pending, 5) == [b"reply %d" % round_]
            assert router.recv_multipart() == [b"dealer", b"request"]
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()
        sync_ctx.term()
