"""Labels, hashes, owner references and conditions shared by the reconcilers.

Label and annotation keys are those of kubernetes-sigs/agent-sandbox v1beta1, so
objects written by either controller are understood by the other.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .core import now_rfc3339

SANDBOX_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
SANDBOX_API = f"{SANDBOX_GROUP}/v1beta1"
EXT_API = f"{EXT_GROUP}/v1beta1"

NAME_HASH_LABEL = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH_LABEL = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH_LABEL = "agents.x-k8s.io/sandbox-template-hash"
POD_TEMPLATE_HASH_LABEL = (
    "agents.x-k8s.io/sandbox-pod-template-hash"  # deprecated upstream, still written
)
LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type"
CREATED_BY_LABEL = "agents.x-k8s.io/created-by"
CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"
ADOPTABLE_LABEL = "agents.x-k8s.io/adoptable"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
ASSIGNED_SANDBOX_ANNOTATION = "agents.x-k8s.io/sandbox-name"
PROPAGATED_LABELS_ANNOTATION = "agents.x-k8s.io/propagated-labels"

FIELD_MANAGER = "jupyter-sandbox-operator"


def name_hash(name: str) -> str:
    """FNV-1a 32-bit of ``name`` as 8 lowercase hex digits (upstream NameHash)."""
    h = 0x811C9DC5
    for b in name.encode():
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


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
