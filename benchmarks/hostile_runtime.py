"""A neighbour's round trip while another sandbox's runtime floods its connection.

The Jupyter server (and a bridge) reads every sandbox's kernel WebSocket in one
event loop, so what one runtime sends can delay everybody's messages. Here this
process plays that loop with two kernel WebSocket clients (the project's own,
``kernel_provisioner/ws_client``): one to a hostile runtime that sends empty
frames as fast as it can, one to a well-behaved runtime that echoes. Both
runtimes are one separate process. The figure: the neighbour's round trip during
the flood against the same round trip with the hostile runtime quiet.

    python -m benchmarks.hostile_runtime serve PORT   # the two runtimes (internal)
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

from tornado import httpclient, httpserver, netutil, web, websocket

from jupyter_sandbox.kernel_provisioner import ws_client

from .stats import Figure, Series

EMPTY_FRAMES = b"\x82\x00" * 32768  # 32768 empty binary frames in one write


class Flood(websocket.WebSocketHandler):
    async def open(self, *args: str, **kwargs: str) -> None:
        assert self.ws_connection is not None and self.ws_connection.stream is not None
        stream = self.ws_connection.stream
        while not stream.closed():
            await stream.write(EMPTY_FRAMES)


class Echo(websocket.WebSocketHandler):
    def on_message(self, message: str | bytes) -> None:
        self.write_message(message, binary=isinstance(message, bytes))


def serve(port: int) -> None:
    async def run() -> None:
        app = web.Application([("/flood", Flood), ("/echo", Echo)])
        server = httpserver.HTTPServer(app)
        server.add_sockets(netutil.bind_sockets(port, "127.0.0.1"))
        await asyncio.Event().wait()

    asyncio.run(run())


async def _round_trips(url: str, count: int) -> list[float]:
    replies: asyncio.Queue[bytes | None] = asyncio.Queue()
    ws = await ws_client.websocket_connect(
        httpclient.HTTPRequest(url),
        on_message_callback=lambda m: replies.put_nowait(None if m is None else bytes(m)),
    )
    times = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            ws.write_binary(b"1+1")
            await asyncio.wait_for(replies.get(), 30)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        ws.close()
    return times


async def neighbour_during_flood(count: int) -> Figure:
    port = netutil.bind_sockets(0, "127.0.0.1")[0].getsockname()[1]
    runtimes = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.hostile_runtime", "serve", str(port)]
    )
    try:
        base = f"ws://127.0.0.1:{port}"
        for _ in range(100):
            try:
                await _round_trips(f"{base}/echo", 1)
                break
            except OSError:
                await asyncio.sleep(0.1)
        quiet = await _round_trips(f"{base}/echo", count)
        frames = 0

        def count_frame(message: object) -> None:
            nonlocal frames
            frames += 1

        flood = await ws_client.websocket_connect(
            httpclient.HTTPRequest(f"{base}/flood"), on_message_callback=count_frame
        )
        try:
            await asyncio.sleep(0.5)  # the flood is on
            during = await _round_trips(f"{base}/echo", count)
        finally:
            flood.close()
    finally:
        runtimes.kill()
        runtimes.wait()
    return Figure(
        "neighbour round trip during a frame flood (ms)",
        Series("during the flood", "ms", during),
        Series("runtime quiet", "ms", quiet),
        "p90 < 100 ms",
        notes=f"{frames} empty frames handled during the flood; max {max(during):.1f} ms",
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        figure = asyncio.run(neighbour_during_flood(200))
        from .stats import table

        print(table([figure]))
