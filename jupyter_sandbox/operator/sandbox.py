"""Sandbox reconciler: Sandbox -> Pod (same name) + headless Service + PVCs.

Semantics follow agent-sandbox v1beta1 (see controllers/sandbox_controller.go
there): children carry ``agents.x-k8s.io/sandbox-name-hash`` and a controller
ownerReference to the Sandbox; ``operatingMode: Suspended`` deletes only the
Pod; ``shutdownTime`` tears down Pod and Service, then ``shutdownPolicy``
deletes (Delete) or keeps (Retain, Ready=False/SandboxExpired) the Sandbox.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

from ..agent_sandbox import (
    ADOPTABLE_LABEL,
    EXT_GROUP,
    NAME_HASH_LABEL,
    POD_NAME_ANNOTATION,
    PROPAGATED_LABELS_ANNOTATION,
    SANDBOX,
    SANDBOX_GROUP,
    TEMPLATE_REF_HASH_LABEL,
    WARM_POOL_LABEL,
    name_hash,
)
from ..kube.client import POD, PVC, SERVICE, ApiError
from ..kube.informer import Key
from ..kube.times import parse_time
from .core import Result
from .runtime_token import TokenConflict, ensure_token_secret, give_runtime_token
from .util import (
    FIELD_MANAGER,
    condition_true,
    controller_of,
    controller_ref,
    deleting,
    get_condition,
    is_controlled_by,
    owner_kind_is,
    remove_condition,
    set_condition,
)

if TYPE_CHECKING:
    from .manager import Operator

SYSTEM_PREFIXES = (f"{SANDBOX_GROUP}/", "kubernetes.io/", "k8s.io/")


class ChildConflict(Exception):
    """A child object exists but belongs to someone else."""


def _system_key(k: str) -> bool:
    prefix = k.split("/", 1)[0] + "/" if "/" in k else ""
    return any(prefix.endswith(p) for p in SYSTEM_PREFIXES)


def extension_pod_labels(sb: dict) -> dict[str, str]:
    """Pool label only while pool-controlled; template ref hash always (upstream)."""
    labels = sb["metadata"].get("labels") or {}
    out: dict[str, str] = {}
    ref = controller_of(sb)
    if not owner_kind_is(ref, EXT_GROUP, ref.get("kind", "") if ref else ""):
        return out
    assert ref is not None
    if ref.get("kind") == "SandboxWarmPool" and labels.get(WARM_POOL_LABEL):
        out[WARM_POOL_LABEL] = labels[WARM_POOL_LABEL]
    if labels.get(TEMPLATE_REF_HASH_LABEL):
        out[TEMPLATE_REF_HASH_LABEL] = labels[TEMPLATE_REF_HASH_LABEL]
    return out


def desired_pod_labels(sb: dict) -> tuple[dict[str, str], list[str]]:
    tmpl_labels = (sb["spec"].get("podTemplate", {}).get("metadata") or {}).get("labels") or {}
    labels: dict[str, str] = {}
    managed: list[str] = []
    for k, v in tmpl_labels.items():
        if k in (NAME_HASH_LABEL,):
            continue
        labels[k] = v
        managed.append(k)
    labels[NAME_HASH_LABEL] = name_hash(sb["metadata"]["name"])
    labels.update(extension_pod_labels(sb))
    return labels, sorted(managed)


def service_ports(pod_spec: dict) -> list[dict]:
    seen: dict[tuple[int, str], str] = {}
    reserved: set[str] = set()
    containers = list(pod_spec.get("containers") or [])
    containers += [
        c for c in pod_spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    ]
    for c in containers:
        for p in c.get("ports") or []:
            port = p.get("containerPort")
            if not port:
                continue
            key = (int(port), p.get("protocol") or "TCP")
            seen.setdefault(key, "")
            name = p.get("name")
            if name and not seen[key] and name not in reserved:
                seen[key] = name
                reserved.add(name)
    out = []
    for port, proto in sorted(seen):
        name = seen[(port, proto)]
        if not name:
            base = f"p-{port}-{proto.lower()}"
            name, i = base, 2
            while name in reserved:
                name, i = f"{base}-{i}", i + 1
        reserved.add(name)
        out.append({"name": name, "protocol": proto, "port": port, "targetPort": port})
    return out


def sandbox_conditions(
    sb: dict,
    conds: list[dict],
    pod: dict | None,
    owned_pod: dict | None,
    svc: dict | None,
    err: Exception | None,
    pod_err: Exception | None,
    gen: int | None,
) -> list[dict]:
    """The Sandbox's conditions after one reconcile, from what it found: upstream's
    computeSuspendedCondition / computeReadyCondition family, as one pure function.

    ``pod`` is the pod of the Sandbox's name whoever owns it, ``owned_pod`` the
    same if the Sandbox controls it; ``err`` the first error of the reconcile and
    ``pod_err`` the pod lookup's.
    """
    suspended = sb["spec"].get("operatingMode", "Running") == "Suspended"
    # Suspended
    if not suspended:
        conds = set_condition(
            conds, "Suspended", "False", "NotSuspended", "Sandbox is not suspended", gen
        )
    elif pod is None and pod_err is not None:
        conds = set_condition(
            conds,
            "Suspended",
            "Unknown",
            "PodStateUnknown",
            "Pod state is unknown. Sandbox suspension cannot be confirmed",
            gen,
        )
    elif pod is None:
        conds = set_condition(
            conds,
            "Suspended",
            "True",
            "PodTerminated",
            "Pod has been terminated. Sandbox is suspended",
            gen,
        )
    elif owned_pod is None:
        conds = set_condition(
            conds,
            "Suspended",
            "False",
            "PodNotOwned",
            "Refused to delete pod because it is not owned by this sandbox",
            gen,
        )
    else:
        conds = set_condition(
            conds,
            "Suspended",
            "False",
            "PodTerminating",
            "Pod is terminating. Sandbox is suspending",
            gen,
        )
    # Finished
    phase = (owned_pod or {}).get("status", {}).get("phase")
    if owned_pod is not None and phase in ("Succeeded", "Failed"):
        reason = "PodSucceeded" if phase == "Succeeded" else "PodFailed"
        conds = set_condition(
            conds,
            "Finished",
            "True",
            reason,
            "Pod completed successfully" if phase == "Succeeded" else "Pod failed",
            gen,
        )
    else:
        conds = remove_condition(conds, "Finished")
    # PodScheduled
    if owned_pod is not None:
        pc = next(
            (
                c
                for c in (owned_pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            None,
        )
        if pc is None:
            conds = set_condition(
                conds,
                "PodScheduled",
                "Unknown",
                "PodSchedulingUnknown",
                "Pod has not reported a PodScheduled condition yet",
                gen,
            )
        else:
            st = pc.get("status", "Unknown")
            reason = pc.get("reason") or (
                "PodScheduled" if st == "True" else "PodSchedulingUnknown"
            )
            conds = set_condition(conds, "PodScheduled", st, reason, pc.get("message") or "", gen)
    elif pod is None and pod_err is not None:
        conds = set_condition(
            conds,
            "PodScheduled",
            "Unknown",
            "PodSchedulingUnknown",
            "Pod state is unknown. Pod scheduling cannot be determined",
            gen,
        )
    else:
        conds = remove_condition(conds, "PodScheduled")
    # Ready
    if err is not None:
        reason = "ChildConflict" if isinstance(err, ChildConflict) else "ReconcilerError"
        conds = set_condition(conds, "Ready", "False", reason, f"Error seen: {err}"[:32000], gen)
        return conds
    if suspended:
        msg = "Sandbox is suspending" if pod is not None else "Sandbox is suspended"
        return set_condition(conds, "Ready", "False", "SandboxSuspended", msg, gen)
    if phase in ("Succeeded", "Failed"):
        reason = "PodSucceeded" if phase == "Succeeded" else "PodFailed"
        return set_condition(
            conds,
            "Ready",
            "False",
            reason,
            "Pod completed successfully" if phase == "Succeeded" else "Pod failed",
            gen,
        )
    ready = False
    if owned_pod is None:
        msg = "Pod does not exist"
    else:
        pst = owned_pod.get("status") or {}
        msg = f"Pod exists with phase: {phase or ''}"
        if phase == "Running":
            msg = "Pod is Running but not Ready"
            rc = next((c for c in pst.get("conditions") or [] if c.get("type") == "Ready"), None)
            if rc is not None and rc.get("status") == "True":
                if pst.get("podIPs"):
                    msg, ready = "Pod is Ready", True
                else:
                    msg = "Pod is Ready but has no podIPs yet"
    want = sb["spec"].get("service")
    svc_required = want is True or (want is None and svc is not None)
    svc_ok = True
    if svc_required:
        svc_ok = svc is not None
        msg += "; Service Exists" if svc_ok else "; Service does not exist"
    if ready and svc_ok:
        return set_condition(conds, "Ready", "True", "DependenciesReady", msg, gen)
    return set_condition(conds, "Ready", "False", "DependenciesNotReady", msg, gen)


def _present(status: dict) -> dict:
    return {k: v for k, v in status.items() if v not in (None, [], "")}


def node_name_only_change(old: dict, new: dict) -> bool:
    """True when the status would change by ``nodeName`` alone while not Ready.

    Upstream's ``updateStatus`` skips that write: a pod is bound (nodeName set)
    moments after it is created and well before it runs, so the node name rides
    along with the next write, normally the Ready transition. Writing it on its own
    adds a resourceVersion change within milliseconds of the Sandbox's creation,
    which a client's read-modify-write of a new Sandbox meets as a 409 conflict.
    Once Ready, a node change is written through.
    """
    if old.get("nodeName") == new.get("nodeName"):
        return False
    if any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in new.get("conditions") or []
    ):
        return False
    rest_old = {k: v for k, v in old.items() if k != "nodeName"}
    rest_new = {k: v for k, v in new.items() if k != "nodeName"}
    return rest_old == rest_new


class SandboxReconciler:
    name = "sandbox"

    def __init__(self, op: Operator) -> None:
        self.op = op

    async def reconcile(self, key: Key) -> Result | None:
        op = self.op
        sb = op.sandboxes.get(*key)
        if sb is None or deleting(sb):
            return None
        ns, name = key
        old_status = copy.deepcopy(sb.get("status") or {})
        status = copy.deepcopy(old_status)
        gen = sb["metadata"].get("generation")
        result: Result | None = None

        shutdown_at = parse_time(sb["spec"].get("shutdownTime"))
        if shutdown_at is not None and time.time() >= shutdown_at:
            return await self._expire(sb, status, old_status)
        if shutdown_at is not None:
            result = Result(requeue_after=max(0.05, shutdown_at - time.time()))

        err: Exception | None = None
        nh = name_hash(name)
        try:
            await self._pvcs(sb, nh)
        except (ApiError, ChildConflict) as e:
            err = e
        pod, pod_err = None, None
        try:
            pod = await self._pod(sb, nh)
        except (ApiError, ChildConflict) as e:
            pod_err = e
            err = err or e
        svc = None
        try:
            svc = await self._service(sb, nh)
        except (ApiError, ChildConflict) as e:
            err = err or e

        owned_pod = pod if pod is not None and is_controlled_by(pod, sb) else None
        if pod is not None:
            status["selector"] = f"{NAME_HASH_LABEL}={nh}"
        if owned_pod is not None:
            ips = [
                p["ip"] for p in (owned_pod.get("status") or {}).get("podIPs") or [] if p.get("ip")
            ]
            status["podIPs"] = ips or None
            status["nodeName"] = owned_pod["spec"].get("nodeName") or None
        else:
            status["podIPs"] = None
            status["nodeName"] = None
        if svc is not None:
            status["service"] = svc["metadata"]["name"]
            status["serviceFQDN"] = f"{svc['metadata']['name']}.{ns}.svc.{op.cluster_domain}"
        else:
            status["service"] = None
            status["serviceFQDN"] = None

        if pod is not None and owned_pod is None and err is None:
            # a foreign pod blocks suspension and is outside our pod watch: look again
            later = result.requeue_after if result and result.requeue_after else 10.0
            result = Result(requeue_after=min(10.0, later))
        conds = list(status.get("conditions") or [])
        conds = sandbox_conditions(sb, conds, pod, owned_pod, svc, err, pod_err, gen)
        status["conditions"] = conds
        await self._write_status(sb, old_status, status)
        if err is not None:
            if isinstance(err, ChildConflict):
                await op.events.record(sb, "Warning", "ChildConflict", str(err))
                return Result(requeue_after=30)
            raise err
        return result

    # -- children ----------------------------------------------------------------

    async def _pvcs(self, sb: dict, nh: str) -> None:
        op = self.op
        ns, name = sb["metadata"]["namespace"], sb["metadata"]["name"]
        for vct in sb["spec"].get("volumeClaimTemplates") or []:
            md = vct.get("metadata") or {}
            pvc_name = f"{md.get('name')}-{name}"
            existing = op.pvcs.get(ns, pvc_name)
            if existing is None:
                try:
                    existing = await op.client.get(PVC, ns, pvc_name)
                except ApiError as e:
                    if not e.not_found:
                        raise
            if existing is not None:
                if is_controlled_by(existing, sb):
                    continue
                if controller_of(existing) is not None:
                    raise ChildConflict(f"PVC {pvc_name} is controlled by another object")
                labels = existing["metadata"].get("labels") or {}
                if labels.get(ADOPTABLE_LABEL) != "true" and labels.get(NAME_HASH_LABEL) != nh:
                    raise ChildConflict(f"cannot adopt unowned PVC {pvc_name}")
                await op.client.patch(
                    PVC,
                    ns,
                    pvc_name,
                    {
                        "metadata": {
                            "ownerReferences": [controller_ref(sb)],
                            "resourceVersion": existing["metadata"]["resourceVersion"],
                        }
                    },
                )
                continue
            labels = dict(md.get("labels") or {})
            labels[NAME_HASH_LABEL] = nh
            body = {
                "metadata": {
                    "name": pvc_name,
                    "namespace": ns,
                    "labels": labels,
                    "annotations": dict(md.get("annotations") or {}),
                    "ownerReferences": [controller_ref(sb)],
                },
                "spec": copy.deepcopy(vct.get("spec") or {}),
            }
            try:
                created = await op.client.create(PVC, ns, body, fieldManager=FIELD_MANAGER)
                op.pvcs.upsert_local(created)
            except ApiError as e:
                if not e.already_exists:
                    raise

    def _pod_name(self, sb: dict) -> str:
        ann = sb["metadata"].get("annotations") or {}
        return ann.get(POD_NAME_ANNOTATION) or sb["metadata"]["name"]

    async def _pod(self, sb: dict, nh: str) -> dict | None:
        op = self.op
        ns, name = sb["metadata"]["namespace"], sb["metadata"]["name"]
        pod_name = self._pod_name(sb)
        pod = op.pods.get(ns, pod_name)
        if pod is None and pod_name != name:
            pod = op.pods.get(ns, name)
        suspended = sb["spec"].get("operatingMode", "Running") == "Suspended"
        if suspended:
            if pod is None and not condition_true(sb, "Suspended"):
                # The pod cache holds only pods carrying the name-hash label.  A pod
                # of this name that somebody else made is invisible to it, yet it
                # must block suspension (upstream reports PodNotOwned): look it up
                # by name until suspension is confirmed.
                pod = await self._get_pod(ns, pod_name)
            if pod is not None and is_controlled_by(pod, sb) and not deleting(pod):
                try:
                    await op.client.delete(
                        POD, ns, pod["metadata"]["name"], uid=pod["metadata"]["uid"]
                    )
                except ApiError as e:
                    if not (e.not_found or e.conflict):
                        raise
            return pod
        if pod is not None:
            return await self._own_existing_pod(sb, pod, nh)
        # create
        labels, managed = desired_pod_labels(sb)
        tmeta = sb["spec"].get("podTemplate", {}).get("metadata") or {}
        annotations = {
            k: v for k, v in (tmeta.get("annotations") or {}).items() if not _system_key(k)
        }
        if managed:
            annotations[PROPAGATED_LABELS_ANNOTATION] = ",".join(managed)
        spec = copy.deepcopy(sb["spec"].get("podTemplate", {}).get("spec") or {})
        vols = [v for v in spec.get("volumes") or []]
        for vct in sb["spec"].get("volumeClaimTemplates") or []:
            vname = (vct.get("metadata") or {}).get("name")
            vols = [v for v in vols if v.get("name") != vname]
            vols.append({"name": vname, "persistentVolumeClaim": {"claimName": f"{vname}-{name}"}})
        if vols:
            spec["volumes"] = vols
        if op.opts.runtime_key is not None:
            try:
                secret = await ensure_token_secret(op, sb, op.opts.runtime_key)
            except TokenConflict as e:
                raise ChildConflict(str(e)) from None
            give_runtime_token(spec, secret)
        body = {
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [controller_ref(sb)],
            },
            "spec": spec,
        }
        try:
            created = await op.client.create(POD, ns, body, fieldManager=FIELD_MANAGER)
        except ApiError as e:
            if e.already_exists:
                # made by someone else, and invisible to the pod cache if unlabelled
                return await self._own_existing_pod(sb, await op.client.get(POD, ns, name), nh)
            raise
        op.pods.upsert_local(created)
        return created

    async def _own_existing_pod(self, sb: dict, pod: dict, nh: str) -> dict:
        """Keep our pod, adopt an adoptable orphan, refuse anything else."""
        if is_controlled_by(pod, sb):
            await self._sync_pod_labels(sb, pod)
            return pod
        name = pod["metadata"]["name"]
        if controller_of(pod) is not None:
            raise ChildConflict(f"pod {name} is controlled by another object")
        labels = pod["metadata"].get("labels") or {}
        if labels.get(ADOPTABLE_LABEL) != "true" and labels.get(NAME_HASH_LABEL) != nh:
            raise ChildConflict(
                f"cannot adopt unowned pod {name}: it has neither the label "
                f"{ADOPTABLE_LABEL}=true nor {NAME_HASH_LABEL}={nh}"
            )
        patched = await self.op.client.patch(
            POD,
            sb["metadata"]["namespace"],
            name,
            {
                "metadata": {
                    "ownerReferences": [controller_ref(sb)],
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                }
            },
        )
        self.op.pods.upsert_local(patched)
        return patched

    async def _get_pod(self, ns: str, name: str) -> dict | None:
        try:
            return await self.op.client.get(POD, ns, name)
        except ApiError as e:
            if e.not_found:
                return None
            raise

    async def _sync_pod_labels(self, sb: dict, pod: dict) -> None:
        """Keep managed pod labels in line (e.g. pool label dropped after adoption)."""
        desired, _ = desired_pod_labels(sb)
        have = pod["metadata"].get("labels") or {}
        patch: dict[str, str | None] = {k: v for k, v in desired.items() if have.get(k) != v}
        for k in (WARM_POOL_LABEL,):
            if k in have and k not in desired:
                patch[k] = None
        if patch and not deleting(pod):
            try:
                new = await self.op.client.patch(
                    POD,
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    {"metadata": {"labels": patch}},
                )
                self.op.pods.upsert_local(new)
            except ApiError as e:
                if not e.not_found:
                    raise

    async def _service(self, sb: dict, nh: str) -> dict | None:
        op = self.op
        ns, name = sb["metadata"]["namespace"], sb["metadata"]["name"]
        want = sb["spec"].get("service")
        svc = op.services.get(ns, name)
        if svc is None:
            if want is not True:
                return None
            body = {
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {NAME_HASH_LABEL: nh},
                    "ownerReferences": [controller_ref(sb)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {NAME_HASH_LABEL: nh},
                    "ports": service_ports(sb["spec"].get("podTemplate", {}).get("spec") or {}),
                },
            }
            try:
                created = await op.client.create(SERVICE, ns, body, fieldManager=FIELD_MANAGER)
            except ApiError as e:
                if not e.already_exists:
                    raise
                created = await op.client.get(SERVICE, ns, name)
                if not is_controlled_by(created, sb):
                    raise ChildConflict(
                        f"service {name} exists and is not controlled by this sandbox"
                    ) from e
            op.services.upsert_local(created)
            return created
        owned = is_controlled_by(svc, sb)
        if want is False:
            if owned and not deleting(svc):
                try:
                    await op.client.delete(SERVICE, ns, name, uid=svc["metadata"]["uid"])
                except ApiError as e:
                    if not (e.not_found or e.conflict):
                        raise
            return None
        if not owned:
            if controller_of(svc) is not None:
                raise ChildConflict(f"service {name} is controlled by another object")
            if want is None:
                return None
            labels = svc["metadata"].get("labels") or {}
            if labels.get(ADOPTABLE_LABEL) != "true" and labels.get(NAME_HASH_LABEL) != nh:
                raise ChildConflict(f"cannot adopt unowned service {name}")
            svc = await op.client.patch(
                SERVICE,
                ns,
                name,
                {
                    "metadata": {
                        "ownerReferences": [controller_ref(sb)],
                        "labels": {NAME_HASH_LABEL: nh},
                    },
                    "spec": {"selector": {NAME_HASH_LABEL: nh}},
                },
            )
            op.services.upsert_local(svc)
        return svc

    # -- status ------------------------------------------------------------------

    async def _write_status(self, sb: dict, old: dict, new: dict) -> None:
        clean = _present(new)
        old_clean = _present(old)
        if clean == old_clean or node_name_only_change(old_clean, clean):
            return
        patch = dict(clean)
        for k in old_clean:
            if k not in clean:
                patch[k] = None
        await self.op.sandboxes.patch_status(sb, patch)

    async def _expire(self, sb: dict, status: dict, old_status: dict) -> Result | None:
        """shutdownTime reached: Pod and Service go; the policy decides the Sandbox."""
        op = self.op
        ns, name = sb["metadata"]["namespace"], sb["metadata"]["name"]
        gen = sb["metadata"].get("generation")
        ready = get_condition(sb, "Ready")
        first = ready is None or ready.get("reason") != "SandboxExpired"
        conds = list(status.get("conditions") or [])
        conds = set_condition(conds, "Ready", "False", "SandboxExpired", "Sandbox has expired", gen)
        conds = remove_condition(conds, "PodScheduled")
        # live fields are cleared in the same write that marks the expiry
        await self._write_status(sb, old_status, {"conditions": conds})
        if first:
            await op.events.record(
                sb, "Normal", "SandboxExpired", "shutdownTime reached; Pod and Service deleted"
            )
        for res, cache, cname in ((POD, op.pods, self._pod_name(sb)), (SERVICE, op.services, name)):
            child = cache.get(ns, cname)
            if child is not None and is_controlled_by(child, sb) and not deleting(child):
                try:
                    await op.client.delete(res, ns, cname, uid=child["metadata"]["uid"])
                except ApiError as e:
                    if not (e.not_found or e.conflict):
                        raise
        if sb["spec"].get("shutdownPolicy", "Retain") == "Delete":
            try:
                await op.client.delete(SANDBOX, ns, name, uid=sb["metadata"]["uid"])
            except ApiError as e:
                if not (e.not_found or e.conflict):
                    raise
        return None
