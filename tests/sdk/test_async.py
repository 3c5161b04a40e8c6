"""The asyncio API: same operations, ``async with`` releases even when cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from jupyter_sandbox.client import AsyncSandboxClient, SandboxWarmPoolNotFoundError
from jupyter_sandbox.control_plane.local.client import LocalControlPlane


async def names(home: Path) -> set[str]:
    plane = LocalControlPlane(home)
    try:
        return {c.name for c in await plane.list_claims()}
    finally:
        await plane.close()


async def test_async_api(warm_daemon: Path) -> None:
    async with AsyncSandboxClient() as client:
        async with await client.create_sandbox(warmpool="default") as sb:
            name = sb.claim_name
            assert name in await names(warm_daemon)
            await sb.files.write("a/b.bin", b"\x00\xff" * 1000)
            assert await sb.files.read("a/b.bin") == b"\x00\xff" * 1000
            assert [e.name for e in await sb.files.list("a")] == ["b.bin"]
            assert await sb.files.exists("a/b.bin")
            result = await sb.commands.run("sh -c 'cat a/b.bin | wc -c; exit 2'")
            assert (result.stdout.strip(), result.exit_code) == ("2000", 2)
            assert (await sb.commands.run("sleep 30", timeout=1)).exit_code == 124

            chunks = []
            stream = sb.commands.stream("sh -c 'echo 1; sleep 0.2; echo 2'")
            async for chunk in stream:
                chunks.append(chunk.text)
            assert "".join(chunks) == "1\n2\n" and stream.exit_code == 0

            kc = await sb.kernel()
            reply = await kc.execute_interactive("print('async', 1 + 1)", timeout=60)
            assert reply["content"]["status"] == "ok"
            assert await sb.status() == ("SandboxReady", sb.claim_status.message)
        assert name not in await names(warm_daemon)

        with pytest.raises(SandboxWarmPoolNotFoundError):
            await client.create_sandbox(warmpool="nope")


async def test_cancellation_releases_the_claim(warm_daemon: Path) -> None:
    seen: list[str] = []
    claimed = asyncio.Event()

    async def work() -> None:
        async with AsyncSandboxClient() as client:
            async with await client.create_sandbox(warmpool="default") as sb:
                assert sb.claim_name
                seen.append(sb.claim_name)
                claimed.set()
                await sb.commands.run("sleep 60", timeout=120)

    task = asyncio.create_task(work())
    await asyncio.wait_for(claimed.wait(), 120)
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen[0] not in await names(warm_daemon)
