"""``deploy/`` as users apply it, on the real node: the operator and the router run
as the Deployments of the manifests (in-cluster config through the ``kubernetes``
Service, which kube-proxy maps to the API server on the node's bridge address),
in the image ``deploy/docker/Dockerfile.operator`` builds (built here by buildah,
``tests/cluster/images.py``).  Then the example pool serves a claim, and the
kernel provisioner (Kubernetes backend) runs a notebook cell through the router
pod: suspend, resume with the workspace file, shutdown.

Applying ``deploy/``: the kustomization lists plain YAML files; they are applied
in its order with server-side apply.  The only change is what
``kustomize edit set image`` would do (image names: ours, built locally) plus
``imagePullPolicy: Never`` (no registry).  Storage: hostPath PVs, as in the
other node tests."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.hub.hubprocess import Hub, running_hub
from tests.operator.conftest import CLAIM, POOL, SB, TPL, Kube, is_ready, wait_for

from .conftest import RUNTIME_KEY, _http, pod_ready, run, runtime_token, sandbox_pod

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SYSTEM_NS = "jupyter-sandbox-system"
SANDBOX_NS = "jupyter-sandboxes"
MANAGER = "jupyter-sandbox-node-test"
SECRET = "deploy-manifests-router-secret-0123456789abcdef0123"
PVS = 10  # the example pool's 3 warm sandboxes + a refill for each of the 7 claims the tests make


def manifest_documents(images: dict[str, str]) -> list[dict]:
    """The documents of deploy/kustomization.yaml, in order, with ``images``
    (name without tag -> full reference) substituted and pull policy Never."""
    kz = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = []
    for res in kz["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / res).read_text()):
            if doc:
                docs.append(_override_images(doc, images))
    return docs


def _override_images(doc: dict, images: dict[str, str]) -> dict:
    doc = copy.deepcopy(doc)

    def walk(o):
        if isinstance(o, dict):
            # pod specs only: in the CRDs' schemas "containers" is a schema (a dict)
            lists = [o.get(k) for k in ("containers", "initContainers")]
            for c in [c for cs in lists if isinstance(cs, list) for c in cs]:
                if isinstance(c, dict) and "image" in c:
                    name = c["image"].rsplit(":", 1)[0]
                    if name in images:
                        c["image"] = images[name]
                        c["imagePullPolicy"] = "Never"
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(doc)
    return doc


def server_side_apply(api_client, docs: list[dict]) -> None:
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api_client)
    for doc in docs:
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        res.server_side_apply(
            body=doc,
            name=doc["metadata"]["name"],
            namespace=doc["metadata"].get("namespace"),
            field_manager=MANAGER,
            force_conflicts=True,
        )


def _deployment_available(apps, name: str):
    d = apps.read_namespaced_deployment(name, SYSTEM_NS)
    conds = {c.type: c.status for c in (d.status.conditions or [])}
    ok = conds.get("Available") == "True" and (d.status.available_replicas or 0) == d.spec.replicas
    return d if ok else None


def _delete_quietly(fn, *args) -> None:
    from kubernetes.client.rest import ApiException

    try:
        fn(*args)
    except ApiException as e:
        if e.status != 404:
            raise


SINGLEUSER_FILES = "singleuser-extra-files"


@pytest.fixture(scope="module")
def hub(kube_node_cluster, tmp_path_factory) -> Iterator[Hub]:
    """A real JupyterHub with users alice and bob; its API listens on all addresses
    so that pods reach it on the node's bridge address (which exists only once the
    first pod is networked).  It spawns with KubeSpawner as z2jh does
    (tests/hub/kubehubconfig.py): servers are pods of the single-user image, with
    values.yaml's extraFiles from the Secret ``SINGLEUSER_FILES``."""
    values = yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())
    files = {k: v["mountPath"] for k, v in values["singleuser"]["extraFiles"].items()}
    kube = {
        "namespace": SANDBOX_NS,
        "image": kube_node_cluster.singleuser_image,
        "connect_ip": kube_node_cluster.node.node_ip,
        "files_secret": SINGLEUSER_FILES,
        "files": files,
    }
    with running_hub(
        tmp_path_factory.mktemp("hub"),
        ("alice", "bob"),
        spawn=False,
        api_ip="0.0.0.0",
        config="kubehubconfig.py",
        env={"JSBX_HUB_KUBE": json.dumps(kube), "KUBECONFIG": str(kube_node_cluster.kubeconfig)},
    ) as hub:
        yield hub


def hub_url_for_pods(hub: Hub, node_ip: str) -> str:
    return hub.api_url.replace("0.0.0.0", node_ip)


@pytest.fixture(scope="module")
def deployed(kube_node_cluster, hub, tmp_path_factory):
    """deploy/ applied; operator and router Available; the example pool Ready."""
    from kubernetes import client

    api = kube_node_cluster.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    kube = Kube(api, SANDBOX_NS)
    images = {
        "jupyter-sandbox-operator": kube_node_cluster.operator_image,
        "jupyter-sandbox-runtime": kube_node_cluster.runtime_image,
    }
    docs = manifest_documents(images)
    pv_dir = tmp_path_factory.mktemp("deploy-pvs")
    pvs = []
    for i in range(PVS):
        d = pv_dir / f"pv{i}"
        d.mkdir()
        os.chown(d, 1000, 1000)
        pvs.append(f"pv-deploy-{i}")
        core.create_persistent_volume(
            {
                "metadata": {"name": pvs[-1]},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(d), "type": "Directory"},
                },
            }
        )
    t0 = time.monotonic()
    try:
        # the namespaces first, so that the optional router token Secret (the
        # manifests' documented way to turn on scoped tokens) exists before the
        # router pods start
        ns_docs = [d for d in docs if d["kind"] == "Namespace"]
        server_side_apply(api, ns_docs)
        core.create_namespaced_secret(
            SYSTEM_NS,
            {
                "metadata": {"name": "jupyter-sandbox-router-token"},
                "stringData": {"secret": SECRET},
            },
        )
        # the runtime key, as deploy/README.md says to create it before applying
        core.create_namespaced_secret(
            SYSTEM_NS,
            {
                "metadata": {"name": "jupyter-sandbox-runtime-key"},
                "stringData": {"key": RUNTIME_KEY.decode()},
            },
        )
        # and the hub's API URL (deploy/README.md, JupyterHub): hub users' tokens too
        core.create_namespaced_config_map(
            SYSTEM_NS,
            {
                "metadata": {"name": "jupyter-sandbox-router"},
                "data": {"hubApiUrl": hub_url_for_pods(hub, kube_node_cluster.node.node_ip)},
            },
        )
        server_side_apply(api, docs)
        for name in ("jupyter-sandbox-operator", "jupyter-sandbox-router"):
            wait_for(
                lambda n=name: _deployment_available(apps, n),
                300,
                0.5,
                f"Deployment {name} Available",
            )
        available_s = time.monotonic() - t0
        replicas = kube.get(POOL, "python")["spec"]["replicas"]
        wait_for(
            lambda: (
                (kube.get(POOL, "python") or {}).get("status", {}).get("readyReplicas") == replicas
            ),
            300,
            0.5,
            "example pool Ready",
        )
        pool_s = time.monotonic() - t0
        print(
            f"\n[deploy] operator + router Available in {available_s:.1f}s;"
            f" example pool of {replicas} Ready after {pool_s:.1f}s"
        )
        yield {"api": api, "core": core, "apps": apps, "kube": kube, "docs": docs}
    finally:
        t1 = time.monotonic()
        # sandboxes first, while the operator still runs (its finalizers, if any)
        for res in (CLAIM, POOL, TPL):
            for o in kube.list(res) if _exists(core, SANDBOX_NS) else []:
                kube.delete(res, o["metadata"]["name"])
        if _exists(core, SANDBOX_NS):
            wait_for(lambda: not kube.list(SB), 120, 0.5, "sandboxes deleted")
        for ns in (SANDBOX_NS, SYSTEM_NS):
            _delete_quietly(core.delete_namespace, ns)
        for d in docs:
            if d["kind"] == "ClusterRole":
                _delete_quietly(rbac.delete_cluster_role, d["metadata"]["name"])
            elif d["kind"] == "ClusterRoleBinding":
                _delete_quietly(rbac.delete_cluster_role_binding, d["metadata"]["name"])
        for ns in (SANDBOX_NS, SYSTEM_NS):
            try:
                wait_for(lambda n=ns: not _exists(core, n), 180, 0.5, f"namespace {ns} deleted")
            except AssertionError as exc:
                conditions = core.read_namespace(ns).status.conditions or []
                why = "; ".join(f"{c.type}: {c.message}" for c in conditions if c.status == "True")
                raise AssertionError(f"{exc} ({why})") from None
        for pv in pvs:
            _delete_quietly(core.delete_persistent_volume, pv)
        print(f"\n[deploy] removed in {time.monotonic() - t1:.1f}s")
        api.close()


def _exists(core, ns: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        core.read_namespace(ns)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _router_pod_ip(core) -> str:
    pods = core.list_namespaced_pod(SYSTEM_NS, label_selector="app=sandbox-router").items
    ready = [p for p in pods if pod_ready(p)]
    assert ready, [p.status.phase for p in pods]
    return ready[0].status.pod_ip


async def execute(kc, code: str) -> dict:
    """Run ``code`` on a kernel client; its execute_result's data."""
    msg_id = kc.execute(code)
    reply = await kc.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    while True:
        msg = await kc.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == ("execute_result"):
            return msg["content"]["data"]


def test_operator_and_router_run_in_cluster(kube_node_cluster, deployed):
    core, apps, kube = deployed["core"], deployed["apps"], deployed["kube"]
    # the Deployments' pods run our image on the real node, in-cluster config
    for name in ("jupyter-sandbox-operator", "jupyter-sandbox-router"):
        d = apps.read_namespaced_deployment(name, SYSTEM_NS)
        sel = ",".join(f"{k}={v}" for k, v in d.spec.selector.match_labels.items())
        pods = core.list_namespaced_pod(SYSTEM_NS, label_selector=sel).items
        assert len(pods) == d.spec.replicas
        for p in pods:
            assert pod_ready(p) and p.spec.node_name == kube_node_cluster.node_name
            assert p.spec.containers[0].image == kube_node_cluster.operator_image
    # the `kubernetes` Service points at the API server on the bridge address
    ep = core.read_namespaced_endpoints("kubernetes", "default")
    assert [a.ip for a in ep.subsets[0].addresses] == [kube_node_cluster.node.node_ip]

    # a claim against the example pool adopts a warm sandbox with a real pod
    warm = {s["metadata"]["name"] for s in kube.list(SB)}
    t0 = time.monotonic()
    kube.create(
        CLAIM,
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "deploy-alice"},
            "spec": {"warmPoolRef": {"name": "python"}},
        },
    )
    c = wait_for(
        lambda: (x := kube.get(CLAIM, "deploy-alice")) and is_ready(x) and x,
        120,
        0.05,
        "claim Ready",
    )
    claim_s = time.monotonic() - t0
    name = c["status"]["sandbox"]["name"]
    assert name in warm
    pod = sandbox_pod(kube, name)
    assert pod_ready(pod) and pod.spec.node_name == kube_node_cluster.node_name
    assert pod.spec.containers[0].image == kube_node_cluster.runtime_image
    # no service-account token in the template's pod; the NetworkPolicy exists
    # (not enforced: the CNI bridge plugin has no policy support)
    assert pod.spec.automount_service_account_token is False
    code, _ = _http("POST", f"http://{pod.status.pod_ip}:8888/execute", {"command": "id"})
    assert code == 401, "the runtime answered a caller without its token"
    out = run(
        pod.status.pod_ip,
        "ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; echo rc=$?",
        runtime_token(kube, name),
    )
    assert "rc=0" not in out["stdout"], out
    nps = kube.net.list_namespaced_network_policy(SANDBOX_NS).items
    assert nps, "no NetworkPolicy for the example template"
    kube.delete(CLAIM, "deploy-alice")
    wait_for(lambda: kube.get(SB, name) is None, 120, what="sandbox deleted")
    print(f"\n[deploy] claim Ready in {claim_s * 1000:.0f} ms")


async def test_notebook_through_deployed_router(kube_node_cluster, deployed, tmp_path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from kubernetes import client

    from jupyter_sandbox.kernelspec import make_kernelspec

    core, kube = deployed["core"], deployed["kube"]
    # the router's pod, from the host (the Service's ClusterIP would do in a pod)
    router_url = f"http://{_router_pod_ip(core)}:8080"
    secret_file = tmp_path / "router-secret"
    secret_file.write_text(SECRET)
    options = {
        "namespace": SANDBOX_NS,
        "kubeconfig": str(kube_node_cluster.kubeconfig),
        "router_url": router_url,
        "token_secret_file": str(secret_file),
    }
    kdir = tmp_path / "kernels" / "sbdeploy"
    kdir.mkdir(parents=True)
    spec = make_kernelspec("python", backend="kubernetes", backend_options=options)
    (kdir / "kernel.json").write_text(json.dumps(spec))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])

    km = AsyncKernelManager(kernel_name="sbdeploy", kernel_spec_manager=ksm)
    t0 = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        start_s = time.perf_counter() - t0
        (claim,) = kube.list(CLAIM)
        sandbox = claim["status"]["sandbox"]["name"]
        pod = sandbox_pod(kube, sandbox)
        assert pod_ready(pod)
        data = await execute(
            kc,
            "import os, socket; open('/workspace/nb.txt', 'w').write('deployed'); "
            "(socket.gethostname(), os.getuid())",
        )
        assert data["text/plain"] == repr((sandbox, 1000))
        # the Sandbox Terminal: a shell in the pod, through the deployed router
        # (the typed line is echoed as typed: only the shell's output has the values)
        await _terminal_says(
            km.provisioner.session.endpoint, 'echo "$(hostname)/$(id -u)/ok"', f"{sandbox}/1000/ok"
        )

        # suspend (what the culler does): the pod goes, the PVC stays
        await km.provisioner.suspend()
        wait_for(lambda: sandbox_pod(kube, sandbox) is None, 120, what="pod deleted")
        pvc = kube.core.read_namespaced_persistent_volume_claim(f"workspace-{sandbox}", SANDBOX_NS)
        assert pvc.status.phase == "Bound"

        # resume: a new pod, the same workspace
        t1 = time.perf_counter()
        await km.provisioner.resume()
        data = await execute(kc, "open('/workspace/nb.txt').read()")
        resume_s = time.perf_counter() - t1
        assert data["text/plain"] == repr("deployed")
        new = sandbox_pod(kube, sandbox)
        assert new is not None and new.metadata.uid != pod.metadata.uid
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)

    name = claim["metadata"]["name"]
    wait_for(lambda: kube.get(CLAIM, name) is None, 60, what="claim deleted")
    wait_for(lambda: kube.get(SB, sandbox) is None, 60, what="sandbox deleted")
    wait_for(lambda: sandbox_pod(kube, sandbox) is None, 120, what="pod deleted")
    with pytest.raises(client.ApiException) as e:
        kube.core.read_namespaced_service(sandbox, SANDBOX_NS)
    assert e.value.status == 404
    print(
        f"\n[deploy] kernel start via the deployed router {start_s:.2f}s;"
        f" resume to first reply {resume_s:.1f}s"
    )


async def _terminal_says(endpoint, command: str, until: str) -> str:
    """What a sandbox terminal shows once ``command`` has printed ``until``,
    opened as the Jupyter server opens it (runtime_websocket_request)."""
    from tornado import websocket

    from jupyter_sandbox.kernel_provisioner.bridge import runtime_websocket_request

    request, resolver = runtime_websocket_request(endpoint, "api/terminal")
    ws = await websocket.websocket_connect(request, resolver=resolver)
    try:
        assert json.loads(await ws.read_message()) == ["setup", {}]
        ws.write_message(json.dumps(["stdin", f"{command}\r"]))
        screen = ""
        deadline = time.monotonic() + 60
        while until not in screen:
            assert time.monotonic() < deadline, screen
            message = await asyncio.wait_for(ws.read_message(), 60)
            assert message is not None, screen
            kind, *rest = json.loads(message)
            if kind == "stdout":
                screen += rest[0]
        return screen
    finally:
        ws.close()


def _router_status(router_url: str, sandbox: str, token: str) -> int:
    request = urllib.request.Request(
        f"{router_url}/exists/hub.txt",
        headers={
            "X-Sandbox-ID": sandbox,
            "X-Sandbox-Namespace": SANDBOX_NS,
            "X-Sandbox-Port": "8888",
            "Authorization": f"token {token}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_hub_user_sdk_through_deployed_router(kube_node_cluster, deployed, hub, monkeypatch):
    """The z2jh recipe's authorization on real pods: the SDK as hub user alice
    (router_auth jupyterhub, her hub token, no router secret) through the
    deployed router pod; bob's token and a hub service's token are refused."""
    from jupyter_sandbox.client import SandboxClient
    from jupyter_sandbox.client.models import SandboxDirectConnectionConfig

    core, kube = deployed["core"], deployed["kube"]
    router_url = f"http://{_router_pod_ip(core)}:8080"
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["alice"])
    client = SandboxClient(
        connection_config=SandboxDirectConnectionConfig(api_url=router_url),
        backend_options={
            "kubeconfig": str(kube_node_cluster.kubeconfig),
            "router_auth": "jupyterhub",
        },
    )
    try:
        sb = client.create_sandbox(warmpool="python", namespace=SANDBOX_NS)
        claim = kube.get(CLAIM, sb.claim_name)
        assert claim["metadata"]["annotations"]["jupyter-sandbox/user"] == "alice"
        sb.files.write("hub.txt", "alice's\n")
        result = sb.commands.run("cat hub.txt")
        assert (result.exit_code, result.stdout) == (0, "alice's\n")
        assert sb.files.read("hub.txt") == b"alice's\n"
        assert _router_status(router_url, sb.sandbox_id, hub.tokens["alice"]) == 200
        assert _router_status(router_url, sb.sandbox_id, hub.tokens["bob"]) == 403
        assert _router_status(router_url, sb.sandbox_id, hub.admin_token) == 403
        name = sb.claim_name
        sb.terminate()
        wait_for(lambda: kube.get(CLAIM, name) is None, 60, what="claim deleted")
    finally:
        client.close()


def test_sdk_local_tunnel_to_deployed_router(kube_node_cluster, deployed, tmp_path, monkeypatch):
    """SandboxLocalTunnelConnectionConfig: `kubectl port-forward` (kubectl built
    with the node binaries) to the router's Service, through the API server and
    the kubelet, then commands and files in a real sandbox pod, with a scoped
    token signed by the deployment's router secret."""
    from jupyter_sandbox.client import SandboxClient, SandboxLocalTunnelConnectionConfig
    from tests.cluster.controlplane import find_binary

    kubectl = find_binary("kubectl")
    assert kubectl is not None, "build.sh --node builds kubectl"
    monkeypatch.setenv("PATH", f"{kubectl.parent}{os.pathsep}{os.environ['PATH']}")
    secret_file = tmp_path / "router-secret"
    secret_file.write_text(SECRET)
    config = SandboxLocalTunnelConnectionConfig(
        router_namespace=SYSTEM_NS, router_service="svc/jupyter-sandbox-router"
    )
    client = SandboxClient(
        config,
        backend_options={
            "kubeconfig": str(kube_node_cluster.kubeconfig),
            "token_secret_file": str(secret_file),
        },
    )
    try:
        sb = client.create_sandbox(warmpool="python", namespace=SANDBOX_NS)
        assert sb.endpoint.router_url.startswith("http://127.0.0.1:")
        sb.files.write("tunnel.txt", "through kubectl port-forward\n")
        result = sb.commands.run("cat tunnel.txt")
        assert (result.exit_code, result.stdout) == (0, "through kubectl port-forward\n")
        name = sb.claim_name
        sb.terminate()
        wait_for(lambda: deployed["kube"].get(CLAIM, name) is None, 60, what="claim deleted")
    finally:
        client.close()


# low enough to reach with real pods in the KubeSpawner test
MAX_CLAIMS_PER_USER = 2


def claim_service_documents(images: dict[str, str], hub_url: str, router_url: str) -> list[dict]:
    """deploy/jupyterhub's rbac.yaml and claim-service.yaml, moved from the recipe's
    namespace to the sandboxes', with the hub and router URLs of this node."""
    docs = []
    for name in ("rbac.yaml", "claim-service.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / "jupyterhub" / name).read_text()):
            if not doc:
                continue
            doc = _override_images(doc, images)
            if doc["metadata"].get("namespace") == "jhub":
                doc["metadata"]["namespace"] = SANDBOX_NS
            for subject in doc.get("subjects") or []:
                subject["namespace"] = SANDBOX_NS
            if doc["kind"] == "Deployment":
                env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
                settings = {
                    "CLAIM_SERVICE_HUB_API_URL": hub_url,
                    "CLAIM_SERVICE_ROUTER_URL": router_url,
                    "CLAIM_SERVICE_MAX_CLAIMS_PER_USER": str(MAX_CLAIMS_PER_USER),
                }
                for var in env:
                    var["value"] = settings.get(var["name"], var.get("value"))
            docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def claim_service(kube_node_cluster, deployed, hub) -> Iterator[dict[str, str]]:
    """deploy/jupyterhub's claim service, applied and Available: its URL (its pod,
    from the host) and the router's."""
    from kubernetes import client

    api, core, apps = deployed["api"], deployed["core"], deployed["apps"]
    router_url = f"http://{_router_pod_ip(core)}:8080"
    images = {"jupyter-sandbox-operator": kube_node_cluster.operator_image}
    hub_url = hub_url_for_pods(hub, kube_node_cluster.node.node_ip)
    docs = claim_service_documents(images, hub_url, router_url)
    adm = client.AdmissionregistrationV1Api(api)
    try:
        server_side_apply(api, docs)

        def available():
            d = apps.read_namespaced_deployment("jupyter-sandbox-claims", SANDBOX_NS)
            return (d.status.available_replicas or 0) == 1 and d

        selector = "app.kubernetes.io/name=jupyter-sandbox-claims"
        try:
            wait_for(available, 180, 0.5, "the claim service Available")
        except AssertionError as exc:
            logs = [
                core.read_namespaced_pod_log(
                    p.metadata.name,
                    SANDBOX_NS,
                    previous=bool(p.status.container_statuses)
                    and bool(p.status.container_statuses[0].restart_count),
                )[-2000:]
                for p in core.list_namespaced_pod(SANDBOX_NS, label_selector=selector).items
            ]
            raise AssertionError(f"{exc}; its logs: {logs}") from None
        pods = core.list_namespaced_pod(SANDBOX_NS, label_selector=selector).items
        (pod,) = [p for p in pods if pod_ready(p)]
        # the pod's address serves the host and pods alike (this node does not
        # forward between pods, so a Service's ClusterIP reaches only the host)
        yield {"url": f"http://{pod.status.pod_ip}:8090", "router_url": router_url}
    finally:
        deletes = {
            "ValidatingAdmissionPolicyBinding": adm.delete_validating_admission_policy_binding,
            "ValidatingAdmissionPolicy": adm.delete_validating_admission_policy,
        }
        for doc in docs:
            if doc["kind"] in deletes:
                _delete_quietly(deletes[doc["kind"]], doc["metadata"]["name"])
        _delete_quietly(apps.delete_namespaced_deployment, "jupyter-sandbox-claims", SANDBOX_NS)


def recipe_kernelspec(directory: Path, service_url: str) -> Path:
    """The z2jh recipe's kernelspec (values.yaml), pointed at ``service_url``;
    the kernels directory it is in."""
    values = yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())
    spec = json.loads(values["singleuser"]["extraFiles"]["sandbox-kernelspec"]["stringData"])
    config = spec["metadata"]["kernel_provisioner"]["config"]
    config["backend_options"]["claim_service_url"] = service_url
    kdir = directory / "kernels" / "sandbox-python"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps(spec))
    return directory / "kernels"


async def test_hub_users_through_the_deployed_claim_service(
    kube_node_cluster, deployed, claim_service, hub, tmp_path, monkeypatch
):
    """The z2jh recipe on real pods: the claim service as deploy/jupyterhub
    deploys it, and alice's kernel (the recipe's kernelspec: no Kubernetes
    credentials, her hub token) runs, keeps a variable and a file across a
    suspend and resume in a new pod, and is gone at shutdown; bob, with his own
    token, can neither see, suspend nor delete her claim, nor reach her sandbox."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_sandbox.control_plane.base import ClaimNotFound
    from jupyter_sandbox.control_plane.factory import _create

    kube = deployed["kube"]
    router_url = claim_service["router_url"]
    kernels = recipe_kernelspec(tmp_path, claim_service["url"])
    options = {"claim_service_url": claim_service["url"], "router_auth": "jupyterhub"}
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["alice"])
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # no credentials here

    ksm = KernelSpecManager(kernel_dirs=[str(kernels)])
    km = AsyncKernelManager(kernel_name="sandbox-python", kernel_spec_manager=ksm)
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    bob = None
    try:
        await kc.wait_for_ready(timeout=120)
        (claim,) = kube.list(CLAIM)
        assert claim["metadata"]["annotations"]["jupyter-sandbox/user"] == "alice"
        name, sandbox = claim["metadata"]["name"], claim["status"]["sandbox"]["name"]
        data = await execute(kc, "x = 41 + 1; open('/workspace/hub.txt', 'w').write('alice'); x")
        assert data["text/plain"] == "42"

        # bob, from his own server: nothing of alice's by any verb or route
        monkeypatch.setenv("JUPYTERHUB_USER", "bob")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["bob"])
        bob = _create("kubernetes", dict(options))
        assert await bob.list_claims() == []
        assert await bob.status(name) is None
        for attempt in (bob.suspend, bob.resume):
            with pytest.raises(ClaimNotFound):
                await attempt(name)
        await bob.release(name)
        assert kube.get(CLAIM, name) is not None
        assert _router_status(router_url, sandbox, hub.tokens["bob"]) == 403

        # the culler's suspend: state saved through the router, the pod goes
        pod = sandbox_pod(kube, sandbox)
        await km.provisioner.suspend()
        wait_for(lambda: sandbox_pod(kube, sandbox) is None, 120, what="pod deleted")
        await km.provisioner.resume()
        data = await execute(kc, "(x, open('/workspace/hub.txt').read())")
        assert data["text/plain"] == "(42, 'alice')"
        new = sandbox_pod(kube, sandbox)
        assert new is not None and new.metadata.uid != pod.metadata.uid
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
        if bob is not None:
            await bob.close()
    wait_for(lambda: kube.get(CLAIM, name) is None, 60, what="claim deleted")


async def test_a_restarted_hub_server_takes_back_only_its_users_kernels(
    kube_node_cluster, deployed, claim_service, hub, tmp_path
):
    """Two users' Jupyter servers on the recipe (no Kubernetes credentials): alice's
    server is killed and started again; it re-attaches her running kernel, variables
    intact, through the claim service, and bob's kernel is untouched."""
    from tests.helpers import KernelSocket, jupyter_server, start_kernel
    from tests.helpers import wait_for as twait

    kube = deployed["kube"]
    kernels = recipe_kernelspec(tmp_path, claim_service["url"])

    def env(user: str) -> dict[str, str]:
        return {
            "JUPYTER_PATH": str(kernels.parent),
            "JUPYTERHUB_USER": user,
            "JUPYTERHUB_API_TOKEN": hub.tokens[user],
            "KUBECONFIG": str(tmp_path / "none"),
        }

    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    with jupyter_server(tmp_path / "bob", env=env("bob")) as bobs:
        bobs_kernel = await start_kernel(bobs, "sandbox-python")
        with jupyter_server(tmp_path / "alice", env=env("alice")) as first:
            kernel_id = await start_kernel(first, "sandbox-python")
            ws = await KernelSocket(first, kernel_id).connect()
            await ws.execute("kept = 'before the restart'")
            ws.close()
            first.proc.kill()  # no shutdown: the claim stays for the next server
            first.proc.wait(30)
        claims = {c["metadata"]["annotations"]["jupyter-sandbox/user"] for c in kube.list(CLAIM)}
        assert claims == {"alice", "bob"}, claims
        with jupyter_server(tmp_path / "alice", env=env("alice"), root=first.root) as again:

            async def reattached() -> bool:
                listed = await again.request("GET", "/api/kernels")
                return [k["id"] for k in listed] == [kernel_id]

            await twait(reattached, 60)
            ws = await KernelSocket(again, kernel_id).connect()
            result = await ws.execute("print(kept)")
            ws.close()
            assert result.stdout.strip() == "before the restart", result.stdout
        # bob's server and kernel never noticed
        listed = await bobs.request("GET", "/api/kernels")
        assert [k["id"] for k in listed] == [bobs_kernel]
        assert (
            len(
                [
                    c
                    for c in kube.list(CLAIM)
                    if c["metadata"]["annotations"]["jupyter-sandbox/user"] == "bob"
                ]
            )
            == 1
        )
        await bobs.request("DELETE", f"/api/kernels/{bobs_kernel}", expect=204)
    for c in kube.list(CLAIM):
        kube.delete(CLAIM, c["metadata"]["name"])
    wait_for(lambda: not kube.list(CLAIM), 60, what="claims deleted")


def singleuser_files(service_url: str) -> dict[str, str]:
    """values.yaml's singleuser.extraFiles (Secret key -> content), the
    kernelspec pointed at the claim service's ``service_url``."""
    values = yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())
    files = {k: v["stringData"] for k, v in values["singleuser"]["extraFiles"].items()}
    spec = json.loads(files["sandbox-kernelspec"])
    spec["metadata"]["kernel_provisioner"]["config"]["backend_options"]["claim_service_url"] = (
        service_url
    )
    files["sandbox-kernelspec"] = json.dumps(spec)
    return files


def exec_in_pod(core, pod: str, command: list[str]) -> str:
    """``command`` in ``pod``'s container (what ``kubectl exec`` does): its output."""
    from kubernetes.stream import stream

    return stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        SANDBOX_NS,
        command=command,
        stdout=True,
        stderr=True,
        stdin=False,
        tty=False,
        _request_timeout=180,
    )


def _restart_count(core, pod: str) -> int:
    statuses = core.read_namespaced_pod(pod, SANDBOX_NS).status.container_statuses or []
    return sum(s.restart_count for s in statuses)


def _kill_server_of(core, user: str) -> None:
    """SIGKILL ``user``'s single-user server from the host (in its pod it is pid 1,
    which no signal from inside can kill)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if not any("jupyterhub-singleuser" in part for part in proc.info["cmdline"] or []):
            continue
        try:
            if proc.environ().get("JUPYTERHUB_USER") == user:
                proc.kill()
                return
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no single-user server of {user}'s on this host")


def user_claims(kube: Kube, user: str) -> dict[str, dict]:
    return {
        c["metadata"]["name"]: c
        for c in kube.list(CLAIM)
        if c["metadata"]["annotations"].get("jupyter-sandbox/user") == user
    }


async def test_kubespawner_users_cannot_reach_each_others_kernels(
    kube_node_cluster, deployed, claim_service, hub
):
    """zero-to-jupyterhub for real: KubeSpawner runs alice's and bob's servers in
    pods of deploy/jupyterhub/Dockerfile's image, set up as values.yaml says (no
    service-account token; kernelspec and server settings mounted as extraFiles).
    Each opens a notebook whose kernel is claimed through the claim service.
    From inside alice's pod, every route to bob's kernel is refused: the claim
    service, the router, bob's sandbox pod and server pod by IP, the Kubernetes
    API, the hub.  Over her limit alice gets the reason in JupyterLab's answer.
    Her pod killed and her server started again, it takes back her kernels (a
    variable intact), and bob's kernel never noticed."""
    from kubernetes import client

    from jupyter_sandbox.protocol import runtime_auth
    from tests.helpers import KernelSocket
    from tests.helpers import wait_for as twait

    core, kube = deployed["core"], deployed["kube"]
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=SINGLEUSER_FILES),
        string_data=singleuser_files(claim_service["url"]),
    )
    core.create_namespaced_secret(SANDBOX_NS, secret)
    alice, bob = hub.server("alice"), hub.server("bob")

    async def open_notebook(server, path: str) -> str:
        """What JupyterLab does when a notebook is opened: a session; its kernel id."""
        body = {"path": path, "type": "notebook", "kernel": {"name": "sandbox-python"}}
        model = await server.request("POST", "/api/sessions", body, expect=201, timeout=240)
        return str(model["kernel"]["id"])

    async def run(server, kernel_id: str, code: str) -> str:
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(code)
        finally:
            ws.close()
        return result.stdout.strip()

    try:
        for user in ("alice", "bob"):
            response = await hub.api("POST", f"/hub/api/users/{user}/server")
            assert response.code in (201, 202), response.body
        for user in ("alice", "bob"):
            await hub.wait_ready(user, 300)
        pods = {u: core.read_namespaced_pod(f"jupyter-{u}", SANDBOX_NS) for u in ("alice", "bob")}
        assert pods["alice"].spec.automount_service_account_token is False
        # only the sandbox kernel is offered: none runs in the user's pod
        specs = await alice.request("GET", "/api/kernelspecs")
        assert (specs["default"], list(specs["kernelspecs"])) == (
            "sandbox-python",
            ["sandbox-python"],
        )

        bobs_kernel = await open_notebook(bob, "bob.ipynb")
        assert await run(bob, bobs_kernel, "secret = 'bob'; print(secret)") == "bob"
        alices_kernel = await open_notebook(alice, "alice.ipynb")
        assert await run(alice, alices_kernel, "x = 41 + 1; print(x)") == "42"
        (bobs_claim,) = user_claims(kube, "bob").values()
        bobs_sandbox = bobs_claim["status"]["sandbox"]["name"]
        bobs_sandbox_pod = sandbox_pod(kube, bobs_sandbox)
        assert bobs_sandbox_pod is not None

        # the attack, from inside alice's pod
        target = {
            "claim_service": claim_service["url"],
            "router": claim_service["router_url"],
            "claim": bobs_claim["metadata"]["name"],
            "sandbox": bobs_sandbox,
            "sandbox_ip": bobs_sandbox_pod.status.pod_ip,
            "server_ip": pods["bob"].status.pod_ip,
            "user": "bob",
            "namespace": SANDBOX_NS,
            "runtime_header": runtime_auth.HEADER,
        }
        script = (Path(__file__).parent / "pod_attack.py").read_text()
        output = exec_in_pod(core, "jupyter-alice", ["python", "-c", script, json.dumps(target)])
        got = json.loads(output.strip().splitlines()[-1])
        listed = got.pop("service list")
        assert isinstance(listed, dict) and listed["status"] == 200, listed
        names = [c["name"] for c in json.loads(listed["body"])["items"]]
        assert names == list(user_claims(kube, "alice")), names
        refused = {
            "service get": {404},
            "service suspend": {404},
            "service resume": {404},
            "service delete": {404},
            "router": {403},
            "pod ip kernel": {401, 403},
            "pod ip channels": {401, 403},
            "pod ip variables": {401, 403},
            "pod ip execute": {401, 403},
            "pod ip with hub token": {401, 403},
            "server kernels": {403},
            "server sessions": {403},
            "service account token": {False},
            "kube claims": {401, 403},
            "kube claims with hub token": {401},
            "kube pods": {401, 403},
            "kube pods with hub token": {401},
            "hub user": {403, 404},
            "hub token": {403, 404},
        }
        wrong = {k: v for k, v in got.items() if v not in refused[k]}
        assert not wrong and set(got) == set(refused), (wrong, got)
        # bob never noticed
        assert kube.get(CLAIM, bobs_claim["metadata"]["name"]) is not None
        assert sandbox_pod(kube, bobs_sandbox).metadata.uid == bobs_sandbox_pod.metadata.uid
        assert await run(bob, bobs_kernel, "print(secret)") == "bob"

        # over her limit: JupyterLab's session request answers with the reason
        second = await open_notebook(alice, "second.ipynb")
        assert len(user_claims(kube, "alice")) == MAX_CLAIMS_PER_USER
        body = {"path": "third.ipynb", "type": "notebook", "kernel": {"name": "sandbox-python"}}
        answer = json.dumps(await alice.request("POST", "/api/sessions", body, timeout=240))
        assert f"alice already has {MAX_CLAIMS_PER_USER} sandboxed kernels" in answer, answer
        assert "shut down a kernel you no longer need" in answer, answer
        assert len(user_claims(kube, "alice")) == MAX_CLAIMS_PER_USER

        # alice's server dies at once (SIGKILL: out of memory, a crash): kubelet
        # starts it again in her pod, and it takes back her kernels, and only hers
        restarts = _restart_count(core, "jupyter-alice")
        _kill_server_of(core, "alice")
        wait_for(
            lambda: _restart_count(core, "jupyter-alice") > restarts,
            120,
            what="alice's server restarted",
        )
        await hub.wait_ready("alice", 300)

        async def reattached() -> bool:
            try:
                kernels = await alice.request("GET", "/api/kernels")
            except json.JSONDecodeError:  # the hub's page: her server is not back yet
                return False
            return sorted(k["id"] for k in kernels) == sorted([alices_kernel, second])

        try:
            await twait(reattached, 120)
        except TimeoutError:
            log = core.read_namespaced_pod_log("jupyter-alice", SANDBOX_NS)[-4000:]
            claims = {n: c["metadata"]["labels"] for n, c in user_claims(kube, "alice").items()}
            kernels = await alice.request("GET", "/api/kernels")
            raise AssertionError(
                f"not re-attached: {kernels}; claims {claims}; log {log}"
            ) from None
        assert await run(alice, alices_kernel, "print(x)") == "42"
        assert [c["metadata"]["uid"] for c in user_claims(kube, "bob").values()] == [
            bobs_claim["metadata"]["uid"]
        ]
        assert await run(bob, bobs_kernel, "print(secret)") == "bob"
        for server, kernel in ((alice, alices_kernel), (alice, second), (bob, bobs_kernel)):
            await server.request("DELETE", f"/api/kernels/{kernel}", expect=204)
        wait_for(lambda: not kube.list(CLAIM), 120, what="claims deleted")
    finally:
        for user in ("alice", "bob"):
            try:
                await hub.stop_server(user, timeout=120)
            except RuntimeError:
                pass
        _delete_quietly(core.delete_namespaced_secret, SINGLEUSER_FILES, SANDBOX_NS)
        for c in kube.list(CLAIM):
            kube.delete(CLAIM, c["metadata"]["name"])
