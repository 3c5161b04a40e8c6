"""The claim service: each hub user's server reaches only that user's claims.

Real parts: a JupyterHub (users alice and bob, an API token each, and the
hub's admin service token), the test API server with our operator and a warm
pool, and ``jupyter-sandbox claim-service`` as its own process, running as the
service account of ``deploy/jupyterhub/rbac.yaml`` (so the Role is proven to
suffice). The users' side is what a single-user server runs: the Kubernetes
backend with ``claim_service_url`` and the user's ``JUPYTERHUB_API_TOKEN``,
and no Kubernetes credentials at all.

Each attack is one a user could make from their own pod: ask the service for
another user's claims by every verb, name them in labels, claim more than the
limit, cold-start in a loop, and call it with no, a forged or a service token.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, wait_listening
from tests.hub.hubprocess import Hub, running_hub
from tests.hub.test_deploy_values import grant
from tests.kubernetes.test_rbac import sa_kubeconfig

from .conftest import CLAIM, POOL, REPO_ROOT, SB, Kube, pool_body, wait_for

pytestmark = pytest.mark.cluster

USERS = ("alice", "bob")
ROUTER_URL = "http://router.example:8080"
MAX_CLAIMS = 2


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with running_hub(tmp_path_factory.mktemp("hub"), USERS, spawn=False) as hub:
        yield hub


@pytest.fixture
def claim_service(
    kube: Kube, kube_cluster: Any, api_client: Any, hub: Hub, tmp_path: Path
) -> Iterator[str]:
    grant(api_client, kube.ns)
    kubeconfig = sa_kubeconfig(
        api_client,
        Path(kube_cluster.kubeconfig),
        "jupyter-sandbox-claims",
        tmp_path / "claims-kubeconfig",
        namespace=kube.ns,
    )
    port = free_port()
    log_path = tmp_path / "claim-service.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.cli",
            "claim-service",
            "--address=127.0.0.1",
            f"--port={port}",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={kube.ns}",
            f"--hub-api-url={hub.api_url}",
            f"--router-url={ROUTER_URL}",
            f"--max-claims-per-user={MAX_CLAIMS}",
            "--cold-starts-per-minute=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # it listens only once its credentials and Role have answered
        wait_listening(proc, port, log_path, "the claim service")
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        yield url
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
        print(log_path.read_text()[-3000:])


def plane_of(user: str, hub: Hub, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """What ``user``'s single-user server builds from the z2jh kernelspec."""
    from jupyter_sandbox.control_plane.factory import _create

    monkeypatch.setenv("JUPYTERHUB_USER", user)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens[user])
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return _create("kubernetes", {"claim_service_url": url, "router_auth": "jupyterhub"})


async def test_each_user_reaches_only_their_own_claims(
    kube, operator, warm_pool, hub, claim_service, monkeypatch
):
    from jupyter_sandbox.control_plane.base import ClaimNotFound, ClaimRequest, Phase

    alice = plane_of("alice", hub, claim_service, monkeypatch)
    bob = plane_of("bob", hub, claim_service, monkeypatch)
    try:
        # alice's claim, with labels that try to make it bob's or unmanaged
        request = ClaimRequest(
            pool="pool",
            labels={
                "jupyter-sandbox/user": "bob",
                "app.kubernetes.io/managed-by": "someone-else",
                "jupyter-sandbox/kernel-id": "k-alice",
            },
            owner_pid=1,
        )
        status = await alice.claim(request)
        status = await alice.wait_ready(status.name, timeout=60)
        mine = status.name
        claim = kube.get(CLAIM, mine)
        assert claim["metadata"]["annotations"]["jupyter-sandbox/user"] == "alice"
        assert claim["metadata"]["labels"]["jupyter-sandbox/user"] == "alice"
        assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "jupyter-sandbox"
        assert claim["metadata"]["labels"]["jupyter-sandbox/kernel-id"] == "k-alice"
        assert "jupyter-sandbox/owner-pid" not in claim["metadata"]["annotations"]
        # the endpoint goes through the router, with alice's own hub token
        assert status.user == "alice" and status.endpoint is not None
        assert status.endpoint.router_url == ROUTER_URL
        assert status.endpoint.headers()["Authorization"] == f"Bearer {hub.tokens['alice']}"
        assert [s.name for s in await alice.list_claims()] == [mine]
        assert [s.name for s in await alice.list_claims({"jupyter-sandbox/kernel-id": "k-alice"})]

        # bob, by every verb: as if the claim did not exist, and it is untouched
        assert await bob.list_claims() == []
        assert await bob.list_claims({"jupyter-sandbox/user": "alice"}) == []
        assert await bob.status(mine) is None
        for attempt in (bob.suspend, bob.resume, lambda n: bob.wait_ready(n, 5)):
            with pytest.raises(ClaimNotFound):
                await attempt(mine)
        await bob.release(mine)  # release is idempotent: a 404 is "already gone"
        claim = kube.get(CLAIM, mine)
        assert claim is not None and not claim["metadata"].get("deletionTimestamp")
        sandbox = kube.get(SB, status.sandbox)
        assert sandbox["spec"].get("operatingMode", "Running") == "Running"

        # alice suspends and resumes her own
        suspended = await alice.suspend(mine)
        assert suspended.phase in (Phase.SUSPENDING, Phase.SUSPENDED)
        assert kube.get(SB, status.sandbox)["spec"]["operatingMode"] == "Suspended"
        await alice.resume(mine)
        assert kube.get(SB, status.sandbox)["spec"]["operatingMode"] == "Running"
        await alice.release(mine)
        wait_for(lambda: kube.get(CLAIM, mine) is None, 60, what="alice's claim deleted")
    finally:
        await alice.close()
        await bob.close()


async def test_limits_refuse_with_the_reason(
    kube, operator, warm_pool, hub, claim_service, monkeypatch
):
    from jupyter_sandbox.control_plane.base import ClaimRequest, QuotaExceeded

    alice = plane_of("alice", hub, claim_service, monkeypatch)
    bob = plane_of("bob", hub, claim_service, monkeypatch)
    try:
        held = [await alice.claim(ClaimRequest(pool="pool")) for _ in range(MAX_CLAIMS)]
        with pytest.raises(QuotaExceeded, match=f"alice already has {MAX_CLAIMS} sandboxed") as e:
            await alice.claim(ClaimRequest(pool="pool"))
        assert "shut down a kernel" in e.value.hint
        assert len(kube.list(CLAIM)) == MAX_CLAIMS
        # bob's allowance is his own
        theirs = await bob.claim(ClaimRequest(pool="pool"))
        # a claim let go makes room again
        await alice.release(held[0].name)
        wait_for(lambda: kube.get(CLAIM, held[0].name) is None, 60, what="claim deleted")
        held[0] = await alice.claim(ClaimRequest(pool="pool"))

        # cold starts: a pool with no warm sandbox, one cold start per minute
        await bob.release(theirs.name)
        wait_for(lambda: kube.get(CLAIM, theirs.name) is None, 60, what="claim deleted")
        kube.create(POOL, pool_body("cold", "python", 0))
        await bob.claim(ClaimRequest(pool="cold"))
        with pytest.raises(QuotaExceeded, match="new sandboxes in the last minute") as e:
            await bob.claim(ClaimRequest(pool="cold"))
        assert e.value.hint.startswith("try again in")
        # the warm pool still serves him
        await bob.claim(ClaimRequest(pool="pool"))
    finally:
        await alice.close()
        await bob.close()


def test_who_may_call(kube, hub, claim_service):
    """No token, a forged one, a service's token: refused; a name is not the caller's."""

    def post(token: str | None, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"token {token}"} if token else {}
        return httpx.post(f"{claim_service}/api/claims", json=body, headers=headers, timeout=30)

    body = {"pool": "pool"}
    r = post(None, body)
    assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"
    assert post(hub.tokens["alice"][:-2] + "xx", body).status_code == 403
    r = post(hub.admin_token, body)
    assert r.status_code == 403 and "not belong to a user" in r.json()["message"]
    for path in ("/api/claims", "/api/pools", "/api/info", "/api/claims/x/suspend"):
        assert httpx.get(f"{claim_service}{path}", timeout=30).status_code in (401, 405)

    alice = hub.tokens["alice"]
    r = post(alice, {"pool": "pool", "name": "bobs-kernel"})
    assert r.status_code == 400 and "names claims itself" in r.json()["message"]
    for bad in ({}, {"pool": 3}, {"pool": "pool", "labels": {"a": 1}}, {"pool": "p", "x": 1}):
        r = post(alice, bad)
        assert r.status_code == 400 and r.json()["reason"] == "Invalid", bad
    r = httpx.post(
        f"{claim_service}/api/claims",
        content=b"not json",
        headers={"Authorization": f"token {alice}"},
        timeout=30,
    )
    assert r.status_code == 400
    info = httpx.get(
        f"{claim_service}/api/info", headers={"Authorization": f"token {alice}"}, timeout=30
    ).json()
    assert info == {
        "user": "alice",
        "claims": 0,
        "max_claims_per_user": MAX_CLAIMS,
        "cold_starts_per_minute": 1.0,
    }
    assert kube.list(CLAIM) == []


async def test_a_jupyter_server_over_the_limit_says_why(
    kube, operator, warm_pool, hub, claim_service, monkeypatch, tmp_path
):
    """The z2jh recipe's kernelspec in a real Jupyter server of alice's: with no
    Kubernetes credentials at all, a kernel over her limit fails with the reason."""
    import json

    import yaml

    from jupyter_sandbox.control_plane.base import ClaimRequest
    from tests.helpers import jupyter_server

    values = yaml.safe_load((REPO_ROOT / "deploy/jupyterhub/values.yaml").read_text())
    spec = json.loads(values["singleuser"]["extraFiles"]["sandbox-kernelspec"]["stringData"])
    config = spec["metadata"]["kernel_provisioner"]["config"]
    config["backend_options"]["claim_service_url"] = claim_service
    config["pool"] = "pool"
    kernels = tmp_path / "share" / "jupyter" / "kernels" / "sandbox-python"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps(spec))

    alice = plane_of("alice", hub, claim_service, monkeypatch)
    try:
        for _ in range(MAX_CLAIMS):
            await alice.claim(ClaimRequest(pool="pool"))
    finally:
        await alice.close()
    env = {
        "JUPYTER_PATH": str(tmp_path / "share" / "jupyter"),
        "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_API_TOKEN": hub.tokens["alice"],
        "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),  # nothing to fall back on
    }
    with jupyter_server(tmp_path, env=env) as server:
        answer = await server.request(
            "POST",
            "/api/sessions",
            {"path": "a.ipynb", "type": "notebook", "kernel": {"name": "sandbox-python"}},
        )
        assert "alice already has 2 sandboxed kernels" in json.dumps(answer), answer
        assert "shut down a kernel you no longer need" in json.dumps(answer), answer
    assert len(kube.list(CLAIM)) == MAX_CLAIMS
