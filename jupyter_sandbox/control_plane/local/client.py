"""The local control plane as the provisioner and SDK see it: a client of the daemon.

The daemon is started on first use (detached, so it outlives the process that
started it and serves every Jupyter server and nbclient run of the user).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from ...router.upstreams import UnixSocketResolver, Upstream
from ..base import BackendUnavailable
from ..http_client import MAX_ANSWER_BYTES, HttpControlPlane
from .controller import last_line
from .paths import socket_path, state_dir

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT = 30.0


class LocalControlPlane(HttpControlPlane):
    settles_files_dir = True  # bound at the claim, or refused, or the pool's fallback
    service = "the local sandbox daemon"

    def __init__(
        self,
        base: Path | None = None,
        *,
        autostart: bool = True,
        daemon_args: list[str] | None = None,
    ) -> None:
        self.base = base or state_dir()
        self.base.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.autostart = autostart
        self.daemon_args = daemon_args or []
        self._socket = socket_path(self.base)
        self._resolver = UnixSocketResolver()
        upstream = Upstream(unix_socket=str(self._socket))
        self._resolver.register(upstream)
        self._authority = upstream.authority()
        self._start_lock = asyncio.Lock()
        super().__init__()

    @property
    def base_url(self) -> str:
        return f"http://{self._authority}"

    def make_http(self) -> SimpleAsyncHTTPClient:
        return SimpleAsyncHTTPClient(
            force_instance=True,
            resolver=self._resolver,
            max_clients=100,
            max_body_size=MAX_ANSWER_BYTES,
        )

    async def before_call(self) -> None:
        await self.ensure_daemon()

    # -- daemon ------------------------------------------------------------

    async def ensure_daemon(self) -> dict[str, Any]:
        try:
            return await self._call("GET", "/api/info", retry=False)
        except BackendUnavailable:
            if not self.autostart:
                raise
        async with self._start_lock:
            try:
                return await self._call("GET", "/api/info", retry=False)
            except BackendUnavailable:
                pass
            self._spawn_daemon()
            deadline = time.monotonic() + DAEMON_START_TIMEOUT
            while time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                try:
                    return await self._call("GET", "/api/info", retry=False)
                except BackendUnavailable:
                    continue
        log_path = self.base / "daemon.log"
        raise BackendUnavailable(
            f"the local sandbox daemon did not start: {last_line(str(log_path))} (see {log_path})"
        )

    def _spawn_daemon(self) -> None:
        # Serialize spawning across processes; the daemon's own lock makes extra ones exit.
        with open(self.base / "spawn.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _daemon_holds_lock(self.base):
                return  # starting, or serving: the caller waits for its answer
            log_file = open(self.base / "daemon.log", "ab")
            env = {
                k: v
                for k, v in os.environ.items()
                if k.startswith(
                    (
                        "JUPYTER_SANDBOX_",
                        "PATH",
                        "LANG",
                        "LC_",
                        "HOME",
                        "TMPDIR",
                        "PYTHONPATH",
                        "VIRTUAL_ENV",
                        "JUPYTER_",
                        "PROXY_TIMEOUT_SECONDS",
                        # pip's settings: the daemon installs pools' requirements
                        # with them and forwards the index (never credentials).
                        "PIP_",
                        "XDG_CONFIG_",
                        "SSL_CERT_",
                        "REQUESTS_CA_BUNDLE",
                        "HTTP_PROXY",
                        "HTTPS_PROXY",
                        "NO_PROXY",
                        "http_proxy",
                        "https_proxy",
                        "no_proxy",
                    )
                )
            }
            launcher = subprocess.Popen(
                [
                    sys.executable,
                    "-P",  # never import from the caller's working directory
                    "-m",
                    "jupyter_sandbox.control_plane.local.daemon",
                    "--state-dir",
                    str(self.base),
                    "--detach",  # the daemon forks away: never our zombie
                    *self.daemon_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                close_fds=True,
                cwd="/",
                env=env,
            )
            log_file.close()
            launcher.wait(30)

    async def stop_daemon(self) -> None:
        try:
            info = await self._call("GET", "/api/info", retry=False)
            await self._call("POST", "/api/shutdown", retry=False)
        except BackendUnavailable:
            return
        pid = int(info.get("pid", 0))
        deadline = time.monotonic() + 30
        while pid and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return  # exited; whoever it was re-parented to has yet to reap it
            except psutil.NoSuchProcess:
                return
            await asyncio.sleep(0.05)

    async def apply_pool(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return await self._call("PUT", f"/api/pools/{quote(name)}", spec)  # type: ignore[no-any-return]

    async def delete_pool(self, name: str) -> None:
        await self._call("DELETE", f"/api/pools/{quote(name)}")


def _daemon_holds_lock(base: Path) -> bool:
    """Whether a daemon runs for ``base``: it holds ``daemon.lock`` while it lives.
    A socket file alone says nothing: a daemon killed outright leaves its socket."""
    try:
        handle = open(base / "daemon.lock", "a")
    except OSError:
        return False
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
