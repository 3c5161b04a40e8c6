"""A client of the claims HTTP API: the local daemon's or a claim service's.

Both serve the same paths and bodies (``control_plane/http_api.py``); a
subclass says where the API is (``base_url``), how to reach it (``make_http``)
and what to show it (``headers``).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote

from tornado import httpclient
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from .base import (
    BackendUnavailable,
    ClaimError,
    ClaimNotFound,
    ClaimRequest,
    ClaimStatus,
    ClaimTimeout,
    ControlPlane,
    Phase,
    PoolStatus,
    error_from_json,
)

# Listings of a few thousand claims fit; nothing a server answers is held past this.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
SUSPEND_TIMEOUT = 3660.0


class HttpControlPlane(ControlPlane):
    """Claim, wait, suspend, resume, release, status and list over HTTP."""

    #: Who answers, for messages ("the local sandbox daemon").
    service = "the claims API"

    def __init__(self) -> None:
        self._http: SimpleAsyncHTTPClient | None = None

    @property
    def base_url(self) -> str:
        raise NotImplementedError

    def headers(self) -> dict[str, str]:
        return {}

    def make_http(self) -> SimpleAsyncHTTPClient:
        return SimpleAsyncHTTPClient(
            force_instance=True, max_clients=100, max_body_size=MAX_ANSWER_BYTES
        )

    @property
    def http(self) -> SimpleAsyncHTTPClient:
        if self._http is None:
            self._http = self.make_http()
        return self._http

    async def before_call(self) -> None:
        """Make sure the API is there (the local daemon starts on first use)."""

    def status_from_json(self, data: dict[str, Any]) -> ClaimStatus:
        return ClaimStatus.from_json(data)

    def claim_body(self, request: ClaimRequest) -> dict[str, Any]:
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
        return body

    async def _call(
        self, method: str, path: str, body: Any = None, *, retry: bool = True, timeout: float = 60.0
    ) -> Any:
        if retry:
            await self.before_call()
        request = httpclient.HTTPRequest(
            self.base_url + path,
            method=method,
            body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
            headers={**self.headers(), "Content-Type": "application/json"},
            request_timeout=timeout + 5,
            allow_nonstandard_methods=True,
        )
        try:
            response = await self.http.fetch(request, raise_error=False)
        except OSError as exc:
            raise BackendUnavailable(f"{self.service} is unreachable: {exc}") from None
        if response.code == 599:
            raise BackendUnavailable(f"{self.service} is unreachable: {response.error}")
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
            raise BackendUnavailable(f"{self.service} answered {response.code}: {data}")
        return data

    async def claim(self, request: ClaimRequest) -> ClaimStatus:
        body = self.claim_body(request)
        return self.status_from_json(await self._call("POST", "/api/claims", body))

    async def wait_ready(self, name: str, timeout: float) -> ClaimStatus:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ClaimTimeout(f"claim {name} not ready after {timeout:g}s")
            chunk = min(remaining, 600.0)
            status = self.status_from_json(
                await self._call(
                    "GET",
                    f"/api/claims/{quote(name)}?wait=Ready&timeout={chunk:.3f}",
                    timeout=chunk,
                )
            )
            if status.phase == Phase.READY:
                return status
            if status.phase == Phase.FAILED:
                raise ClaimError(f"claim {name} failed: {status.message}")

    async def suspend(self, name: str, *, force: bool = False) -> ClaimStatus:
        body = {"force": True} if force else None
        path = f"/api/claims/{quote(name)}/suspend"
        # The answer waits for the kernel's variables to be saved (a pool allows
        # up to an hour for that); the server bounds it, not this client.
        answer = await self._call("POST", path, body, timeout=SUSPEND_TIMEOUT)
        return self.status_from_json(answer)

    async def resume(self, name: str) -> ClaimStatus:
        return self.status_from_json(await self._call("POST", f"/api/claims/{quote(name)}/resume"))

    async def adopt(self, name: str, owner_pid: int) -> ClaimStatus | None:
        return self.status_from_json(
            await self._call("POST", f"/api/claims/{quote(name)}/adopt", {"owner_pid": owner_pid})
        )

    async def release(self, name: str) -> None:
        try:
            await self._call("DELETE", f"/api/claims/{quote(name)}")
        except ClaimNotFound:
            pass

    async def status(self, name: str) -> ClaimStatus | None:
        try:
            return self.status_from_json(await self._call("GET", f"/api/claims/{quote(name)}"))
        except ClaimNotFound:
            return None

    async def list_claims(self, labels: dict[str, str] | None = None) -> list[ClaimStatus]:
        query = "&".join(f"label={quote(k)}%3D{quote(v)}" for k, v in (labels or {}).items())
        data = await self._call("GET", "/api/claims" + (f"?{query}" if query else ""))
        return [self.status_from_json(item) for item in data["items"]]

    async def list_pools(self) -> list[PoolStatus]:
        data = await self._call("GET", "/api/pools")
        return [PoolStatus(**item) for item in data["items"]]

    async def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
