"""A MappingKernelManager whose idle culling suspends sandboxes instead of killing kernels.

jupyter_server's culler calls plain ``shutdown_kernel``; a provisioner cannot tell
that from a user's shutdown. So the manager marks the kernels it is culling, and
``shutdown_kernel`` suspends those (when they run in a sandbox) instead. The kernel
stays listed, its session survives, and the next message to it resumes the sandbox.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from traitlets import Bool

from ..control_plane.base import ClaimError
from .provisioner import SandboxProvisioner


class SandboxKernelManager(AsyncMappingKernelManager):  # type: ignore[misc]
    suspend_on_cull = Bool(
        True,
        config=True,
        help="Suspend idle sandboxed kernels (keep workspace and session) instead of "
        "shutting them down when the culler finds them idle.",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._culling: set[str] = set()

    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        try:
            return await super().start_kernel(*args, **kwargs)  # type: ignore[no-any-return]
        except ClaimError as exc:
            # Tell the user what went wrong and what to do, not "Unhandled error".
            message = exc.message + (f" ({exc.hint})" if exc.hint else "")
            raise web.HTTPError(exc.status, message, reason=exc.reason) from exc

    def sandbox_provisioner(self, kernel_id: str) -> SandboxProvisioner | None:
        kernel = self._kernels.get(kernel_id)
        provisioner = getattr(kernel, "provisioner", None)
        return provisioner if isinstance(provisioner, SandboxProvisioner) else None

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        self._culling.add(kernel_id)
        try:
            await super().cull_kernel_if_idle(kernel_id)
        finally:
            self._culling.discard(kernel_id)

    async def shutdown_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False, restart: bool = False
    ) -> None:
        if kernel_id in self._culling and self.suspend_on_cull and not restart:
            kernel = self._kernels.get(kernel_id)
            provisioner = self.sandbox_provisioner(kernel_id)
            if provisioner is not None and getattr(kernel, "execution_state", "") != "dead":
                session = provisioner.session
                if session is not None and not session.suspended:
                    self.log.info(
                        "Suspending idle sandboxed kernel %s (claim %s)",
                        kernel_id,
                        session.claim_name,
                    )
                    await provisioner.suspend()
                return
        await super().shutdown_kernel(kernel_id, now=now, restart=restart)

    async def suspend_kernel(self, kernel_id: str) -> None:
        provisioner = self._require(kernel_id)
        await provisioner.suspend()

    async def resume_kernel(self, kernel_id: str) -> None:
        provisioner = self._require(kernel_id)
        await provisioner.resume()

    def _require(self, kernel_id: str) -> SandboxProvisioner:
        self._check_kernel_id(kernel_id)
        provisioner = self.sandbox_provisioner(kernel_id)
        if provisioner is None:
            raise ValueError(f"kernel {kernel_id} does not run in a sandbox")
        return provisioner
