"""Fixtures for the real-node tests: a namespace, hostPath PVs, our operator as a
host process, the example template/pool with the locally built image."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from jupyter_sandbox.protocol import runtime_auth
from tests.helpers import wait_listening
from tests.operator.conftest import Kube, OperatorProc, wait_for

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "python-kernel.yaml"
REPLICAS = 2


# The runtime key the node tests' operators and routers share (protocol/runtime_auth.py).
RUNTIME_KEY = b"node-tests-runtime-key-0123456789abcdef0123456789"


def runtime_token(kube: Kube, name: str) -> str:
    """The token of sandbox ``name``'s runtime, as the router derives it."""
    from tests.operator.conftest import SB

    sandbox = kube.get(SB, name)
    assert sandbox is not None, name
    return runtime_auth.token_for(RUNTIME_KEY, kube.ns, name, sandbox["metadata"]["uid"])


def _http(
    method: str, url: str, body: dict | None = None, timeout: float = 30, token: str = ""
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers[runtime_auth.HEADER] = token
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def run(ip: str, command: str, token: str) -> dict:
    """``command`` in the runtime at ``ip``, presenting its sandbox's token."""
    code, body = _http(
        "POST",
        f"http://{ip}:8888/execute",
        {"command": command, "shell": True, "timeout": 30},
        token=token,
    )
    assert code == 200, body
    return body


def example_objects(image: str) -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    tpl = copy.deepcopy(next(d for d in docs if d["kind"] == "SandboxTemplate"))
    pool = copy.deepcopy(next(d for d in docs if d["kind"] == "SandboxWarmPool"))
    for d in (tpl, pool):
        d["metadata"].pop("namespace", None)
    (c,) = tpl["spec"]["podTemplate"]["spec"]["containers"]
    c["image"] = image
    c["imagePullPolicy"] = "Never"
    pool["spec"]["replicas"] = REPLICAS
    return tpl, pool


@pytest.fixture
def kube(kube_node_cluster):
    from kubernetes import client

    api = kube_node_cluster.api_client()
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, what="default SA")
    yield Kube(api, ns)
    try:
        core.delete_namespace(ns)
    except Exception:
        pass
    api.close()


@pytest.fixture
def host_pvs(kube, tmp_path):
    """hostPath PVs, one directory each, writable by the runtime's uid 1000."""
    made = []
    for i in range(REPLICAS + 4):
        d = tmp_path / f"pv{i}"
        d.mkdir()
        os.chown(d, 1000, 1000)
        name = f"pv-{kube.ns}-{i}"
        kube.core.create_persistent_volume(
            {
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(d), "type": "Directory"},
                },
            }
        )
        made.append(name)
    yield made
    for name in made:
        try:
            kube.core.delete_persistent_volume(name)
        except Exception:
            pass


def runtime_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "runtime-key"
    path.write_bytes(RUNTIME_KEY)
    return path


@pytest.fixture
def operator(kube_node_cluster, kube, tmp_path):
    key = runtime_key_file(tmp_path)
    p = OperatorProc(
        kube_node_cluster.kubeconfig,
        kube.ns,
        tmp_path / "operator.log",
        [f"--runtime-key-file={key}"],
    ).start()
    yield p
    p.stop()


def sandbox_pod(kube: Kube, name: str):
    from kubernetes import client

    try:
        return kube.core.read_namespaced_pod(name, kube.ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def pod_ready(pod) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])} if pod else {}
    return conds.get("Ready") == "True" and bool(pod.status.pod_ip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def router_factory(kube_node_cluster, kube, tmp_path):
    """``python -m jupyter_sandbox.router`` on loopback, resolving sandboxes from the
    API (their pod IPs), presenting each runtime's token; with a secret it requires
    scoped tokens, without one it admits every caller (the upstream router's
    behaviour)."""
    procs: list[subprocess.Popen] = []

    def start(secret: str | None = None) -> tuple[str, Path | None]:
        args = [
            sys.executable,
            "-m",
            "jupyter_sandbox.router",
            "--address=127.0.0.1",
            "--resolve=api",
            f"--kubeconfig={kube_node_cluster.kubeconfig}",
            f"--allowed-namespaces={kube.ns}",
            f"--runtime-key-file={runtime_key_file(tmp_path)}",
        ]
        secret_file = None
        if secret:
            secret_file = tmp_path / f"router-secret-{len(procs)}"
            secret_file.write_text(secret)
            args.append(f"--token-secret-file={secret_file}")
        else:
            args.append("--allow-unauthenticated")
        port = _free_port()
        args.append(f"--port={port}")
        log_path = tmp_path / f"router-{len(procs)}.log"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=env,
                start_new_session=True,
            )
        procs.append(proc)
        wait_listening(proc, port, log_path, "the router")
        return f"http://127.0.0.1:{port}", secret_file

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def warm_pool(kube_node_cluster, kube, host_pvs, operator):
    """The example template and pool (``python``), all members Ready; their names."""
    from tests.operator.conftest import POOL, SB, TPL

    tpl, pool = example_objects(kube_node_cluster.runtime_image)
    kube.create(TPL, tpl)
    kube.create(POOL, pool)
    wait_for(
        lambda: (kube.get(POOL, "python") or {}).get("status", {}).get("readyReplicas") == REPLICAS,
        300,
        interval=0.5,
        what="warm pool Ready",
    )
    return {s["metadata"]["name"] for s in kube.list(SB)}
