"""SandboxClaim reconciler: adopt a warm-pool Sandbox or cold-start one.

Adoption is one resourceVersion-conditioned PUT of the candidate Sandbox that
replaces its controller reference (pool -> claim) and drops the pool labels.
If anyone changed the Sandbox since our cache saw it (another claim, another
operator replica, the pool) the API server answers 409 and we try the next
candidate, so a Sandbox can never end up controlled by two claims.  Within one
process, candidates being adopted are reserved so concurrent workers do not
collide on the same one.

Adoption takes the oldest Ready member, else the oldest member that has its
pod IP; a claim younger than two seconds waits for members still getting one.
A claim with ``env`` or ``volumeClaimTemplates``, one for a template with a user
volume (``user_volume``), or one whose pool has nothing to adopt, gets a fresh
Sandbox named like the claim.  Deleting the claim deletes
its Sandbox through the garbage collector (controller ownerReference).
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from ..agent_sandbox import (
    ASSIGNED_SANDBOX_ANNOTATION,
    CLAIM,
    CLAIM_UID_LABEL,
    CREATED_BY_LABEL,
    FIRST_OBSERVED_ANNOTATION,
    LAUNCH_TYPE_LABEL,
    POD_NAME_ANNOTATION,
    POD_TEMPLATE_HASH_LABEL,
    SANDBOX,
    TEMPLATE_HASH_LABEL,
    TEMPLATE_REF_ANNOTATION,
    TEMPLATE_REF_HASH_LABEL,
    WARM_POOL_LABEL,
    name_hash,
)
from ..kube.client import POD, PVC, ApiError
from ..kube.informer import Key
from ..kube.times import parse_time, rfc3339_nano
from . import user_volume
from .core import Result
from .user_volume import UserVolumeError, user_volume_of
from .util import (
    FIELD_MANAGER,
    blueprint_hash,
    blueprint_of,
    controller_of,
    controller_ref,
    deleting,
    get_condition,
    is_controlled_by,
    sandbox_ready,
    secure_defaults,
    set_condition,
)
from .warmpool import is_stale

if TYPE_CHECKING:
    from .manager import Operator

CLAIMS = Counter(
    "jupyter_sandbox_operator_claims_total", "Sandboxes bound to claims", ["launch_type"]
)
ADOPTION_CONFLICTS = Counter(
    "jupyter_sandbox_operator_adoption_conflicts_total",
    "Adoption attempts lost to a concurrent writer",
)
CLAIM_READY_SECONDS = Histogram(
    "jupyter_sandbox_operator_claim_ready_seconds",
    "Claim creation to Ready, as observed by the operator",
    ["launch_type"],
    buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120),
)

RESTRICTED_DOMAINS = ("kubernetes.io", "k8s.io", "x-k8s.io")
ALLOWED_SYSTEM_ANNOTATIONS = {"cluster-autoscaler.kubernetes.io/safe-to-evict"}


class ClaimRejected(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _restricted(key: str) -> bool:
    if "/" not in key:
        return False
    domain = key.split("/", 1)[0]
    return any(domain == d or domain.endswith("." + d) for d in RESTRICTED_DOMAINS)


def validate_claim(claim: dict, template: dict) -> None:
    spec = claim.get("spec", {})
    tspec = template.get("spec", {})
    apm = spec.get("additionalPodMetadata") or {}
    for k in apm.get("labels") or {}:
        if _restricted(k):
            raise ClaimRejected(
                "InvalidMetadata", f"label {k!r} in additionalPodMetadata uses a restricted domain"
            )
    for k in apm.get("annotations") or {}:
        if _restricted(k) and k not in ALLOWED_SYSTEM_ANNOTATIONS:
            raise ClaimRejected(
                "InvalidMetadata",
                f"annotation {k!r} in additionalPodMetadata uses a restricted domain",
            )
    env = spec.get("env") or []
    if env:
        policy = tspec.get("envVarsInjectionPolicy") or "Disallowed"
        if policy not in ("Allowed", "Overrides"):
            raise ClaimRejected(
                "EnvVarsInjectionRejected",
                "environment variable injection is not allowed by the template policy",
            )
        pspec = (tspec.get("podTemplate") or {}).get("spec") or {}
        names = {
            c.get("name")
            for c in (pspec.get("containers") or []) + (pspec.get("initContainers") or [])
        }
        for e in env:
            if e.get("containerName") and e["containerName"] not in names:
                raise ClaimRejected(
                    "EnvVarsInjectionRejected",
                    f"target container {e['containerName']!r} not found in template",
                )
    if spec.get("volumeClaimTemplates"):
        template_vcts = tspec.get("volumeClaimTemplates") or []
        _check_vct_names(template_vcts, "template")
        _check_vct_names(spec["volumeClaimTemplates"], "claim")
        policy = tspec.get("volumeClaimTemplatesPolicy") or "Disallowed"
        if policy not in ("Allowed", "Overrides"):
            raise ClaimRejected(
                "VolumeClaimTemplatesError",
                "volume claim templates are disallowed by the template",
            )
        if policy == "Allowed":
            tnames = {(v.get("metadata") or {}).get("name") for v in template_vcts}
            for v in spec["volumeClaimTemplates"]:
                n = v["metadata"]["name"]
                if n in tnames:
                    raise ClaimRejected(
                        "VolumeClaimTemplatesError",
                        "overriding volume claim templates is forbidden by the template: "
                        f"cannot override template volume {n!r}",
                    )


# How long a new claim waits for a pool member that is still getting its pod IP
# before it cold-starts instead (upstream's warmCandidateGracePeriod).
WARM_CANDIDATE_GRACE_SECONDS = 2.0


def _warm_grace_left(claim: dict) -> float:
    created = parse_time(claim["metadata"].get("creationTimestamp"))
    if created is None:
        return 0.0
    return max(0.0, created + WARM_CANDIDATE_GRACE_SECONDS - time.time())


def _check_vct_names(vcts: list[dict], where: str) -> None:
    """Every volume claim template needs a name, and no name twice (one PVC each)."""
    seen: set[str] = set()
    for i, v in enumerate(vcts):
        n = (v.get("metadata") or {}).get("name")
        if not n:
            raise ClaimRejected(
                "VolumeClaimTemplatesError",
                f"{where}: invalid volume claim templates: name at index {i} is empty",
            )
        if n in seen:
            raise ClaimRejected(
                "VolumeClaimTemplatesError",
                f"{where}: invalid volume claim templates: duplicate name {n!r}",
            )
        seen.add(n)


def _inject_env(container: dict, envs: list[dict], policy: str) -> None:
    cur = container.setdefault("env", [])
    for e in envs:
        existing = next((x for x in cur if x.get("name") == e["name"]), None)
        if existing is not None:
            if policy != "Overrides":
                raise ClaimRejected(
                    "EnvVarsInjectionRejected",
                    f"environment variable {e['name']!r} is defined by the template",
                )
            existing.clear()
            existing.update({"name": e["name"], "value": e["value"]})
        else:
            cur.append({"name": e["name"], "value": e["value"]})


def merge_pod_metadata(pmeta: dict, claim: dict) -> None:
    apm = claim.get("spec", {}).get("additionalPodMetadata") or {}
    if apm.get("labels"):
        pmeta.setdefault("labels", {}).update(apm["labels"])
    if apm.get("annotations"):
        pmeta.setdefault("annotations", {}).update(apm["annotations"])


def claim_identity(labels: dict, claim: dict) -> dict:
    labels = dict(labels or {})
    labels[CLAIM_UID_LABEL] = claim["metadata"]["uid"]
    cb = (claim["metadata"].get("labels") or {}).get(CREATED_BY_LABEL)
    if cb:
        labels[CREATED_BY_LABEL] = cb
    else:
        labels.pop(CREATED_BY_LABEL, None)
    return labels


def build_cold_sandbox(claim: dict, template: dict) -> dict:
    ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
    tspec = template.get("spec", {})
    bp = blueprint_of(tspec)
    cvcts = claim.get("spec", {}).get("volumeClaimTemplates") or []
    if cvcts:
        merged = {
            (v.get("metadata") or {}).get("name"): v for v in bp.get("volumeClaimTemplates") or []
        }
        for v in cvcts:
            merged[(v.get("metadata") or {}).get("name")] = copy.deepcopy(v)
        bp["volumeClaimTemplates"] = list(merged.values())
    pt = bp.setdefault("podTemplate", {})
    pmeta = pt.setdefault("metadata", {})
    th = name_hash(template["metadata"]["name"])
    pmeta["labels"] = claim_identity(pmeta.get("labels"), claim)
    pmeta["labels"][TEMPLATE_REF_HASH_LABEL] = th
    merge_pod_metadata(pmeta, claim)
    pspec = pt.setdefault("spec", {})
    env = claim.get("spec", {}).get("env") or []
    if env:
        policy = tspec.get("envVarsInjectionPolicy") or "Disallowed"
        containers = pspec.get("containers") or []
        by_container: dict[str, list[dict]] = {}
        default: list[dict] = []
        for e in env:
            (
                by_container.setdefault(e["containerName"], [])
                if e.get("containerName")
                else default
            ).append(e)
        for c in pspec.get("initContainers") or []:
            if c.get("name") in by_container:
                _inject_env(c, by_container[c["name"]], policy)
        for i, c in enumerate(containers):
            envs = list(by_container.get(c.get("name"), []))
            if i == 0:
                envs += default
            if envs:
                _inject_env(c, envs, policy)
    secure_defaults(template, pspec)
    labels = claim_identity({}, claim)
    labels[LAUNCH_TYPE_LABEL] = "cold"
    labels[TEMPLATE_REF_HASH_LABEL] = th
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "annotations": {TEMPLATE_REF_ANNOTATION: template["metadata"]["name"]},
            "ownerReferences": [controller_ref(claim)],
        },
        "spec": bp,
    }


def adopted_body(candidate: dict, claim: dict, template: dict | None) -> dict:
    sb = copy.deepcopy(candidate)
    md = sb["metadata"]
    labels = md.setdefault("labels", {})
    for k in (WARM_POOL_LABEL, TEMPLATE_HASH_LABEL, POD_TEMPLATE_HASH_LABEL):
        labels.pop(k, None)
    labels[LAUNCH_TYPE_LABEL] = "warm"
    md["labels"] = claim_identity(labels, claim)
    md["ownerReferences"] = [controller_ref(claim)]
    md.setdefault("annotations", {})[POD_NAME_ANNOTATION] = md["name"]
    pt = sb["spec"].setdefault("podTemplate", {})
    pmeta = pt.setdefault("metadata", {})
    plabels = dict(pmeta.get("labels") or {})
    th = labels.get(TEMPLATE_REF_HASH_LABEL)
    for k in (WARM_POOL_LABEL, TEMPLATE_HASH_LABEL, POD_TEMPLATE_HASH_LABEL):
        plabels.pop(k, None)
    if template is not None:
        tmeta = (template.get("spec", {}).get("podTemplate") or {}).get("metadata") or {}
        plabels = {**plabels, **(tmeta.get("labels") or {})}
    plabels = claim_identity(plabels, claim)
    if th:
        plabels[TEMPLATE_REF_HASH_LABEL] = th
    pmeta["labels"] = plabels
    merge_pod_metadata(pmeta, claim)
    return sb


class ClaimReconciler:
    name = "sandboxclaim"

    def __init__(self, op: Operator) -> None:
        self.op = op
        self._reserved: set[tuple[str, str]] = set()  # candidates being adopted right now
        self._assigned: dict[str, str] = {}  # claim uid -> sandbox name (covers cache lag)
        self._ready_seen: set[str] = set()
        self._first_observed: dict[str, str] = {}  # claim uid -> RFC 3339 nano

    # -- main ------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result | None:
        op = self.op
        claim = op.claims.get(*key)
        if claim is None or deleting(claim):
            if claim is None:
                self._forget_missing()
            return None
        ns, _ = key
        uid = claim["metadata"]["uid"]
        self._first_observed.setdefault(uid, rfc3339_nano(time.time_ns()))
        spec = claim.get("spec", {})
        lc = spec.get("lifecycle") or {}
        result: Result | None = None

        # lifecycle ---------------------------------------------------------------
        shutdown_at = parse_time(lc.get("shutdownTime"))
        expire_at = shutdown_at
        finished = get_condition(claim, "Finished")
        ttl = lc.get("ttlSecondsAfterFinished")
        if ttl is not None and finished is not None and finished.get("status") == "True":
            fin_at = parse_time(finished.get("lastTransitionTime"))
            if fin_at is not None:
                t = fin_at + int(ttl)
                expire_at = t if expire_at is None else min(expire_at, t)
        if expire_at is not None and time.time() >= expire_at:
            return await self._expire(claim, lc.get("shutdownPolicy") or "Retain")
        if expire_at is not None:
            result = Result(requeue_after=max(0.05, expire_at - time.time()))

        sandbox = await self._bound_sandbox(claim)
        if sandbox is None and (claim.get("status") or {}).get("sandbox", {}).get("name"):
            # it had one and it is gone (expired with policy Delete, or deleted by hand)
            await self._set_status(
                claim, None, ("False", "SandboxMissing", "Sandbox does not exist")
            )
            return result
        if sandbox is None:
            pool_name = (spec.get("warmPoolRef") or {}).get("name", "")
            pool = op.pools.get(ns, pool_name)
            if pool is None:
                return await self._reject(
                    claim, "WarmPoolNotFound", f"SandboxWarmPool {pool_name!r} not found"
                )
            tname = (pool.get("spec", {}).get("sandboxTemplateRef") or {}).get("name", "")
            template = op.templates.get(ns, tname)
            if template is None:
                return await self._reject(
                    claim,
                    "TemplateNotFound",
                    f"SandboxTemplate {tname!r} (of pool {pool_name!r}) not found",
                )
            try:
                validate_claim(claim, template)
                volume = user_volume_of(template)
                # A warm pod cannot gain a volume or an environment variable.
                cold = (
                    bool(spec.get("env"))
                    or bool(spec.get("volumeClaimTemplates"))
                    or volume is not None
                )
                if not cold:
                    sandbox, pending = await self._adopt(claim, pool, template)
                    launch = "warm"
                    wait = _warm_grace_left(claim) if sandbox is None and pending else 0.0
                    if wait > 0:
                        # members about to get their pod IP beat a cold start
                        return Result(requeue_after=min(0.5, wait))
                if sandbox is None:
                    sandbox = await self._cold_start(claim, template, volume)
                    launch = "cold"
            except ClaimRejected as e:
                return await self._reject(claim, e.reason, str(e))
            except UserVolumeError as e:
                return await self._reject(claim, "UserVolumeError", str(e))
            if sandbox is None:
                return Result(requeue_after=0.5)
            self._assigned[uid] = sandbox["metadata"]["name"]
            CLAIMS.labels(launch).inc()
            sbn = sandbox["metadata"]["name"]
            if launch == "warm":
                await op.events.record(
                    claim, "Normal", "SandboxAdopted", f"Adopted warm pool Sandbox {sbn!r}"
                )
            else:
                await op.events.record(
                    claim, "Normal", "SandboxProvisioned", f"Created Sandbox {sbn!r}"
                )

        # annotate + status -------------------------------------------------------
        sbname = sandbox["metadata"]["name"]
        annotated = (claim["metadata"].get("annotations") or {}).get(
            ASSIGNED_SANDBOX_ANNOTATION
        ) == sbname
        sready = get_condition(sandbox, "Ready")
        if sready is not None and sready.get("reason") == "SandboxExpired":
            cond = (
                "False",
                "SandboxExpired",
                "Underlying Sandbox resource has expired independently of the Claim.",
            )
        elif sandbox_ready(sandbox):
            cond = ("True", "SandboxReady", "Sandbox is ready")
            if uid not in self._ready_seen:
                self._ready_seen.add(uid)
                created = parse_time(claim["metadata"].get("creationTimestamp"))
                if created:
                    lt = (sandbox["metadata"].get("labels") or {}).get(LAUNCH_TYPE_LABEL, "unknown")
                    CLAIM_READY_SECONDS.labels(lt).observe(max(0.0, time.time() - created))
        else:
            cond = (
                "False",
                "SandboxNotReady",
                (sready or {}).get("message") or "Sandbox is not ready",
            )
        annotations = self._missing_annotations(claim)
        if not annotated:
            annotations[ASSIGNED_SANDBOX_ANNOTATION] = sbname
        if not annotations:
            await self._set_status(claim, sandbox, cond)
            return result
        if cond[0] == "True":
            # Whoever sees the claim Ready reads its sandbox from the annotation
            # (upstream's SDK and e2e suite do): it must land first.
            if not await self._annotate(claim, annotations):
                return None
            await self._set_status(claim, sandbox, cond)
            return result
        # Not Ready yet: the annotation (metadata) and the status (its own
        # subresource) are independent merge patches, one round trip for both.
        still_there, _ = await asyncio.gather(
            self._annotate(claim, annotations), self._set_status(claim, sandbox, cond)
        )
        return result if still_there else None

    def _missing_annotations(self, claim: dict) -> dict[str, str]:
        """The annotations every claim gets that this one lacks (upstream's
        first-observed time, which latency metrics read)."""
        present = claim["metadata"].get("annotations") or {}
        if present.get(FIRST_OBSERVED_ANNOTATION):
            return {}
        observed = self._first_observed.get(claim["metadata"]["uid"])
        return {FIRST_OBSERVED_ANNOTATION: observed or rfc3339_nano(time.time_ns())}

    async def _annotate(self, claim: dict, annotations: dict[str, str]) -> bool:
        """Merge ``annotations`` into the claim's; False if the claim is gone."""
        md = claim["metadata"]
        try:
            updated = await self.op.client.patch(
                CLAIM,
                md["namespace"],
                md["name"],
                {"metadata": {"annotations": annotations}},
            )
        except ApiError as e:
            if e.not_found:
                return False
            raise
        self.op.claims.upsert_local(updated)
        return True

    def _forget_missing(self) -> None:
        live = {c["metadata"]["uid"] for c in self.op.claims.items()}
        for u in list(self._assigned):
            if u not in live:
                del self._assigned[u]
        self._ready_seen &= live
        for u in [u for u in self._first_observed if u not in live]:
            del self._first_observed[u]

    # -- finding / adopting / creating ----------------------------------------

    async def _bound_sandbox(self, claim: dict) -> dict | None:
        op = self.op
        ns = claim["metadata"]["namespace"]
        uid = claim["metadata"]["uid"]
        owned = [s for s in op.sandboxes.by_index("controller-uid", uid) if not deleting(s)]
        if len(owned) > 1:
            # should never happen; keep the recorded one, release the others
            keep = self._assigned.get(uid) or (claim["metadata"].get("annotations") or {}).get(
                ASSIGNED_SANDBOX_ANNOTATION
            )
            owned.sort(
                key=lambda s: (
                    s["metadata"]["name"] != keep,
                    s["metadata"].get("creationTimestamp", ""),
                )
            )
            for extra in owned[1:]:
                await op.events.record(
                    claim,
                    "Warning",
                    "DuplicateSandbox",
                    f"releasing extra Sandbox {extra['metadata']['name']!r}",
                )
                try:
                    await op.client.delete(
                        SANDBOX, ns, extra["metadata"]["name"], uid=extra["metadata"]["uid"]
                    )
                except ApiError as e:
                    if not (e.not_found or e.conflict):
                        raise
        if owned:
            return owned[0]
        want = self._assigned.get(uid)
        if want:
            sb = op.sandboxes.get(ns, want)
            if sb is None:
                try:
                    sb = await op.client.get(SANDBOX, ns, want)
                    op.sandboxes.upsert_local(sb)
                except ApiError as e:
                    if not e.not_found:
                        raise
                    sb = None
            if sb is not None and is_controlled_by(sb, claim) and not deleting(sb):
                return sb
            self._assigned.pop(uid, None)
        return None

    async def _adopt(self, claim: dict, pool: dict, template: dict) -> tuple[dict | None, int]:
        """The adopted member, or None and how many members wait for a pod IP."""
        op = self.op
        ns = claim["metadata"]["namespace"]
        pool_uid = pool["metadata"]["uid"]
        recreate = ((pool.get("spec", {}).get("updateStrategy") or {}).get("type")) == "Recreate"
        current = blueprint_hash(template)
        members = op.sandboxes.by_index("warm-pool", name_hash(pool["metadata"]["name"]))
        # Oldest first: members that have been Ready longest go out first, and a
        # refill that turns Ready mid-burst never overtakes an original member.
        # Sort on the cheap key, then check members lazily and stop at 8 Ready
        # ones: a burst reconciles every claim against the whole pool, so a full
        # scan per claim made a burst of N claims cost O(N^2) condition lookups.
        # As upstream does, a member that is not Ready yet but has its pod IP is
        # the fallback when none is Ready: it is closer to Ready than a cold start.
        members.sort(
            key=lambda s: (s["metadata"].get("creationTimestamp", ""), s["metadata"]["name"])
        )
        cands: list[dict] = []
        fallback: dict | None = None
        pending = 0
        for sb in members:
            md = sb["metadata"]
            if md["namespace"] != ns or deleting(sb) or (ns, md["name"]) in self._reserved:
                continue
            ref = controller_of(sb)
            if ref is None or ref.get("uid") != pool_uid:
                continue
            if recreate and is_stale(sb, template, current):
                continue
            if sandbox_ready(sb):
                cands.append(sb)
                if len(cands) == 8:
                    break
            elif not (sb.get("status") or {}).get("podIPs"):
                pending += 1
            elif fallback is None:
                fallback = sb
        if not cands and fallback is not None:
            cands.append(fallback)
        for cand in cands:
            k = (ns, cand["metadata"]["name"])
            if k in self._reserved:
                continue
            self._reserved.add(k)
            try:
                body = adopted_body(cand, claim, template)
                try:
                    adopted = await op.client.replace(SANDBOX, body)
                except ApiError as e:
                    if e.conflict or e.not_found:
                        ADOPTION_CONFLICTS.inc()
                        continue
                    raise
                op.sandboxes.upsert_local(adopted)
                return adopted, pending
            finally:
                self._reserved.discard(k)
        return None, pending

    async def _cold_start(
        self, claim: dict, template: dict, volume: user_volume.UserVolume | None
    ) -> dict | None:
        op = self.op
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        body = build_cold_sandbox(claim, template)
        if volume is not None:
            await self._attach_user_volume(body, claim, volume)
        try:
            sb = await op.client.create(SANDBOX, ns, body, fieldManager=FIELD_MANAGER)
        except ApiError as e:
            if not e.already_exists:
                raise
            sb = await op.client.get(SANDBOX, ns, name)
            if not is_controlled_by(sb, claim):
                raise ClaimRejected(
                    "SandboxNameConflict",
                    f"a Sandbox named {name!r} already exists and belongs to someone else",
                ) from e
        op.sandboxes.upsert_local(sb)
        return sb

    async def _attach_user_volume(
        self, body: dict, claim: dict, volume: user_volume.UserVolume
    ) -> None:
        """Mount the claiming user's PVC in the new Sandbox's pod (see user_volume)."""
        ns = claim["metadata"]["namespace"]
        annotations = claim["metadata"].get("annotations") or {}
        pvcs = (await self.op.client.list(PVC, ns)).get("items") or []
        pvc = user_volume.choose_user_pvc(
            pvcs,
            annotations.get(user_volume.CLAIM_USER_ANNOTATION),
            annotations.get(user_volume.CLAIM_SERVER_ANNOTATION),
        )
        node = None
        if not user_volume.attaches_anywhere(pvc):  # else no need to list the pods
            pods = (await self.op.client.list(POD, ns)).get("items") or []
            node = user_volume.node_to_share(pvc, pods)
        user_volume.attach(
            body["spec"].setdefault("podTemplate", {}).setdefault("spec", {}),
            pvc["metadata"]["name"],
            volume,
            user_volume.kernel_cwd(claim, volume),
            node,
        )

    # -- status / expiry ---------------------------------------------------------

    async def _reject(self, claim: dict, reason: str, message: str) -> Result | None:
        annotations = self._missing_annotations(claim)
        if annotations:
            await self._annotate(claim, annotations)
        await self._set_status(claim, None, ("False", reason, message))
        await self.op.events.record(claim, "Warning", reason, message)
        return None  # level-triggered: a change of claim, pool or template requeues it

    async def _set_status(
        self, claim: dict, sandbox: dict | None, ready: tuple[str, str, str]
    ) -> None:
        old = claim.get("status") or {}
        gen = claim["metadata"].get("generation")
        conds = set_condition(old.get("conditions") or [], "Ready", *ready, gen)
        if sandbox is not None:
            fin = get_condition(sandbox, "Finished")
            if fin is not None and fin.get("status") == "True":
                conds = set_condition(
                    conds,
                    "Finished",
                    "True",
                    fin.get("reason", "PodFinished"),
                    fin.get("message", ""),
                    gen,
                )
        new = dict(old)
        new["conditions"] = conds
        mirrored = ("podIPs", "serviceFQDN")  # from the Sandbox's status, as upstream
        if sandbox is not None:
            sbs = {"name": sandbox["metadata"]["name"]}
            sstatus = sandbox.get("status") or {}
            sbs.update({k: sstatus[k] for k in mirrored if sstatus.get(k)})
            new["sandbox"] = sbs
        if new == old:
            return
        patch = dict(new)
        if sandbox is not None:
            # a merge patch keeps what it does not mention: clear what went away
            gone = [k for k in mirrored if k in (old.get("sandbox") or {}) and k not in sbs]
            if gone:
                patch["sandbox"] = dict(sbs, **dict.fromkeys(gone))
        await self.op.claims.patch_status(claim, patch)

    async def _expire(self, claim: dict, policy: str) -> Result | None:
        op = self.op
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        if policy in ("Delete", "DeleteForeground"):
            try:
                await op.client.delete(
                    CLAIM,
                    ns,
                    name,
                    propagation="Foreground" if policy == "DeleteForeground" else "Background",
                    uid=claim["metadata"]["uid"],
                )
            except ApiError as e:
                if not (e.not_found or e.conflict):
                    raise
            return None
        for sb in op.sandboxes.by_index("controller-uid", claim["metadata"]["uid"]):
            if not deleting(sb):
                try:
                    await op.client.delete(
                        SANDBOX, ns, sb["metadata"]["name"], uid=sb["metadata"]["uid"]
                    )
                except ApiError as e:
                    if not (e.not_found or e.conflict):
                        raise
        old = get_condition(claim, "Ready")
        if old is None or old.get("reason") != "ClaimExpired":
            await op.events.record(
                claim, "Normal", "ClaimExpired", "Claim expired; Sandbox deleted"
            )
        await self._set_status(
            claim, None, ("False", "ClaimExpired", "Claim expired. Sandbox cleanup initiated.")
        )
        return None
