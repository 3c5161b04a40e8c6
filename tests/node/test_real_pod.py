"""A real pod on a real node: the runtime image, started by kubelet + containerd + runc,
reached over its pod IP from the host."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]


def _http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_pod_ready(core, name: str, ns: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    pod = None
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, ns)
        conds = {c.type: c.status for c in (pod.status.conditions or [])}
        if conds.get("Ready") == "True" and pod.status.pod_ip:
            return pod
        time.sleep(0.25)
    raise TimeoutError(f"pod {ns}/{name} not Ready: {pod.status if pod else None}")


def test_runtime_pod_runs_and_serves_over_pod_ip(kube_node_cluster):
    from kubernetes import client

    ns = "default"
    name = f"runtime-{int(time.time())}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "jsbx-runtime"}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "runtime",
                    "image": kube_node_cluster.runtime_image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-m", "jupyter_sandbox.runtime"],
                    "args": ["--port", "8888", "--workspace", "/workspace"],
                    "ports": [{"containerPort": 8888, "name": "http"}],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": 8888},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }
    with kube_node_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        t0 = time.monotonic()
        core.create_namespaced_pod(ns, pod)
        try:
            p = wait_pod_ready(core, name, ns)
            ready_s = time.monotonic() - t0
            print(f"\n[node] pod {name} Ready in {ready_s:.1f}s at {p.status.pod_ip}")
            assert p.spec.node_name == kube_node_cluster.node_name
            base = f"http://{p.status.pod_ip}:8888"

            code, body = _http("GET", f"{base}/readyz")
            assert code == 200 and body["ready"] is True, body

            code, body = _http(
                "POST",
                f"{base}/execute",
                {"command": "python -c 'import os, sys; print(os.getuid(), sys.version_info[:2])'"},
            )
            assert code == 200, body
            assert body["exit_code"] == 0, body
            assert body["stdout"].strip() == "1000 (3, 11)", body

            # the container really is isolated: its own hostname (the pod name)
            # and its own network namespace with the pod IP
            code, body = _http("POST", f"{base}/execute", {"command": "hostname"})
            assert body["stdout"].strip() == name, body
            code, body = _http(
                "POST", f"{base}/execute", {"command": "cat /proc/net/fib_trie", "timeout": 10}
            )
            assert p.status.pod_ip in body["stdout"], body
        finally:
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                core.read_namespaced_pod(name, ns)
            except client.ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.25)
        else:
            pytest.fail(f"pod {name} not deleted")
