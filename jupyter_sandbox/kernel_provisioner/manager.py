"""A MappingKernelManager whose idle culling suspends sandboxes instead of killing kernels.

jupyter_server's culler calls plain ``shutdown_kernel``; a provisioner cannot tell
that from a user's shutdown. So the manager marks the kernels it is culling, and
``shutdown_kernel`` suspends those (when they run in a sandbox) instead. The kernel
stays listed, its session survives, and the next message to it resumes the sandbox.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from tornado.ioloop import IOLoop
from traitlets import Bool, Unicode, default

from ..control_plane.base import ClaimError, ClaimStatus
from ..control_plane.factory import get_control_plane
from ..kernelspec import PROVISIONER_NAME
from ..utils.background import background
from . import log_filter
from .provisioner import (
    LABEL_KERNEL_ID,
    LABEL_KERNEL_NAME,
    LABEL_SERVER,
    SandboxProvisioner,
)


class SandboxStartError(web.HTTPError):
    """A failed claim as an HTTP error whose text is just its message.

    jupyter_server's sessions handler (the one JupyterLab calls) re-raises any start
    error as a 500 with ``str(error)``; tornado's own text would put "HTTP 404:
    PoolNotFound (...)" in front of the message the user reads.
    """

    def __str__(self) -> str:
        return self.log_message or super().__str__()


def server_id_for(user: str, root: str, environ: Mapping[str, str]) -> str:
    """A server's claims' label: the hub user and server name under JupyterHub.

    In a zero-to-jupyterhub deployment every single-user server runs as ``jovyan``
    in ``/home/jovyan``: from the local user and root directory alone, every user's
    server had the same id, and on start each re-attached (or, without re-attach,
    released) the others' kernels.
    """
    hub_user = environ.get("JUPYTERHUB_USER", "")
    if hub_user:
        key = json.dumps([user, root, hub_user, environ.get("JUPYTERHUB_SERVER_NAME", "")])
    else:
        key = f"{user}:{root}"  # as before JupyterHub was considered: restarts re-attach
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class SandboxKernelManager(AsyncMappingKernelManager):  # type: ignore[misc]
    suspend_on_cull = Bool(
        True,
        config=True,
        help="Suspend idle sandboxed kernels (keep workspace and session) instead of "
        "shutting them down when the culler finds them idle.",
    )

    reattach = Bool(
        True,
        config=True,
        help="On start, re-attach to the sandboxed kernels an earlier run of this server "
        "(same server_id) left running; if False, release them.",
    )
    server_id = Unicode(
        config=True,
        help="Names this server's claims so a restart can find them. Default: derived from "
        "the JupyterHub user and server name when the server runs under JupyterHub, the "
        "local user, and the server's root directory.",
    )

    @default("server_id")
    def _default_server_id(self) -> str:
        root = os.path.realpath(getattr(self, "root_dir", "") or os.getcwd())
        return server_id_for(getpass.getuser(), root, os.environ)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._culling: set[str] = set()
        log_filter.install(self.log)
        # Runs once the server's loop starts (the manager is built before it runs).
        IOLoop.current().add_callback(self._reattach_on_start)

    async def _reattach_on_start(self) -> None:
        try:
            found = await self.reattach_kernels()
        except Exception:
            self.log.exception("re-attaching earlier sandboxed kernels failed")
            return
        if found:
            self.log.info("re-attached %d sandboxed kernel(s) from an earlier run", len(found))

    async def reattach_kernels(self) -> list[str]:
        """Take back (or release) the kernels a killed run of this server left in sandboxes."""
        found: list[str] = []
        for backend, options in self._sandbox_backends():
            try:
                claims = await background().run(_list_claims(backend, options, self.server_id))
            except ClaimError as exc:
                self.log.warning("cannot look for earlier kernels on %s: %s", backend, exc)
                continue
            for claim in claims:
                kernel_id = claim.labels.get(LABEL_KERNEL_ID, "")
                owner = claim.resources.get("owner_pid")
                if (
                    not kernel_id
                    or kernel_id in self
                    # This very server claimed it: a kernel starting while we scan.
                    or owner == os.getpid()
                    or (isinstance(owner, int) and _alive(owner))
                ):
                    continue  # a live server still holds it
                kernel_name = claim.labels.get(LABEL_KERNEL_NAME) or ""
                if not self.reattach or kernel_name not in self._specs().find_kernel_specs():
                    self.log.info(
                        "releasing claim %s of an earlier kernel %s", claim.name, kernel_id
                    )
                    await background().run(_release(backend, options, claim.name))
                    continue
                try:
                    await self.start_kernel(
                        kernel_id=kernel_id, kernel_name=kernel_name, sandbox_claim=claim.name
                    )
                except Exception as exc:
                    self.log.warning("could not re-attach kernel %s: %s", kernel_id, exc)
                    continue
                self.log.info("re-attached kernel %s in sandbox %s", kernel_id, claim.sandbox)
                found.append(kernel_id)
        return found

    def _specs(self) -> Any:
        return self.kernel_spec_manager

    def _sandbox_backends(self) -> list[tuple[str, dict[str, Any]]]:
        seen: dict[str, tuple[str, dict[str, Any]]] = {}
        for spec in self._specs().get_all_specs().values():
            provisioner = spec.get("spec", {}).get("metadata", {}).get("kernel_provisioner", {})
            if provisioner.get("provisioner_name") != PROVISIONER_NAME:
                continue
            config = provisioner.get("config", {})
            backend = config.get("backend", "local")
            options = config.get("backend_options", {}) or {}
            seen[json.dumps([backend, options], sort_keys=True)] = (backend, options)
        return list(seen.values())

    async def start_kernel(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        try:
            return await super().start_kernel(*args, **kwargs)  # type: ignore[no-any-return]
        except ClaimError as exc:
            # Tell the user what went wrong and what to do, not "Unhandled error".
            raise SandboxStartError(exc.status, str(exc), reason=exc.reason) from exc

    def sandbox_provisioner(self, kernel_id: str) -> SandboxProvisioner | None:
        kernel = self._kernels.get(kernel_id)
        provisioner = getattr(kernel, "provisioner", None)
        return provisioner if isinstance(provisioner, SandboxProvisioner) else None

    def start_watching_activity(self, kernel_id: str) -> None:
        """jupyter_server's activity tracking, fed by the bridge in-process for sandboxes.

        jupyter_server subscribes to each kernel's iopub over ZMQ and decodes every
        message to keep ``last_activity`` and ``execution_state`` (what culling
        goes by). For a sandboxed kernel that subscription alone would make the
        bridge sign and publish every output that JupyterLab tabs already get by
        their direct link; the bridge hands its already-parsed messages over instead.
        """
        provisioner = self.sandbox_provisioner(kernel_id)
        session = provisioner.session if provisioner is not None else None
        if session is None:
            super().start_watching_activity(kernel_id)
            return
        kernel = self._kernels[kernel_id]
        kernel.reason = ""
        kernel.last_activity = utcnow()
        kernel._activity_stream = None
        session.bridge.on_iopub = partial(self._record_activity, kernel)

    def stop_watching_activity(self, kernel_id: str) -> None:
        provisioner = self.sandbox_provisioner(kernel_id)
        if provisioner is not None and provisioner.session is not None:
            provisioner.session.bridge.on_iopub = None
        super().stop_watching_activity(kernel_id)

    def _record_activity(self, kernel: Any, head: dict[str, Any], parts: Sequence[Any]) -> None:
        """What jupyter_server's ``record_activity`` does with one iopub message.

        Called on the bridge's thread: it only sets attributes.
        """
        msg_type = head.get("msg_type")
        parent_type = None
        if len(parts) > 1 and bytes(parts[1][:2]) != b"{}":
            parent_type = json.loads(bytes(parts[1])).get("msg_type")
        if (
            self.track_message_type(msg_type)
            or self.track_message_type(parent_type)
            or kernel.execution_state == "busy"
        ):
            self.last_kernel_activity = kernel.last_activity = utcnow()
        if msg_type != "status" or len(parts) < 4:
            return
        state = json.loads(bytes(parts[3])).get("execution_state")
        if self.track_message_type(parent_type):
            kernel.execution_state = state
        elif kernel.execution_state == "starting" and state != "starting":
            # jupyter_server's rule: after starting, untracked replies mean idle.
            kernel.execution_state = "idle"

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

    async def suspend_kernel(self, kernel_id: str, *, force: bool = False) -> None:
        provisioner = self._require(kernel_id)
        await provisioner.suspend(force=force)

    async def resume_kernel(self, kernel_id: str) -> None:
        provisioner = self._require(kernel_id)
        await provisioner.resume()

    def _require(self, kernel_id: str) -> SandboxProvisioner:
        self._check_kernel_id(kernel_id)
        provisioner = self.sandbox_provisioner(kernel_id)
        if provisioner is None:
            raise ValueError(f"kernel {kernel_id} does not run in a sandbox")
        return provisioner


async def _list_claims(backend: str, options: dict[str, Any], server_id: str) -> list[ClaimStatus]:
    return await get_control_plane(backend, **options).list_claims({LABEL_SERVER: server_id})


async def _release(backend: str, options: dict[str, Any], name: str) -> None:
    await get_control_plane(backend, **options).release(name)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
