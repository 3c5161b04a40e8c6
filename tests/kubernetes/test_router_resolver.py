"""The router's API resolver follows Sandbox status on the real API server."""

from __future__ import annotations

import asyncio
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from jupyter_sandbox.kube.client import Client, load_config
from jupyter_sandbox.protocol import runtime_auth
from jupyter_sandbox.router.kubernetes import SandboxResolver
from jupyter_sandbox.router.upstreams import Upstream

from .conftest import REPO_ROOT, SB, make_pool, sandbox_body, wait_for

pytestmark = pytest.mark.cluster


class _LoopThread:
    """An event loop in a thread: the resolver lives in one, as in the router,
    while the test polls it from its own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


_loop: _LoopThread | None = None


def _sync(coro):
    assert _loop is not None
    return _loop.run(coro)


@pytest.fixture
def resolver_factory(kube_cluster):
    global _loop
    _loop = _LoopThread()
    made: list[SandboxResolver] = []

    async def start(**kw) -> SandboxResolver:
        settings = await asyncio.to_thread(load_config, kube_cluster.kubeconfig)
        r = SandboxResolver(Client(settings), **kw).start()
        made.append(r)
        assert await r.wait_synced(30), "resolver never synced"
        return r

    def make(**kw) -> SandboxResolver:
        return _sync(start(**kw))

    async def stop_all() -> None:
        for r in made:
            await r.stop()
            await r.client.close()

    yield make
    _sync(stop_all())
    _loop.close()
    _loop = None


def test_follows_sandbox_status(kube, operator, resolver_factory):
    r = resolver_factory(allowed_namespaces=[kube.ns])
    make_pool(kube, replicas=1, service=True)
    (sb,) = kube.list(SB)
    name = sb["metadata"]["name"]

    def ip_now():
        s = kube.get(SB, name)
        return (s.get("status") or {}).get("podIPs", [None])[0]

    ip = ip_now()
    up = wait_for(
        lambda: (u := _sync(r.lookup(kube.ns, name, 8888))) and u.host == ip and u,
        10,
        what="resolver sees the pod IP",
    )
    assert up == Upstream(host=ip, port=8888)
    assert _sync(r.lookup(kube.ns, name, 9000)).port == 9000

    # suspended: no pod, so no address (404), not a stale IP
    kube.patch(SB, name, {"spec": {"operatingMode": "Suspended"}})
    wait_for(lambda: _sync(r.lookup(kube.ns, name, 8888)) is None, 20, what="suspended -> None")

    # resumed: the new pod's IP
    kube.patch(SB, name, {"spec": {"operatingMode": "Running"}})
    wait_for(lambda: ip_now(), 30, what="new pod IP in status")
    wait_for(
        lambda: (u := _sync(r.lookup(kube.ns, name, 8888))) and u.host == ip_now(),
        10,
        what="resolver sees the new pod IP",
    )

    # unknown sandbox: DNS fallback; other namespace: refused
    assert _sync(r.lookup(kube.ns, "nope", 8888)) == Upstream(
        host=f"nope.{kube.ns}.svc.cluster.local", port=8888
    )
    assert _sync(r.lookup("kube-system", name, 8888)) is None

    # deleted: forgotten
    kube.delete(SB, name)
    wait_for(
        lambda: r.get(kube.ns, name) is None, 30, what="deleted sandbox dropped from the cache"
    )


def test_cluster_wide_without_fallback(kube, operator, resolver_factory):
    r = resolver_factory(fallback_dns=False)
    assert _sync(r.lookup(kube.ns, "nope", 8888)) is None
    make_pool(kube, replicas=1)
    (sb,) = kube.list(SB)
    name = sb["metadata"]["name"]
    wait_for(lambda: _sync(r.lookup(kube.ns, name, 8888)), 10, what="cluster-wide watch sees it")


def test_with_a_runtime_key_each_upstream_carries_its_sandboxs_token(
    kube, operator, resolver_factory
):
    key = b"r" * 48
    r = resolver_factory(allowed_namespaces=[kube.ns], runtime_key=key)
    make_pool(kube, replicas=2)
    wait_for(lambda: len(kube.list(SB)) == 2, 30, what="two sandboxes")
    tokens = set()
    for sb in kube.list(SB):
        name, uid = sb["metadata"]["name"], sb["metadata"]["uid"]
        up = wait_for(lambda n=name: _sync(r.lookup(kube.ns, n, 8888)), 30, what="an upstream")
        assert up.runtime_token == runtime_auth.token_for(key, kube.ns, name, uid)
        tokens.add(up.runtime_token)
    assert len(tokens) == 2
    # a sandbox the cache does not know is routed by DNS with no token: its runtime refuses
    assert _sync(r.lookup(kube.ns, "nope", 8888)).runtime_token == ""


def test_a_relist_reads_every_page(kube, operator, resolver_factory):
    make_pool(kube, replicas=5)
    wait_for(lambda: len(kube.list(SB)) == 5, 30, what="five sandboxes")
    names = {sb["metadata"]["name"] for sb in kube.list(SB)}
    # started after they exist: only the initial list, in pages of two, can know them all
    r = resolver_factory(allowed_namespaces=[kube.ns], fallback_dns=False, list_page_size=2)
    assert {name for name in names if r.get(kube.ns, name) is not None} == names


def test_a_page_size_below_one_is_refused(kube_cluster):
    with pytest.raises(ValueError, match="list_page_size"):
        SandboxResolver(None, list_page_size=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello from " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_router_main_with_api_resolver(kube, kube_cluster, tmp_path):
    """``python -m jupyter_sandbox.router --resolve=api`` routes by Sandbox status.

    No operator here: the test writes the Sandbox status itself (as a controller
    would) with a loopback pod IP, where a stand-in upstream listens."""
    import httpx

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    up_port = upstream.server_address[1]
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    kube.create(SB, sandbox_body("sb-route"))
    kube.co.patch_namespaced_custom_object_status(
        *SB[:2], kube.ns, SB[2], "sb-route", {"status": {"podIPs": ["127.0.0.1"]}}
    )
    port = _free_port()
    log = open(tmp_path / "router.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.router",
            f"--port={port}",
            "--address=127.0.0.1",
            "--resolve=api",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--allowed-namespaces={kube.ns}",
            "--no-dns-fallback",
            "--allow-unauthenticated",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env={**os.environ, "PROXY_TIMEOUT_SECONDS": "5"},
    )
    try:
        url = f"http://127.0.0.1:{port}/some/path"
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert r.status_code == 400  # no X-Sandbox-ID
        h = {
            "X-Sandbox-ID": "sb-route",
            "X-Sandbox-Namespace": kube.ns,
            "X-Sandbox-Port": str(up_port),
        }
        r = wait_for(
            lambda: (x := httpx.get(url, headers=h, timeout=5)).status_code == 200 and x,
            10,
            what="routed through the API resolver",
        )
        assert r.text == "hello from /some/path"
        assert httpx.get(url, headers={**h, "X-Sandbox-Namespace": "other"}).status_code == 404
        assert httpx.get(url, headers={**h, "X-Sandbox-ID": "nope"}).status_code == 404
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        upstream.shutdown()
    assert "resolve: api" in (tmp_path / "router.log").read_text()
