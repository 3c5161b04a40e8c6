"""Compatibility: the upstream agent-sandbox Python SDK (PyPI ``k8s-agent-sandbox``)
obtains a sandbox from OUR operator on the real test API server.

Control-plane part only: the SDK creates a SandboxClaim against a warm pool,
watches it until Ready (reading ``status.sandbox.name``), and deletes it; pods
are kwok's, so no command runs here (the data-plane part needs real pods).
"""

from __future__ import annotations

import time

import pytest

from .conftest import CLAIM, SB, is_ready, wait_for

pytestmark = pytest.mark.cluster

sdk = pytest.importorskip("k8s_agent_sandbox", reason="pip install k8s-agent-sandbox")


def test_upstream_sdk_create_sandbox_from_warm_pool(kube, warm_pool, kube_cluster):
    from k8s_agent_sandbox import SandboxClient
    from k8s_agent_sandbox.models import SandboxDirectConnectionConfig

    warm_members = {s["metadata"]["name"] for s in kube.list(SB)}
    api = kube_cluster.api_client()
    # A direct (router) connection is lazy: nothing is dialled until a command runs.
    client = SandboxClient(
        connection_config=SandboxDirectConnectionConfig(api_url="http://router.invalid:8080"),
        api_client=api,
    )
    try:
        t0 = time.perf_counter()
        sandbox = client.create_sandbox(
            warmpool="pool",
            namespace=kube.ns,
            sandbox_ready_timeout=60,
            labels={"suite": "upstream-sdk"},
        )
        took = time.perf_counter() - t0
        print(f"\n[upstream SDK] create_sandbox(warmpool=...) -> Ready in {took * 1000:.0f} ms")

        # adopted from the pool, not cold-started
        assert sandbox.sandbox_id in warm_members
        claim = kube.get(CLAIM, sandbox.claim_name)
        assert claim["spec"]["warmPoolRef"]["name"] == "pool"
        assert claim["metadata"]["labels"]["suite"] == "upstream-sdk"
        assert claim["status"]["sandbox"]["name"] == sandbox.sandbox_id
        assert is_ready(claim)
        sb = kube.get(SB, sandbox.sandbox_id)
        assert is_ready(sb)
        (ref,) = [r for r in sb["metadata"]["ownerReferences"] if r.get("controller")]
        assert (ref["kind"], ref["name"]) == ("SandboxClaim", sandbox.claim_name)

        # re-attach by claim name, as another SDK process would
        again = client.get_sandbox(sandbox.claim_name, namespace=kube.ns)
        assert again.sandbox_id == sandbox.sandbox_id

        # a second claim: the pool had two members, so this one is warm too
        other = client.create_sandbox(warmpool="pool", namespace=kube.ns, sandbox_ready_timeout=60)
        assert other.sandbox_id != sandbox.sandbox_id

        claim_name, sandbox_id = sandbox.claim_name, sandbox.sandbox_id
        sandbox.terminate()  # deletes the claim; the garbage collector does the rest
        other.terminate()
        wait_for(lambda: kube.get(CLAIM, claim_name) is None, 30, what="claim deleted")
        wait_for(lambda: kube.get(SB, sandbox_id) is None, 30, what="sandbox deleted")
        wait_for(lambda: kube.pod(sandbox_id) is None, 30, what="pod deleted")
        assert kube.list(CLAIM) == []
    finally:
        api.close()
