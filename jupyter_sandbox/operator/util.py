"""Hashes, owner references and conditions shared by the reconcilers.

The agent-sandbox label and annotation keys are in ``jupyter_sandbox/agent_sandbox.py``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ..agent_sandbox import name_hash
from ..kube.times import now_rfc3339

FIELD_MANAGER = "jupyter-sandbox-operator"


def canonical_hash(obj: Any) -> str:
    return name_hash(json.dumps(obj, sort_keys=True, separators=(",", ":")))


def controller_of(obj: dict) -> dict | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def controller_ref(owner: dict) -> dict:
    md = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": md["name"],
        "uid": md["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_controlled_by(obj: dict, owner: dict) -> bool:
    ref = controller_of(obj)
    return ref is not None and ref.get("uid") == owner["metadata"]["uid"]


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def owner_kind_is(ref: dict | None, group: str, kind: str) -> bool:
    return (
        ref is not None and group_of(ref.get("apiVersion", "")) == group and ref.get("kind") == kind
    )


def deleting(obj: dict) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def get_condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def condition_true(obj: dict, ctype: str) -> bool:
    c = get_condition(obj, ctype)
    return c is not None and c.get("status") == "True"


def set_condition(
    conditions: list[dict],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
) -> list[dict]:
    """metav1 SetStatusCondition: lastTransitionTime moves only when status changes."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c.get("type") == ctype:
            if c.get("status") != status:
                c["lastTransitionTime"] = now_rfc3339()
            c["status"], c["reason"], c["message"] = status, reason, message
            if generation is not None:
                c["observedGeneration"] = generation
            return out
    new = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }
    if generation is not None:
        new["observedGeneration"] = generation  # type: ignore[assignment]
    out.append(new)
    return out


def remove_condition(conditions: list[dict], ctype: str) -> list[dict]:
    return [c for c in conditions if c.get("type") != ctype]


def sandbox_ready(sb: dict) -> bool:
    return condition_true(sb, "Ready")


def blueprint_of(spec: dict) -> dict:
    """The SandboxBlueprint part of a Sandbox/SandboxTemplate spec."""
    return {
        k: copy.deepcopy(spec[k])
        for k in ("podTemplate", "volumeClaimTemplates", "service")
        if k in spec
    }


def secure_defaults(template: dict, pod_spec: dict) -> dict:
    """Upstream ApplySandboxSecureDefaults: no SA token by default; in the strict
    default network mode, public resolvers instead of cluster DNS."""
    pod_spec.setdefault("automountServiceAccountToken", False)
    tspec = template.get("spec", {})
    managed = tspec.get("networkPolicyManagement", "Managed") in ("", "Managed")
    if managed and tspec.get("networkPolicy") is None and not pod_spec.get("dnsPolicy"):
        pod_spec["dnsPolicy"] = "None"
        pod_spec["dnsConfig"] = {"nameservers": ["8.8.8.8", "1.1.1.1"]}
    return pod_spec


def expected_pod_spec(template: dict) -> dict:
    spec = copy.deepcopy(template.get("spec", {}).get("podTemplate", {}).get("spec", {}))
    return secure_defaults(template, spec)


def blueprint_hash(template: dict) -> str:
    return canonical_hash(blueprint_of(template.get("spec", {})))
