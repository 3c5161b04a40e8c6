"""A real JupyterHub for tests: started from ``hubconfig.py``, with users and tokens."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from tornado import httpclient

from tests.cluster.controlplane import free_ports
from tests.helpers import Server

HERE = Path(__file__).parent


def find_chp() -> str | None:
    """configurable-http-proxy from $JUPYTERHUB_TEST_CHP, PATH or a local npm install."""
    candidates = [
        os.environ.get("JUPYTERHUB_TEST_CHP"),
        shutil.which("configurable-http-proxy"),
        str(Path.cwd() / "node_modules" / ".bin" / "configurable-http-proxy"),
    ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@dataclass
class Hub:
    url: str
    api_url: str  # the hub's own API (what the router asks), not through the proxy
    admin_token: str
    root: Path
    proc: subprocess.Popen[bytes]
    users: tuple[str, ...]
    tokens: dict[str, str]

    def home(self, user: str) -> Path:
        return self.root / "sandbox" / user

    async def api(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> httpclient.HTTPResponse:
        return await httpclient.AsyncHTTPClient().fetch(
            f"{self.url}{path}",
            method=method,
            headers={"Authorization": f"token {token or self.admin_token}"},
            body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
            raise_error=False,
            request_timeout=120,
            allow_nonstandard_methods=True,
        )

    def server(self, user: str, token: str | None = None) -> Server:
        """tests.helpers.Server for ``user``'s single-user server, behind the hub's proxy."""
        return Server(
            f"{self.url}/user/{user}", token or self.tokens[user], self.proc, self.root, self.log
        )

    @property
    def log(self) -> Path:
        return self.root / "hub.log"

    async def user_model(self, user: str) -> dict[str, Any]:
        return json.loads((await self.api("GET", f"/hub/api/users/{user}")).body)

    async def start_server(self, user: str, timeout: float = 300) -> dict[str, Any]:
        """Spawn ``user``'s default server; its model once the hub calls it ready."""
        response = await self.api("POST", f"/hub/api/users/{user}/server")
        assert response.code in (201, 202), response.body
        return await self.wait_ready(user, timeout)

    async def wait_ready(self, user: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            server = (await self.user_model(user)).get("servers", {}).get("", {})
            if server.get("ready"):
                return server
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user}'s server did not start:\n{self.log.read_text()}")
            await asyncio.sleep(0.5)

    async def stop_server(self, user: str, *, wait: bool = True, timeout: float = 60) -> None:
        await self.api("DELETE", f"/hub/api/users/{user}/server")
        if wait:
            await self.wait_stopped(user, timeout)

    async def wait_stopped(self, user: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (await self.user_model(user)).get("servers"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user}'s server did not stop:\n{self.log.read_text()}")
            await asyncio.sleep(0.5)


@contextmanager
def running_hub(
    root: Path,
    users: tuple[str, ...],
    *,
    spawn: bool,
    api_ip: str = "127.0.0.1",
    config: str = "hubconfig.py",
    env: dict[str, str] | None = None,
) -> Iterator[Hub]:
    """JupyterHub with ``users`` and an API token each; with ``spawn`` their
    single-user servers too (stopped again on exit).  The hub's own API listens
    on ``api_ip``.  ``config`` is a file here (``kubehubconfig.py``: KubeSpawner,
    its settings in ``env``)."""
    chp = find_chp()
    if chp is None:
        message = "configurable-http-proxy not found (npm install -g configurable-http-proxy)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    pytest.importorskip("jupyterhub")
    for user in users:
        (root / "homes" / user).mkdir(parents=True)
    port, api_port, proxy_api_port = free_ports(3)
    env = {
        **os.environ,
        **(env or {}),
        "JSBX_HUB_ROOT": str(root),
        "JSBX_HUB_PORT": str(port),
        "JSBX_HUB_API_PORT": str(api_port),
        "JSBX_HUB_PROXY_API_PORT": str(proxy_api_port),
        "JSBX_HUB_CHP": chp,
        "JSBX_HUB_ADMIN_TOKEN": uuid.uuid4().hex,
        "JSBX_HUB_API_IP": api_ip,
    }
    log = open(root / "hub.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(HERE / config)],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    hub = Hub(
        f"http://127.0.0.1:{port}",
        f"http://{api_ip}:{api_port}/hub/api",
        env["JSBX_HUB_ADMIN_TOKEN"],
        root,
        proc,
        users,
        {},
    )
    try:
        asyncio.run(_create_users(hub))
        if spawn:
            asyncio.run(_spawn_servers(hub))
        yield hub
    finally:
        if spawn:
            try:
                asyncio.run(_stop_servers(hub))
            except Exception:
                pass
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _kill_leftovers(root)


async def _create_users(hub: Hub) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            response = await hub.api("GET", "/hub/api/")
            if response.code == 200:
                break
        except OSError:
            pass
        if hub.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("jupyterhub did not start:\n" + hub.log.read_text(errors="replace"))
        await asyncio.sleep(0.3)
    for user in hub.users:
        response = await hub.api("POST", f"/hub/api/users/{user}")
        assert response.code in (201, 409), response.body
        response = await hub.api("POST", f"/hub/api/users/{user}/tokens", {"note": "test"})
        assert response.code == 201, response.body
        hub.tokens[user] = json.loads(response.body)["token"]


async def _spawn_servers(hub: Hub) -> None:
    for user in hub.users:
        response = await hub.api("POST", f"/hub/api/users/{user}/server")
        assert response.code in (201, 202), response.body
    for user in hub.users:
        await hub.wait_ready(user, 180)


async def _stop_servers(hub: Hub) -> None:
    for user in hub.users:
        await hub.stop_server(user, wait=False)
    for user in hub.users:
        await hub.wait_stopped(user, 60)


def _kill_leftovers(root: Path) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        if str(root) in " ".join(proc.info["cmdline"] or []):
            proc.kill()
