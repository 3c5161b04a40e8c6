"""The host's calls to a runtime against a hostile runtime: a tornado app on
loopback plays a sandbox whose runtime answers with more than it was asked for,
with what is not JSON, or refuses what a shutdown needs.

The review's figures: a 400 MB listing cost the Jupyter server 839 MB (copy-back
lists at every suspend and shutdown), and a 1.5 GB sparse file, which costs the
sandbox no disk, took the server from 93 MB to 4.18 GB through the workspace
download handler, which held the whole file.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest
from tornado import httpserver, testing, web

from jupyter_sandbox.control_plane import runtime_client
from jupyter_sandbox.control_plane.base import Endpoint
from jupyter_sandbox.kernel_provisioner import runtime_files
from jupyter_sandbox.kernel_provisioner.session import SandboxSession

CHUNK = 64 * 1024


class HugeListing(web.RequestHandler):
    async def get(self, path: str) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(b"[")
        entry = b'{"name": "x", "size": 1, "type": "file", "mod_time": 0},'
        for _ in range(runtime_files.LIST_MAX_BYTES // len(entry) + 10):
            self.write(entry)
        self.write(b'{"name": "last"}]')


class KernelCalls(web.RequestHandler):
    """/api/kernel/*: signal refused, status huge, info not JSON."""

    def post(self, what: str) -> None:
        if what in ("signal", "interrupt"):
            self.set_status(404)
            self.finish({"message": "no such kernel"})
        elif what == "status":
            self.finish(b"{" + b'"x": 1,' * 400_000 + b'"y": 2}')
        else:
            self.finish(b"<html>not json</html>")


class EndlessFile(web.RequestHandler):
    """Sends as fast as the host reads; counts what it could hand over."""

    sent = 0

    async def get(self, path: str) -> None:
        EndlessFile.sent = 0
        block = b"\0" * CHUNK
        while EndlessFile.sent < 512 * 1024 * 1024:
            self.write(block)
            await self.flush()  # waits until the host's side of the socket takes it
            EndlessFile.sent += CHUNK


@pytest.fixture
async def runtime() -> AsyncIterator[Endpoint]:
    sock, port = testing.bind_unused_port()
    server = httpserver.HTTPServer(
        web.Application(
            [
                (r"/list/(.*)", HugeListing),
                (r"/download/(.*)", EndlessFile),
                (r"/api/kernel/(.*)", KernelCalls),
            ]
        )
    )
    server.add_sockets([sock])
    yield Endpoint(f"http://127.0.0.1:{port}", "ns", "hostile")
    server.stop()


async def test_a_listing_over_the_bound_is_refused_before_it_is_held(runtime: Endpoint) -> None:
    with pytest.raises(runtime_files.RuntimeFileError, match="the listing is over"):
        await runtime_files.list_dir(runtime, "")


async def test_a_download_goes_at_the_pace_of_its_sink(runtime: Endpoint) -> None:
    """A sink that takes its time (a browser on a slow link) holds the runtime back:
    what the runtime managed to send stays within a few socket buffers of what the
    sink took, instead of piling up in the host's memory."""
    taken = 0

    async def slow(chunk: bytes) -> None:
        nonlocal taken
        taken += len(chunk)
        await asyncio.sleep(0.002)

    with pytest.raises(runtime_files.RuntimeFileError, match="larger than"):
        await runtime_files.download(runtime, "big", slow, 16 * 1024 * 1024)
    ahead = EndlessFile.sent - taken
    assert ahead < 16 * 1024 * 1024, f"the runtime got {ahead >> 20} MiB ahead of the sink"


@pytest.mark.parametrize(
    ("what", "why"),
    [("status", "no usable answer"), ("info", "not JSON"), ("signal", "answered 404")],
)
async def test_a_kernel_call_answer_is_bounded_and_checked(
    runtime: Endpoint, what: str, why: str
) -> None:
    with pytest.raises(runtime_client.RuntimeCallError, match=why):
        await runtime_client.call(runtime, "POST", f"api/kernel/{what}", {"signum": 15})


async def test_a_shutdown_goes_on_when_the_runtime_refuses_the_signals(runtime: Endpoint) -> None:
    """The review's runtime answered /api/kernel/signal with 404: DELETE
    /api/sessions failed with 500 and the claim stayed. terminate() now takes a
    refusing runtime's kernel as killed, so jupyter_client goes on to cleanup."""
    session = SandboxSession.__new__(SandboxSession)
    session.endpoint = runtime
    session.suspended = False
    session.exit_code = None
    await session.terminate()
    assert session.exit_code == -signal.SIGKILL
