"""One live view of the server's sandboxes, pushed to browsers as server-sent events.

The hub keeps a snapshot (sandboxed kernels, kernels still claiming a sandbox,
pools and the daemon's state) and sends it to every subscriber whenever it
changes. Sources of change:

- the local daemon's own event stream (``/api/events`` on its Unix socket):
  each pool/claim/sandbox change triggers one refresh of the pool list;
- the server's actions (suspend/resume through this API) poke the hub at once;
- kernel state held in this process (claim progress, suspended, execution
  state) is compared against the last snapshot once a second while someone is
  subscribed. That is a comparison of in-memory state, not a network call;
  nothing runs while no browser listens;
- pools on Kubernetes (when an installed kernelspec uses that backend) are
  listed every 15 seconds while someone is subscribed: the cluster does not
  tell this server when they change.

Browsers therefore never poll; they hold one stream and receive a snapshot on
connect and on each change.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from tornado import iostream

from ..control_plane.base import ClaimError, ClaimStatus
from ..control_plane.factory import get_control_plane
from ..kernel_provisioner.provisioner import SandboxProvisioner
from ..utils.background import background

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
DAEMON_RETRY_SECONDS = 5.0
POOL_DEBOUNCE_SECONDS = 0.1
FAILED_START_TTL = 120.0
KUBERNETES_REFRESH_SECONDS = 15.0
SPECS_CACHE_SECONDS = 30.0


def kernel_entry(kernel_id: str, kernel: Any, provisioner: SandboxProvisioner) -> dict[str, Any]:
    """What the API and the event stream say about one sandboxed kernel."""
    return {
        "id": kernel_id,
        "name": getattr(kernel, "kernel_name", ""),
        "execution_state": getattr(kernel, "execution_state", None),
        "backend": provisioner.backend,
        "sandbox": provisioner.describe(),
    }


def _error_entry(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, ClaimError):
        return {"reason": exc.reason, "message": exc.message, "hint": exc.hint}
    reason = getattr(exc, "reason", None) or type(exc).__name__
    message = getattr(exc, "log_message", None) or str(exc) or type(exc).__name__
    return {"reason": str(reason), "message": str(message), "hint": ""}


async def _kubernetes_pools(options: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs on the background loop, where every control-plane client lives."""
    plane = get_control_plane("kubernetes", **options)
    return [p.to_json() for p in await plane.list_pools()]


def _is_sandbox_spec(km: Any) -> bool:
    try:
        metadata = km.kernel_spec.metadata or {}
    except Exception:
        return False
    return "jupyter_sandbox" in metadata


class EventHub:
    def __init__(self, serverapp: Any) -> None:
        self.serverapp = serverapp
        self.subscribers: set[asyncio.Queue[str | None]] = set()
        self.snapshot: dict[str, Any] = {
            "kernels": [],
            "starting": [],
            "pools": [],
            "daemon": {"running": False, "message": "not contacted yet"},
        }
        self._last_json = ""
        self._starting: list[Any] = []
        self._failed: list[tuple[float, dict[str, Any]]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[None]] = set()
        self._pool_refresh: asyncio.TimerHandle | None = None
        self._local_claims: dict[str, ClaimStatus] = {}
        self._daemon_stream: iostream.IOStream | None = None
        self._local_pools: list[dict[str, Any]] = []
        self._kubernetes_pools: list[dict[str, Any]] = []
        self._k8s_backends: tuple[float, list[dict[str, Any]]] | None = None
        self._plane: Any = None
        self._closed = False
        self._track_starting_kernels()

    # -- kernels ---------------------------------------------------------------

    @property
    def kernel_manager(self) -> Any:
        return self.serverapp.kernel_manager

    def _track_starting_kernels(self) -> None:
        """Remember every KernelManager the server creates, to report claim progress.

        jupyter_client lists a kernel only once it has started; a sandbox claim
        may take a while (cold start, empty pool) and the user should see why,
        or why it failed.
        """
        mkm = self.kernel_manager
        factory = getattr(mkm, "kernel_manager_factory", None)
        if factory is None or getattr(factory, "_sandbox_tracked", False):
            return

        def tracking_factory(*args: Any, **kwargs: Any) -> Any:
            km = factory(*args, **kwargs)
            self._prune_starting()
            self._starting.append(km)
            try:
                km.ready.add_done_callback(lambda future: self._start_done(km, future))
            except Exception:  # pragma: no cover - a manager without a ready future
                pass
            return km

        tracking_factory._sandbox_tracked = True  # type: ignore[attr-defined]
        try:
            mkm.kernel_manager_factory = tracking_factory
        except Exception:  # pragma: no cover - a kernel manager without the trait
            log.debug("cannot track starting kernels", exc_info=True)

    def _start_done(self, km: Any, future: Any) -> None:
        if km in self._starting:
            self._starting.remove(km)
        exc = None if future.cancelled() else future.exception()
        provisioner = getattr(km, "provisioner", None)
        sandboxed = isinstance(provisioner, SandboxProvisioner) or _is_sandbox_spec(km)
        if exc is not None and sandboxed:
            now = time.time()
            entry = {
                "id": getattr(km, "kernel_id", None),
                "name": getattr(km, "kernel_name", ""),
                "state": "failed",
                "error": _error_entry(exc),
                "at": now,
            }
            self._failed.append((now, entry))
        if self.subscribers:
            self.refresh_kernels()

    def _prune_starting(self) -> None:
        listed = set(self.kernel_manager.list_kernel_ids())
        self._starting = [
            km
            for km in self._starting
            if getattr(km, "kernel_id", None) not in listed and not km.ready.done()
        ]
        now = time.time()
        self._failed = [(t, e) for t, e in self._failed if now - t < FAILED_START_TTL]

    def kernels(self) -> list[dict[str, Any]]:
        km = self.kernel_manager
        items = []
        for kernel_id in list(km.list_kernel_ids()):
            kernel = km.get_kernel(kernel_id)
            provisioner = getattr(kernel, "provisioner", None)
            if isinstance(provisioner, SandboxProvisioner):
                entry = kernel_entry(kernel_id, kernel, provisioner)
                fresh = self._local_claims.get(entry["sandbox"].get("claim") or "")
                if provisioner.backend == "local" and fresh is not None:
                    entry["sandbox"]["resources"] = fresh.resources
                    entry["sandbox"]["message"] = fresh.message
                items.append(entry)
        return items

    def starting(self) -> list[dict[str, Any]]:
        """Sandboxed kernels still claiming their sandbox, and recent failed starts."""
        self._prune_starting()
        items = []
        for km in self._starting:
            provisioner = getattr(km, "provisioner", None)
            if not isinstance(provisioner, SandboxProvisioner) or not km.kernel_id:
                continue
            items.append(
                {
                    "id": km.kernel_id,
                    "name": getattr(km, "kernel_name", ""),
                    "state": "starting",
                    "pool": provisioner.pool,
                    "backend": provisioner.backend,
                    "sandbox": provisioner.describe(),
                }
            )
        return items + [entry for _, entry in self._failed]

    # -- snapshot and subscribers ----------------------------------------------

    def culling(self) -> dict[str, Any]:
        """When jupyter_server culls idle kernels (a sandbox's: suspends them, with
        SandboxKernelManager), so that JupyterLab can say so before it happens."""
        km = self.kernel_manager
        return {
            "idle_timeout": int(getattr(km, "cull_idle_timeout", 0) or 0),
            "interval": int(getattr(km, "cull_interval", 0) or 0),
            "connected": bool(getattr(km, "cull_connected", False)),
            "busy": bool(getattr(km, "cull_busy", False)),
            "suspends": bool(getattr(km, "suspend_on_cull", False)),
        }

    def refresh_kernels(self) -> None:
        try:
            self.snapshot["kernels"] = self.kernels()
            self.snapshot["starting"] = self.starting()
            self.snapshot["culling"] = self.culling()
        except Exception:
            log.exception("jupyter_sandbox: could not describe kernels")
        self.publish()

    def publish(self) -> None:
        data = json.dumps(self.snapshot, sort_keys=True, default=str)
        if data == self._last_json:
            return
        self._last_json = data
        for queue in list(self.subscribers):
            offer(queue, data)

    def poke(self) -> None:
        """Something changed here (an action of this API): tell subscribers now."""
        self.refresh_kernels()
        self.schedule_pool_refresh()

    def subscribe(self) -> asyncio.Queue[str | None]:
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=100)
        self.subscribers.add(queue)
        self._ensure_running()
        self.refresh_kernels()
        offer(queue, self._last_json or json.dumps(self.snapshot, default=str))
        return queue

    def unsubscribe(self, queue: asyncio.Queue[str | None]) -> None:
        self.subscribers.discard(queue)
        if not self.subscribers and self._daemon_stream is not None:
            self._daemon_stream.close()  # nobody listens: let go of the daemon

    def _ensure_running(self) -> None:
        if self._closed:
            return
        self._tasks = [t for t in self._tasks if not t.done()]
        if not self._tasks:
            self._tasks = [
                asyncio.ensure_future(self._tick()),
                asyncio.ensure_future(self._follow_daemon()),
                asyncio.ensure_future(self._follow_kubernetes()),
            ]

    async def _tick(self) -> None:
        while self.subscribers and not self._closed:
            self.refresh_kernels()
            await asyncio.sleep(TICK_SECONDS)

    # -- pools and the local daemon ----------------------------------------------

    def _local_plane(self) -> Any:
        if self._plane is None:
            from ..control_plane.local.client import LocalControlPlane

            # Looking must not start the daemon (and its warm pools): no autostart.
            self._plane = LocalControlPlane(autostart=False)
        return self._plane

    def schedule_pool_refresh(self) -> None:
        if self._pool_refresh is not None or self._closed:
            return
        loop = asyncio.get_event_loop()

        def run() -> None:
            self._pool_refresh = None
            task = asyncio.ensure_future(self.refresh_pools())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        self._pool_refresh = loop.call_later(POOL_DEBOUNCE_SECONDS, run)

    async def refresh_pools(self) -> None:
        plane = self._local_plane()
        try:
            pools = [dict(p.to_json(), backend="local") for p in await plane.list_pools()]
        except ClaimError as exc:
            self._local_pools = []
            self.snapshot["daemon"] = {"running": False, "message": exc.message}
        except Exception as exc:
            log.debug("listing pools failed", exc_info=True)
            self._local_pools = []
            self.snapshot["daemon"] = {"running": False, "message": str(exc)}
        else:
            self._local_pools = pools
            self.snapshot["daemon"] = {"running": True, "message": ""}
            try:
                # What the daemon says of each claim now (a disk over its limit, say)
                self._local_claims = {c.name: c for c in await plane.list_claims()}
            except Exception:
                log.debug("listing claims failed", exc_info=True)
        self.snapshot["pools"] = self._local_pools + self._kubernetes_pools
        self.refresh_kernels()

    # -- pools on Kubernetes ---------------------------------------------------------

    def kubernetes_backends(self) -> list[dict[str, Any]]:
        """``backend_options`` of the installed kernelspecs that use Kubernetes (cached)."""
        now = time.monotonic()
        if self._k8s_backends is not None and now - self._k8s_backends[0] < SPECS_CACHE_SECONDS:
            return self._k8s_backends[1]
        found: dict[str, dict[str, Any]] = {}
        try:
            specs = self.serverapp.kernel_spec_manager.get_all_specs()
        except Exception:
            log.debug("cannot read kernelspecs", exc_info=True)
            specs = {}
        for info in specs.values():
            metadata = (info.get("spec") or {}).get("metadata") or {}
            if (metadata.get("jupyter_sandbox") or {}).get("backend") != "kubernetes":
                continue
            config = (metadata.get("kernel_provisioner") or {}).get("config") or {}
            options = config.get("backend_options") or {}
            found[json.dumps(options, sort_keys=True)] = options
        backends = list(found.values())
        self._k8s_backends = (now, backends)
        return backends

    async def refresh_kubernetes_pools(self) -> None:
        backends = self.kubernetes_backends()
        if not backends:
            self._kubernetes_pools = []
            self.snapshot.pop("kubernetes", None)
        else:
            pools: list[dict[str, Any]] = []
            errors: list[str] = []
            for options in backends:
                try:
                    listed = await background().run(_kubernetes_pools(options))
                except ClaimError as exc:
                    errors.append(exc.message)
                except Exception as exc:
                    log.debug("listing Kubernetes pools failed", exc_info=True)
                    errors.append(str(exc) or type(exc).__name__)
                else:
                    pools.extend(dict(p, backend="kubernetes") for p in listed)
            self._kubernetes_pools = pools
            self.snapshot["kubernetes"] = {"ok": not errors, "message": "; ".join(errors)}
        self.snapshot["pools"] = self._local_pools + self._kubernetes_pools
        self.publish()

    async def _follow_kubernetes(self) -> None:
        """The Kubernetes pools change without telling this server: look now and then."""
        while self.subscribers and not self._closed:
            await self.refresh_kubernetes_pools()
            if not self.kubernetes_backends():
                break
            await asyncio.sleep(KUBERNETES_REFRESH_SECONDS)

    async def _follow_daemon(self) -> None:
        """Hold the daemon's event stream while anyone listens; reconnect when it drops."""
        while self.subscribers and not self._closed:
            await self.refresh_pools()
            if self.snapshot["daemon"]["running"]:
                try:
                    await self._stream_daemon_events(self.schedule_pool_refresh)
                except Exception as exc:
                    log.debug("daemon event stream ended: %s", exc)
                # The stream ended: the daemon stopped or restarted.
                await self.refresh_pools()
            if not self.subscribers or self._closed:
                break
            await asyncio.sleep(DAEMON_RETRY_SECONDS)

    async def _stream_daemon_events(self, on_event: Callable[[], None]) -> None:
        """Read the daemon's server-sent events until it or this hub stops."""
        from ..control_plane.local.paths import socket_path, state_dir

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stream = iostream.IOStream(sock)
        self._daemon_stream = stream
        try:
            await asyncio.wait_for(stream.connect(str(socket_path(state_dir()))), 5)
            # HTTP/1.0: no chunked encoding; the body is the raw event stream.
            await stream.write(b"GET /api/events HTTP/1.0\r\nHost: daemon\r\n\r\n")
            head = await stream.read_until(b"\r\n\r\n", max_bytes=65536)
            if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0]:
                raise OSError(f"daemon answered {head[:60]!r}")
            while not self._closed and self.subscribers:
                block = await stream.read_until(b"\n\n", max_bytes=1 << 20)
                if any(line.startswith(b"event:") for line in block.split(b"\n")):
                    on_event()
        except iostream.StreamClosedError:
            pass
        finally:
            self._daemon_stream = None
            stream.close()

    async def close(self) -> None:
        self._closed = True
        for queue in list(self.subscribers):
            offer(queue, None)
        self.subscribers.clear()
        for task in self._tasks:
            task.cancel()
        if self._pool_refresh is not None:
            self._pool_refresh.cancel()
        if self._daemon_stream is not None:
            self._daemon_stream.close()
        if self._plane is not None:
            await self._plane.close()


def offer(queue: asyncio.Queue[str | None], item: str | None) -> None:
    """Queue ``item``; a slow subscriber only needs the newest snapshot."""
    while queue.full():
        try:
            queue.get_nowait()
        except asyncio.QueueEmpty:  # pragma: no cover
            break
    queue.put_nowait(item)
