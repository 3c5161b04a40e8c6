"""Per-user authorization at the router on JupyterHub (the z2jh recipe's router).

Real parts: a JupyterHub (PyPI) with users alice and bob and an API token each,
the router as its own process (``jupyter-sandbox router --resolve=api
--hub-api-url ...``) watching the test API server, and one real runtime per
user.  The Sandbox objects stand for what the operator makes of each user's
claim (a controller ownerReference to the claim, the pod IP in status); kwok's
pods run nothing, so their status points at the runtimes on loopback, and no
operator runs here to overwrite it.

A user's hub token reaches that user's sandbox and nothing else; a service's
token, a forged or missing token, a sandbox without a user, and a claim handed
to another user are all refused, over HTTP and WebSocket alike.  A second test
checks the other half: the Kubernetes backend with ``router_auth: jupyterhub``
annotates its claims with the hub user and hands the router the hub token.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tornado import websocket

from tests.helpers import free_port
from tests.hub.hubprocess import Hub, running_hub

from .conftest import CLAIM, REPO_ROOT, SB, Kube, claim_body, runtime_on_loopback, wait_for

pytestmark = pytest.mark.cluster

USERS = ("alice", "bob")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub"), USERS, spawn=False) as hub:
        yield hub


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[dict[str, int]]:
    """One real runtime per user, each with a file naming its owner."""
    with (
        runtime_on_loopback(tmp_path / "alice") as alice,
        runtime_on_loopback(tmp_path / "bob") as bob,
    ):
        for user in USERS:
            (tmp_path / user / "workspace" / "owner.txt").write_text(user)
        yield {"alice": alice, "bob": bob}


def user_sandbox(kube: Kube, claim: str, sandbox: str, user: str | None) -> None:
    """A claim naming ``user`` and the Sandbox it controls, Running on loopback."""
    body = claim_body(claim)
    if user is not None:
        body["metadata"]["annotations"] = {"jupyter-sandbox/user": user}
    c = kube.create(CLAIM, body)
    sb = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": sandbox,
            "ownerReferences": [
                {
                    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                    "kind": "SandboxClaim",
                    "name": claim,
                    "uid": c["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "r", "image": "x"}]}}},
    }
    kube.create(SB, sb)
    kube.co.patch_namespaced_custom_object_status(
        *SB[:2], kube.ns, SB[2], sandbox, {"status": {"podIPs": ["127.0.0.1"]}}
    )


@pytest.fixture
def router(kube: Kube, kube_cluster, hub: Hub, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path / "router.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.router",
            "--address=127.0.0.1",
            f"--port={port}",
            "--resolve=api",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--allowed-namespaces={kube.ns}",
            "--no-dns-fallback",
            f"--hub-api-url={hub.api_url}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            assert time.monotonic() < deadline, "router not listening"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def fetch(router: str, ns: str, sandbox: str, port: int, token: str | None, scheme="token"):
    headers = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": ns, "X-Sandbox-Port": str(port)}
    if token is not None:
        headers["Authorization"] = f"{scheme} {token}"
    return httpx.get(f"{router}/download/owner.txt", headers=headers, timeout=30)


def test_each_hub_user_reaches_only_their_own_sandbox(kube, hub, runtimes, router):
    user_sandbox(kube, "claim-alice", "sb-alice", "alice")
    user_sandbox(kube, "claim-bob", "sb-bob", "bob")
    user_sandbox(kube, "claim-nobody", "sb-nobody", None)
    ns, alice, bob = kube.ns, hub.tokens["alice"], hub.tokens["bob"]
    # the router's watch catches up with the objects just made
    wait_for(
        lambda: fetch(router, ns, "sb-alice", runtimes["alice"], alice).status_code == 200,
        30,
        what="alice reaches her sandbox",
    )
    r = fetch(router, ns, "sb-alice", runtimes["alice"], alice, scheme="Bearer")
    assert (r.status_code, r.text) == (200, "alice")
    r = fetch(router, ns, "sb-bob", runtimes["bob"], bob)
    assert (r.status_code, r.text) == (200, "bob")

    # another user's sandbox, whichever runtime port is named
    for port in runtimes.values():
        assert fetch(router, ns, "sb-bob", port, alice).status_code == 403
        assert fetch(router, ns, "sb-alice", port, bob).status_code == 403
    # a sandbox whose claim names nobody, and one that does not exist: the same 403
    assert fetch(router, ns, "sb-nobody", runtimes["alice"], alice).status_code == 403
    assert fetch(router, ns, "sb-missing", runtimes["alice"], alice).status_code == 403
    # no token, a forged one, the hub admin service's (not a user) token
    assert fetch(router, ns, "sb-alice", runtimes["alice"], None).status_code == 401
    assert fetch(router, ns, "sb-alice", runtimes["alice"], alice[:-2] + "xx").status_code == 403
    assert fetch(router, ns, "sb-alice", runtimes["alice"], hub.admin_token).status_code == 403
    # the hub token is not forwarded into the sandbox
    r = httpx.post(
        f"{router}/execute",
        json={"command": "env"},
        headers={
            "X-Sandbox-ID": "sb-alice",
            "X-Sandbox-Namespace": ns,
            "X-Sandbox-Port": str(runtimes["alice"]),
            "Authorization": f"token {alice}",
        },
        timeout=30,
    )
    assert r.status_code == 200 and alice not in r.text

    # the kernel WebSocket goes through the same door
    async def ws_status(sandbox: str, port: int, token: str) -> int:
        try:
            conn = await websocket.websocket_connect(
                websocket.httpclient.HTTPRequest(
                    f"{router.replace('http', 'ws')}/api/kernel/channels",
                    headers={
                        "X-Sandbox-ID": sandbox,
                        "X-Sandbox-Namespace": ns,
                        "X-Sandbox-Port": str(port),
                        "Authorization": f"token {token}",
                    },
                )
            )
        except websocket.httpclient.HTTPClientError as exc:
            return exc.code
        conn.close()
        return 101

    assert asyncio.run(ws_status("sb-alice", runtimes["alice"], alice)) == 101
    assert asyncio.run(ws_status("sb-alice", runtimes["alice"], bob)) == 403

    # a claim deleted and made again for bob under the same names: alice is out
    kube.delete(SB, "sb-alice")
    kube.delete(CLAIM, "claim-alice")
    wait_for(lambda: kube.get(CLAIM, "claim-alice") is None, 30, what="claim gone")
    user_sandbox(kube, "claim-alice", "sb-alice", "bob")
    wait_for(
        lambda: fetch(router, ns, "sb-alice", runtimes["alice"], bob).status_code == 200,
        30,
        what="the new owner admitted",
    )
    assert fetch(router, ns, "sb-alice", runtimes["alice"], alice).status_code == 403


async def test_backend_sends_the_hub_token_and_names_the_user(
    kube, warm_pool, kube_cluster, monkeypatch
):
    from jupyter_sandbox.control_plane.base import ClaimRequest, InvalidRequest
    from jupyter_sandbox.control_plane.kubernetes import KubernetesControlPlane

    options = {
        "namespace": kube.ns,
        "kubeconfig": str(kube_cluster.kubeconfig),
        "router_url": "http://router.example:8080",
        "router_auth": "jupyterhub",
    }
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_USER", "alice@example.org")
    with pytest.raises(InvalidRequest, match="JUPYTERHUB_API_TOKEN"):
        KubernetesControlPlane(**options)
    with pytest.raises(InvalidRequest, match="router_auth must be one of"):
        KubernetesControlPlane(**{**options, "router_auth": "hub"})
    with pytest.raises(InvalidRequest, match="needs the router's secret"):
        KubernetesControlPlane(**{**options, "router_auth": "token"})

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token-of-alice")
    plane = KubernetesControlPlane(**options)
    try:
        status = await plane.claim(ClaimRequest(pool="pool", labels={}))
        status = await plane.wait_ready(status.name, timeout=60)
        claim = kube.get(CLAIM, status.name)
        assert claim["metadata"]["annotations"]["jupyter-sandbox/user"] == "alice@example.org"
        assert status.endpoint is not None
        assert status.endpoint.headers()["Authorization"] == "Bearer hub-token-of-alice"
        await plane.release(status.name)
    finally:
        await plane.close()

    # without router_url (the SDK names the router itself): the pod-IP endpoint
    # carries no credential, and router_token still gives the hub token
    options.pop("router_url")
    plane = KubernetesControlPlane(**options)
    try:
        status = await plane.claim(ClaimRequest(pool="pool", labels={}))
        status = await plane.wait_ready(status.name, timeout=60)
        assert status.endpoint is None or status.endpoint.token is None
        assert plane.router_token(status) == "hub-token-of-alice"
        await plane.release(status.name)
    finally:
        await plane.close()
