"""Helpers for operator tests: API clients, a namespace per test, the operator
as a real subprocess (scoped to that namespace, so tests never share one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SB = ("agents.x-k8s.io", "v1beta1", "sandboxes")
TPL = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates")
POOL = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools")
CLAIM = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims")


@dataclass
class Kube:
    """Thin sync wrapper over the official ``kubernetes`` client (dict objects)."""

    api_client: Any
    ns: str = ""

    def __post_init__(self) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(self.api_client)
        self.co = client.CustomObjectsApi(self.api_client)
        self.net = client.NetworkingV1Api(self.api_client)

    def create(self, res: tuple[str, str, str], body: dict, ns: str | None = None) -> dict:
        g, v, p = res
        return self.co.create_namespaced_custom_object(g, v, ns or self.ns, p, body)

    def get(self, res: tuple[str, str, str], name: str, ns: str | None = None) -> dict | None:
        from kubernetes.client.rest import ApiException

        g, v, p = res
        try:
            return self.co.get_namespaced_custom_object(g, v, ns or self.ns, p, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, res: tuple[str, str, str], ns: str | None = None, **kw: Any) -> list[dict]:
        g, v, p = res
        return self.co.list_namespaced_custom_object(g, v, ns or self.ns, p, **kw)["items"]

    def patch(
        self, res: tuple[str, str, str], name: str, body: dict, ns: str | None = None
    ) -> dict:
        g, v, p = res
        return self.co.patch_namespaced_custom_object(g, v, ns or self.ns, p, name, body)

    def delete(self, res: tuple[str, str, str], name: str, ns: str | None = None) -> None:
        from kubernetes.client.rest import ApiException

        g, v, p = res
        try:
            self.co.delete_namespaced_custom_object(g, v, ns or self.ns, p, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def pods(self) -> list:
        return self.core.list_namespaced_pod(self.ns).items

    def pod(self, name: str):
        from kubernetes.client.rest import ApiException

        try:
            return self.core.read_namespaced_pod(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def events(self, name: str) -> list:
        return self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name}"
        ).items


def wait_for(
    pred: Callable[[], Any], timeout: float = 30, interval: float = 0.2, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = pred()
        except Exception as e:  # transient API errors while polling
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what or pred}: last={last!r}"
            )
        time.sleep(interval)


def cond(obj: dict | None, ctype: str) -> dict:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == ctype:
            return c
    return {}


def is_ready(obj: dict | None) -> bool:
    return cond(obj, "Ready").get("status") == "True"


@pytest.fixture(scope="session")
def api_client(kube_cluster):
    c = kube_cluster.api_client()
    yield c
    c.close()


@pytest.fixture
def kube(api_client, kube_cluster) -> Iterator[Kube]:
    """A fresh namespace (deleted afterwards) and a client bound to it."""
    from kubernetes import client

    ns = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(
        lambda: core.read_namespaced_service_account("default", ns),
        30,
        what="default ServiceAccount",
    )
    k = Kube(api_client, ns)
    yield k
    try:
        core.delete_namespace(ns)
    except Exception:
        pass


@pytest.fixture
def make_pv(kube) -> Iterator[Callable[[], str]]:
    """Pre-provisioned PersistentVolumes so PVCs bind (no dynamic provisioner here)."""
    made: list[str] = []

    def make(size: str = "1Gi") -> str:
        name = f"pv-{kube.ns}-{len(made)}"
        kube.core.create_persistent_volume(
            {
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": f"/tmp/{name}"},
                },
            }
        )
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            kube.core.delete_persistent_volume(name)
        except Exception:
            pass


@dataclass
class OperatorProc:
    kubeconfig: Path
    namespace: str
    log_path: Path
    extra: list[str] = field(default_factory=list)
    identity: str = ""
    proc: subprocess.Popen | None = None

    def start(self) -> OperatorProc:
        args = [
            sys.executable,
            "-m",
            "jupyter_sandbox.operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={self.namespace}",
            f"--leader-election-namespace={self.namespace}",
            "--lease-duration=4",
            "--renew-deadline=3",
            "--retry-period=0.5",
            "--metrics-bind-address=0",
            *self.extra,
        ]
        if self.identity:
            args.append(f"--identity={self.identity}")
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
        )
        log.close()
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=15)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def operator_factory(kube_cluster, kube, tmp_path) -> Iterator[Callable[..., OperatorProc]]:
    procs: list[OperatorProc] = []

    def make(*extra: str, identity: str = "", start: bool = True) -> OperatorProc:
        p = OperatorProc(
            kube_cluster.kubeconfig,
            kube.ns,
            tmp_path / f"operator-{len(procs)}.log",
            list(extra),
            identity,
        )
        procs.append(p)
        return p.start() if start else p

    yield make
    for p in procs:
        p.stop()


@pytest.fixture
def operator(operator_factory) -> OperatorProc:
    return operator_factory()


# ---------------------------------------------------------------- object builders


def template_body(name: str = "python", **spec: Any) -> dict:
    body = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "kernel"}},
                "spec": {
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "jupyter-sandbox/runtime:test",
                            "ports": [{"name": "http", "containerPort": 8888}],
                        }
                    ]
                },
            },
        },
    }
    body["spec"].update(spec)
    return body


def pool_body(name: str = "pool", template: str = "python", replicas: int = 2, **spec: Any) -> dict:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}, **spec},
    }


def claim_body(name: str, pool: str = "pool", **spec: Any) -> dict:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}, **spec},
    }


def sandbox_body(name: str, **spec: Any) -> dict:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "kernel"}, "annotations": {"example.com/a": "b"}},
                "spec": {
                    "containers": [
                        {"name": "runtime", "image": "busybox", "ports": [{"containerPort": 8888}]}
                    ]
                },
            },
            **spec,
        },
    }
