"""Run shell commands in the workspace with a timeout, whole process group killed on expiry."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 24 * 3600.0
TIMEOUT_EXIT_CODE = 124


@dataclass
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int


def argv_for(command: str, shell: bool) -> list[str]:
    """Upstream's runtime splits with shlex (no shell); ``shell`` opts into /bin/sh -c."""
    if shell:
        return ["/bin/sh", "-c", command]
    argv = shlex.split(command)
    if not argv:
        raise ValueError("command is empty")
    return argv


async def _spawn(argv: list[str], cwd: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run(argv: list[str], *, cwd: str, env: dict[str, str], timeout: float) -> CommandResult:
    """Run to completion; on timeout the output so far is kept and the exit code is 124."""
    out: list[bytes] = []
    err: list[bytes] = []
    code = 0
    async with aclosing(stream(argv, cwd=cwd, env=env, timeout=timeout)) as output:
        async for kind, value in output:
            if kind == "exit":
                assert isinstance(value, int)
                code = value
            else:
                assert isinstance(value, bytes)
                (out if kind == "stdout" else err).append(value)
    return CommandResult(
        b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"), code
    )


async def stream(
    argv: list[str], *, cwd: str, env: dict[str, str], timeout: float
) -> AsyncGenerator[tuple[str, bytes | int], None]:
    """Yield ("stdout"|"stderr", chunk) as output arrives, then ("exit", code)."""
    try:
        proc = await _spawn(argv, cwd, env)
    except (FileNotFoundError, PermissionError) as exc:
        yield ("stderr", f"Failed to execute command: {exc}\n".encode())
        yield ("exit", 127)
        return
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue()

    async def pump(name: str, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(65536):
            await queue.put((name, chunk))
        await queue.put(None)

    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        asyncio.create_task(pump("stdout", proc.stdout)),
        asyncio.create_task(pump("stderr", proc.stderr)),
    ]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    open_pipes = 2
    try:
        while open_pipes:
            try:
                item = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                _kill_group(proc)
                yield ("stderr", f"\ncommand timed out after {timeout:g}s\n".encode())
                await proc.wait()
                yield ("exit", TIMEOUT_EXIT_CODE)
                return
            if item is None:
                open_pipes -= 1
            else:
                yield item
        yield ("exit", await proc.wait())
    finally:
        for task in pumps:
            task.cancel()
        if proc.returncode is None:
            _kill_group(proc)
