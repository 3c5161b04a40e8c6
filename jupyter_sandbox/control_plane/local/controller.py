"""Level-triggered reconcilers for the local daemon's pools, sandboxes and claims.

One loop compares what the store says should exist with the processes that do,
and acts on the difference; every change (an API call, a process exiting, a
sandbox becoming ready) just wakes the loop. Doing the whole comparison on each
pass keeps the daemon correct after a crash or a missed event.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from ...runtime.kernel_state import named
from ...runtime.paths import project_key
from ..base import (
    LABEL_SAVE_STATE,
    ClaimNotFound,
    ClaimRequest,
    ClaimTimeout,
    FilesNotBindable,
    InvalidRequest,
    Phase,
    PoolNotFound,
    kernel_busy_error,
    state_not_saved_error,
)
from ..runtime_client import busy_answer
from .cgroups import CgroupError, CgroupLimits, SandboxCgroup
from .disk_images import IMAGES_SUBDIR, AttachedImage, DiskImages, describe
from .disk_usage import Usage, measure
from .isolation import POOLS_SUBDIR, PROJECTS_SUBDIR, Isolation, UnsafeMount, check_files_dir
from .liveness import PERIOD_SECONDS as LIVENESS_PERIOD
from .liveness import LivenessProbe
from .model import (
    DEFAULT_DISK_MB,
    FILES_NONE,
    FILES_READ_ONLY,
    NAMESPACE,
    Claim,
    PoolSpec,
    Sandbox,
    Store,
    check_labels,
    check_name,
    random_suffix,
)
from .network import NetworkSetupError
from .packages import (
    FAILED,
    READY,
    InstallFailed,
    PipForwarding,
    PoolEnvironment,
    install,
    requirements_hash,
)
from .paths import listen_socket, private_dir, runtime_dir
from .process import LaunchSpec, Limits, SandboxProcess, bound_directory_refusal
from .runtime_calls import RuntimeCalls

log = logging.getLogger(__name__)

RESYNC_SECONDS = 2.0
READY_TIMEOUT = 120.0
MAX_QUICK_RESTARTS = 5


class LocalController:
    def __init__(
        self,
        base: Path,
        isolation: Isolation,
        *,
        orphan_grace: float = 30.0,
        disk_check_seconds: float = 30.0,
        max_claims: int = 200,
        cgroups: CgroupLimits | None = None,
        limits: str = "",
        pip: PipForwarding | None = None,
        disk_images: DiskImages | None = None,
    ) -> None:
        self.base = base
        self.isolation = isolation
        self.orphan_grace = orphan_grace
        self.disk_check_seconds = disk_check_seconds
        self.disk: dict[str, Usage] = {}  # claimed sandboxes' workspaces, last measured
        self.max_claims = max_claims
        self.store = Store(base / "state.json")
        self.processes: dict[str, SandboxProcess] = {}
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._dirty = False
        self._orphan_since: dict[str, float] = {}
        self._failures: dict[str, list[float]] = {}
        self._deleting: set[asyncio.Task[None]] = set()
        self.listeners: set[Callable[[str, dict[str, Any]], None]] = set()
        self.runtime_calls = RuntimeCalls()
        self.liveness = LivenessProbe(self.runtime_calls)
        self._suspending: dict[str, asyncio.Task[None]] = {}
        self._presaved: set[str] = set()  # sandboxes whose state suspend_claim saved
        self.cgroups = cgroups or CgroupLimits()
        self.limits = limits  # how resource limits are enforced, in words
        self.pip = pip or PipForwarding()  # what of the host's pip settings sandboxes get
        self.pool_envs: dict[str, PoolEnvironment] = {}  # pools with requirements
        self.disk_images = disk_images  # a root daemon's: workspaces of enforced size
        # Several daemons (users' state directories) may share one cgroup parent.
        self._cgroup_prefix = hashlib.sha256(str(base).encode()).hexdigest()[:8] + "-"
        for sub in ("workspaces", "run", "sockets", "logs", POOLS_SUBDIR, PROJECTS_SUBDIR):
            private_dir(base / sub)

    # -- start-up --------------------------------------------------------

    def load(self, default_pools: list[PoolSpec]) -> None:
        self.store.load()
        for pool in default_pools:
            self.store.pools.setdefault(pool.name, pool)
        for sandbox in list(self.store.sandboxes.values()):
            _reap_stale_process(sandbox.pid)
            sandbox.pid = None
            sandbox.ready = False
            if sandbox.owner.startswith("pool/"):
                # Nobody has claimed it: start it again from nothing, so whatever
                # was planted in it before cannot reach the next claimant.
                self._wipe(sandbox)
                del self.store.sandboxes[sandbox.name]
        self._dirty = True

    def _wipe(self, sandbox: Sandbox, *, keep_workspace: bool = False) -> None:
        shutil.rmtree(sandbox.runtime_dir, ignore_errors=True)
        listen_socket(self.base, sandbox.name).unlink(missing_ok=True)
        Path(self._log_path(sandbox.name)).unlink(missing_ok=True)
        if keep_workspace:  # (an image keeps its files for the next start)
            return
        if sandbox.disk_image and self.disk_images is not None:
            self.disk_images.remove(sandbox.name, Path(sandbox.workspace))
        else:
            shutil.rmtree(sandbox.workspace, ignore_errors=True)

    # -- API used by the HTTP handlers ------------------------------------

    def apply_pool(self, spec: PoolSpec) -> PoolSpec:
        self.store.pools[spec.name] = spec
        env = self.pool_envs.get(spec.name)
        if env is not None and env.phase == FAILED:
            self.pool_envs.pop(spec.name)  # applying it again tries the install again
        self._touch("pool", spec.name)
        return spec

    def delete_pool(self, name: str) -> None:
        if self.store.pools.pop(name, None) is None:
            raise PoolNotFound(f"pool {name!r} does not exist")
        self._drop_environment(name)
        self._touch("pool", name)

    def create_claim(self, request: ClaimRequest) -> Claim:
        check_name("pool", request.pool)
        if request.pool not in self.store.pools:
            raise PoolNotFound(
                f"pool {request.pool!r} does not exist",
                hint=f"create it with: jupyter-sandbox pool create {request.pool}",
            )
        labels = check_labels(request.labels)
        env = check_labels_env(request.env)
        if len(self.store.claims) >= self.max_claims:
            raise InvalidRequest(f"at most {self.max_claims} claims may exist at once")
        name = request.name or f"{request.pool}-claim-{random_suffix(6)}"
        check_name("claim", name)
        if name in self.store.claims:
            raise InvalidRequest(f"claim {name!r} already exists")
        owner_start = None
        grace = request.orphan_grace
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 86400
        ):
            raise InvalidRequest("orphan_grace must be a number of seconds from 0 to 86400")
        if request.owner_pid is not None:
            if not isinstance(request.owner_pid, int) or request.owner_pid <= 0:
                raise InvalidRequest("owner_pid must be a positive integer")
            owner_start = _start_time(request.owner_pid)
            if owner_start is None:
                raise InvalidRequest(f"owner process {request.owner_pid} is not running")
        files_dir = ""
        pool = self.store.pools[request.pool]
        if request.files_dir is not None and pool.files != FILES_NONE:
            try:
                files_dir = self._bindable_files_dir(
                    request.files_dir, read_only=pool.files == FILES_READ_ONLY
                )
            except InvalidRequest as exc:
                if not request.files_optional:
                    raise
                log.info("claim %s works in /workspace: %s", name, exc)
        claim = Claim(
            name=name,
            pool=request.pool,
            labels=labels,
            env=env,
            files_dir=files_dir,
            owner_pid=request.owner_pid,
            owner_start=owner_start,
            orphan_grace=request.orphan_grace,
        )
        self.store.claims[name] = claim
        # Adopt right away when a warm sandbox is ready: the claim answers Ready at once.
        self._reconcile_claim(claim)
        self._touch("claim", name)
        return claim

    def _bindable_files_dir(self, path: object, read_only: bool = False) -> str:
        """The notebook directory a sandbox may be given, resolved; InvalidRequest
        when it may not.  A root daemon shows it through an idmapped mount: on a
        filesystem without them (NFS, FUSE, ramfs) FilesNotBindable, with which the
        provisioner copies the files instead; the same where a writable bound
        directory could not be kept to data (no Landlock, no write guard)."""
        try:
            files_dir = check_files_dir(path, self.base)
        except UnsafeMount as exc:
            raise InvalidRequest(str(exc)) from None
        refusal = bound_directory_refusal() if self.isolation.confined and not read_only else None
        if refusal:
            raise FilesNotBindable(
                f"a sandbox cannot write in {files_dir} bound from the host: {refusal}",
                hint="its files are copied in and back instead (kernelspec files 'copy'); "
                "a pool created with --files ro binds it read-only",
            )
        host = self.isolation.host if self.isolation.isolated else None
        why = host.idmap_refusal(files_dir) if host is not None else None
        if why:
            raise FilesNotBindable(
                f"a sandbox cannot work in {files_dir}: its filesystem has no idmapped "
                f"mounts ({why}), which a root daemon's sandbox needs to write there as "
                "its own uid",
                hint="use the kernelspec's files option 'copy', or keep the notebooks on "
                "a local filesystem (ext4, xfs, btrfs, tmpfs)",
            )
        return files_dir

    def get_claim(self, name: str) -> Claim:
        claim = self.store.claims.get(name)
        if claim is None:
            raise ClaimNotFound(f"claim {name!r} does not exist")
        return claim

    def set_suspended(self, name: str, suspended: bool) -> Claim:
        claim = self.get_claim(name)
        if claim.suspended != suspended:
            claim.suspended = suspended
            self._reconcile_claim(claim)
            self._touch("claim", name)
        return claim

    async def suspend_claim(self, name: str, *, force: bool = False) -> Claim:
        """Suspend a claim's sandbox, saving its kernel's variables first.

        Unless ``force``: a busy kernel is refused (KernelBusy), and a save that
        fails (too slow, the kernel gone wrong) refuses the suspend with the
        reason (StateNotSaved) and leaves the sandbox running.
        """
        claim = self.get_claim(name)
        if claim.suspended:
            return claim
        sandbox = self.store.sandboxes.get(claim.sandbox or "")
        proc = self.processes.get(claim.sandbox or "")
        if sandbox is not None and proc is not None and sandbox.ready and not force:
            if await self.kernel_busy(name):
                raise kernel_busy_error(name)
            pool = self.store.pools.get(sandbox.pool) or PoolSpec(name=sandbox.pool)
            if self._saves_state(pool, claim):
                saved, text = await self._save_state(proc, pool)
                if not saved:
                    raise state_not_saved_error(name, text)
                sandbox.saved_state = text
                self._presaved.add(sandbox.name)
        return self.set_suspended(name, True)

    @staticmethod
    def _saves_state(pool: PoolSpec, claim: Claim | None) -> bool:
        return pool.save_state and not (claim and claim.labels.get(LABEL_SAVE_STATE) == "false")

    async def kernel_busy(self, name: str) -> bool:
        """Whether the claim's kernel is running a cell now (False if it cannot say)."""
        claim = self.get_claim(name)
        sandbox = self.store.sandboxes.get(claim.sandbox or "")
        proc = self.processes.get(claim.sandbox or "")
        if claim.suspended or sandbox is None or not sandbox.ready or proc is None:
            return False
        status, body = await self.runtime_calls.call(proc.socket, "GET", "/api/kernel", timeout=10)
        return status == 200 and busy_answer(body)

    def delete_claim(self, name: str) -> bool:
        claim = self.store.claims.pop(name, None)
        if claim is None:
            return False
        if claim.sandbox:
            self._delete_sandbox(claim.sandbox)
        self._touch("claim", name, deleted=True)
        return True

    async def wait_for_claim(self, name: str, phases: set[Phase], timeout: float) -> Claim:
        deadline = time.monotonic() + timeout
        async with self._changed:
            while True:
                claim = self.get_claim(name)
                if claim.phase in phases or claim.phase == Phase.FAILED:
                    return claim
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ClaimTimeout(
                        f"claim {name!r} is still {claim.phase} after {timeout:g}s",
                        hint="the pool may be starting; raise the timeout or the pool's replicas",
                    )
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    pass

    # -- views -----------------------------------------------------------

    def claim_view(self, claim: Claim) -> dict[str, Any]:
        sandbox = self.store.sandboxes.get(claim.sandbox or "")
        pool = self.store.pools.get(claim.pool)
        proc = self.processes.get(claim.sandbox or "")
        return {
            "name": claim.name,
            "namespace": NAMESPACE,
            "pool": claim.pool,
            "phase": str(claim.phase),
            "sandbox": claim.sandbox,
            "warm": claim.warm,
            "isolation": self.isolation.kind,
            "isolation_detail": self.isolation.detail,
            "workspace": sandbox.workspace if sandbox else None,
            "labels": claim.labels,
            "created": claim.created,
            "ready_at": claim.ready_at,
            "message": claim.message,
            "resources": {
                "pid": proc.pid if proc else None,
                "network": pool.network if pool else None,
                # what applies, the default included (cgroup or RLIMIT_DATA), not the setting
                "memory_mb": _megabytes(pool.cgroup_memory_bytes()) if pool else None,
                "cpu_seconds": pool.cpu_seconds if pool else None,
                "restarts": sandbox.restarts if sandbox else 0,
                "owner_pid": claim.owner_pid,
                "files_dir": claim.files_dir or None,
                "files_read_only": bool(sandbox and sandbox.files_read_only),
                "packages_dir": sandbox.packages_dir or None if sandbox else None,
                "disk": self.disk_view(sandbox, pool),
            },
        }

    def pool_view(self, pool: PoolSpec) -> dict[str, Any]:
        owned = [s for s in self.store.sandboxes.values() if s.owner == f"pool/{pool.name}"]
        ready = sum(1 for s in owned if s.ready)
        claimed = sum(1 for c in self.store.claims.values() if c.pool == pool.name)
        return {
            "name": pool.name,
            "namespace": NAMESPACE,
            "replicas": pool.replicas,
            "ready": ready,
            "starting": len(owned) - ready,
            "claimed": claimed,
            "isolation": self.isolation.kind,
            "limits": self.limits,
            "display_name": pool.display_name or f"Python 3 (sandbox: {pool.name})",
            "message": self._environment_message(pool) or self._failing(owned),
            "settings": pool_settings(pool),
        }

    def _environment_message(self, pool: PoolSpec) -> str:
        env = self.pool_envs.get(pool.name)
        if not pool.requirements or env is None or env.phase == READY:
            return ""
        return env.message

    def _failing(self, sandboxes: list[Sandbox]) -> str:
        """Why a pool does not fill: the last log line of a member that keeps exiting."""
        for sandbox in sandboxes:
            if not sandbox.ready and len(self._failures.get(sandbox.name, ())) >= 2:
                path = self._log_path(sandbox.name)
                return f"sandboxes keep exiting: {last_line(path)} (log: {path})"
        return ""

    # -- the loop ----------------------------------------------------------

    def _touch(self, kind: str, name: str, *, deleted: bool = False) -> None:
        self._dirty = True
        self._wake.set()
        for listener in list(self.listeners):
            try:
                listener(kind, {"name": name, "deleted": deleted})
            except Exception:
                log.exception("listener failed")

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("reconcile pass failed; retrying")
            try:
                await asyncio.wait_for(self._wake.wait(), RESYNC_SECONDS)
            except TimeoutError:
                pass
            self._wake.clear()

    async def probe_liveness(self) -> None:
        """Restart runtimes that stopped answering (see liveness.py); runs beside ``run``."""
        while True:
            await asyncio.sleep(LIVENESS_PERIOD)
            ready = [
                (name, proc)
                for name, proc in self.processes.items()
                if (sandbox := self.store.sandboxes.get(name)) is not None and sandbox.ready
            ]
            results = await asyncio.gather(
                *(self.liveness.failed(name, proc.socket) for name, proc in ready),
                return_exceptions=True,
            )
            for (name, proc), failed in zip(ready, results, strict=True):
                if failed is True and self.processes.get(name) is proc:
                    log.warning("sandbox %s stopped answering its liveness probe; restarting", name)
                    await proc.stop(grace=0)

    async def watch_disk(self) -> None:
        """Measure claimed workspaces against their pool's ``disk_mb``; runs beside ``run``.

        A workspace over its limit marks its claim (the message says so, and what
        to do; ``resources.disk`` carries the figures), which JupyterLab shows.
        """
        while True:
            await asyncio.sleep(self.disk_check_seconds)
            for sandbox in list(self.store.sandboxes.values()):
                if not sandbox.owner.startswith("claim/") or sandbox.name not in self.processes:
                    continue  # the pool's spares hold nothing; a stopped one cannot grow
                try:
                    usage = await asyncio.to_thread(self._measure, sandbox)
                except OSError as exc:
                    # It stopped while measured (its /proc went): the next round sees.
                    # Letting this through ended the watch for every sandbox.
                    log.info("sandbox %s: workspace not measured: %s", sandbox.name, exc)
                    continue
                pool = self.store.pools.get(sandbox.pool) or PoolSpec(name=sandbox.pool)
                before = self.disk.get(sandbox.name)
                self.disk[sandbox.name] = usage
                over = usage.over(pool.disk_limit_bytes())
                if before is None or before.over(pool.disk_limit_bytes()) != over:
                    if over:
                        log.warning(
                            "sandbox %s: workspace over its disk limit (%s)",
                            sandbox.name,
                            _disk_words(usage, pool),
                        )
                    self._touch("sandbox", sandbox.name)

    def _measure(self, sandbox: Sandbox) -> Usage:
        proc = self.processes.get(sandbox.name)
        if sandbox.disk_image and proc is not None and proc.pid is not None:
            # mounted only in the sandbox's own namespace: seen through its /proc
            return DiskImages.usage(Path(f"/proc/{proc.pid}/root{sandbox.workspace}"))
        usage = measure(sandbox.workspace)
        if sandbox.packages_dir:  # kept for the project, counted with the workspace
            kept = measure(sandbox.packages_dir)
            usage = Usage(
                usage.bytes + kept.bytes,
                usage.entries + kept.entries,
                usage.complete and kept.complete,
            )
        return usage

    def disk_view(self, sandbox: Sandbox | None, pool: PoolSpec | None) -> dict[str, Any] | None:
        if sandbox is None:
            return None
        limit = (pool or PoolSpec(name=sandbox.pool)).disk_limit_bytes()
        usage = self.disk.get(sandbox.name)
        return {
            "limit_mb": None if limit is None else limit // (1024 * 1024),
            "used_mb": None if usage is None else round(usage.bytes / (1024 * 1024), 1),
            "over": usage is not None and usage.over(limit),
            "enforced": sandbox.disk_image,
        }

    async def reconcile(self) -> None:
        self._reap_orphaned_claims()
        for claim in list(self.store.claims.values()):
            self._reconcile_claim(claim)
        for pool in list(self.store.pools.values()):
            self._reconcile_pool(pool)
        self._reconcile_pool_orphans()
        await self._collect_environments()
        for sandbox in list(self.store.sandboxes.values()):
            await self._reconcile_sandbox(sandbox)
        for claim in list(self.store.claims.values()):
            self._reconcile_claim(claim)
        if self._dirty:
            self._dirty = False
            self.store.save()
        async with self._changed:
            self._changed.notify_all()

    def _reconcile_claim(self, claim: Claim) -> None:
        before = (claim.phase, claim.sandbox, claim.message)
        if claim.sandbox is None:
            self._bind_claim(claim)
        sandbox = self.store.sandboxes.get(claim.sandbox or "")
        if sandbox is None:
            if claim.sandbox is not None:
                claim.phase, claim.message = Phase.FAILED, "its sandbox was deleted"
        else:
            sandbox.running = not claim.suspended
            proc = self.processes.get(sandbox.name)
            if claim.suspended:
                claim.phase = Phase.SUSPENDED if proc is None else Phase.SUSPENDING
                claim.message = (
                    "; ".join(
                        filter(None, ["workspace kept, compute released", sandbox.saved_state])
                    )
                    if proc is None
                    else "saving the kernel's variables"
                    if sandbox.name in self._suspending and not sandbox.saved_state
                    else ""
                )
            elif sandbox.ready:
                if claim.phase != Phase.READY:
                    claim.ready_at = time.time()
                claim.phase, claim.message = Phase.READY, self._disk_message(sandbox)
            elif self._gave_up(sandbox.name):
                # Only after repeated failures: one start that dies (say, on a
                # machine too busy for the kernel) is retried, not fatal.
                claim.phase = Phase.FAILED
                claim.message = "the sandbox keeps exiting; see " + self._log_path(sandbox.name)
            elif claim.phase in (Phase.SUSPENDED, Phase.SUSPENDING, Phase.RESUMING):
                claim.phase, claim.message = Phase.RESUMING, "starting the sandbox again"
            elif claim.phase == Phase.READY:
                claim.phase, claim.message = Phase.PENDING, "sandbox restarting"
            else:
                claim.phase = Phase.PENDING
        if (claim.phase, claim.sandbox, claim.message) != before:
            self._touch("claim", claim.name)

    def _disk_message(self, sandbox: Sandbox) -> str:
        usage = self.disk.get(sandbox.name)
        pool = self.store.pools.get(sandbox.pool) or PoolSpec(name=sandbox.pool)
        if usage is None or not usage.over(pool.disk_limit_bytes()):
            return ""
        if usage.full:
            return (
                f"the workspace is full ({_disk_words(usage, pool)}, enforced): writes "
                "fail; delete files in /workspace, or ask for a pool with a larger disk_mb"
            )
        return (
            f"the workspace is over its disk limit ({_disk_words(usage, pool)}): "
            "delete files in /workspace, or ask for a pool with a larger disk_mb"
        )

    def _bind_claim(self, claim: Claim) -> None:
        pool = self.store.pools.get(claim.pool)
        if pool is None:
            claim.phase, claim.message = Phase.FAILED, f"pool {claim.pool!r} was deleted"
            return
        env = self._ensure_environment(pool)
        if env is not None and env.phase != READY:
            # Nothing installs at claim time: wait for the pool's install, or fail with it.
            claim.phase = Phase.FAILED if env.phase == FAILED else Phase.PENDING
            claim.message = env.message
            return
        # A sandbox's environment and mounts are fixed when it starts: a claim that
        # brings its own gets a sandbox started for it.
        candidates = (
            []
            if claim.env or claim.files_dir
            else [s for s in self.store.sandboxes.values() if s.owner == f"pool/{pool.name}"]
        )
        ready = [s for s in candidates if s.ready]
        pick = min(ready or candidates, key=lambda s: s.created, default=None)
        if pick is not None:
            pick.owner = f"claim/{claim.name}"
            claim.sandbox = pick.name
            claim.warm = pick.ready
            claim.message = "claimed a warm sandbox" if pick.ready else "waiting for the pool"
        else:
            sandbox = self._new_sandbox(
                pool, owner=f"claim/{claim.name}", env=claim.env, files_dir=claim.files_dir
            )
            claim.sandbox = sandbox.name
            claim.warm = False
            claim.message = "cold start: no warm sandbox in the pool"
        log.info("claim %s bound to %s (warm=%s)", claim.name, claim.sandbox, claim.warm)

    def _reconcile_pool(self, pool: PoolSpec) -> None:
        env = self._ensure_environment(pool)
        current = str(env.path) if env is not None and env.phase == READY else ""
        owned = []
        for sandbox in self.store.sandboxes.values():
            if sandbox.owner != f"pool/{pool.name}":
                continue
            if sandbox.pool_packages != current:  # started with other requirements
                self._delete_sandbox(sandbox.name)
            else:
                owned.append(sandbox)
        if env is not None and env.phase != READY:
            return  # no warm sandbox before the pool's packages are installed
        owned.sort(key=lambda s: (s.ready, -s.created))
        for _ in range(pool.replicas - len(owned)):
            self._new_sandbox(pool, owner=f"pool/{pool.name}")
        for extra in owned[: max(0, len(owned) - pool.replicas)]:
            self._delete_sandbox(extra.name)

    def _reconcile_pool_orphans(self) -> None:
        for sandbox in list(self.store.sandboxes.values()):
            kind, _, owner = sandbox.owner.partition("/")
            if (kind == "pool" and owner not in self.store.pools) or (
                kind == "claim" and owner not in self.store.claims
            ):
                self._delete_sandbox(sandbox.name)

    async def _reconcile_sandbox(self, sandbox: Sandbox) -> None:
        proc = self.processes.get(sandbox.name)
        if sandbox.running and proc is None:
            if self._crash_looping(sandbox.name):
                return
            await self._start(sandbox)
        elif not sandbox.running and proc is not None and sandbox.name not in self._suspending:
            # Saving the kernel's variables may take a while: not in the loop's way.
            task = asyncio.create_task(self._suspend(sandbox, proc))
            self._suspending[sandbox.name] = task
            task.add_done_callback(lambda _: self._suspending.pop(sandbox.name, None))

    async def _suspend(self, sandbox: Sandbox, proc: SandboxProcess) -> None:
        """Save the kernel's variables into the workspace (if wanted), then stop."""
        was_ready, sandbox.ready = sandbox.ready, False
        pool = self.store.pools.get(sandbox.pool) or PoolSpec(name=sandbox.pool)
        claim = self.store.claims.get(sandbox.owner.partition("/")[2])
        if sandbox.name in self._presaved:  # by suspend_claim, which waited for it
            self._presaved.discard(sandbox.name)
        elif was_ready and self._saves_state(pool, claim):
            sandbox.saved_state = ""
            sandbox.saved_state = (await self._save_state(proc, pool))[1]
        else:
            sandbox.saved_state = "kernel state not saved (turned off)"
        self._touch("sandbox", sandbox.name)
        await proc.stop()

    async def _save_state(self, proc: SandboxProcess, pool: PoolSpec) -> tuple[bool, str]:
        """(nothing lost, what happened in words): False only when there were
        variables and they could not be saved (too slow, or the save failed)."""
        status, body = await self.runtime_calls.call(
            proc.socket,
            "POST",
            "/api/kernel/state",
            body={"max_bytes": pool.state_max_mb * 1024 * 1024, "timeout": pool.state_timeout},
            timeout=pool.state_timeout + 5,
        )
        if status != 200 or not isinstance(body, dict):
            reason = body.get("message") if isinstance(body, dict) else "no answer in time"
            log.warning("sandbox %s: kernel state not saved: %s", proc.spec.name, reason)
            # 409: no kernel runs, so there is nothing to lose
            return status == 409, f"kernel state not saved: {reason}"
        saved, skipped = body.get("saved") or [], body.get("skipped") or {}
        text = f"kernel state saved: {len(saved)} variables, {body.get('bytes', 0)} bytes"
        if skipped:
            text += "; not saved: " + named(skipped)
        log.info("sandbox %s: %s in %ss", proc.spec.name, text, body.get("seconds"))
        return True, text

    # -- sandbox lifecycle -----------------------------------------------

    def _new_sandbox(
        self,
        pool: PoolSpec,
        *,
        owner: str,
        env: dict[str, str] | None = None,
        files_dir: str = "",
    ) -> Sandbox:
        name = f"{pool.name}-{random_suffix()}"
        while name in self.store.sandboxes:
            name = f"{pool.name}-{random_suffix()}"
        sandbox = Sandbox(
            disk_image=self.disk_images is not None
            and pool.disk_limit_bytes() is not None
            and not pool.keep_workspace,
            name=name,
            pool=pool.name,
            owner=owner,
            env=dict(env or {}),
            workspace=str(self.base / "workspaces" / name),
            runtime_dir=str(runtime_dir(self.base, name)),
            files_dir=files_dir,
            files_read_only=bool(files_dir) and pool.files == FILES_READ_ONLY,
            packages_dir=self._project_packages(files_dir) if files_dir else "",
        )
        packages = self.pool_envs.get(pool.name)
        if pool.requirements and packages is not None and packages.phase == READY:
            sandbox.pool_packages = str(packages.path)
        self.store.sandboxes[name] = sandbox
        self._touch("sandbox", name)
        return sandbox

    def _project_packages(self, files_dir: str) -> str:
        """Where a notebook project's %pip packages are kept, across its kernels
        (bubblewrap binds them over the workspace's; without it they stay there).
        A file beside says which project it is, for whoever looks."""
        if not self.isolation.isolated:
            return ""
        key = project_key(files_dir)
        projects = self.base / PROJECTS_SUBDIR
        (projects / f"{key}.project").write_text(files_dir + "\n")
        return str(projects / key)

    def _log_path(self, name: str) -> str:
        return str(self.base / "logs" / f"{name}.log")

    async def _start(self, sandbox: Sandbox) -> None:
        pool = self.store.pools.get(sandbox.pool) or PoolSpec(name=sandbox.pool)
        spec = LaunchSpec(
            name=sandbox.name,
            workspace=Path(sandbox.workspace),
            runtime_dir=Path(sandbox.runtime_dir),
            listen_socket=listen_socket(self.base, sandbox.name),
            state_dir=self.base,
            log_file=Path(self._log_path(sandbox.name)),
            kernel_name=pool.kernel_name,
            network=pool.network,
            env={**(self.pip.env if pool.pip_config else {}), **pool.env, **sandbox.env},
            limits=Limits(cpu_seconds=pool.cpu_seconds),
            tmp_bytes=pool.tmp_bytes(),
            cgroup=self._cgroup(sandbox.name, pool),
            files_dir=Path(sandbox.files_dir) if sandbox.files_dir else None,
            files_read_only=sandbox.files_read_only,
            packages_dir=Path(sandbox.packages_dir) if sandbox.packages_dir else None,
            pool_packages=Path(sandbox.pool_packages) if sandbox.pool_packages else None,
            ro_files=tuple(self.pip.files) if pool.pip_config else (),
        )
        if spec.cgroup is None:
            # The memory cgroup counts the sandbox's resident memory, /tmp and
            # /dev/shm included; without one, each process's private memory.
            spec.limits.memory_bytes = pool.cgroup_memory_bytes()
        processes = pool.process_limit()
        if spec.cgroup is None and processes is not None:
            # RLIMIT_NPROC counts every process and thread of the user, not the
            # sandbox's: allow this many more than the user runs now.
            host = self.isolation.host
            uid = host.host_uid if host is not None else os.getuid()
            spec.limits.max_processes = _user_tasks(uid) + processes
        proc = SandboxProcess(spec, self.isolation)
        self.processes[sandbox.name] = proc
        sandbox.ready = False
        try:
            if sandbox.disk_image:
                spec.image = await asyncio.to_thread(self._attach_image, sandbox, pool)
            if sandbox.packages_dir:
                await asyncio.to_thread(self._prepare_packages, proc, pool)
            await proc.start()
        except (OSError, NetworkSetupError, UnsafeMount, subprocess.SubprocessError) as exc:
            log.error("could not start sandbox %s: %s", sandbox.name, describe(exc))
            proc.exited()
            if spec.cgroup is not None:
                await asyncio.to_thread(spec.cgroup.remove)
            self.processes.pop(sandbox.name, None)
            self._record_failure(sandbox.name)
            sandbox.restarts += 1
            return
        sandbox.pid = proc.pid
        self._dirty = True
        proc.supervisor = asyncio.create_task(self._supervise(sandbox.name, proc))

    def _prepare_packages(self, proc: SandboxProcess, pool: PoolSpec) -> None:
        """The project's packages directory; as root an image of the pool's disk_mb
        like the workspace, so %pip cannot fill the host's disk either."""
        spec = proc.spec
        assert spec.packages_dir is not None
        images, name = self.disk_images, f"packages-{spec.packages_dir.name}"
        limit = pool.disk_limit_bytes()
        if images is None or not images.holds(name, spec.packages_dir, limit is not None):
            private_dir(spec.packages_dir)
            return
        size = limit or DEFAULT_DISK_MB * 1024 * 1024
        spec.packages_image = images.attach_shared(name, spec.packages_dir, size)
        proc.on_exit.append(lambda: images.release_shared(name))

    def _attach_image(self, sandbox: Sandbox, pool: PoolSpec) -> AttachedImage:
        if self.disk_images is None:
            raise OSError(
                f"its workspace is a disk image in {self.base / IMAGES_SUBDIR}, which only "
                "a root daemon can mount"
            )
        size = pool.disk_limit_bytes() or DEFAULT_DISK_MB * 1024 * 1024
        return self.disk_images.attach(sandbox.name, Path(sandbox.workspace), size)

    # -- a pool's packages ------------------------------------------------

    def _ensure_environment(self, pool: PoolSpec) -> PoolEnvironment | None:
        """The pool's package directory, its install started if needed (None: no requirements)."""
        if not pool.requirements:
            self._drop_environment(pool.name)
            return None
        digest = requirements_hash(pool.requirements)
        env = self.pool_envs.get(pool.name)
        if env is not None and env.digest == digest:
            return env
        self._drop_environment(pool.name)  # other requirements: stop that install
        env = PoolEnvironment(digest, self.base / POOLS_SUBDIR / pool.name / digest)
        self.pool_envs[pool.name] = env
        if env.path.is_dir():  # installed before (renamed into place only when complete)
            env.phase = READY
            return env
        env.message = f"installing the pool's packages (pip log: {self._pip_log(pool.name)})"
        env.task = asyncio.create_task(self._install(pool.name, list(pool.requirements), env))
        return env

    def _pip_log(self, pool: str) -> Path:
        return self.base / "logs" / f"pool-{pool}-pip.log"

    async def _install(self, pool: str, lines: list[str], env: PoolEnvironment) -> None:
        log.info("pool %s: installing %d requirement lines", pool, len(lines))
        started = time.monotonic()
        try:
            await install(lines, env, self._pip_log(pool))
        except InstallFailed as exc:
            env.phase = FAILED
            env.message = f"the pool's packages did not install: {exc}"
            log.error("pool %s: %s (log: %s)", pool, env.message, self._pip_log(pool))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            env.phase = FAILED
            env.message = f"the pool's packages did not install: {exc}"
            log.exception("pool %s: install failed", pool)
        else:
            env.phase, env.message = READY, ""
            log.info("pool %s: packages installed in %.1fs", pool, time.monotonic() - started)
        finally:
            env.task = None
        if self.pool_envs.get(pool) is env:
            self._touch("pool", pool)

    def _drop_environment(self, pool: str) -> None:
        env = self.pool_envs.pop(pool, None)
        if env is not None and env.task is not None:
            env.task.cancel()  # kills pip; its staging directory is removed

    async def _collect_environments(self) -> None:
        """Remove package directories no pool wants and no sandbox was started with:
        a deleted pool's, an outdated install's, a crashed daemon's leftovers."""
        root = self.base / POOLS_SUBDIR
        keep = {str(env.path) for env in self.pool_envs.values()}
        keep |= {s.pool_packages for s in self.store.sandboxes.values() if s.pool_packages}
        staging = [str(e.staging) for e in self.pool_envs.values() if e.staging is not None]
        installing = {name for name, e in self.pool_envs.items() if e.task is not None}
        try:
            pool_dirs = list(root.iterdir())
        except OSError:
            return
        for pool_dir in pool_dirs:
            if pool_dir.name in installing:
                continue  # its staging directory appears while we look
            for entry in list(pool_dir.iterdir()) if pool_dir.is_dir() else [pool_dir]:
                path = str(entry)
                if path in keep or any(path.startswith(s) for s in staging):
                    continue
                log.info("removing unused pool packages %s", entry)
                if entry.is_dir() and not entry.is_symlink():
                    await asyncio.to_thread(shutil.rmtree, entry, True)
                else:
                    entry.unlink(missing_ok=True)
            if pool_dir.is_dir() and not any(pool_dir.iterdir()):
                pool_dir.rmdir()

    def _cgroup(self, name: str, pool: PoolSpec) -> SandboxCgroup | None:
        """A cgroup with the pool's limits, where this daemon can create one."""
        if not self.cgroups.probe().enforced:
            return None
        try:
            return self.cgroups.create(
                self._cgroup_prefix + name,
                memory_bytes=pool.cgroup_memory_bytes(),
                max_pids=pool.process_limit(),
                cpu_quota_fraction=pool.cpus,
            )
        except (OSError, CgroupError) as exc:
            log.error("no cgroup for sandbox %s, rlimits only: %s", name, exc)
            return None

    def remove_stale_cgroups(self) -> None:
        """This daemon's sandbox cgroups that no process of it runs in: at start, those
        its predecessor left (it died without removing them); at shutdown, its own."""
        if not self.cgroups.probe().enforced:
            return
        for name in self.cgroups.sandboxes():
            if name.startswith(self._cgroup_prefix):
                self.cgroups.group(name).remove(timeout=1)
        self.cgroups.remove_parents()

    async def _supervise(self, name: str, proc: SandboxProcess) -> None:
        waiter = asyncio.create_task(proc.wait())
        ready = asyncio.create_task(proc.ready.wait())
        done, _ = await asyncio.wait(
            {waiter, ready}, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED
        )
        sandbox = self.store.sandboxes.get(name)
        if ready in done and sandbox is not None:
            sandbox.ready = True
            log.info("sandbox %s ready (pid %s)", name, proc.pid)
            self._touch("sandbox", name)
        elif not done:
            log.error("sandbox %s not ready after %ss; stopping it", name, READY_TIMEOUT)
            await proc.stop()
        ready.cancel()
        code = await waiter
        if self.processes.get(name) is proc:
            del self.processes[name]
        sandbox = self.store.sandboxes.get(name)
        if sandbox is not None:
            was_ready = sandbox.ready
            sandbox.ready = False
            sandbox.pid = None
            if sandbox.running:
                sandbox.restarts += 1
                if not was_ready:
                    self._record_failure(name)
                log.warning("sandbox %s exited with %s while it should run", name, code)
            self._touch("sandbox", name)

    def _record_failure(self, name: str) -> None:
        now = time.monotonic()
        recent = [t for t in self._failures.get(name, []) if now - t < 60] + [now]
        self._failures[name] = recent

    def _gave_up(self, name: str) -> bool:
        """MAX_QUICK_RESTARTS failed starts within a minute."""
        return len(self._failures.get(name, [])) >= MAX_QUICK_RESTARTS

    def _crash_looping(self, name: str) -> bool:
        """Given up, or still backing off after a failed start."""
        recent = self._failures.get(name, [])
        if not recent:
            return False
        if self._gave_up(name):
            return True
        # Back off: 0.5 s, 1 s, 2 s, ... after each failed start.
        return time.monotonic() - recent[-1] < 0.5 * 2 ** (len(recent) - 1)

    def _delete_sandbox(self, name: str) -> None:
        sandbox = self.store.sandboxes.pop(name, None)
        if sandbox is None:
            return
        self._failures.pop(name, None)
        self.disk.pop(name, None)
        self._presaved.discard(name)
        pool = self.store.pools.get(sandbox.pool)
        keep = bool(pool and pool.keep_workspace and sandbox.owner.startswith("claim/"))
        task = asyncio.create_task(self._remove(sandbox, self.processes.pop(name, None), keep))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)
        self._touch("sandbox", name, deleted=True)

    async def _remove(self, sandbox: Sandbox, proc: SandboxProcess | None, keep: bool) -> None:
        if proc is not None:
            await proc.stop()
        self._wipe(sandbox, keep_workspace=keep)
        log.info("sandbox %s deleted (workspace %s)", sandbox.name, "kept" if keep else "removed")

    async def shutdown(self) -> None:
        """Stop every process (the store keeps what should run for the next start)."""
        await asyncio.gather(*(p.stop() for p in self.processes.values()), return_exceptions=True)
        installs = [e.task for e in self.pool_envs.values() if e.task is not None]
        for task in installs:
            task.cancel()
        pending = [*self._deleting, *self._suspending.values(), *installs]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        # Unclaimed sandboxes would be wiped at the next start anyway: leave no
        # workspaces behind. Claims keep theirs, for the next daemon.
        for sandbox in list(self.store.sandboxes.values()):
            if sandbox.owner.startswith("pool/"):
                self._wipe(sandbox)
                del self.store.sandboxes[sandbox.name]
        self.runtime_calls.close()
        self.store.save()
        # Every process is gone: their cgroups go too, and the per-user parents
        # when no other daemon of the user has sandboxes in them.
        await asyncio.to_thread(self.remove_stale_cgroups)

    # -- orphans -----------------------------------------------------------

    def _reap_orphaned_claims(self) -> None:
        now = time.monotonic()
        for claim in list(self.store.claims.values()):
            if claim.owner_pid is None or _owner_alive(claim.owner_pid, claim.owner_start):
                self._orphan_since.pop(claim.name, None)
                continue
            since = self._orphan_since.setdefault(claim.name, now)
            grace = self.orphan_grace if claim.orphan_grace is None else claim.orphan_grace
            if now - since >= grace:
                log.info(
                    "releasing claim %s: its owner process %s is gone", claim.name, claim.owner_pid
                )
                self._orphan_since.pop(claim.name, None)
                self.delete_claim(claim.name)

    def adopt_owner(self, name: str, owner_pid: int) -> Claim:
        """Hand a claim to a new owner process (a restarted Jupyter server re-attaching)."""
        claim = self.get_claim(name)
        start = _start_time(owner_pid)
        if start is None:
            raise InvalidRequest(f"owner process {owner_pid} is not running")
        claim.owner_pid, claim.owner_start = owner_pid, start
        self._orphan_since.pop(name, None)
        self._touch("claim", name)
        return claim


def pool_settings(pool: PoolSpec) -> dict[str, Any]:
    """What a pool's sandboxes get, defaults applied (None: no limit)."""
    memory = pool.cgroup_memory_bytes()
    disk = pool.disk_limit_bytes()
    return {
        "memory_mb": None if memory is None else memory // (1024 * 1024),
        "max_processes": pool.process_limit(),
        "cpus": pool.cpus,
        "disk_mb": None if disk is None else disk // (1024 * 1024),
        "tmp_mb": pool.tmp_bytes() // (1024 * 1024),
        "network": pool.network,
        "files": pool.files,
        "requirements": len(pool.requirements),
    }


def _disk_words(usage: Usage, pool: PoolSpec) -> str:
    used = f"{usage.bytes / (1024 * 1024):.0f} MB"
    if not usage.complete:
        used = f"more than {usage.entries - 1} files"
    limit_mb = (pool.disk_limit_bytes() or 0) // (1024 * 1024)
    return f"{used} of {limit_mb} MB"


def _suspension_message(sandbox: Sandbox, *, stopped: bool) -> str:
    if stopped:
        return "; ".join(filter(None, ["workspace kept, compute released", sandbox.saved_state]))
    return sandbox.saved_state or "saving the kernel's variables"


def check_labels_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidRequest("env must be an object of string names to string values")
    return dict(env)


def _user_tasks(uid: int) -> int:
    """Processes and threads of host uid ``uid``, as RLIMIT_NPROC counts them."""
    count = 0
    for proc in psutil.process_iter(["uids", "num_threads"]):
        uids, threads = proc.info["uids"], proc.info["num_threads"]
        if uids is not None and uids.real == uid:
            count += threads or 1
    return count


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _owner_alive(pid: int, start: float | None) -> bool:
    current = _start_time(pid)
    if current is None:
        return False
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    return start is None or abs(current - start) < 1.0


def _reap_stale_process(pid: int | None) -> None:
    """Kill a sandbox process left by a daemon that died without stopping it."""
    if pid is None:
        return
    try:
        proc = psutil.Process(pid)
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return
    if "jupyter_sandbox.runtime" not in cmdline:
        return
    log.info("killing stale sandbox process %s", pid)
    for child in proc.children(recursive=True):
        child.kill()
    proc.kill()


def last_line(path: str, limit: int = 8192) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            lines = handle.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"


def _megabytes(size: int | None) -> int | None:
    return None if size is None else size // (1024 * 1024)
