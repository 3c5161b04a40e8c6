"""The Sandbox's conditions from what a reconcile found (operator/sandbox.py
``sandbox_conditions``), case by case as upstream's controller and e2e suite
state them."""

from __future__ import annotations

import pytest

from jupyter_sandbox.operator.sandbox import (
    ChildConflict,
    node_name_only_change,
    sandbox_conditions,
)

UID = "sb-uid"


def sandbox(mode: str = "Running", service: bool | None = None) -> dict:
    spec: dict = {"operatingMode": mode}
    if service is not None:
        spec["service"] = service
    return {"metadata": {"name": "s", "uid": UID, "generation": 3}, "spec": spec}


def pod(phase: str = "Running", ready: bool = True, ips: bool = True, owned: bool = True) -> dict:
    refs = [{"uid": UID, "controller": True, "kind": "Sandbox"}] if owned else []
    status: dict = {
        "phase": phase,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ips:
        status["podIPs"] = [{"ip": "10.0.0.7"}]
    return {"metadata": {"name": "s", "ownerReferences": refs}, "status": status}


SERVICE = {"metadata": {"name": "s"}}
FOREIGN = pod(owned=False)
OWNED = pod()

CASES = {
    "running and ready": (
        sandbox(service=True),
        OWNED,
        OWNED,
        SERVICE,
        None,
        None,
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "PodScheduled": ("True", "PodScheduled", ""),
            "Ready": ("True", "DependenciesReady", "Pod is Ready; Service Exists"),
        },
    ),
    "ready pod without its IP yet": (
        sandbox(),
        pod(ips=False),
        pod(ips=False),
        None,
        None,
        None,
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "PodScheduled": ("True", "PodScheduled", ""),
            "Ready": ("False", "DependenciesNotReady", "Pod is Ready but has no podIPs yet"),
        },
    ),
    "service wanted, not there yet": (
        sandbox(service=True),
        OWNED,
        OWNED,
        None,
        None,
        None,
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "PodScheduled": ("True", "PodScheduled", ""),
            "Ready": ("False", "DependenciesNotReady", "Pod is Ready; Service does not exist"),
        },
    ),
    "no pod yet": (
        sandbox(),
        None,
        None,
        None,
        None,
        None,
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "Ready": ("False", "DependenciesNotReady", "Pod does not exist"),
        },
    ),
    "pod finished": (
        sandbox(),
        pod("Succeeded", ready=False),
        pod("Succeeded", ready=False),
        None,
        None,
        None,
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "Finished": ("True", "PodSucceeded", "Pod completed successfully"),
            "PodScheduled": ("True", "PodScheduled", ""),
            "Ready": ("False", "PodSucceeded", "Pod completed successfully"),
        },
    ),
    "suspended, pod gone": (
        sandbox("Suspended"),
        None,
        None,
        SERVICE,
        None,
        None,
        {
            "Suspended": ("True", "PodTerminated", "Pod has been terminated. Sandbox is suspended"),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspended"),
        },
    ),
    "suspended, own pod still terminating": (
        sandbox("Suspended"),
        OWNED,
        OWNED,
        SERVICE,
        None,
        None,
        {
            "Suspended": ("False", "PodTerminating", "Pod is terminating. Sandbox is suspending"),
            "PodScheduled": ("True", "PodScheduled", ""),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    "suspended, a foreign pod holds the name": (
        sandbox("Suspended"),
        FOREIGN,
        None,
        SERVICE,
        None,
        None,
        {
            "Suspended": (
                "False",
                "PodNotOwned",
                "Refused to delete pod because it is not owned by this sandbox",
            ),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    "suspended, pod state unknown": (
        sandbox("Suspended"),
        None,
        None,
        None,
        RuntimeError("boom"),
        RuntimeError("boom"),
        {
            "Suspended": (
                "Unknown",
                "PodStateUnknown",
                "Pod state is unknown. Sandbox suspension cannot be confirmed",
            ),
            "PodScheduled": (
                "Unknown",
                "PodSchedulingUnknown",
                "Pod state is unknown. Pod scheduling cannot be determined",
            ),
            "Ready": ("False", "ReconcilerError", "Error seen: boom"),
        },
    ),
    "running, a foreign pod refuses adoption": (
        sandbox(),
        None,
        None,
        None,
        ChildConflict("cannot adopt"),
        ChildConflict("cannot adopt"),
        {
            "Suspended": ("False", "NotSuspended", "Sandbox is not suspended"),
            "PodScheduled": (
                "Unknown",
                "PodSchedulingUnknown",
                "Pod state is unknown. Pod scheduling cannot be determined",
            ),
            "Ready": ("False", "ChildConflict", "Error seen: cannot adopt"),
        },
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_conditions(case: str) -> None:
    sb, found, owned, svc, err, pod_err, expected = CASES[case]
    conds = sandbox_conditions(sb, [], found, owned, svc, err, pod_err, 3)
    got = {c["type"]: (c["status"], c["reason"], c["message"]) for c in conds}
    assert got == expected
    assert {c["observedGeneration"] for c in conds} == {3}


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = sandbox_conditions(sandbox("Suspended"), [], None, None, None, None, None, 3)
    for c in first:
        c["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    again = sandbox_conditions(sandbox("Suspended"), first, None, None, None, None, None, 4)
    assert {c["lastTransitionTime"] for c in again} == {"2026-01-01T00:00:00Z"}
    resumed = sandbox_conditions(sandbox(), again, None, None, None, None, None, 5)
    suspended = next(c for c in resumed if c["type"] == "Suspended")
    assert suspended["lastTransitionTime"] != "2026-01-01T00:00:00Z"


NOT_READY = [{"type": "Ready", "status": "False", "reason": "DependenciesNotReady"}]
READY = [{"type": "Ready", "status": "True", "reason": "DependenciesReady"}]
NODE_NAME_CASES = {
    # (old status, new status, skipped?)
    "the pod was bound: nodeName alone, not Ready": (
        {"conditions": NOT_READY},
        {"conditions": NOT_READY, "nodeName": "n1"},
        True,
    ),
    "nodeName cleared alone, not Ready": (
        {"conditions": NOT_READY, "nodeName": "n1"},
        {"conditions": NOT_READY},
        True,
    ),
    "nodeName with the Ready transition": (
        {"conditions": NOT_READY},
        {"conditions": READY, "nodeName": "n1", "podIPs": ["10.0.0.7"]},
        False,
    ),
    "nodeName changes on a Ready sandbox": (
        {"conditions": READY, "nodeName": "n1"},
        {"conditions": READY, "nodeName": "n2"},
        False,
    ),
    "nodeName with another field": (
        {"conditions": NOT_READY},
        {"conditions": NOT_READY, "nodeName": "n1", "selector": "x=y"},
        False,
    ),
    "no nodeName change": (
        {"conditions": NOT_READY},
        {"conditions": READY},
        False,
    ),
}


@pytest.mark.parametrize("case", NODE_NAME_CASES, ids=list(NODE_NAME_CASES))
def test_a_status_write_of_the_node_name_alone_waits_for_the_next_one(case: str) -> None:
    """Upstream's updateStatus defers it; so must we, or a new Sandbox gets a write
    moments after its creation that upstream's controller does not make."""
    old, new, skipped = NODE_NAME_CASES[case]
    assert node_name_only_change(old, new) is skipped
