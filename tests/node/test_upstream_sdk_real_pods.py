"""Compatibility, data plane: the upstream agent-sandbox SDK (PyPI
``k8s-agent-sandbox``), pointed at OUR router, gets a sandbox from OUR warm pool
of real runtime pods, writes a file, runs a command, reads the result back and
terminates (claim, sandbox and pod gone)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from tests.operator.conftest import CLAIM, SB, wait_for

from .conftest import sandbox_pod

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]

sdk = pytest.importorskip("k8s_agent_sandbox", reason="pip install k8s-agent-sandbox")


def _via_router(url: str, ns: str, name: str, path: str) -> int:
    req = urllib.request.Request(
        url + path,
        headers={"X-Sandbox-ID": name, "X-Sandbox-Namespace": ns, "X-Sandbox-Port": "8888"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_upstream_sdk_commands_and_files_on_a_real_pod(
    kube_node_cluster, kube, warm_pool, router_factory
):
    from k8s_agent_sandbox import SandboxClient
    from k8s_agent_sandbox.models import SandboxDirectConnectionConfig

    url, _ = router_factory(None)  # upstream clients send no token: an open router
    # the router answers before its watch cache has synced (it then falls back to
    # DNS names, which the SDK's X-Sandbox-Pod-IP check refuses): wait until it
    # routes to a warm sandbox's real pod
    member = sorted(warm_pool)[0]
    wait_for(lambda: _via_router(url, kube.ns, member, "/readyz") == 200, 30, what="router synced")
    api = kube_node_cluster.api_client()
    client = SandboxClient(
        connection_config=SandboxDirectConnectionConfig(api_url=url), api_client=api
    )
    try:
        t0 = time.perf_counter()
        sandbox = client.create_sandbox(
            warmpool="python", namespace=kube.ns, sandbox_ready_timeout=120
        )
        took = time.perf_counter() - t0
        assert sandbox.sandbox_id in warm_pool
        assert sandbox_pod(kube, sandbox.sandbox_id) is not None

        sandbox.files.write("hello.txt", "written by the upstream SDK\n")
        # like upstream's runtime, /execute splits the command (no shell): use sh -c
        res = sandbox.commands.run("sh -c 'cat hello.txt; hostname; id -u; pwd'")
        assert res.exit_code == 0, res
        assert res.stdout.split("\n")[:4] == [
            "written by the upstream SDK",
            sandbox.sandbox_id,
            "1000",
            "/workspace",
        ], res
        res = sandbox.commands.run("sh -c 'python -c \"print(6 * 7)\" > answer.txt'")
        assert res.exit_code == 0, res
        assert sandbox.files.read("answer.txt") == b"42\n"
        assert sandbox.files.exists("hello.txt")
        names = {e.name for e in sandbox.files.list(".")}
        assert {"hello.txt", "answer.txt"} <= names, names
        print(f"\n[node] upstream SDK create_sandbox(warmpool=...) Ready in {took * 1000:.0f} ms")

        claim_name, sandbox_id = sandbox.claim_name, sandbox.sandbox_id
        sandbox.terminate()
        wait_for(lambda: kube.get(CLAIM, claim_name) is None, 60, what="claim deleted")
        wait_for(lambda: kube.get(SB, sandbox_id) is None, 60, what="sandbox deleted")
        wait_for(lambda: sandbox_pod(kube, sandbox_id) is None, 120, what="pod deleted")
    finally:
        api.close()
