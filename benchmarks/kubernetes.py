"""Kubernetes figures on the test API server (``tests/cluster``: kube-apiserver,
etcd, kube-controller-manager, kube-scheduler and kwok, which makes bound pods
Running/Ready with IPs at once, so "cold start" here is the control-plane part of
a cold start: no image pull, no container start).

1. warm claim to Ready through ``KubernetesControlPlane.claim`` + ``wait_ready``
   with our operator, beside a cold start of the same template (a pool of 0);
2. claim burst: N concurrent SandboxClaims against a warm pool of N, our operator
   beside the upstream agent-sandbox controller (``build-upstream.sh``) on the
   same API server, same kwok node, one controller at a time, fresh namespace each;
3. resume after suspend to Ready (Sandbox ``operatingMode`` patch) beside a cold
   start.

The control plane is started here and stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from jupyter_sandbox.control_plane.base import ClaimRequest, Phase
from jupyter_sandbox.control_plane.kubernetes.backend import KubernetesControlPlane
from jupyter_sandbox.kube.client import ApiError, Client, load_config

from .stats import Figure, Series
from .upstream import upstream_program

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "deploy" / "crds"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxes"
TEMPLATES = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxtemplates"
POOLS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxwarmpools"
CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{ns}/sandboxclaims"
CLAIM_TIMEOUT = 60.0


@dataclass
class Options:
    quick: bool
    reps: int
    bursts: tuple[int, ...]
    upstream: Path | None
    upstream_note: str = ""
    profile: Path | None = None  # py-spy the operator during the largest burst
    rounds: int = 1  # bursts per controller and N, in alternating order


# --------------------------------------------------------------------------- availability


def unavailable_reason() -> str | None:
    """Why the Kubernetes figures cannot run here, or None."""
    try:
        from tests.cluster.controlplane import missing_binaries
    except ImportError as exc:  # not run from the repository root
        return f"tests.cluster is not importable ({exc}); run from the repository root"
    missing = missing_binaries(with_kwok=True)
    if missing:
        return (
            f"control-plane binaries missing ({', '.join(missing)}): "
            "run tests/cluster/build.sh or set KUBEBUILDER_ASSETS"
        )
    return None


def upstream_controller(build: bool) -> tuple[Path | None, str]:
    """The upstream controller binary (building it if ``build``), or None and why not."""
    return upstream_program("controller", build)


# --------------------------------------------------------------------------- API client


class Api:
    """The benchmark's view of the API server: the project's own client, used by
    path, with a few helpers for namespaces and CRDs."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._client: Client | None = None

    async def client(self) -> Client:
        if self._client is None:
            settings = await asyncio.to_thread(load_config, str(self.kubeconfig))
            self._client = Client(
                settings, user_agent="jupyter-sandbox-benchmark", request_timeout=60
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """One request; an error whose status is in ``ok`` answers ``{}``."""
        client = await self.client()
        try:
            return await client.request(method, path, body, params, content_type)
        except ApiError as exc:
            if exc.status in ok:
                return {}
            raise

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", path, body)

    async def items(self, path: str) -> list[dict[str, Any]]:
        return list((await self.call("GET", path)).get("items") or [])

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call("PATCH", path, body, "application/merge-patch+json")

    async def watch(self, path: str, rv: str) -> AsyncIterator[dict[str, Any]]:
        client = await self.client()
        async for event in client.watch_path(path, {"resourceVersion": rv}):
            yield event

    async def apply_crds(self, timeout: float = 60) -> None:
        base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        names = []
        for f in sorted(CRD_DIR.glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if doc:
                    names.append(doc["metadata"]["name"])
                    await self.call("POST", base, doc, ok=(409,))
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = await self.call("GET", f"{base}/{name}")
                # A CRD just created may have no status yet, or "conditions": null.
                status = crd.get("status") or {}
                conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not Established")
                await asyncio.sleep(0.1)

    async def new_namespace(self, prefix: str, timeout: float = 60) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await self.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        deadline = time.monotonic() + timeout
        while True:  # pods need the default ServiceAccount
            got = await self.call(
                "GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default", ok=(404,)
            )
            if got.get("metadata"):
                return ns
            if time.monotonic() > deadline:
                raise TimeoutError(f"no default ServiceAccount in {ns}")
            await asyncio.sleep(0.1)

    async def delete_namespace(self, ns: str, timeout: float) -> bool:
        """Delete and wait until it is gone (True) or the timeout passed (False)."""
        await self.call("DELETE", f"/api/v1/namespaces/{ns}", ok=(404,))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = await self.call("GET", f"/api/v1/namespaces/{ns}", ok=(404,))
            if not got.get("metadata"):
                return True
            await asyncio.sleep(0.5)
        return False


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return {}


def is_ready(obj: dict[str, Any] | None) -> bool:
    return condition(obj, "Ready").get("status") == "True"


# --------------------------------------------------------------------------- objects


def template(name: str) -> dict[str, Any]:
    return {
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
                            "image": "jupyter-sandbox/runtime:bench",
                            "ports": [{"name": "http", "containerPort": 8888}],
                        }
                    ]
                },
            }
        },
    }


def pool(name: str, tpl: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": tpl}},
    }


def claim(name: str, pool_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool_name}},
    }


async def wait_ready_sandboxes(api: Api, ns: str, n: int, timeout: float) -> float:
    """Seconds until ``n`` unclaimed Sandboxes in ``ns`` are Ready (controller-agnostic)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    ready = 0
    while time.monotonic() < deadline:
        items = await api.items(SANDBOXES.format(ns=ns))
        ready = sum(1 for s in items if is_ready(s))
        if ready >= n:
            return time.monotonic() - t0
        await asyncio.sleep(0.25)
    raise TimeoutError(f"{ready}/{n} warm sandboxes Ready in {ns} after {timeout:.0f}s")


# --------------------------------------------------------------------------- controllers


@dataclass
class Controller:
    """A controller as a child process in its own session (killed with its group)."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Controller:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                env=env,
                start_new_session=True,
            )
        return self

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


def ours(kubeconfig: Path, ns: str, log: Path) -> Controller:
    argv = [
        sys.executable,
        "-m",
        "jupyter_sandbox.operator",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={ns}",
        "--no-leader-elect",
        "--metrics-bind-address=0",
    ]
    return Controller("our operator", argv, log)


def upstream(exe: Path, kubeconfig: Path, log: Path) -> Controller:
    argv = [
        str(exe),
        f"--kubeconfig={kubeconfig}",
        "--extensions=true",
        "--enable-webhook=false",
        "--leader-elect=false",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
    ]
    return Controller("upstream agent-sandbox controller", argv, log)


# --------------------------------------------------------------------------- figures 1 and 3


async def _claim_to_ready(plane: KubernetesControlPlane, pool_name: str) -> tuple[float, Any]:
    started = time.perf_counter()
    status = await plane.claim(ClaimRequest(pool=pool_name))
    status = await plane.wait_ready(status.name, CLAIM_TIMEOUT)
    return time.perf_counter() - started, status


async def _wait_phase(plane: KubernetesControlPlane, name: str, phase: Phase) -> None:
    deadline = time.monotonic() + CLAIM_TIMEOUT
    while True:
        status = await plane.status(name)
        if status is not None and status.phase == phase:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"claim {name} not {phase} (is {status and status.phase})")
        await asyncio.sleep(0.05)


async def latency_figures(api: Api, kubeconfig: Path, workdir: Path, reps: int) -> list[Figure]:
    """Figures 1 (warm vs cold claim) and 3 (resume vs cold), our operator."""
    ns = await api.new_namespace("bench-latency")
    op = ours(kubeconfig, ns, workdir / "operator-latency.log").start()
    plane = KubernetesControlPlane(namespace=ns, kubeconfig=str(kubeconfig))
    try:
        await api.create(TEMPLATES.format(ns=ns), template("python"))
        await api.create(POOLS.format(ns=ns), pool("warm", "python", reps))
        await api.create(POOLS.format(ns=ns), pool("cold", "python", 0))
        await wait_ready_sandboxes(api, ns, reps, 60 + reps)
        warm = Series(f"warm claim, pool of {reps}", "ms")
        cold = Series("cold start, pool of 0", "ms")
        resumed = Series("resume after suspend", "ms")
        cold2 = Series("cold start, pool of 0", "ms")
        not_warm = 0
        # one untimed round of each path first (client set-up, first watch)
        for pool_name in ("warm", "cold"):
            _, st = await _claim_to_ready(plane, pool_name)
            await plane.release(st.name)
        for _ in range(reps):
            # the warm pool is full again before each warm claim
            await _wait_pool_full(api, ns, "warm", reps)
            seconds, st = await _claim_to_ready(plane, "warm")
            warm.values.append(seconds * 1000)
            not_warm += st.warm is False
            await plane.release(st.name)
            seconds, st = await _claim_to_ready(plane, "cold")
            cold.values.append(seconds * 1000)
            await plane.release(st.name)
        for _ in range(reps):
            _, st = await _claim_to_ready(plane, "warm")
            await plane.suspend(st.name)
            await _wait_phase(plane, st.name, Phase.SUSPENDED)
            started = time.perf_counter()
            await plane.resume(st.name)
            await plane.wait_ready(st.name, CLAIM_TIMEOUT)
            resumed.values.append((time.perf_counter() - started) * 1000)
            await plane.release(st.name)
            seconds, st = await _claim_to_ready(plane, "cold")
            cold2.values.append(seconds * 1000)
            await plane.release(st.name)
        op.check()
    finally:
        await plane.close()
        await api.delete_namespace(ns, 120)
        op.stop()
    note = "kwok pods: cold start has no image pull or container start"
    warm_note = note + (f"; {not_warm} 'warm' claims were cold-started" if not_warm else "")
    return [
        Figure(
            "Kubernetes claim to Ready (KubernetesControlPlane.claim + wait_ready, our operator)",
            warm,
            cold,
            "warm p90 < 300 ms",
            notes=warm_note,
        ),
        Figure(
            "Kubernetes resume after suspend to Ready (operatingMode patch, our operator)",
            resumed,
            cold2,
            "stated",
            notes=note,
        ),
    ]


async def _wait_pool_full(api: Api, ns: str, name: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = await api.call("GET", f"{POOLS.format(ns=ns)}/{name}")
        if (got.get("status") or {}).get("readyReplicas", 0) >= n:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool {name} not refilled to {n}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- figure 2


@dataclass
class BurstResult:
    controller: str
    n: int
    pool_fill_s: float
    created_s: float  # first create sent -> last create answered
    all_ready_s: float  # first create sent -> last claim Ready seen
    latencies_ms: list[float] = field(default_factory=list)
    not_ready: int = 0

    @property
    def claims_per_s(self) -> float:
        return self.n / self.all_ready_s if self.all_ready_s else float("nan")


async def burst(
    api: Api,
    make_controller: Any,
    label: str,
    n: int,
    profile: Path | None = None,
) -> BurstResult:
    """N concurrent claims against a Ready pool of N; claim-to-Ready per claim."""
    ns = await api.new_namespace(f"bench-burst-{label}-{n}")
    ctl: Controller = make_controller(ns).start()
    spy: subprocess.Popen[bytes] | None = None
    try:
        await api.create(TEMPLATES.format(ns=ns), template("python"))
        await api.create(POOLS.format(ns=ns), pool("pool", "python", n))
        fill = await wait_ready_sandboxes(api, ns, n, 120 + n)
        ctl.check()
        path = CLAIMS.format(ns=ns)
        listed = await api.call("GET", path)
        rv = listed["metadata"]["resourceVersion"]
        sent: dict[str, float] = {}
        ready_at: dict[str, float] = {}
        all_ready = asyncio.Event()

        async def watch() -> None:
            nonlocal rv
            while not all_ready.is_set():
                async for ev in api.watch(path, rv):
                    obj = ev.get("object") or {}
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    name = obj.get("metadata", {}).get("name")
                    if ev.get("type") in ("ADDED", "MODIFIED") and is_ready(obj):
                        ready_at.setdefault(name, time.perf_counter())
                        if len(ready_at) >= n:
                            all_ready.set()
                            return

        if profile is not None and ctl.proc is not None:
            spy = _py_spy(ctl.proc.pid, profile)
        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)  # the watch is open
        gate = asyncio.Semaphore(32)

        async def create(i: int) -> None:
            name = f"c{i:04d}"
            async with gate:
                sent[name] = time.perf_counter()
                await api.create(path, claim(name, "pool"))

        t0 = time.perf_counter()
        await asyncio.gather(*(create(i) for i in range(n)))
        created = time.perf_counter() - t0
        try:
            await asyncio.wait_for(all_ready.wait(), 60 + n * 0.5)
        except TimeoutError:
            pass
        watcher.cancel()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            spy = None
        ctl.check()
        lat = [(ready_at[k] - sent[k]) * 1000 for k in sent if k in ready_at]
        end = max(ready_at.values()) if ready_at else time.perf_counter()
        return BurstResult(label, n, fill, created, end - t0, lat, n - len(lat))
    finally:
        if spy is not None:
            spy.kill()
        # delete while the controller still runs (finalizers, if any, get handled),
        # and wait: the upstream controller watches every namespace
        gone = await api.delete_namespace(ns, 300)
        ctl.stop()
        if not gone:
            print(f"[kubernetes] namespace {ns} still terminating", file=sys.stderr)


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy")
    if exe is None:
        print("[kubernetes] py-spy not installed: no profile", file=sys.stderr)
        return None
    argv = [exe, "record", "--pid", str(pid), "-o", str(out), "--rate", "200", "--nonblocking"]
    if out.suffix == ".txt":
        argv += ["--format", "raw"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def burst_figures(results: list[BurstResult]) -> list[Figure]:
    figures = []
    for n in sorted({r.n for r in results}):
        sub = [r for r in results if r.n == n and r.controller == "ours"]
        base = [r for r in results if r.n == n and r.controller == "upstream"]
        if not sub or not base:
            continue

        def mean(rs: list[BurstResult], attr: str) -> float:
            return sum(getattr(r, attr) for r in rs) / len(rs)

        notes = (
            f"pool fill {mean(sub, 'pool_fill_s'):.1f}s vs {mean(base, 'pool_fill_s'):.1f}s; "
            f"creates took {mean(sub, 'created_s'):.2f}s vs {mean(base, 'created_s'):.2f}s; "
            f"not Ready: {sum(r.not_ready for r in sub)} vs {sum(r.not_ready for r in base)}"
        )
        figures.append(
            Figure(
                f"claim burst N={n}: claims/s (first create to last Ready)",
                Series("our operator", "claims/s", [r.claims_per_s for r in sub]),
                Series("upstream controller", "claims/s", [r.claims_per_s for r in base]),
                ">= 1x",
                higher_is_better=True,
                notes=notes,
            )
        )
        figures.append(
            Figure(
                f"claim burst N={n}: claim create to Ready latency",
                Series("our operator", "ms", [x for r in sub for x in r.latencies_ms]),
                Series("upstream controller", "ms", [x for r in base for x in r.latencies_ms]),
                "p90 <= upstream p90",
                notes=notes,
            )
        )
    return figures


# --------------------------------------------------------------------------- entry


def _maker(label: str, opts: Options, kubeconfig: Path, workdir: Path, n: int) -> Any:
    if label == "upstream":
        exe = opts.upstream
        assert exe is not None
        return lambda ns: upstream(exe, kubeconfig, workdir / f"upstream-{n}.log")
    return lambda ns: ours(kubeconfig, ns, workdir / f"operator-{n}.log")


async def _run(cp: Any, opts: Options, workdir: Path) -> list[Figure]:
    api = Api(cp.kubeconfig)
    figures: list[Figure] = []
    try:
        await api.apply_crds()
        t = time.monotonic()
        figures += await latency_figures(api, cp.kubeconfig, workdir, opts.reps)
        print(f"[kubernetes] latency figures in {time.monotonic() - t:.0f}s", file=sys.stderr)
        results: list[BurstResult] = []
        for i, n in enumerate(opts.bursts):
            labels = (["upstream"] if opts.upstream is not None else []) + ["ours"]
            for r in range(opts.rounds):
                # alternate who goes first (ABBA...), so drifting machine load does
                # not favour one controller
                for label in labels if (i + r) % 2 == 0 else labels[::-1]:
                    t = time.monotonic()
                    last = n == max(opts.bursts) and r == opts.rounds - 1
                    prof = opts.profile if (label == "ours" and last) else None
                    make = _maker(label, opts, cp.kubeconfig, workdir, n)
                    res = await burst(api, make, label, n, prof)
                    results.append(res)
                    lat = Series("", "ms", res.latencies_ms)
                    print(
                        f"[kubernetes] burst {label} N={n}: {res.claims_per_s:.1f} claims/s, "
                        f"p90 {lat.p90:.0f} ms, pool fill {res.pool_fill_s:.1f}s, "
                        f"not Ready {res.not_ready} ({time.monotonic() - t:.0f}s)",
                        file=sys.stderr,
                    )
        if opts.upstream is None:
            for res in results:
                lat = Series("our operator", "ms", res.latencies_ms)
                print(
                    f"[kubernetes] our operator alone, N={res.n}: {res.claims_per_s:.1f} claims/s, "
                    f"latency median {lat.median:.0f} ms, p90 {lat.p90:.0f} ms"
                )
        figures += burst_figures(results)
    finally:
        await api.close()
    return figures


def kubernetes_figures(opts: Options) -> list[Figure]:
    from tests.cluster.controlplane import ControlPlane

    t0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench-kube-"))
    cp = ControlPlane(workdir=workdir / "cluster")
    cp.start()
    print(f"[kubernetes] control plane up in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    try:
        return asyncio.run(_run(cp, opts, workdir))
    finally:
        cp.stop()
        shutil.rmtree(workdir / "cluster" / "etcd", ignore_errors=True)  # keep only the logs
        print(
            f"[kubernetes] done in {time.monotonic() - t0:.0f}s (logs in {workdir})",
            file=sys.stderr,
        )
