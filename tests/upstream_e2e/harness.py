"""Run upstream agent-sandbox's own end-to-end suite against a controller.

Upstream's ``test/e2e`` and ``test/e2e/extensions`` packages are compiled from
the ``sigs.k8s.io/agent-sandbox`` Go module at :data:`VERSION` (``go test -c``)
and run, test by test, against a fresh control plane (tests/cluster) with kwok
nodes and one controller: ours (the operator as a process) or upstream's (its
controller built from the same module, webhooks off), each with its own CRDs.

What the suite expects of its cluster and kwok does not give by default:

- the ``agent-sandbox-system`` namespace and an ``agent-sandbox-controller``
  Deployment (every test checks they exist; here a placeholder);
- the deployment, replicaset and PVC/PV protection controllers;
- PersistentVolumes for the volume claim template tests;
- pods that take time: kwok's stock stages make a pod Ready at once and
  complete only Job pods, so here a pod is Ready after 1 s, a ``restartPolicy:
  Never`` pod exits 0 after 2 s, and a pod with a ``preStop`` hook stays
  Terminating for 4 s.

Tests that need upstream's images or a real kubelet (Chrome, the Python
runtime, sandboxd, RuntimeClass, density) are skipped for both controllers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster import crdgen
from tests.cluster.controlplane import ControlPlane, find_binary
from tests.cluster.fixtures import crd_documents, install_crds
from tests.helpers import stop_process

from .build import REPO, VERSION, build_suites, build_upstream_controller, log

# Need upstream's images, a real kubelet or a real runtime class: skipped for both.
NOT_RUNNABLE = re.compile(r"Chrome|Python|Sandboxd|RuntimeClass|Density")
TEST_TIMEOUT = "240s"
POD_START_MILLISECONDS = 1000
PERSISTENT_VOLUMES = 24

STAGES = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-exits}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: DoesNotExist}
    - {key: .status.phase, operator: In, values: [Running]}
    - {key: .spec.restartPolicy, operator: In, values: [Never]}
  delay: {durationMilliseconds: 2000}
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: '.spec.containers.[].lifecycle.preStop', operator: DoesNotExist}
  next: {delete: true}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-delete-after-prestop}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .metadata.deletionTimestamp, operator: Exists}
    - {key: '.spec.containers.[].lifecycle.preStop', operator: Exists}
  delay: {durationMilliseconds: 4000}
  next: {delete: true}
"""


def kwok_stages() -> str:
    """build.sh's stages (nodes, pod readiness) with the pod endings above."""
    kwok = find_binary("kwok")
    assert kwok is not None, "kwok is not built: run tests/cluster/build.sh"
    stock = yaml.safe_load_all((kwok.parent / "kwok-stages.yaml").read_text())
    ours = list(yaml.safe_load_all(STAGES))
    replaced = {d["metadata"]["name"] for d in ours}
    kept = [d for d in stock if d and d["metadata"]["name"] not in replaced]
    for stage in kept:
        if stage["metadata"]["name"] == "pod-ready":
            # A real pod takes a while to start; instantly Ready pods hide the
            # Ready=False that follows a pod's loss (TestWarmPoolSandboxWatcher
            # polls every 100 ms).
            stage["spec"]["delay"] = {"durationMilliseconds": POD_START_MILLISECONDS}
    return yaml.safe_dump_all([*kept, *ours], sort_keys=False)


def runnable_tests(binary: Path) -> list[str]:
    out = subprocess.run(
        [str(binary), "-test.list", "^Test"], check=True, capture_output=True, text=True
    ).stdout
    return [t for t in out.split() if t.startswith("Test") and not NOT_RUNNABLE.search(t)]


# Tests that race any controller, ours or upstream's, and how their lost race reads.
# TestSandboxVolumeClaimTemplatesImmutable creates a Sandbox, reads it and updates it
# at once; a controller's first status write (both write one, the same one, in the
# same order: python -m tests.upstream_e2e --writes) that lands between the read and
# the update makes the API server answer 409 before it validates. Upstream's
# controller loses it too (1 in 20 there, 4 in 20 for ours, on 2 cores). Such a test
# is run again, up to RACE_RETRIES times, only when its failure is that conflict;
# the table says so, and any other failure fails at once.
RACES = {
    "TestSandboxVolumeClaimTemplatesImmutable": "the object has been modified; please "
    "apply your changes to the latest version and try again",
}
RACE_RETRIES = 2


@dataclass
class Outcome:
    test: str
    passed: bool
    seconds: float
    output: str = field(repr=False, default="")
    races_lost: int = 0  # runs that failed only by the race RACES names


def _apply(cp: ControlPlane, docs: list[dict]) -> None:
    from kubernetes import client, config, utils

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        for doc in docs:
            utils.create_from_dict(api, doc)


def _harness_objects() -> list[dict]:
    ns = "agent-sandbox-system"
    labels = {"app": "agent-sandbox-controller"}
    docs: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "agent-sandbox-controller", "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "placeholder", "image": "placeholder:0"}]},
                },
            },
        },
    ]
    for i in range(PERSISTENT_VOLUMES):
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"e2e-pv-{i}"},
                "spec": {
                    "capacity": {"storage": "10Gi"},
                    "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "hostPath": {"path": f"/tmp/e2e-pv-{i}"},
                },
            }
        )
    return docs


@contextmanager
def cluster_with(controller: str, workdir: Path) -> Iterator[ControlPlane]:
    """A fresh control plane with ``controller`` ("ours" or "upstream") running."""
    workdir.mkdir(parents=True, exist_ok=True)
    stages = workdir / "kwok-stages.yaml"
    stages.write_text(kwok_stages())
    cp = ControlPlane(
        nodes=2,
        workdir=workdir / "cluster",
        kwok_stages=stages,
        extra_controllers=("deployment", "replicaset", "pvc-protection", "pv-protection"),
    )
    (workdir / "cluster").mkdir(parents=True, exist_ok=True)
    cp.start()
    proc: subprocess.Popen | None = None
    try:
        if controller == "ours":
            crds = crd_documents()
        else:
            crds = []
            for f in sorted(crdgen.upstream_crd_dir(VERSION).glob("*.yaml")):
                crds += [d for d in yaml.safe_load_all(f.read_text()) if d]
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        with client.ApiClient(cfg) as api:
            install_crds(api, documents=crds)
        _apply(cp, _harness_objects())
        log_file = open(workdir / f"{controller}-controller.log", "wb")
        if controller == "ours":
            argv = [
                sys.executable,
                "-m",
                "jupyter_sandbox.operator",
                f"--kubeconfig={cp.kubeconfig}",
                "--no-leader-elect",
                "--metrics-bind-address=0",
            ]
        else:
            argv = [
                str(build_upstream_controller()),
                f"--kubeconfig={cp.kubeconfig}",
                "--extensions=true",
                "--leader-elect=false",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
            ]
        proc = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
        log_file.close()
        time.sleep(2)
        if proc.poll() is not None:
            raise RuntimeError(
                f"{controller} controller exited: "
                + (workdir / f"{controller}-controller.log").read_text()[-2000:]
            )
        yield cp
    finally:
        if proc is not None:
            stop_process(proc, grace=15)
        cp.stop()


def run_test(binary: Path, test: str, cp: ControlPlane, artifacts: Path) -> Outcome:
    """One test; again (RACE_RETRIES at most) only when it lost the race RACES names."""
    outcome = _run_once(binary, test, cp, artifacts)
    race = RACES.get(test)
    while race is not None and _lost_race(outcome, race) and outcome.races_lost < RACE_RETRIES:
        log(f"{test} lost its create-read-update race (409); running it again")
        again = _run_once(binary, test, cp, artifacts)
        again.races_lost = outcome.races_lost + 1
        again.output = outcome.output + "\n--- run again after a lost race ---\n" + again.output
        outcome = again
    return outcome


def _lost_race(outcome: Outcome, race: str) -> bool:
    """Failed, and every failure it reports is the race's conflict."""
    if outcome.passed:
        return False
    errors = [line for line in outcome.output.splitlines() if "Error:" in line]
    return bool(errors) and all(race in line for line in errors)


def _run_once(binary: Path, test: str, cp: ControlPlane, artifacts: Path) -> Outcome:
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig), "ARTIFACTS": str(artifacts)}
    start = time.monotonic()
    proc = subprocess.run(
        [str(binary), "-test.run", f"^{test}$", "-test.v", "-test.timeout", TEST_TIMEOUT],
        env=env,
        capture_output=True,
        text=True,
        cwd=artifacts,
        timeout=600,
    )
    output = proc.stdout + proc.stderr
    passed = proc.returncode == 0 and f"--- PASS: {test} " in output
    return Outcome(test, passed, time.monotonic() - start, output)


def run(controller: str, workdir: Path, only: str | None = None) -> dict[str, list[Outcome]]:
    """Every runnable test of both suites against ``controller``, suite by suite."""
    binaries = build_suites()
    results: dict[str, list[Outcome]] = {}
    with cluster_with(controller, workdir) as cp:
        for suite, binary in binaries.items():
            artifacts = workdir / f"artifacts-{suite}"
            artifacts.mkdir(parents=True, exist_ok=True)
            outcomes = []
            for test in runnable_tests(binary):
                if only and not re.search(only, test):
                    continue
                outcome = run_test(binary, test, cp, artifacts)
                log(f"{controller} {suite} {test}: {'PASS' if outcome.passed else 'FAIL'}")
                (artifacts / f"{test}.log").write_text(outcome.output)
                outcomes.append(outcome)
            results[suite] = outcomes
    return results
