"""Controller core: informers (list+watch caches), a keyed work queue, workers,
Lease leader election and an Event recorder.

The shape follows client-go: every reconciler is level-triggered and keyed by
``namespace/name``; events only enqueue keys, the reconciler reads the current
state from the caches.  The queue de-duplicates a key that is already waiting,
never hands the same key to two workers at once, and re-queues failures with
per-key exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ..kube.client import EVENT, LEASE, ApiError, Client, sleep_or_stop
from ..kube.informer import Key
from ..kube.times import micro_now, now_rfc3339, parse_time

log = logging.getLogger("jupyter_sandbox.operator")


RECONCILE_TOTAL = Counter(
    "jupyter_sandbox_operator_reconcile_total",
    "Reconciles by controller and result",
    ["controller", "result"],
)
RECONCILE_SECONDS = Histogram(
    "jupyter_sandbox_operator_reconcile_duration_seconds",
    "Reconcile duration",
    ["controller"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
QUEUE_DEPTH = Gauge("jupyter_sandbox_operator_workqueue_depth", "Keys waiting", ["controller"])
QUEUE_RETRIES = Counter(
    "jupyter_sandbox_operator_workqueue_retries_total", "Rate-limited requeues", ["controller"]
)
IS_LEADER = Gauge("jupyter_sandbox_operator_leader", "1 while this replica holds the Lease")


# --------------------------------------------------------------------------- work queue


class WorkQueue:
    """De-duplicating keyed queue with delayed adds and per-key exponential backoff."""

    def __init__(self, name: str, base_delay: float = 0.05, max_delay: float = 60.0) -> None:
        self.name = name
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self.base_delay = base_delay
        self.max_delay = max_delay

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)
        QUEUE_DEPTH.labels(self.name).set(len(self._dirty))

    def add_after(self, key: Key, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        t = self._timers.get(key)
        if t is not None and not t.cancelled():
            if t.when() <= due:
                return  # an earlier wake-up is already scheduled
            t.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_at(due, fire)

    def add_rate_limited(self, key: Key) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(self.base_delay * (2**n), self.max_delay) * (0.8 + 0.4 * random.random())
        QUEUE_RETRIES.labels(self.name).inc()
        self.add_after(key, delay)
        return delay

    def forget(self, key: Key) -> None:
        self._failures.pop(key, None)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        QUEUE_DEPTH.labels(self.name).set(len(self._dirty))
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)


# --------------------------------------------------------------------------- controller


@dataclass
class Result:
    requeue_after: float | None = None


class Controller:
    """Runs ``reconcile(key)`` on N workers fed by a WorkQueue."""

    def __init__(
        self, name: str, reconcile: Callable[[Key], Awaitable[Result | None]], workers: int = 4
    ) -> None:
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.queue = WorkQueue(name)
        self.logger = logging.getLogger(f"jupyter_sandbox.operator.{name}")

    def enqueue(self, key: Key) -> None:
        self.queue.add(key)

    async def run(self, stop: asyncio.Event) -> None:
        tasks = [asyncio.create_task(self._worker(stop)) for _ in range(self.workers)]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _worker(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            key = await self.queue.get()
            t0 = time.perf_counter()
            try:
                res = await self.reconcile(key)
                self.queue.forget(key)
                RECONCILE_TOTAL.labels(self.name, "success").inc()
                if res is not None and res.requeue_after is not None:
                    self.queue.add_after(key, res.requeue_after)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                delay = self.queue.add_rate_limited(key)
                RECONCILE_TOTAL.labels(self.name, "error").inc()
                level = logging.INFO if isinstance(e, ApiError) and e.conflict else logging.WARNING
                self.logger.log(
                    level,
                    "reconcile failed, requeued",
                    extra={
                        "key": f"{key[0]}/{key[1]}",
                        "error": str(e),
                        "retry_in": round(delay, 3),
                    },
                    exc_info=not isinstance(e, ApiError),
                )
            finally:
                RECONCILE_SECONDS.labels(self.name).observe(time.perf_counter() - t0)
                self.queue.done(key)


# --------------------------------------------------------------------------- leader election


@dataclass
class LeaderElector:
    """coordination.k8s.io/v1 Lease lock, client-go semantics.

    Acquire when the Lease is free or expired (resourceVersion-conditioned
    update, so two candidates cannot both win); renew every ``retry_period``;
    if renewal has not succeeded for ``renew_deadline``, give up leadership
    (``on_lost`` is called; the operator exits so a fresh process restarts
    cleanly).  On graceful shutdown the Lease is released.
    """

    client: Client
    namespace: str
    name: str
    identity: str = field(default_factory=lambda: f"{uuid.uuid4().hex[:8]}")
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def _spec(self, acquire_time: str | None, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire_time or micro_now(),
            "renewTime": micro_now(),
            "leaseTransitions": transitions,
        }

    async def _try(self) -> bool:
        try:
            lease = await self.client.get(LEASE, self.namespace, self.name)
        except ApiError as e:
            if not e.not_found:
                raise
            body = {
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None, 0),
            }
            try:
                await self.client.create(LEASE, self.namespace, body)
                return True
            except ApiError as e2:
                if e2.conflict:
                    return False
                raise
        spec = lease.get("spec", {})
        holder = spec.get("holderIdentity")
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            lease["spec"] = self._spec(spec.get("acquireTime"), transitions)
        else:
            renew = parse_time(spec.get("renewTime"))
            dur = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if holder and renew is not None and renew + dur > time.time():
                return False
            lease["spec"] = self._spec(None, transitions + 1)
        try:
            await self.client.replace(LEASE, lease)
            return True
        except ApiError as e:
            if e.conflict:
                return False
            raise

    async def acquire(self, stop: asyncio.Event) -> bool:
        log.info(
            "waiting for leadership",
            extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity},
        )
        while not stop.is_set():
            try:
                if await self._try():
                    IS_LEADER.set(1)
                    log.info("became leader", extra={"identity": self.identity})
                    return True
            except Exception as e:
                log.warning("leader election attempt failed", extra={"error": str(e)})
            if await sleep_or_stop(stop, self.retry_period * (0.9 + 0.2 * random.random())):
                return False
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until ``stop``; returns (without raising) when leadership is lost."""
        last_ok = time.monotonic()
        while not stop.is_set():
            if await sleep_or_stop(stop, self.retry_period):
                break
            try:
                if await self._try():
                    last_ok = time.monotonic()
                    continue
                log.error("leadership lost to another replica", extra={"identity": self.identity})
                IS_LEADER.set(0)
                return
            except Exception as e:
                log.warning("lease renewal failed", extra={"error": str(e)})
            if time.monotonic() - last_ok > self.renew_deadline:
                log.error("lease renewal deadline exceeded", extra={"identity": self.identity})
                IS_LEADER.set(0)
                return

    async def release(self) -> None:
        try:
            lease = await self.client.get(LEASE, self.namespace, self.name)
            if lease.get("spec", {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = None
            lease["spec"]["leaseDurationSeconds"] = 1
            lease["spec"]["renewTime"] = micro_now()
            await self.client.replace(LEASE, lease)
            IS_LEADER.set(0)
        except Exception as e:  # best effort
            log.info("lease release failed", extra={"error": str(e)})


# --------------------------------------------------------------------------- events


class EventRecorder:
    """core/v1 Events, de-duplicated in memory per (object uid, reason, message).

    Like client-go's recorder, ``record`` does not wait for the API: the write
    runs in the background (at most ``concurrency`` at once), so a reconcile is
    never slowed by its events.  Events are best effort; ``drain`` waits for
    the writes in flight (shutdown, tests)."""

    def __init__(
        self, client: Client, component: str = "jupyter-sandbox-operator", concurrency: int = 8
    ) -> None:
        self.client = client
        self.component = component
        self._seen: dict[tuple[str, str, str], tuple[str, int]] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._inflight: set[asyncio.Task[None]] = set()

    async def record(self, obj: dict, etype: str, reason: str, message: str) -> None:
        md = obj["metadata"]
        ns = md.get("namespace") or "default"
        k = (md.get("uid", ""), reason, message)
        ts = now_rfc3339()
        prev = self._seen.get(k)
        if prev:
            name, count = prev
            self._seen[k] = (name, count + 1)
            write = self.client.patch(EVENT, ns, name, {"count": count + 1, "lastTimestamp": ts})
        else:
            name = f"{md['name']}.{uuid.uuid4().hex[:12]}"
            if len(self._seen) >= 10000:
                self._seen.clear()
            self._seen[k] = (name, 1)
            write = self.client.create(
                EVENT,
                ns,
                {
                    "metadata": {"name": name, "namespace": ns},
                    "involvedObject": {
                        "apiVersion": obj.get("apiVersion"),
                        "kind": obj.get("kind"),
                        "name": md["name"],
                        "namespace": ns,
                        "uid": md.get("uid"),
                        "resourceVersion": md.get("resourceVersion"),
                    },
                    "reason": reason,
                    "message": message[:1024],
                    "type": etype,
                    "source": {"component": self.component},
                    "reportingComponent": self.component,
                    "reportingInstance": self.component,
                    "firstTimestamp": ts,
                    "lastTimestamp": ts,
                    "count": 1,
                },
            )
        task = asyncio.create_task(self._write(write, k, reason))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _write(self, write: Awaitable[Any], k: tuple[str, str, str], reason: str) -> None:
        async with self._slots:
            try:
                await write
            except ApiError as e:
                log.info("event not recorded", extra={"reason": reason, "error": str(e)})
                self._seen.pop(k, None)

    async def drain(self) -> None:
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)
