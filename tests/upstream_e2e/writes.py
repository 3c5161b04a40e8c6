"""What a controller writes to a new Sandbox, and what a client's read-modify-write
of that Sandbox meets, for our operator and upstream's controller side by side:

    python -m tests.upstream_e2e --writes 20

For each controller, on a fresh control plane (the e2e suite's, see harness.py),
it creates Sandboxes like upstream's TestSandboxVolumeClaimTemplatesImmutable does
(a pause pod, no volume claim templates), each in a namespace of its own, and for
each one records every change a watch sees in its first seconds (time after the
create, what changed: metadata, spec or which status fields), then does what that
test does: read it at once and update it with a volume claim template, and notes
whether the API server answered 422 (immutable, what the test expects) or 409 (the
controller wrote in between).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .harness import cluster_with

GROUP, VERSION, PLURAL = "agents.x-k8s.io", "v1beta1", "sandboxes"
WATCH_SECONDS = 4.0
PAUSE_POD = {"spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}}
VCT = {
    "metadata": {"name": "data"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


@dataclass
class Trial:
    writes: list[tuple[float, str]] = field(default_factory=list)
    update: str = ""
    update_at: float = 0.0


def _changed(old: dict | None, new: dict) -> str:
    if old is None:
        return "created"
    parts = []
    for part in ("metadata", "spec"):
        a = {k: v for k, v in (old.get(part) or {}).items() if k not in _VOLATILE}
        b = {k: v for k, v in (new.get(part) or {}).items() if k not in _VOLATILE}
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            parts.append(f"{part}." + "+".join(keys))
    so, sn = old.get("status") or {}, new.get("status") or {}
    keys = sorted(k for k in set(so) | set(sn) if so.get(k) != sn.get(k))
    if "conditions" in keys:
        co = {c["type"]: c.get("status") for c in so.get("conditions") or []}
        cn = {c["type"]: c.get("status") for c in sn.get("conditions") or []}
        types = sorted(set(co) | set(cn))
        diff = [f"{t}={cn.get(t, '-')}" for t in types if co.get(t) != cn.get(t)]
        keys[keys.index("conditions")] = "conditions(" + ",".join(diff) + ")"
    if keys:
        parts.append("status." + "+".join(keys))
    return " ".join(parts) or "resourceVersion only"


_VOLATILE = {"resourceVersion", "managedFields", "generation"}


def trial(api, ns: str) -> Trial:
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    co = client.CustomObjectsApi(api)
    out = Trial()
    start = [0.0]
    ready = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        last: dict | None = None
        stream = w.stream(
            co.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            PLURAL,
            timeout_seconds=int(WATCH_SECONDS) + 2,
            allow_watch_bookmarks=False,
        )
        ready.set()
        for ev in stream:
            obj = ev["object"]
            t = (time.monotonic() - start[0]) * 1000
            out.writes.append((t, _changed(last, obj)))
            last = obj
            if t > WATCH_SECONDS * 1000:
                w.stop()

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    ready.wait(5)
    time.sleep(0.2)
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "vct-immutable"},
        "spec": {"podTemplate": PAUSE_POD},
    }
    start[0] = time.monotonic()
    co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
    latest = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vct-immutable")
    latest["spec"]["volumeClaimTemplates"] = [VCT]
    try:
        co.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "vct-immutable", latest)
        out.update = "accepted (!)"
    except ApiException as e:
        out.update = {409: "409 conflict", 422: "422 immutable"}.get(e.status, str(e.status))
    out.update_at = (time.monotonic() - start[0]) * 1000
    th.join(WATCH_SECONDS + 5)
    w.stop()
    return out


def measure(controller: str, workdir: Path, n: int) -> list[Trial]:
    from kubernetes import client, config

    with cluster_with(controller, workdir) as cp:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(cp.kubeconfig), client_configuration=cfg)
        with client.ApiClient(cfg) as api:
            core = client.CoreV1Api(api)
            trials = []
            for _ in range(n):
                ns = f"writes-{uuid.uuid4().hex[:8]}"
                core.create_namespace({"metadata": {"name": ns}})
                trials.append(trial(api, ns))
            return trials


def report(results: dict[str, list[Trial]]) -> None:
    for controller, trials in results.items():
        print(f"\n## {controller}: writes to a new Sandbox (first trial, ms after create)")
        for t, what in trials[0].writes:
            print(f"  {t:8.1f} ms  {what}")
        first = trials[0]
        print(f"  read-modify-write of the test: {first.update} at {first.update_at:.1f} ms")
        seqs = Counter(
            tuple(w for _, w in tr.writes if not w.startswith("spec.volumeClaimTemplates"))
            for tr in trials
        )
        print(f"\n  distinct write sequences over {len(trials)} trials:")
        for seq, count in seqs.most_common():
            print(f"   {count:3d}x  " + " | ".join(seq))
        outcomes = Counter(tr.update for tr in trials)
        print("  the test's update: " + ", ".join(f"{k}: {v}" for k, v in outcomes.items()))
