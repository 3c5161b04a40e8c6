"""The kernel provisioner with the Kubernetes backend, end to end.

STAND-IN for the real-pod test of issue 4: pods here are kwok's (Ready, with
invented IPs, running nothing), so the sandbox's runtime is a real
``python -m jupyter_sandbox.runtime`` process on this machine, and the router's
lookup sends every sandbox of the test namespace to it.  Everything on the
control plane is real: the SandboxClaim, adoption from the warm pool, the
Sandbox's operatingMode on suspend/resume, the pod deleted and recreated, the
claim (and by garbage collection the Sandbox, Pod and Service) deleted on
shutdown, and a "restarted server" re-attaching by labels.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from tornado.httpserver import HTTPServer

from jupyter_sandbox.control_plane.kubernetes import KubernetesControlPlane
from jupyter_sandbox.kernel_provisioner.session import SandboxSession
from jupyter_sandbox.kernelspec import make_kernelspec
from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import RouterContext
from jupyter_sandbox.router.tokens import TokenAuthority
from jupyter_sandbox.router.upstreams import Upstream
from jupyter_sandbox.utils.background import background

from .conftest import CLAIM, SB, runtime_on_loopback, wait_for

pytestmark = pytest.mark.cluster

SECRET = "stand-in-router-secret-0123456789abcdef0123456789"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def runtime(tmp_path: Path):
    """The stand-in for the sandbox pod's container: a real runtime on loopback."""
    with runtime_on_loopback(tmp_path) as port:
        yield port


@pytest.fixture
def router(kube, runtime):
    """A router on the background loop; its lookup maps the test namespace to the runtime."""

    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        if namespace != kube.ns:
            return None
        return Upstream(host="127.0.0.1", port=runtime)

    port = _free_port()

    async def start() -> tuple[HTTPServer, RouterContext]:
        ctx = RouterContext(lookup=lookup, authority=TokenAuthority(SECRET))
        server = HTTPServer(make_router_app(ctx))
        server.listen(port, address="127.0.0.1")
        return server, ctx

    server, ctx = background().run_sync(start(), 10)
    yield f"http://127.0.0.1:{port}"

    async def stop() -> None:
        server.stop()
        await ctx.close()

    background().run_sync(stop(), 10)


async def _execute(kc, code: str) -> dict:
    msg_id = kc.execute(code)
    reply = await kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "ok", reply["content"]
    while True:
        msg = await kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_result":
            return msg["content"]["data"]


async def test_provisioner_on_kubernetes(kube, warm_pool, kube_cluster, router, tmp_path):
    secret = tmp_path / "router-secret"
    secret.write_text(SECRET)
    options = {
        "namespace": kube.ns,
        "kubeconfig": str(kube_cluster.kubeconfig),
        "router_url": router,
        "token_secret_file": str(secret),
    }
    kdir = tmp_path / "kernels" / "sbk8s"
    kdir.mkdir(parents=True)
    spec = make_kernelspec("pool", backend="kubernetes", backend_options=options)
    (kdir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    km = AsyncKernelManager(kernel_name="sbk8s", kernel_spec_manager=ksm)
    warm = {s["metadata"]["name"] for s in kube.list(SB)}

    t0 = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    print(f"\n[stand-in] kernel start (claim + bridge + runtime): {time.perf_counter() - t0:.2f}s")
    prov = km.provisioner
    try:
        assert (await _execute(kc, "6 * 7"))["text/plain"] == "42"

        # the claim: labelled with the kernel id, bound to a warm pool member
        (claim,) = kube.list(CLAIM)
        assert claim["metadata"]["labels"]["jupyter-sandbox/kernel-id"] == km.kernel_id
        sandbox = claim["status"]["sandbox"]["name"]
        assert sandbox in warm
        assert prov.session.status.warm is True  # adopted from the pool

        # suspend (what the culler does): Sandbox Suspended, pod deleted
        await prov.suspend()
        assert kube.get(SB, sandbox)["spec"]["operatingMode"] == "Suspended"
        wait_for(lambda: kube.pod(sandbox) is None, 30, what="pod deleted on suspend")
        assert await km.is_alive()  # poll() says alive while suspended

        # resume: Running again, a new pod, the kernel answers
        await prov.resume()
        assert kube.get(SB, sandbox)["spec"]["operatingMode"] == "Running"
        assert kube.pod(sandbox) is not None
        assert (await _execute(kc, "1 + 1"))["text/plain"] == "2"

        # a restarted Jupyter server: finds the claim by its labels and re-attaches
        plane2 = KubernetesControlPlane(**options)
        try:
            (found,) = await background().run(
                plane2.list_claims({"jupyter-sandbox/kernel-id": km.kernel_id})
            )
            assert found.name == claim["metadata"]["name"] and found.sandbox == sandbox
            session = SandboxSession(
                plane2,
                pool="pool",
                key=os.urandom(16).hex().encode(),
                labels={},
                env={},
                owner_pid=os.getpid(),
                claim_timeout=30,
                claim_name=found.name,
            )
            await background().run(session.start())
            assert session.status is not None and session.status.sandbox == sandbox
            await background().run(session.bridge.close())  # detach, keep the claim
        finally:
            await background().run(plane2.close())
        assert kube.get(CLAIM, claim["metadata"]["name"]) is not None
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)

    # shutdown released the claim; cleanup again is harmless
    await prov.cleanup(restart=False)
    name = claim["metadata"]["name"]
    wait_for(lambda: kube.get(CLAIM, name) is None, 30, what="claim deleted")
    wait_for(lambda: kube.get(SB, sandbox) is None, 30, what="sandbox deleted")
    wait_for(lambda: kube.pod(sandbox) is None, 30, what="pod deleted")
