"""The local control plane as the provisioner and SDK see it: a client of the daemon.

The daemon is started on first use (detached, so it outlives the process that
started it and serves every Jupyter server and nbclient run of the user).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
from tornado import httpclient
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from ...router.upstreams import UnixSocketResolver, Upstream
from ..base import (
    BackendUnavailable,
    ClaimNotFound,
    ClaimRequest,
    ClaimStatus,
    ClaimTimeout,
    ControlPlane,
    Phase,
    PoolStatus,
    error_from_json,
)
from .controller import last_line
from .paths import socket_path, state_dir

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT = 30.0


class LocalControlPlane(ControlPlane):
    settles_files_dir = True  # bound at the claim, or refused, or the pool's fallback

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
        self._http: SimpleAsyncHTTPClient | None = None
        self._start_lock = asyncio.Lock()

    @property
    def http(self) -> SimpleAsyncHTTPClient:
        if self._http is None:
            self._http = SimpleAsyncHTTPClient(
                force_instance=True, resolver=self._resolver, max_clients=100
            )
        return self._http

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
            if self._socket.exists():
                return
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

    async def _call(
        self, method: str, path: str, body: Any = None, *, retry: bool = True, timeout: float = 60.0
    ) -> Any:
        if retry:
            await self.ensure_daemon()
        request = httpclient.HTTPRequest(
            f"http://{self._authority}{path}",
            method=method,
            body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
            headers={"Content-Type": "application/json"},
            request_timeout=timeout + 5,
            allow_nonstandard_methods=True,
        )
        try:
            response = await self.http.fetch(request, raise_error=False)
        except OSError as exc:
            raise BackendUnavailable(f"local sandbox daemon unreachable: {exc}") from None
        if response.code == 599:
            raise BackendUnavailable(f"local sandbox daemon unreachable: {response.error}")
        if response.code == 204:
            return None
        try:
            data = json.loads(response.body or b"null")
        except ValueError:
            data = {"message": response.body.decode(errors="replace")}
        if response.code >= 400:
            if isinstance(data, dict) and "reason" in data:
                raise error_from_json(data)
            if response.code == 404:
                raise ClaimNotFound(f"{path} not found")
            raise BackendUnavailable(f"daemon answered {response.code}: {data}")
        return data

    # -- ControlPlane --------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimStatus:
        body: dict[str, Any] = {
            "pool": request.pool,
            "labels": request.labels,
            "env": request.env,
            "owner_pid": request.owner_pid,
        }
        if request.orphan_grace is not None:
            body["orphan_grace"] = request.orphan_grace
        if request.name:
            body["name"] = request.name
        if request.files_dir:
            body["files_dir"] = request.files_dir
            body["files_optional"] = request.files_optional
        return ClaimStatus.from_json(await self._call("POST", "/api/claims", body))

    async def wait_ready(self, name: str, timeout: float) -> ClaimStatus:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClaimTimeout(f"claim {name} not ready after {timeout:g}s")
            chunk = min(remaining, 600.0)
            status = ClaimStatus.from_json(
                await self._call(
                    "GET",
                    f"/api/claims/{quote(name)}?wait=Ready&timeout={chunk:.3f}",
                    timeout=chunk,
                )
            )
            if status.phase == Phase.READY:
                return status
            if status.phase == Phase.FAILED:
                from ..base import ClaimError

                raise ClaimError(f"claim {name} failed: {status.message}")

    async def suspend(self, name: str) -> ClaimStatus:
        return ClaimStatus.from_json(await self._call("POST", f"/api/claims/{quote(name)}/suspend"))

    async def resume(self, name: str) -> ClaimStatus:
        return ClaimStatus.from_json(await self._call("POST", f"/api/claims/{quote(name)}/resume"))

    async def adopt(self, name: str, owner_pid: int) -> ClaimStatus:
        return ClaimStatus.from_json(
            await self._call("POST", f"/api/claims/{quote(name)}/adopt", {"owner_pid": owner_pid})
        )

    async def release(self, name: str) -> None:
        try:
            await self._call("DELETE", f"/api/claims/{quote(name)}")
        except ClaimNotFound:
            pass

    async def status(self, name: str) -> ClaimStatus | None:
        try:
            return ClaimStatus.from_json(await self._call("GET", f"/api/claims/{quote(name)}"))
        except ClaimNotFound:
            return None

    async def list_claims(self, labels: dict[str, str] | None = None) -> list[ClaimStatus]:
        query = "&".join(f"label={quote(k)}%3D{quote(v)}" for k, v in (labels or {}).items())
        data = await self._call("GET", "/api/claims" + (f"?{query}" if query else ""))
        return [ClaimStatus.from_json(item) for item in data["items"]]

    async def list_pools(self) -> list[PoolStatus]:
        data = await self._call("GET", "/api/pools")
        return [PoolStatus(**item) for item in data["items"]]

    async def apply_pool(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return await self._call("PUT", f"/api/pools/{quote(name)}", spec)  # type: ignore[no-any-return]

    async def delete_pool(self, name: str) -> None:
        await self._call("DELETE", f"/api/pools/{quote(name)}")

    async def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
