"""A real JupyterHub, two users, sandboxed kernels on the local backend: isolation.

Alice starts a sandboxed kernel through the hub. Bob cannot reach it: not through
his own single-user server, not with his hub token at Alice's server, not with
his sandbox token at either router, and he cannot list it. Every user has a
local sandbox daemon of their own (``JUPYTER_SANDBOX_HOME`` per user, set by the
spawner), so daemons, routers and token secrets are separate.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient

from jupyter_sandbox.control_plane.base import ClaimStatus
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from tests.helpers import KernelSocket, Server

from .hubprocess import Hub, running_hub

USERS = ("alice", "bob")


async def status_of(server: Server, method: str, path: str, body: Any = None) -> int:
    """Only the HTTP status of a request to a single-user server."""
    response = await httpclient.AsyncHTTPClient().fetch(
        f"{server.url}{path}",
        method=method,
        headers=server.headers(),
        body=json.dumps(body) if body is not None else None,
        raise_error=False,
        request_timeout=60,
        follow_redirects=False,
    )
    return response.code


async def claims(home: Path) -> list[ClaimStatus]:
    plane = LocalControlPlane(home, autostart=False)
    try:
        return await plane.list_claims()
    finally:
        await plane.close()


def stop_daemon(home: Path) -> None:
    async def stop() -> None:
        plane = LocalControlPlane(home, autostart=False)
        await plane.stop_daemon()
        await plane.close()

    if (home / "daemon.sock").exists():
        asyncio.run(stop())


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hub")
    try:
        with running_hub(root, USERS, spawn=True) as hub:
            yield hub
    finally:
        for user in USERS:
            stop_daemon(root / "sandbox" / user)


@pytest.fixture(scope="module")
def kernels(hub: Hub) -> Iterator[dict[str, str]]:
    """One sandboxed kernel per user, started through the hub."""
    ids: dict[str, str] = {}

    async def start() -> None:
        for user in USERS:
            model = await hub.server(user).request(
                "POST", "/api/kernels", {"name": "sandbox-default"}, expect=201
            )
            ids[user] = model["id"]

    asyncio.run(start())
    yield ids


@pytest.fixture
async def alice_socket(hub: Hub, kernels: dict[str, str]) -> AsyncIterator[KernelSocket]:
    sock = await KernelSocket(hub.server("alice"), kernels["alice"]).connect()
    yield sock
    sock.close()


async def test_kernels_run_in_sandboxes_labelled_with_the_user(
    hub: Hub, kernels: dict[str, str], alice_socket: KernelSocket
) -> None:
    result = await alice_socket.execute(
        "import os; env = os.environ\n"
        "print(env.get('JUPYTERHUB_USER'), env.get('JUPYTERHUB_API_TOKEN'))"
    )
    assert result.status == "ok"
    assert result.stdout == "None None\n"  # the hub's identity and token stay outside

    for user in USERS:
        [claim] = await claims(hub.home(user))
        assert claim.labels["jupyter-sandbox/user"] == user
        assert claim.labels["jupyter-sandbox/kernel-id"] == kernels[user]
        assert claim.endpoint is not None and claim.endpoint.token


async def test_other_user_cannot_reach_the_kernel_through_the_hub(
    hub: Hub, kernels: dict[str, str]
) -> None:
    alice_kernel = kernels["alice"]
    bob = hub.server("bob")
    listed = await bob.request("GET", "/api/kernels", expect=200)
    assert [k["id"] for k in listed] == [kernels["bob"]]
    assert await status_of(bob, "GET", f"/api/kernels/{alice_kernel}") == 404
    sandbox_listing = await bob.request("GET", "/api/sandbox/kernels", expect=200)
    assert alice_kernel not in json.dumps(sandbox_listing)
    with pytest.raises(httpclient.HTTPClientError) as info:
        await KernelSocket(bob, alice_kernel).connect()
    assert info.value.code == 404

    # Bob's hub token is not good for Alice's server.
    as_bob = hub.server("alice", token=hub.tokens["bob"])
    assert await status_of(as_bob, "GET", "/api/kernels") == 403
    with pytest.raises(httpclient.HTTPClientError) as info:
        await KernelSocket(as_bob, alice_kernel).connect()
    assert info.value.code == 403


async def _router(endpoint: Any, path: str, token: str | None, sandbox: str) -> int:
    headers = {
        "X-Sandbox-ID": sandbox,
        "X-Sandbox-Namespace": endpoint.namespace,
        "X-Sandbox-Port": str(endpoint.port),
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    response = await httpclient.AsyncHTTPClient().fetch(
        f"{endpoint.router_url}/{path}", headers=headers, raise_error=False, request_timeout=30
    )
    return response.code


async def test_other_users_sandbox_token_is_refused_by_the_router(
    hub: Hub, kernels: dict[str, str]
) -> None:
    [alice] = await claims(hub.home("alice"))
    [bob] = await claims(hub.home("bob"))
    assert alice.endpoint and bob.endpoint and alice.sandbox and bob.sandbox
    assert alice.endpoint.router_url != bob.endpoint.router_url  # one daemon per user

    # Positive control: Alice's own token reaches her sandbox.
    assert await _router(alice.endpoint, "exists/x", alice.endpoint.token, alice.sandbox) == 200
    # No token, Bob's token at Alice's router, Bob's token for Alice's sandbox at his router.
    assert await _router(alice.endpoint, "exists/x", None, alice.sandbox) == 401
    assert await _router(alice.endpoint, "exists/x", bob.endpoint.token, alice.sandbox) == 403
    assert await _router(bob.endpoint, "exists/x", bob.endpoint.token, alice.sandbox) == 403
    # Bob cannot list Alice's claim: his daemon does not have it.
    assert [c.name for c in await claims(hub.home("bob"))] == [bob.name]


async def test_from_inside_bobs_sandbox_alice_is_out_of_reach(
    hub: Hub, kernels: dict[str, str]
) -> None:
    """Code in Bob's kernel: Alice's router refuses it, her state dir is not visible."""
    [alice] = await claims(hub.home("alice"))
    [bob] = await claims(hub.home("bob"))
    assert alice.endpoint and bob.endpoint
    probe = f"""
import urllib.request, urllib.error
def status(token):
    req = urllib.request.Request({alice.endpoint.router_url + "/exists/x"!r}, headers={{
        "X-Sandbox-ID": {alice.sandbox!r}, "X-Sandbox-Namespace": {alice.namespace!r},
        **({{"Authorization": "Bearer " + token}} if token else {{}})}})
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__
print(status(None), status({bob.endpoint.token!r}))
try:
    open({str(hub.home("alice") / "router-secret")!r}).read()
    print("secret readable")
except OSError as exc:
    print(type(exc).__name__)
"""
    sock = await KernelSocket(hub.server("bob"), kernels["bob"]).connect()
    try:
        result = await sock.execute(probe)
    finally:
        sock.close()
    assert result.status == "ok", result.reply
    no_token, bob_token, secret = result.stdout.split()
    assert no_token in ("401", "URLError", "ConnectionRefusedError")
    assert bob_token in ("403", "URLError", "ConnectionRefusedError")
    if bob.isolation == "bubblewrap":
        assert secret in ("FileNotFoundError", "PermissionError")
    else:
        pytest.skip(f"sandboxes are not isolated here ({bob.isolation_detail})")


async def test_no_host_kernels_or_terminals(hub: Hub) -> None:
    """The recipe allows only sandboxed kernels and no terminals."""
    bob = hub.server("bob")
    specs = await bob.request("GET", "/api/kernelspecs", expect=200)
    assert set(specs["kernelspecs"]) == {"sandbox-default"}
    assert await status_of(bob, "POST", "/api/terminals", {}) in (403, 404)
    # A kernel started by another name (ipykernel's built-in python3) is sandboxed too.
    before = {c.name for c in await claims(hub.home("bob"))}
    model = await bob.request("POST", "/api/kernels", {"name": "python3"}, expect=201)
    try:
        after = await claims(hub.home("bob"))
        [new] = [c for c in after if c.name not in before]
        assert new.labels["jupyter-sandbox/kernel-id"] == model["id"]
        sock = await KernelSocket(bob, model["id"]).connect()
        try:
            result = await sock.execute("import os; print(os.environ.get('HOME'))")
        finally:
            sock.close()
        assert result.status == "ok"
        assert str(hub.root) not in result.stdout  # not the host home of bob's server
    finally:
        await bob.request("DELETE", f"/api/kernels/{model['id']}", expect=204)
    assert {c.name for c in await claims(hub.home("bob"))} == before


async def test_shutdown_releases_the_claim(hub: Hub, kernels: dict[str, str]) -> None:
    await hub.server("alice").request("DELETE", f"/api/kernels/{kernels['alice']}", expect=204)
    assert await claims(hub.home("alice")) == []
    assert len(await claims(hub.home("bob"))) == 1
