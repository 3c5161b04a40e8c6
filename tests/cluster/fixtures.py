"""pytest plugin: a session-scoped real control plane with our CRDs installed.

Use ``-p tests.cluster.fixtures`` (or register it in a conftest) and mark tests
that need it with ``@pytest.mark.cluster``.  Missing binaries skip those tests
with the reason, except under ``CI`` where they fail loudly.

``JUPYTER_SANDBOX_TEST_KUBECONFIG`` points the fixture at an already running
control plane (e.g. one started with ``tests/cluster/up.sh``) instead of
starting a fresh one.

``kube_node_cluster`` (tests marked ``@pytest.mark.node``) is a second control
plane, without kwok, joined by one real node (containerd, runc, CNI bridge,
kubelet: see ``node.py``) whose pods run the locally built runtime image.
``JUPYTER_SANDBOX_TEST_NODE_CLUSTER=1`` reuses the one ``tests/cluster/node-up.sh``
started.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from .controlplane import ControlPlane, missing_binaries

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "crds"


@dataclass
class KubeCluster:
    kubeconfig: Path
    url: str
    controlplane: ControlPlane | None = None

    def api_client(self):
        """A fresh ``kubernetes`` (sync) ApiClient for this cluster."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cluster: needs the real Kubernetes test control plane (tests/cluster)"
    )
    config.addinivalue_line(
        "markers",
        "node: needs a real node (kubelet + containerd, root; tests/cluster/build.sh --node)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Node tests start containerd and a kubelet as root: only when asked for
    (``-m node`` or an expression naming it), never as part of a plain run."""
    if "node" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="real-node test: select with -m node")
    for item in items:
        if item.get_closest_marker("node"):
            item.add_marker(skip)


def crd_documents() -> list[dict]:
    docs = []
    for f in sorted(CRD_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def install_crds(api_client, timeout: float = 60, documents: list[dict] | None = None) -> None:
    """Create or update our CRDs (or ``documents``) and wait until each is Established."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    names = []
    for doc in documents if documents is not None else crd_documents():
        name = doc["metadata"]["name"]
        names.append(name)
        try:
            cur = ext.read_custom_resource_definition(name)
            doc["metadata"]["resourceVersion"] = cur.metadata.resource_version
            ext.replace_custom_resource_definition(name, doc)
        except ApiException as e:
            if e.status != 404:
                raise
            ext.create_custom_resource_definition(doc)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
            if conds.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established: {conds}")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def kube_cluster():
    external = os.environ.get("JUPYTER_SANDBOX_TEST_KUBECONFIG")
    if external:
        cfg = yaml.safe_load(Path(external).read_text())
        cluster = KubeCluster(
            kubeconfig=Path(external), url=cfg["clusters"][0]["cluster"]["server"]
        )
        with cluster.api_client() as api:
            install_crds(api)
        yield cluster
        return
    missing = missing_binaries()
    if missing:
        msg = (
            f"Kubernetes test binaries missing ({', '.join(missing)}): run tests/cluster/build.sh "
            "or set KUBEBUILDER_ASSETS"
        )
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    cp = ControlPlane()
    t0 = time.monotonic()
    cp.start()
    try:
        cluster = KubeCluster(kubeconfig=cp.kubeconfig, url=cp.url, controlplane=cp)
        with cluster.api_client() as api:
            install_crds(api)
        took = time.monotonic() - t0
        print(f"\n[kube_cluster] control plane + CRDs ready in {took:.1f}s at {cp.url}")
        yield cluster
    finally:
        cp.stop()


@dataclass
class KubeNodeCluster(KubeCluster):
    """A control plane plus one real node; ``images`` maps "runtime"/"pause" to refs."""

    node: object | None = None
    node_name: str = ""
    images: dict | None = None

    @property
    def runtime_image(self) -> str:
        assert self.images
        return self.images["runtime"]

    @property
    def operator_image(self) -> str:
        """The operator/router image (``deploy/docker/Dockerfile.operator``)."""
        assert self.images
        return self.images["operator"]

    @property
    def singleuser_image(self) -> str:
        """The z2jh single-user image (``deploy/jupyterhub/Dockerfile``)."""
        assert self.images
        return self.images["singleuser"]


@pytest.fixture(scope="session")
def kube_node_cluster():
    from .__main__ import node_dir
    from .node import Node, default_node_ip, missing_node_parts

    if os.environ.get("JUPYTER_SANDBOX_TEST_NODE_CLUSTER"):
        import json

        st = json.loads((node_dir() / "state.json").read_text())
        cluster = KubeNodeCluster(
            kubeconfig=Path(st["kubeconfig"]),
            url=st["url"],
            node_name=st["node"],
            images=st["images"],
        )
        with cluster.api_client() as api:
            install_crds(api)
        yield cluster
        return
    missing = missing_binaries(with_kwok=False) + missing_node_parts()
    if missing:
        msg = f"real-node test cluster not available, missing: {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    t0 = time.monotonic()
    # pods reach the API server (bridge address, `kubernetes` Service via kube-proxy)
    cp = ControlPlane(with_kwok=False, pod_reachable_address=default_node_ip())
    node = None
    try:
        cp.start()
        with KubeCluster(kubeconfig=cp.kubeconfig, url=cp.url).api_client() as api:
            install_crds(api)
        t1 = time.monotonic()
        node = Node(cp, controlplane_owned=True, kube_proxy=True)
        node.start()
        timings = " ".join(f"{k}={v:.1f}s" for k, v in node.timings.items())
        print(
            f"\n[kube_node_cluster] control plane in {t1 - t0:.1f}s, node {node.name} Ready "
            f"in {time.monotonic() - t1:.1f}s ({timings})"
        )
        yield KubeNodeCluster(
            kubeconfig=cp.kubeconfig,
            url=cp.url,
            controlplane=cp,
            node=node,
            node_name=node.name,
            images=dict(node.images),
        )
    finally:
        if node is not None:
            node.stop()
        cp.stop()
