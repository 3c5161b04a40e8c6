"""SandboxTemplate reconciler: template-ref-hash label and the managed NetworkPolicy.

One shared NetworkPolicy ``<template>-network-policy`` per template selects the
template's pods by ``agents.x-k8s.io/sandbox-template-ref-hash``.  The default
(no ``spec.networkPolicy``) admits ingress only from the router pods and allows
egress to public addresses only: 10/8, 172.16/12, 192.168/16, 169.254/16 (cloud
metadata), fc00::/7 and fe80::/10 are excluded.  ``Unmanaged`` removes a policy
we own and leaves everything else alone.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ..agent_sandbox import TEMPLATE, TEMPLATE_REF_HASH_LABEL, name_hash
from ..kube.client import NETPOL, ApiError
from ..kube.informer import Key
from .core import Result
from .util import FIELD_MANAGER, controller_ref, deleting, is_controlled_by, set_condition

if TYPE_CHECKING:
    from .manager import Operator


def default_policy_spec(
    template_name: str, router_namespace: str, router_labels: dict[str, str]
) -> dict:
    return {
        "podSelector": {"matchLabels": {TEMPLATE_REF_HASH_LABEL: name_hash(template_name)}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": router_namespace}
                        },
                        "podSelector": {"matchLabels": dict(router_labels)},
                    }
                ]
            }
        ],
        "egress": [
            {
                "to": [
                    {
                        "ipBlock": {
                            "cidr": "0.0.0.0/0",
                            "except": [
                                "10.0.0.0/8",
                                "172.16.0.0/12",
                                "192.168.0.0/16",
                                "169.254.0.0/16",
                            ],
                        }
                    },
                    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
                ]
            }
        ],
    }


def desired_policy_spec(
    template: dict, router_namespace: str, router_labels: dict[str, str]
) -> dict:
    name = template["metadata"]["name"]
    np = template.get("spec", {}).get("networkPolicy")
    if np is None:
        return default_policy_spec(name, router_namespace, router_labels)
    spec: dict = {
        "podSelector": {"matchLabels": {TEMPLATE_REF_HASH_LABEL: name_hash(name)}},
        "policyTypes": ["Ingress", "Egress"],
    }
    if np.get("ingress"):
        spec["ingress"] = copy.deepcopy(np["ingress"])
    if np.get("egress"):
        spec["egress"] = copy.deepcopy(np["egress"])
    return spec


def _norm(spec: dict) -> dict:
    return {k: v for k, v in spec.items() if v not in (None, [], {})}


class TemplateReconciler:
    name = "sandboxtemplate"

    def __init__(self, op: Operator) -> None:
        self.op = op

    async def reconcile(self, key: Key) -> Result | None:
        op = self.op
        t = op.templates.get(*key)
        if t is None or deleting(t):
            return None
        ns, name = key
        want_hash = name_hash(name)
        if (t["metadata"].get("labels") or {}).get(TEMPLATE_REF_HASH_LABEL) != want_hash:
            t = await op.client.patch(
                TEMPLATE, ns, name, {"metadata": {"labels": {TEMPLATE_REF_HASH_LABEL: want_hash}}}
            )
            op.templates.upsert_local(t)

        np_name = f"{name}-network-policy"
        existing = op.netpols.get(ns, np_name)
        mgmt = t.get("spec", {}).get("networkPolicyManagement") or "Managed"
        gen = t["metadata"].get("generation")
        if mgmt == "Unmanaged":
            if existing is not None and is_controlled_by(existing, t):
                try:
                    await op.client.delete(NETPOL, ns, np_name, uid=existing["metadata"]["uid"])
                except ApiError as e:
                    if not e.not_found:
                        raise
            await self._status(
                t,
                "True",
                "NetworkPolicyUnmanaged",
                "NetworkPolicy is not managed by the operator",
                gen,
            )
            return None

        desired = desired_policy_spec(t, op.router_namespace, op.router_labels)
        if existing is not None:
            if not is_controlled_by(existing, t):
                msg = (
                    f"NetworkPolicy {np_name} exists and is not controlled by this template; "
                    "refusing to modify it"
                )
                await self._status(t, "False", "NetworkPolicyConflict", msg, gen)
                await op.events.record(t, "Warning", "NetworkPolicyConflict", msg)
                return Result(requeue_after=60)
            if _norm(existing.get("spec") or {}) != _norm(desired):
                existing = copy.deepcopy(existing)
                existing["spec"] = desired
                updated = await op.client.replace(NETPOL, existing)
                op.netpols.upsert_local(updated)
        else:
            body = {
                "metadata": {
                    "name": np_name,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/managed-by": "jupyter-sandbox-operator"},
                    "ownerReferences": [controller_ref(t)],
                },
                "spec": desired,
            }
            try:
                created = await op.client.create(NETPOL, ns, body, fieldManager=FIELD_MANAGER)
                op.netpols.upsert_local(created)
            except ApiError as e:
                if not e.already_exists:
                    raise
                return Result(requeue_after=0.5)
        await self._status(
            t, "True", "NetworkPolicyReady", f"NetworkPolicy {np_name} is in place", gen
        )
        return None

    async def _status(
        self, t: dict, status: str, reason: str, message: str, gen: int | None
    ) -> None:
        old = (t.get("status") or {}).get("conditions") or []
        conds = set_condition(old, "Ready", status, reason, message, gen)
        if conds == old:
            return
        try:
            updated = await self.op.client.patch(
                TEMPLATE,
                t["metadata"]["namespace"],
                t["metadata"]["name"],
                {"status": {"conditions": conds, "observedGeneration": gen}},
                sub="status",
            )
            self.op.templates.upsert_local(updated)
        except ApiError as e:
            if not e.not_found:
                raise
