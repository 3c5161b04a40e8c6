"""SandboxWarmPool reconciler: keep ``spec.replicas`` unclaimed Sandboxes.

Pool members are Sandboxes created with ``generateName: <pool>-``, labelled
``agents.x-k8s.io/warm-pool-sandbox=<fnv(pool)>`` and controlled by the pool.
A claim adopting a member moves the controller reference to itself and drops
the pool label, so the member simply leaves this reconciler's view and the
deficit is refilled.  ``updateStrategy: Recreate`` deletes members whose
blueprint no longer matches the template; ``OnReplenish`` (default) keeps them
until they are claimed or deleted.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING

from ..agent_sandbox import (
    CREATED_BY_LABEL,
    LAUNCH_TYPE_LABEL,
    POD_TEMPLATE_HASH_LABEL,
    SANDBOX,
    TEMPLATE_HASH_LABEL,
    TEMPLATE_REF_ANNOTATION,
    TEMPLATE_REF_HASH_LABEL,
    WARM_POOL_LABEL,
    name_hash,
)
from ..kube.client import ApiError
from ..kube.informer import Key
from .core import Result
from .util import (
    FIELD_MANAGER,
    blueprint_hash,
    blueprint_of,
    canonical_hash,
    controller_of,
    controller_ref,
    deleting,
    expected_pod_spec,
    sandbox_ready,
    secure_defaults,
    set_condition,
)

if TYPE_CHECKING:
    from .manager import Operator

MAX_BATCH = 100
CREATE_CONCURRENCY = 16


def _vcts(vcts: list[dict] | None) -> list[tuple]:
    return [((v.get("metadata") or {}).get("name"), v.get("spec")) for v in vcts or []]


def is_stale(sb: dict, template: dict, current_hash: str) -> bool:
    labels = sb["metadata"].get("labels") or {}
    if labels.get(TEMPLATE_REF_HASH_LABEL) != name_hash(template["metadata"]["name"]):
        return True
    if labels.get(TEMPLATE_HASH_LABEL) == current_hash:
        return False
    want = blueprint_of(template.get("spec", {}))
    have = sb.get("spec", {})
    if (have.get("podTemplate") or {}).get("spec") != expected_pod_spec(template):
        return True
    if _vcts(have.get("volumeClaimTemplates")) != _vcts(want.get("volumeClaimTemplates")):
        return True
    return have.get("service") != want.get("service")


def build_pool_sandbox(pool: dict, template: dict) -> dict:
    pool_hash = name_hash(pool["metadata"]["name"])
    tname = template["metadata"]["name"]
    bp = blueprint_of(template.get("spec", {}))
    bhash = blueprint_hash(template)
    phash = canonical_hash(template.get("spec", {}).get("podTemplate"))
    pt = bp.setdefault("podTemplate", {})
    pmeta = pt.setdefault("metadata", {})
    plabels = pmeta.setdefault("labels", {})
    plabels[WARM_POOL_LABEL] = pool_hash
    plabels[TEMPLATE_REF_HASH_LABEL] = name_hash(tname)
    plabels[POD_TEMPLATE_HASH_LABEL] = phash
    plabels[TEMPLATE_HASH_LABEL] = bhash
    pt["spec"] = secure_defaults(template, copy.deepcopy(pt.get("spec") or {}))
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {
            "generateName": f"{pool['metadata']['name']}-",
            "namespace": pool["metadata"]["namespace"],
            "labels": {
                WARM_POOL_LABEL: pool_hash,
                TEMPLATE_REF_HASH_LABEL: name_hash(tname),
                LAUNCH_TYPE_LABEL: "warm",
                POD_TEMPLATE_HASH_LABEL: phash,
                TEMPLATE_HASH_LABEL: bhash,
                CREATED_BY_LABEL: "controller",
            },
            "annotations": {TEMPLATE_REF_ANNOTATION: tname},
            "ownerReferences": [controller_ref(pool)],
        },
        "spec": bp,
    }


class WarmPoolReconciler:
    name = "sandboxwarmpool"

    def __init__(self, op: Operator) -> None:
        self.op = op
        # sandboxes we asked to delete, until the informer drops them: uid -> time
        self._deleting: dict[str, float] = {}
        # replenish hold (upstream --sandbox-warm-pool-replenish-delay): pool key ->
        # [member count at last look, no refill before this time]
        self._hold: dict[Key, list[float]] = {}

    def _replenish_hold(self, key: Key, current: int, desired: int, now: float) -> float:
        """Seconds to defer refill: re-armed on every drop below the last count,
        so a burst draining the pool is not raced by its own replacements."""
        delay = self.op.replenish_delay
        if delay <= 0:
            return 0.0
        st = self._hold.get(key)
        if st is None:
            self._hold[key] = [current, 0.0]
            return 0.0
        dropped = current < st[0]
        st[0] = current
        if current >= desired:
            st[1] = 0.0
            return 0.0
        if dropped:
            st[1] = now + delay
        return max(0.0, st[1] - now)

    async def reconcile(self, key: Key) -> Result | None:
        op = self.op
        pool = op.pools.get(*key)
        if pool is None or deleting(pool):
            return None
        ns, name = key
        uid = pool["metadata"]["uid"]
        gen = pool["metadata"].get("generation")
        tname = (pool.get("spec", {}).get("sandboxTemplateRef") or {}).get("name", "")
        template = op.templates.get(ns, tname) if tname else None
        pool_hash = name_hash(name)
        strategy = ((pool.get("spec", {}).get("updateStrategy") or {}).get("type")) or "OnReplenish"
        current_hash = blueprint_hash(template) if template else ""

        now = time.time()
        for u, t in list(self._deleting.items()):
            if now - t > 60:
                del self._deleting[u]

        active: list[dict] = []
        terminating = 0
        to_delete: list[dict] = []
        for sb in op.sandboxes.by_index("warm-pool", pool_hash):
            if sb["metadata"]["namespace"] != ns:
                continue
            ref = controller_of(sb)
            mine = ref is not None and ref.get("uid") == uid
            if ref is not None and not mine:
                continue
            if deleting(sb) or sb["metadata"]["uid"] in self._deleting:
                terminating += 1 if mine else 0
                continue
            if (
                template is not None
                and (strategy == "Recreate" or ref is None)
                and is_stale(sb, template, current_hash)
            ):
                to_delete.append(sb)
                terminating += 1 if mine else 0
                continue
            if ref is None:  # orphan with our label and a matching blueprint: adopt it
                sb = copy.deepcopy(sb)
                sb["metadata"]["ownerReferences"] = [controller_ref(pool)]
                try:
                    sb = await op.client.replace(SANDBOX, sb)
                    op.sandboxes.upsert_local(sb)
                except ApiError as e:
                    if e.conflict or e.not_found:
                        return Result(requeue_after=0.2)
                    raise
            active.append(sb)

        desired = int(
            pool.get("spec", {}).get("replicas", 1)
            if pool.get("spec", {}).get("replicas") is not None
            else 1
        )
        errors: list[Exception] = []
        if template is None:
            msg = f"SandboxTemplate {tname!r} not found in namespace {ns}"
            await self._status(pool, active, gen, ("False", "TemplateNotFound", msg))
            await op.events.record(pool, "Warning", "TemplateNotFound", msg)
            return None  # a template event requeues us

        # surplus first (scale down): unready before ready, newest first
        if len(active) > desired:
            # unready first; among equals newest first
            surplus = list(active)
            surplus.sort(key=lambda s: (sandbox_ready(s), _neg_ts(s)))
            victims = surplus[: min(len(active) - desired, MAX_BATCH)]
            to_delete.extend(victims)
            keep = {v["metadata"]["uid"] for v in victims}
            active = [s for s in active if s["metadata"]["uid"] not in keep]

        for sb in to_delete:
            self._deleting[sb["metadata"]["uid"]] = now
        errors += await self._gather([self._delete(sb) for sb in to_delete])

        deficit = min(desired - (len(active) + terminating), MAX_BATCH)
        created: list[dict] = []
        hold = self._replenish_hold(key, len(active), desired, now)
        if deficit > 0 and hold > 0:
            await self._status(
                pool,
                active,
                gen,
                ("True", "ReplenishDeferred", "refill deferred while the pool drains"),
            )
            return Result(requeue_after=hold)
        if deficit > 0:
            body = build_pool_sandbox(pool, template)
            sem = asyncio.Semaphore(CREATE_CONCURRENCY)

            async def create_one() -> None:
                async with sem:
                    obj = await op.client.create(
                        SANDBOX, ns, copy.deepcopy(body), fieldManager=FIELD_MANAGER
                    )
                    op.sandboxes.upsert_local(obj)
                    created.append(obj)

            errors += await self._gather([create_one() for _ in range(deficit)])
        active += created
        if key in self._hold:
            self._hold[key][0] += len(created)
        await self._status(
            pool,
            active,
            gen,
            ("True", "PoolReconciled", f"{len(active)}/{desired} sandboxes in pool"),
        )
        if errors:
            raise errors[0]
        if desired - (len(active) + terminating) > 0:
            return Result(requeue_after=0.05)
        return None

    async def _gather(self, coros: list) -> list[Exception]:
        if not coros:
            return []
        res = await asyncio.gather(*coros, return_exceptions=True)
        return [r for r in res if isinstance(r, Exception)]

    async def _delete(self, sb: dict) -> None:
        try:
            await self.op.client.delete(
                SANDBOX,
                sb["metadata"]["namespace"],
                sb["metadata"]["name"],
                uid=sb["metadata"]["uid"],
            )
        except ApiError as e:
            self._deleting.pop(sb["metadata"]["uid"], None)
            if not (e.not_found or e.conflict):
                raise

    async def _status(
        self, pool: dict, active: list[dict], gen: int | None, cond: tuple[str, str, str]
    ) -> None:
        old = pool.get("status") or {}
        new = dict(old)
        new["replicas"] = len(active)
        new["readyReplicas"] = sum(1 for s in active if sandbox_ready(s))
        new["selector"] = f"{WARM_POOL_LABEL}={name_hash(pool['metadata']['name'])}"
        new["observedGeneration"] = gen
        new["conditions"] = set_condition(old.get("conditions") or [], "Ready", *cond, gen)
        if new == old:
            return
        await self.op.pools.patch_status(pool, new)


def _neg_ts(sb: dict) -> str:
    # newest first: invert lexical order of RFC3339 timestamps
    ts = sb["metadata"].get("creationTimestamp", "")
    return "".join(chr(0x7F - ord(c)) for c in ts)
