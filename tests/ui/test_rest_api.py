"""The ``/api/sandbox`` REST API and event stream, through a real jupyter_server."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient

from ..helpers import KernelSocket, Server, jupyter_server, start_kernel, wait_for

pytestmark = pytest.mark.usefixtures("warm_daemon")


class EventStream:
    """``GET /api/sandbox/events`` held open; collects the snapshots it sends."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.snapshots: list[dict[str, Any]] = []
        self.comments: list[str] = []
        self.content_type = ""
        self._buffer = b""
        self._client = httpclient.AsyncHTTPClient(force_instance=True)
        self._task: asyncio.Task[Any] | None = None

    def _chunk(self, data: bytes) -> None:
        self._buffer += data
        while b"\n\n" in self._buffer:
            block, self._buffer = self._buffer.split(b"\n\n", 1)
            event, payload = "message", []
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    payload.append(line[5:].strip())
            if event == "snapshot" and payload:
                self.snapshots.append(json.loads("\n".join(payload)))

    def _header(self, line: str) -> None:
        if line.lower().startswith("content-type:"):
            self.content_type = line.split(":", 1)[1].strip()

    def __enter__(self) -> EventStream:
        request = httpclient.HTTPRequest(
            f"{self.server.url}/api/sandbox/events",
            headers=self.server.headers(),
            streaming_callback=self._chunk,
            header_callback=self._header,
            request_timeout=3600,
        )
        self._task = asyncio.ensure_future(self._client.fetch(request, raise_error=False))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._client.close()
        if self._task is not None:
            self._task.cancel()

    async def wait(self, predicate: Any, timeout: float = 30) -> dict[str, Any]:
        async def found() -> dict[str, Any] | None:
            for snapshot in reversed(self.snapshots):
                if predicate(snapshot):
                    return snapshot
            return None

        try:
            return await wait_for(found, timeout, interval=0.05)  # type: ignore[no-any-return]
        except TimeoutError:
            last = self.snapshots[-1] if self.snapshots else None
            raise AssertionError(f"no matching snapshot; last was {last}") from None


def kernel_in(snapshot: dict[str, Any], kernel_id: str) -> dict[str, Any] | None:
    return next((k for k in snapshot["kernels"] if k["id"] == kernel_id), None)


async def test_list_details_suspend_resume_and_events(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        with EventStream(server) as events:
            first = await events.wait(lambda s: s["daemon"]["running"])
            assert events.content_type.startswith("text/event-stream")
            pools = {p["name"]: p for p in first["pools"]}
            assert "default" in pools, first
            assert pools["default"]["replicas"] >= 1 and "ready" in pools["default"]

            kernel_id = await start_kernel(server)
            listed = await server.request("GET", "/api/sandbox/kernels", expect=200)
            assert [k["id"] for k in listed["kernels"]] == [kernel_id]
            assert listed["starting"] == []
            model = listed["kernels"][0]
            assert model["name"] == "sandbox-default" and model["backend"] == "local"
            sandbox = model["sandbox"]
            assert sandbox["pool"] == "default" and sandbox["sandbox"].startswith("default-")
            assert sandbox["isolation"] in ("bubblewrap", "none")
            assert sandbox["progress"]["step"] == "ready" and sandbox["warm"] is True
            assert sandbox["suspended"] is False and sandbox["workspace"]

            snap = await events.wait(lambda s: kernel_in(s, kernel_id) is not None)
            assert kernel_in(snap, kernel_id)["sandbox"]["claim"] == sandbox["claim"]

            details = await server.request(
                "GET", f"/api/sandbox/kernels/{kernel_id}?fresh=true", expect=200
            )
            assert details["claim_status"]["phase"] == "Ready"
            assert "endpoint" not in details["claim_status"], "never hand the router token out"
            assert details["sandbox"]["created"] > 0
            meter = await server.request(
                "GET", f"/api/sandbox/kernels/{kernel_id}?usage=true", expect=200
            )
            assert meter["usage"]["memory_in_use_mb"] > 0 and "claim_status" not in meter

            suspended = await server.request(
                "POST", f"/api/sandbox/kernels/{kernel_id}/suspend", expect=200
            )
            assert suspended["sandbox"]["suspended"] is True
            assert suspended["sandbox"]["progress"]["step"] == "suspended"
            await events.wait(
                lambda s: (k := kernel_in(s, kernel_id)) is not None and k["sandbox"]["suspended"]
            )
            again = await server.request(
                "POST", f"/api/sandbox/kernels/{kernel_id}/suspend", body={}, expect=200
            )
            assert again["sandbox"]["suspended"] is True, "suspend is idempotent"

            resumed = await server.request(
                "POST", f"/api/sandbox/kernels/{kernel_id}/resume", expect=200
            )
            assert resumed["sandbox"]["suspended"] is False
            assert resumed["sandbox"]["progress"]["step"] == "ready"
            await events.wait(
                lambda s: (
                    (k := kernel_in(s, kernel_id)) is not None and not k["sandbox"]["suspended"]
                )
            )
            ws = await KernelSocket(server, kernel_id).connect()
            try:
                result = await ws.execute("print(6 * 7)")
                assert result.stdout.strip() == "42"
            finally:
                ws.close()

            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
            await events.wait(lambda s: kernel_in(s, kernel_id) is None)
            assert len(events.snapshots) >= 4
        # The stream's subscription is dropped when the browser goes away.
        await asyncio.sleep(0.5)


async def test_failed_start_is_reported_in_words(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server, EventStream(server) as events:
        await events.wait(lambda s: s["daemon"]["running"])
        response = await server.request("POST", "/api/kernels", {"name": "sandbox-missing"})
        assert response["reason"] == "PoolNotFound"
        assert "jupyter-sandbox pool create missing" in response["message"]
        snap = await events.wait(lambda s: any(e["state"] == "failed" for e in s["starting"]))
        failed = next(e for e in snap["starting"] if e["state"] == "failed")
        assert failed["name"] == "sandbox-missing"
        assert failed["error"]["reason"] == "PoolNotFound"
        assert "missing" in failed["error"]["message"]
        listed = await server.request("GET", "/api/sandbox/kernels", expect=200)
        assert listed["kernels"] == [] and listed["starting"][0]["state"] == "failed"


async def test_auth_is_required(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        client = httpclient.AsyncHTTPClient()
        kernel_id = str(uuid.uuid4())
        for method, path in [
            ("GET", "/api/sandbox/kernels"),
            ("GET", f"/api/sandbox/kernels/{kernel_id}"),
            ("POST", f"/api/sandbox/kernels/{kernel_id}/suspend"),
            ("POST", f"/api/sandbox/kernels/{kernel_id}/resume"),
            ("GET", "/api/sandbox/pools"),
            ("GET", "/api/sandbox/events"),
        ]:
            for headers in ({}, {"Authorization": "token wrong"}):
                response = await client.fetch(
                    f"{server.url}{path}",
                    method=method,
                    headers=headers,
                    body=b"" if method == "POST" else None,
                    raise_error=False,
                    request_timeout=30,
                )
                assert response.code in (401, 403), (method, path, headers, response.code)


async def test_bad_input_is_400_and_unknown_is_404(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        unknown = str(uuid.uuid4())
        cases: list[tuple[str, str, Any, int]] = [
            ("GET", "/api/sandbox/kernels/not-a-kernel", None, 400),
            ("GET", "/api/sandbox/kernels/..%2F..%2Fetc", None, 400),
            ("GET", f"/api/sandbox/kernels/{unknown}", None, 404),
            ("POST", f"/api/sandbox/kernels/{unknown}/suspend", None, 404),
            ("POST", f"/api/sandbox/kernels/{unknown}/explode", None, 400),
            ("POST", "/api/sandbox/kernels/x/suspend", None, 400),
            ("GET", f"/api/sandbox/kernels/{unknown}?fresh=maybe", None, 400),
            ("GET", f"/api/sandbox/kernels/{unknown}?usage=often", None, 400),
            ("GET", "/api/sandbox/pools?backend=mars", None, 400),
        ]
        for method, path, body, code in cases:
            got = await _status(server, method, path, body)
            assert got == code, (method, path, got)
            if code == 400:
                # Said in words, as JSON like every jupyter_server API error.
                answer = await server.request(method, path, body)
                assert answer["message"], (path, answer)

        kernel_id = await start_kernel(server)
        try:
            for body, code in [("[1]", 400), ("not json", 400), ('{"now": true}', 400)]:
                got = await _status(
                    server, "POST", f"/api/sandbox/kernels/{kernel_id}/suspend", raw=body
                )
                assert got == code, (body, got)
            model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}", expect=200)
            assert model["sandbox"]["suspended"] is False, "a rejected request changes nothing"
        finally:
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)

        # A kernel outside any sandbox is not this API's business.
        local = await server.request("POST", "/api/kernels", {"name": "python3"}, expect=201)
        try:
            assert await _status(server, "GET", f"/api/sandbox/kernels/{local['id']}") == 409
            listed = await server.request("GET", "/api/sandbox/kernels", expect=200)
            assert listed["kernels"] == []
        finally:
            await server.request("DELETE", f"/api/kernels/{local['id']}", expect=204)


async def _status(
    server: Server, method: str, path: str, body: Any = None, raw: str | None = None
) -> int:
    client = httpclient.AsyncHTTPClient()
    if raw is not None:
        payload: bytes | None = raw.encode()
    elif body is not None:
        payload = json.dumps(body).encode()
    else:
        payload = b"" if method == "POST" else None
    response = await client.fetch(
        f"{server.url}{path}",
        method=method,
        headers=server.headers(),
        body=payload,
        raise_error=False,
        request_timeout=60,
    )
    return int(response.code)


async def test_cold_start_progress_is_streamed(tmp_path: Path) -> None:
    """A pool with no warm sandbox: the stream shows the kernel waiting, then ready."""
    import os

    from jupyter_sandbox.control_plane.local.client import LocalControlPlane
    from jupyter_sandbox.kernelspec import install_kernelspec

    install_kernelspec("cold", prefix=str(tmp_path))
    data = str(tmp_path / "share" / "jupyter")
    env = {"JUPYTER_PATH": os.pathsep.join(filter(None, [data, os.environ.get("JUPYTER_PATH")]))}
    plane = LocalControlPlane()
    await plane.apply_pool("cold", {"replicas": 0})
    try:
        with jupyter_server(tmp_path, env=env) as server, EventStream(server) as events:
            await events.wait(lambda s: s["daemon"]["running"])
            starting = asyncio.ensure_future(start_kernel(server, "sandbox-cold"))
            seen = await events.wait(
                lambda s: any(e["state"] == "starting" for e in s["starting"]), timeout=60
            )
            entry = next(e for e in seen["starting"] if e["state"] == "starting")
            assert entry["name"] == "sandbox-cold" and entry["pool"] == "cold"
            assert entry["sandbox"]["progress"]["step"] in ("claiming", "waiting", "ready")
            kernel_id = await starting
            ready = await events.wait(lambda s: kernel_in(s, kernel_id) is not None)
            assert ready["starting"] == []
            model = kernel_in(ready, kernel_id)
            assert model is not None and model["sandbox"]["warm"] is False, "a cold start"
            steps = [
                e["sandbox"]["progress"]["step"]
                for s in events.snapshots
                for e in s["starting"]
                if e["state"] == "starting"
            ]
            print("cold start steps seen:", steps)
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        await plane.delete_pool("cold")
        await plane.close()


async def test_a_busy_kernel_is_not_suspended_unless_forced(tmp_path: Path) -> None:
    """Suspending a kernel in the middle of a cell lost the cell and every variable;
    now the API refuses (409, in words) and the cell finishes with its state kept,
    unless the caller says ``force``."""
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        path = f"/api/sandbox/kernels/{kernel_id}"
        try:
            await ws.execute("kept = 41")
            running = asyncio.ensure_future(
                ws.execute("import time; time.sleep(6); kept += 1; print('finished', kept)")
            )

            async def busy() -> bool:
                model = await server.request("GET", "/api/sandbox/kernels")
                return any(k["execution_state"] == "busy" for k in model["kernels"])

            await wait_for(busy, 30, interval=0.1)
            answer = await server.request("POST", f"{path}/suspend", {})
            assert answer["reason"] == "KernelBusy", answer
            assert "running a cell" in answer["message"] and "force" in answer["message"]
            assert await _status(server, "POST", f"{path}/suspend", {}) == 409
            result = await running
            assert "finished 42" in "".join(o["content"].get("text", "") for o in result.outputs)
            model = await server.request("GET", path, expect=200)
            assert model["sandbox"]["suspended"] is False

            # idle: suspended as before, and the variable is back after the resume
            await server.request("POST", f"{path}/suspend", expect=200)
            back = await ws.execute("print('kept', kept)")
            assert "kept 42" in "".join(o["content"].get("text", "") for o in back.outputs)

            # force: the caller chose to lose the running cell
            running = asyncio.ensure_future(ws.execute("import time; time.sleep(60)"))
            await wait_for(busy, 30, interval=0.1)
            forced = await server.request("POST", f"{path}/suspend", {"force": True}, expect=200)
            assert forced["sandbox"]["suspended"] is True
            running.cancel()
            for body in ({"force": "yes"}, {"force": True, "now": True}):
                assert await _status(server, "POST", f"{path}/suspend", body) == 400, body
            assert await _status(server, "POST", f"{path}/resume", {"force": True}) == 400
        finally:
            ws.close()
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
