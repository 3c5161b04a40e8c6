"""The sandbox terminal: a shell in a sandboxed kernel's sandbox, through a real Jupyter server.

Driven as JupyterLab's terminal widget drives it (terminado's JSON messages on
``/api/sandbox/kernels/<id>/terminal``), against a real server, daemon, runtime
and kernel. What the shell can see is what the kernel can: the notebook's
files, not the host's.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient, websocket

from .helpers import Server, jupyter_server, kernel_socket, suspend_via_api, wait_for

pytestmark = pytest.mark.usefixtures("warm_daemon")


class Terminal:
    """One terminal WebSocket, as JupyterLab's widget opens it."""

    def __init__(self, ws: websocket.WebSocketClientConnection) -> None:
        self.ws = ws
        self.screen = ""

    @classmethod
    async def open(cls, server: Server, kernel_id: str) -> Terminal:
        url = server.url.replace("http", "ws", 1)
        request = httpclient.HTTPRequest(
            f"{url}/api/sandbox/kernels/{kernel_id}/terminal", headers=server.headers()
        )
        terminal = cls(await websocket.websocket_connect(request))
        first = await terminal.message(30)
        assert first == ["setup", {}], first
        return terminal

    async def message(self, timeout: float) -> Any:
        raw = await asyncio.wait_for(self.ws.read_message(), timeout)
        if raw is None:
            return None
        return json.loads(raw)

    def send(self, *message: Any) -> None:
        self.ws.write_message(json.dumps(list(message)))

    async def run(self, command: str, timeout: float = 30) -> str:
        """What ``command`` prints, between two markers the shell echoes."""
        marker = uuid.uuid4().hex[:12]
        self.send("stdin", f"echo {marker}-start; {command}; echo {marker}-end\r")
        pattern = re.compile(rf"{marker}-start\r?\n(.*?){marker}-end\r?\n", re.S)
        deadline = time.monotonic() + timeout
        while not (found := pattern.search(self.screen)):
            message = await self.message(max(0.1, deadline - time.monotonic()))
            if message is None:
                raise ConnectionError(f"the terminal closed; it showed:\n{self.screen}")
            if message[0] == "stdout":
                self.screen += message[1]
        self.screen = self.screen[found.end() :]
        return found.group(1).replace("\r\n", "\n")

    def close(self) -> None:
        self.ws.close()


async def test_the_sandbox_terminal_is_a_shell_where_the_kernel_runs(tmp_path: Path) -> None:
    root = tmp_path / "notebooks"
    (root / "analysis").mkdir(parents=True)
    (root / "analysis" / "data.csv").write_text("a,b\n1,2\n")
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's secret\n")
    with jupyter_server(tmp_path, root=root) as server:
        async with kernel_socket(server, path="analysis/n.ipynb") as (kernel_id, ws):
            seen = await ws.execute("import os; print(os.getcwd(), os.getuid(), os.getpid())")
            kernel_cwd, kernel_uid, _ = seen.stdout.split()
            terminal = await Terminal.open(server, kernel_id)
            try:
                assert (await terminal.run("pwd")).strip() == kernel_cwd
                assert (await terminal.run("id -u")).strip() == kernel_uid
                assert "data.csv" in await terminal.run("ls")
                assert "1,2" in await terminal.run("cat data.csv")
                # the host's files outside the notebook's directory are not there
                host = await terminal.run(f"cat {secret} 2>&1; echo code=$?")
                assert "the host's secret" not in host
                assert "code=1" in host, host
                # a file the shell writes is the kernel's to read
                await terminal.run("echo from-the-terminal > made.txt")
                read = await ws.execute("print(open('made.txt').read().strip())")
                assert read.stdout.strip() == "from-the-terminal"
                assert (root / "analysis" / "made.txt").read_text() == "from-the-terminal\n"
                # the widget's size reaches the terminal
                terminal.send("set_size", 33, 101, 600, 800)
                assert (await terminal.run("stty size")).strip() == "33 101"
                # keystrokes are the kernel's activity: the idle cull waits
                before = (await server.request("GET", f"/api/kernels/{kernel_id}"))["last_activity"]
                await asyncio.sleep(1.1)
                await terminal.run("true")
                after = (await server.request("GET", f"/api/kernels/{kernel_id}"))["last_activity"]
                assert after > before
                shell_pid = (await terminal.run("echo $$")).strip()
                assert shell_pid.isdigit()
            finally:
                terminal.close()

            # Closing the terminal hangs up its shell, in the sandbox.
            async def shell_gone() -> bool:
                probe = await ws.execute(f"import os; print(os.path.exists('/proc/{shell_pid}'))")
                return probe.stdout.strip() == "False"

            await wait_for(shell_gone, 15, interval=0.5)


async def test_a_shell_that_exits_says_so_and_closes(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, _):
            terminal = await Terminal.open(server, kernel_id)
            terminal.send("stdin", "exit 3\r")
            messages = []
            while (message := await terminal.message(20)) is not None:
                messages.append(message)
            assert messages[-1] == ["disconnect", 1], messages


async def test_a_terminal_resumes_a_suspended_sandbox(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, ws):
            await ws.execute("kept = 41 + 1")
            await suspend_via_api(server, kernel_id)
            terminal = await Terminal.open(server, kernel_id)
            try:
                assert (await terminal.run("echo $((6 * 7))")).strip() == "42"
            finally:
                terminal.close()
            model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}")
            assert not model["sandbox"]["suspended"], model


async def test_terminal_requests_that_are_not_allowed_get_a_clear_answer(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        plain = await server.request("POST", "/api/kernels", {"name": "python3"}, expect=201)
        url = server.url.replace("http", "ws", 1)

        async def refused(kernel: str, headers: dict[str, str]) -> tuple[int, str]:
            request = httpclient.HTTPRequest(
                f"{url}/api/sandbox/kernels/{kernel}/terminal", headers=headers
            )
            with pytest.raises(httpclient.HTTPClientError) as caught:
                await websocket.websocket_connect(request)
            body = caught.value.response.body if caught.value.response else b""
            return caught.value.code, (body or b"").decode(errors="replace")

        code, body = await refused(plain["id"], server.headers())
        assert code == 409 and "does not run in a sandbox" in body, (code, body)
        code, body = await refused("not-a-kernel", server.headers())
        assert code == 400 and "not a kernel id" in body, (code, body)
        code, _ = await refused(str(uuid.uuid4()), server.headers())
        assert code == 404
        async with kernel_socket(server) as (kernel_id, _):
            code, _ = await refused(kernel_id, {})  # no token: not this server's user
            assert code == 403
            # A page of another site, riding the browser's login cookie (cross-site
            # WebSocket hijacking); a token in a header is no such risk and skips this.
            login = await httpclient.AsyncHTTPClient().fetch(
                f"{server.url}/lab?token={server.token}", follow_redirects=False, raise_error=False
            )
            cookies = "; ".join(
                c.split(";", 1)[0] for c in login.headers.get_list("Set-Cookie") if "=" in c
            )
            assert cookies, login.headers
            code, _ = await refused(kernel_id, {"Cookie": cookies, "Origin": "http://evil.test"})
            assert code == 403
            own = Terminal(
                await websocket.websocket_connect(
                    httpclient.HTTPRequest(
                        f"{url}/api/sandbox/kernels/{kernel_id}/terminal",
                        headers={"Cookie": cookies, "Origin": server.url},
                    )
                )
            )
            assert await own.message(30) == ["setup", {}]  # the same cookie, its own page
            own.close()
            plain_get = await httpclient.AsyncHTTPClient().fetch(
                f"{server.url}/api/sandbox/kernels/{kernel_id}/terminal",
                headers=server.headers(),
                raise_error=False,
            )
            assert plain_get.code == 400  # not an upgrade: nothing was opened
            assert b"the sandbox terminal is a WebSocket" in plain_get.body
        await server.request("DELETE", f"/api/kernels/{plain['id']}", expect=204)


async def test_the_runtime_refuses_a_ninth_terminal(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, _):
            terminals = [await Terminal.open(server, kernel_id) for _ in range(8)]
            try:
                with pytest.raises(httpclient.HTTPClientError) as caught:
                    await Terminal.open(server, kernel_id)
                assert caught.value.code == 429
            finally:
                for terminal in terminals:
                    terminal.close()


async def test_a_shell_that_prints_without_end_waits_for_its_reader(tmp_path: Path) -> None:
    """Output goes at the pace of the browser: a shell printing as fast as it can
    to a terminal nobody reads costs the Jupyter server no memory to speak of,
    and the terminal still answers once read again."""
    import psutil

    with jupyter_server(tmp_path) as server:
        async with kernel_socket(server) as (kernel_id, _):
            terminal = await Terminal.open(server, kernel_id)
            try:
                jupyter = psutil.Process(server.proc.pid)
                before = jupyter.memory_info().rss
                terminal.send("stdin", "head -c 2000000000 /dev/zero | tr '\\0' x; echo\r")
                await asyncio.sleep(8)  # not reading: the flood must wait for us
                grown = jupyter.memory_info().rss - before
                assert grown < 64 * 1024 * 1024, f"the server grew by {grown >> 20} MB"
                terminal.send("stdin", "\x03")  # Ctrl-C, as a user would
                deadline = time.monotonic() + 60
                while True:  # drain what was held up, until the prompt comes back
                    message = await terminal.message(max(0.1, deadline - time.monotonic()))
                    assert message is not None, "the terminal closed"
                    if message[0] == "stdout" and "$ " in message[1][-200:]:
                        break
                assert (await terminal.run("echo still-here")).strip() == "still-here"
            finally:
                terminal.close()
