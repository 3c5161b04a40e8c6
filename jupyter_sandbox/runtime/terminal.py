"""A shell on a pseudo-terminal in the sandbox, for the sandbox terminal.

The shell runs as the kernel does (same user, environment and confinement: the
runtime's Landlock rules hold for every process it starts), in the kernel's
working directory. Reads wait for the reader (``read`` is awaited by one sender
at a time), so a shell that prints without end is held up by a slow client, not
buffered in memory; input waiting for the shell to read it is bounded too.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import os
import shutil
import signal

from ptyprocess import PtyProcess

READ_BYTES = 64 * 1024
MAX_PENDING_INPUT = 4 * 1024 * 1024
HANGUP_GRACE = 2.0
SHELLS = ("bash", "sh")


class InputOverflow(RuntimeError):
    """The shell has not read this much input yet: more is refused."""


def shell_argv(env: dict[str, str]) -> list[str]:
    """An interactive shell (not a login one: /etc/profile would reset PATH)."""
    for name in SHELLS:
        found = shutil.which(name, path=env.get("PATH") or os.defpath)
        if found:
            return [found, "-i"] if name == "bash" else [found]
    raise FileNotFoundError("no shell (bash or sh) in the sandbox")


def shell_env(env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    out["TERM"] = "xterm-256color"
    out.setdefault("PS1", r"sandbox:\w\$ ")
    return out


class PtyShell:
    def __init__(self, *, cwd: str, env: dict[str, str], rows: int = 24, columns: int = 80) -> None:
        env = shell_env(env)
        self._process = PtyProcess.spawn(
            shell_argv(env), cwd=cwd, env=env, dimensions=(rows, columns)
        )
        self.pid: int = self._process.pid
        self._fd: int = self._process.fd
        os.set_blocking(self._fd, False)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = bytearray()
        self._loop = asyncio.get_running_loop()
        self._closed = False

    async def read(self) -> str | None:
        """The next output, or None once the shell has gone (and its terminal with it)."""
        while not self._closed:
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                await self._readable()
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # no process holds the terminal any more
                    return None
                raise
            if not data:
                return None
            text = self._decoder.decode(data)
            if text:
                return text
        return None

    async def _readable(self) -> None:
        ready = self._loop.create_future()
        self._loop.add_reader(self._fd, ready.set_result, None)
        try:
            await ready
        finally:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._fd)

    def write(self, text: str) -> None:
        if self._closed:
            return
        data = text.encode()
        if len(self._pending) + len(data) > MAX_PENDING_INPUT:
            raise InputOverflow(f"the shell has {len(self._pending)} bytes of input still unread")
        was_idle = not self._pending
        self._pending += data
        if was_idle:
            self._flush()

    def _flush(self) -> None:
        if self._closed:
            return
        try:
            written = os.write(self._fd, self._pending)
        except BlockingIOError:
            written = 0
        except OSError:
            self._pending.clear()  # the shell is gone; read() says so
            return
        del self._pending[:written]
        if self._pending:
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_writer(self._fd)
        self._flush()

    def resize(self, rows: int, columns: int) -> None:
        if not self._closed:
            with contextlib.suppress(OSError):
                self._process.setwinsize(rows, columns)

    async def close(self) -> None:
        """Hang up (as closing a terminal window does), then kill what is left."""
        if self._closed:
            return
        self._closed = True
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            with contextlib.suppress(ValueError, OSError):
                remove(self._fd)
        with contextlib.suppress(OSError):
            self._process.fileobj.close()  # the session's processes get SIGHUP
        # Reaped here, not by ptyprocess (whose clean-up sleeps, blocking the loop).
        self._process.closed = True
        self._signal(signal.SIGHUP)
        deadline = self._loop.time() + HANGUP_GRACE
        while self._loop.time() < deadline:
            if self._reaped():
                return
            await asyncio.sleep(0.05)
        self._signal(signal.SIGKILL)
        await asyncio.to_thread(self._wait)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def _reaped(self) -> bool:
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return True
        return pid == self.pid

    def _wait(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
