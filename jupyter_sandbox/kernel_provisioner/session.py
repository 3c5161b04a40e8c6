"""One kernel's sandbox: its claim, its bridge and what is known of its kernel.

Everything here runs on the background loop (see utils.background); the
provisioner only forwards to it. State read by ``poll`` is cached here and
updated by events from the runtime, so polling costs no network call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ..control_plane.base import (
    ClaimError,
    ClaimNotFound,
    ClaimRequest,
    ClaimStatus,
    ControlPlane,
    Endpoint,
    Phase,
    kernel_busy_error,
)
from ..control_plane.runtime_client import RuntimeCallError, call, kernel_busy
from .bridge import Bridge, KernelIdentity
from .file_sync import FileSync, FileSyncError, SyncReport
from .runtime_files import RuntimeFileError

log = logging.getLogger(__name__)

DEAD_UNKNOWN = -1


@dataclass
class Progress:
    """What a user waiting for the kernel should be told."""

    step: str = "idle"  # claiming | waiting | ready | suspending | suspended | resuming | failed
    detail: str = ""
    warm: bool | None = None
    since: float = field(default_factory=time.time)

    def set(self, step: str, detail: str = "") -> None:
        self.step, self.detail, self.since = step, detail, time.time()


class SandboxSession:
    def __init__(
        self,
        plane: ControlPlane,
        *,
        pool: str,
        key: bytes,
        labels: dict[str, str],
        env: dict[str, str],
        owner_pid: int,
        claim_timeout: float,
        claim_name: str | None = None,
        orphan_grace: float | None = None,
        files_dir: str | None = None,
        files_optional: bool = False,
        file_sync: FileSync | None = None,
    ) -> None:
        self.plane = plane
        self.files_dir = files_dir
        self.files_optional = files_optional
        # Copies the notebook's directory in and the kernel's changes back (copy mode).
        self.file_sync = file_sync
        self._sync_lock = asyncio.Lock()
        self.pool = pool
        self.labels = labels
        self.env = env
        self.owner_pid = owner_pid
        self.claim_timeout = claim_timeout
        self.claim_name = claim_name
        self.orphan_grace = orphan_grace
        self.status: ClaimStatus | None = None
        self.endpoint: Endpoint | None = None
        self.progress = Progress()
        self.suspended = False
        self.released = False
        self.exit_code: int | None = None
        self.expected: KernelIdentity | None = None
        self.kernel: dict[str, Any] = {}
        self._kernel_changed = asyncio.Event()
        self._resuming: asyncio.Task[None] | None = None
        self._resume_waiter: asyncio.Task[None] | None = None
        self.bridge = Bridge(
            key=key,
            on_kernel_state=self._on_kernel_state,
            on_client_request=self.admit_request,
            on_disconnected=self._on_disconnected,
        )

    # -- claim ----------------------------------------------------------------

    async def start(self) -> dict[str, int]:
        """Claim a sandbox (or re-attach to ``claim_name``) and connect the bridge."""
        self.progress.set("claiming", f"claiming a sandbox from pool {self.pool!r}")
        adopting = self.claim_name is not None
        if self.claim_name is None:
            status = await self.plane.claim(
                ClaimRequest(
                    pool=self.pool,
                    labels=self.labels,
                    env=self.env,
                    owner_pid=self.owner_pid,
                    orphan_grace=self.orphan_grace,
                    files_dir=self.files_dir,
                    files_optional=self.files_optional,
                )
            )
            self.claim_name = status.name
            self.progress.warm = status.warm
            if status.phase != Phase.READY:
                self.progress.set("waiting", status.message or "waiting for the sandbox")
        else:
            # Re-attaching: take the claim over before the daemon reaps it as orphaned.
            adopted = await self.plane.adopt(self.claim_name, self.owner_pid)
            if adopted is None:
                raise ClaimNotFound(f"claim {self.claim_name} no longer exists")
            if adopted.phase in (Phase.SUSPENDED, Phase.SUSPENDING):
                await self.plane.resume(self.claim_name)
        try:
            status = await self.plane.wait_ready(self.claim_name, self.claim_timeout)
            self._set_status(status)
            await self._check_files_dir()
            await self._copy_in(adopting)
        except BaseException:
            # A claim that never became ready (or never got its files) must not leak.
            self.progress.set("failed", "the sandbox did not become ready")
            await self.release(copy_back=False)
            raise
        if status.warm is not None:
            self.progress.warm = status.warm  # Kubernetes knows only once the claim is bound
        ports = self.bridge.bind()
        assert self.endpoint is not None
        self.bridge.connect(self.endpoint)
        await self._await_kernel(lambda: self.expected is not None and self.exit_code is None)
        self.progress.set("ready", "claimed a warm sandbox" if status.warm else "cold start")
        return ports

    async def _check_files_dir(self) -> None:
        """Does the kernel work in the notebook's directory? Then nothing is copied."""
        if self.files_dir is None or self.suspended or self.plane.settles_files_dir:
            return
        assert self.endpoint is not None
        info = await call(self.endpoint, "GET", "api/kernel")
        if info.get("kernel_cwd") in (self.files_dir, os.path.realpath(self.files_dir)):
            self.file_sync = None
            return
        if not self.files_optional:
            raise ClaimError(
                f"the sandbox does not show the notebook's directory {self.files_dir}",
                hint="on Kubernetes, a pool whose template mounts the user's volume there "
                "(annotation jupyter-sandbox/user-volume-path); or the kernelspec's files "
                "option 'copy'",
            )

    async def _copy_in(self, adopting: bool) -> None:
        if self.file_sync is None or self.suspended:
            return
        assert self.endpoint is not None
        try:
            if adopting:
                await self.file_sync.adopt(self.endpoint)
                return
            self.progress.set("copying", f"copying {self.file_sync.root} into the sandbox")
            report = await self.file_sync.copy_in(self.endpoint)
        except RuntimeFileError as exc:
            raise ClaimError(
                f"copying the notebook's directory into the sandbox failed: {exc}"
            ) from None
        log.info("claim %s: %s", self.claim_name, report.summary())

    async def copy_back(self) -> SyncReport:
        """Copy what the kernel created or changed back to the notebook's directory."""
        if self.file_sync is None:
            raise FileSyncError(
                "this kernel's sandbox has no copy of the notebook's directory", status=409
            )
        if self.suspended or self.endpoint is None:
            raise FileSyncError(
                "the sandbox is suspended; its files were copied back then", status=409
            )
        async with self._sync_lock:
            report = await self.file_sync.copy_back(self.endpoint)
        if report.copied or report.conflicts or report.skipped:
            log.info("claim %s: %s", self.claim_name, report.summary())
        return report

    async def _copy_back_quietly(self, when: str) -> None:
        if self.file_sync is None or self.suspended or self.endpoint is None:
            return
        try:
            await self.copy_back()
        except RuntimeFileError as exc:
            log.error(
                "claim %s: the kernel's files were not copied back at %s: %s",
                self.claim_name,
                when,
                exc,
            )

    def _set_status(self, status: ClaimStatus) -> None:
        self.status = status
        self.endpoint = status.endpoint

    async def _await_kernel(self, condition: Any, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the sandbox kernel did not report ready")
            self._kernel_changed.clear()
            try:
                await asyncio.wait_for(self._kernel_changed.wait(), min(remaining, 1.0))
            except TimeoutError:
                pass

    # -- kernel state ------------------------------------------------------

    def _on_kernel_state(self, identity: KernelIdentity, kernel: dict[str, Any]) -> None:
        if self.suspended:
            return  # a suspending runtime reports its kernel stopping: that is no death
        self.kernel = kernel
        alive = bool(kernel.get("alive"))
        if self.expected is None:
            if alive and kernel.get("ready"):
                self.expected = identity
                self.exit_code = None
        elif identity != self.expected:
            if self.exit_code is None:
                log.warning(
                    "sandbox %s runs a different kernel now: the old one is gone", self.claim_name
                )
                self.exit_code = DEAD_UNKNOWN
        elif not alive and self.exit_code is None:
            code = kernel.get("exit_code")
            self.exit_code = int(code) if isinstance(code, int) else DEAD_UNKNOWN
        self.bridge.kernel_alive = self.exit_code is None
        self._kernel_changed.set()

    async def _on_disconnected(self, failures: int) -> None:
        """The bridge cannot reach the runtime: is the claim still there at all?"""
        if self.claim_name is None or self.suspended:
            return
        try:
            status = await self.plane.status(self.claim_name)
        except Exception:
            return
        if status is None or status.phase == Phase.FAILED:
            log.warning(
                "claim %s is %s: reporting the kernel dead",
                self.claim_name,
                "gone" if status is None else "failed",
            )
            if self.exit_code is None:
                self.exit_code = DEAD_UNKNOWN
                self.bridge.kernel_alive = False
                self._kernel_changed.set()

    def poll(self) -> int | None:
        if self.released:
            return self.exit_code if self.exit_code is not None else 0
        return self.exit_code  # None while suspended, unless a shutdown was asked for

    # -- kernel control --------------------------------------------------------

    async def launch(self) -> None:
        """Make sure a live kernel runs in the sandbox (a new one after a death or restart)."""
        if self.suspended:
            await self.resume()
        if self.exit_code is None and self.expected is not None:
            return
        assert self.endpoint is not None
        info = await call(self.endpoint, "POST", "api/kernel/start", timeout=120)
        kernel = info.get("kernel", {})
        self.expected = KernelIdentity(
            str(info.get("runtime_id")), int(kernel.get("generation", 0))
        )
        self.exit_code = None
        self.bridge.kernel_alive = True
        self.kernel = kernel

    async def signal(self, signum: int) -> None:
        if self.endpoint is None or self.suspended:
            return
        if signum == signal.SIGINT:
            await call(self.endpoint, "POST", "api/kernel/interrupt")
        else:
            await call(self.endpoint, "POST", "api/kernel/signal", {"signum": int(signum)})

    async def terminate(self) -> None:
        """Ask the kernel process to exit (SIGTERM); a runtime that refuses is passed
        over for a kill, which takes the kernel as dead whatever the runtime says:
        a shutdown must go on to release the claim (a runtime answering 404 made
        DELETE /api/sessions fail with 500 and left the claim running)."""
        if self.suspended:
            return
        try:
            await self.signal(signal.SIGTERM)
        except RuntimeCallError as exc:
            log.info("terminate: the runtime refused SIGTERM (%s); killing the kernel", exc)
            await self.kill()

    async def kill(self) -> None:
        """Kill the kernel process (not the sandbox)."""
        if self.suspended:
            self.exit_code = -signal.SIGKILL
            return
        try:
            await self.signal(signal.SIGKILL)
        except RuntimeCallError as exc:
            log.info("kill: runtime unreachable (%s); taking the kernel as dead", exc)
            self.exit_code = -signal.SIGKILL
            return
        try:
            await self._await_kernel(lambda: self.exit_code is not None, timeout=10)
        except TimeoutError:
            self.exit_code = -signal.SIGKILL

    # -- suspend / resume -------------------------------------------------------

    async def suspend(self, *, force: bool = False) -> None:
        """Release the compute; a kernel running a cell is refused (KernelBusy) unless
        ``force``, before anything changes here."""
        if self.suspended or self.claim_name is None:
            return
        if not force and self.endpoint is not None and await kernel_busy(self.endpoint):
            raise kernel_busy_error(self.claim_name)
        self.progress.set("suspending", "saving the kernel's variables, keeping the workspace")
        await self._copy_back_quietly("suspend")
        self.suspended = True
        self.bridge.hold()
        try:
            status = await self.plane.suspend(self.claim_name, force=force)
        except ClaimError:
            # Refused (a cell started meanwhile, or the state could not be saved):
            # the kernel runs on, and so does its connection.
            self.suspended = False
            if self.endpoint is not None:
                self.bridge.connect(self.endpoint)
            self.progress.set("ready", "")
            raise
        self._set_status(status)
        self.progress.set("suspended", "workspace kept; the next execution resumes it")

    async def resume(self) -> None:
        if self._resuming is None or self._resuming.done():
            self._resuming = asyncio.create_task(self._resume())
        await asyncio.shield(self._resuming)

    async def _resume(self) -> None:
        if not self.suspended or self.claim_name is None:
            return
        self.progress.set("resuming", "starting the sandbox again")
        self.bridge.publish_status("restarting")
        await self.plane.resume(self.claim_name)
        status = await self.plane.wait_ready(self.claim_name, self.claim_timeout)
        self._set_status(status)
        self.expected = None
        self.exit_code = None
        self.suspended = False
        assert self.endpoint is not None
        # The request that resumed the sandbox waits until the new kernel's "idle"
        # is out: the server's resume notice hangs on it and must come first.
        self.bridge.connect(self.endpoint, gated=True)
        try:
            await self._await_kernel(lambda: self.expected is not None)
            self.bridge.publish_status("idle")
        finally:
            self.bridge.open_gate()
        self.progress.set("ready", "resumed: the kernel is new, the workspace is kept")

    async def admit_request(self, channel: str, head: dict[str, Any]) -> bool:
        """Should a client's request go on to the kernel? It resumes a suspended sandbox.

        A shutdown needs no resume. Nor does an interrupt: nothing runs in a suspended sandbox, and
        jupyter_client interrupts every kernel it shuts down (a server stopping).
        """
        if not self.suspended:
            return True
        if head.get("msg_type") == "interrupt_request":
            return False
        if head.get("msg_type") == "shutdown_request":
            self.exit_code = 0
            return False
        if self._resuming is None or self._resuming.done():
            self._resume_waiter = asyncio.create_task(self._resume_logged())
        return True

    async def _resume_logged(self) -> None:
        try:
            await self.resume()
        except Exception:
            log.exception("resuming claim %s failed", self.claim_name)
            self.exit_code = DEAD_UNKNOWN

    # -- release ----------------------------------------------------------------

    async def release(self, copy_back: bool = True) -> None:
        """Delete the claim (idempotent) and close the bridge."""
        if self.released:
            return
        if copy_back:
            await self._copy_back_quietly("shutdown")
        self.released = True
        await self.bridge.close()
        if self.claim_name is not None:
            await self.plane.release(self.claim_name)
        self.progress.set("released", "")

    def describe(self) -> dict[str, Any]:
        status = self.status
        return {
            "claim": self.claim_name,
            "pool": self.pool,
            "sandbox": status.sandbox if status else None,
            "namespace": status.namespace if status else None,
            "isolation": status.isolation if status else None,
            "isolation_detail": status.isolation_detail if status else None,
            "workspace": status.workspace if status else None,
            "warm": self.progress.warm,
            "progress": {
                "step": self.progress.step,
                "detail": self.progress.detail,
                "since": self.progress.since,
            },
            "suspended": self.suspended,
            "connected": self.bridge.connected,
            "kernel": self.kernel,
            "created": status.created if status else None,
            "resources": status.resources if status else {},
            "files": self._describe_files(),
        }

    def _describe_files(self) -> dict[str, Any] | None:
        sync = self.file_sync
        if sync is None:
            return None
        return {
            "mode": "copy",
            "dir": sync.root,
            "copied_in": sync.first.summary() if sync.first else None,
            "last": sync.last.to_json() if sync.last else None,
            "last_summary": sync.last.summary() if sync.last else None,
        }
