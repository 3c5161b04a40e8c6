"""``SandboxProvisioner``: a jupyter_client kernel provisioner that claims sandboxes.

Select it in a kernelspec::

    "metadata": {"kernel_provisioner": {
        "provisioner_name": "sandbox-provisioner",
        "config": {"pool": "default", "backend": "local"}}}

It claims a sandbox from the pool in ``pre_launch``, returns connection info of a
local bridge, keeps the claim across restarts and releases it in
``cleanup(restart=False)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning.provisioner_base import KernelProvisionerBase
from traitlets import Bool, Dict, Enum, Float, Int, List, Unicode

from ..control_plane.base import FilesNotBindable
from ..control_plane.factory import get_control_plane
from ..kernelspec import FILES_MODES
from ..utils.background import background
from ..utils.users import current_user, label_value
from .env import filter_env
from .file_sync import FileSync, FileSyncError, Limits
from .session import SandboxSession

log = logging.getLogger(__name__)

LABEL_KERNEL_ID = "jupyter-sandbox/kernel-id"
LABEL_USER = "jupyter-sandbox/user"
LABEL_SERVER = "jupyter-sandbox/server-id"
LABEL_KERNEL_NAME = "jupyter-sandbox/kernel-name"


class SandboxProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    pool = Unicode("default", config=True, help="Warm pool to claim sandboxes from.")
    backend = Unicode("local", config=True, help="Control plane: 'local' or 'kubernetes'.")
    backend_options = Dict(
        config=True, help="Options for the backend (namespace, router_url, ...)."
    )
    claim_timeout = Float(120.0, config=True, help="Seconds to wait for a claimed sandbox.")
    env_allowlist = List(
        Unicode(),
        config=True,
        help="Server environment variables passed into the sandbox. "
        "Any makes the claim cold-start.",
    )
    release_on_shutdown = Bool(True, config=True)
    orphan_grace = Float(
        None,
        allow_none=True,
        config=True,
        help="Seconds a claim outlives this server if it dies, so a restart can re-attach "
        "(local backend; default: the daemon's).",
    )

    files = Enum(
        list(FILES_MODES),
        "auto",
        config=True,
        help="How the kernel sees the notebook's directory. 'bind': the sandbox shows it at "
        "its own path (local backend: mounted, read-write or read-only as the pool says; "
        "Kubernetes: the pool's template must mount the user's volume, see "
        "deploy/jupyterhub/README.md); 'copy': it is copied into the workspace when the "
        "sandbox is claimed, and what the kernel creates or changes is copied back at "
        "suspend, at shutdown and on demand (any backend, warm claims stay warm); 'none': "
        "the kernel works in the workspace only. 'auto': 'bind' on the local backend; on "
        "Kubernetes 'bind' when the pool mounts the user's volume, else 'copy'.",
    )
    files_max_mb = Int(
        512, config=True, help="Copy mode: at most this many MB are copied each way."
    )

    _session: SandboxSession | None = None

    @property
    def has_process(self) -> bool:
        return self._session is not None and not self._session.released

    @property
    def session(self) -> SandboxSession | None:
        return self._session

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km: Any = self.parent
        env = filter_env(
            kwargs.get("env") or os.environ,
            kernelspec_env=(self.kernel_spec.env or {}).keys() if self.kernel_spec else (),
            allow=self.env_allowlist,
        )
        # The notebook's directory: the pool decides whether the sandbox sees it.
        files_dir = kwargs.pop("cwd", None)
        inherited = False
        if files_dir is None and getattr(getattr(km, "parent", None), "root_dir", None) is None:
            # Outside a Jupyter server (nbclient, papermill --cwd, jupyter console) a
            # kernel works where its client does, as a local kernel would.
            files_dir, inherited = os.getcwd(), True
        mode = (
            self.files
            if self.files != "auto"
            else ("copy" if self.backend == "kubernetes" else "bind")
        )
        file_sync = None
        # Copied only when a client names the directory (a server, nbclient, papermill):
        # a console started somewhere does not copy that somewhere along.
        if mode == "copy" and files_dir and not inherited:
            file_sync = self._file_sync(files_dir)
        optional = inherited
        if mode == "copy" and self.files == "auto" and files_dir and not inherited:
            # A Kubernetes pool that mounts the user's volume shows the directory
            # itself; the session then copies nothing.
            optional = True
        elif mode != "bind":
            files_dir = None
        # A restarted server re-attaching passes the claim its kernel already has.
        existing_claim = kwargs.pop("sandbox_claim", None)
        if self._session is None:
            plane = await background().run(_plane(self.backend, self.backend_options))
            labels = {
                LABEL_KERNEL_ID: self.kernel_id or "",
                LABEL_USER: label_value(current_user()),
                LABEL_KERNEL_NAME: label_value(getattr(km, "kernel_name", "") or ""),
            }
            server_id = getattr(getattr(km, "parent", None), "server_id", "")
            if server_id:
                labels[LABEL_SERVER] = server_id

            def session(files_dir: str | None, file_sync: FileSync | None) -> SandboxSession:
                return SandboxSession(
                    plane,
                    pool=self.pool,
                    key=km.session.key,
                    labels=labels,
                    env=env,
                    owner_pid=os.getpid(),
                    claim_timeout=self.claim_timeout,
                    claim_name=existing_claim,
                    orphan_grace=self.orphan_grace,
                    files_dir=os.path.abspath(files_dir) if files_dir else None,
                    files_optional=optional,
                    file_sync=file_sync,
                )

            self._session = session(files_dir, file_sync)
            try:
                try:
                    await background().run(self._session.start())
                except FilesNotBindable as exc:
                    if self.files != "auto" or not files_dir:
                        raise
                    # The directory cannot be bound here: its files are copied instead.
                    log.info("%s; copying its files into the sandbox", exc.message)
                    self._session = session(None, self._file_sync(files_dir))
                    await background().run(self._session.start())
            except BaseException:
                self._session = None  # start() released whatever it had claimed
                raise
            info = self._session.bridge.connection_info()
            # The kernel's own key, when the runtime tells it: then no signature is
            # computed twice on the way (bridge.py).
            key = self._session.bridge.adopt_runtime_key()
            if key is not None:
                info["key"] = key
            km.load_connection_info(info)
        else:  # a restart: jupyter_client removed the ipc files of the bridge it keeps
            await background().run(self._session.bridge.restore_endpoints())
        kwargs["env"] = {}
        cmd = list(self.kernel_spec.argv) if self.kernel_spec else []
        return await super().pre_launch(cmd=cmd, **kwargs)

    def _file_sync(self, files_dir: str) -> FileSync | None:
        if not _copyable(files_dir):
            return None
        total = self.files_max_mb * 1024 * 1024
        limits = Limits(max_file_bytes=min(Limits.max_file_bytes, total), max_total_bytes=total)
        return FileSync(os.path.abspath(files_dir), limits)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        assert self._session is not None
        await background().run(self._session.launch())
        km: Any = self.parent
        self.connection_info = km.get_connection_info()
        return self.connection_info  # type: ignore[no-any-return]

    async def poll(self) -> int | None:
        if self._session is None:
            return 0
        return self._session.poll()

    async def wait(self) -> int | None:
        while True:
            code = await self.poll()
            if code is not None:
                return code
            await asyncio.sleep(0.1)

    async def send_signal(self, signum: int) -> None:
        if self._session is not None:
            await background().run(self._session.signal(signum))

    # kill/terminate act on the kernel process only and ignore ``restart`` (jupyter_client
    # does not always pass it right); the claim is released only in cleanup(restart=False).
    async def kill(self, restart: bool = False) -> None:
        if self._session is not None:
            await background().run(self._session.kill())

    async def terminate(self, restart: bool = False) -> None:
        # SIGTERM lets the kernel exit cleanly; poll() tells when it is gone.
        if self._session is not None:
            await background().run(self._session.terminate())

    async def cleanup(self, restart: bool = False) -> None:
        if restart or self._session is None:
            return
        session, self._session = self._session, None
        if self.release_on_shutdown:
            await background().run(session.release())
        else:
            await background().run(session.bridge.close())

    async def copy_files_back(self) -> dict[str, Any]:
        """Copy mode: bring what the kernel created or changed back now; the report."""
        if self._session is None:
            raise FileSyncError("the kernel has no sandbox", status=409)
        report = await background().run(self._session.copy_back())
        return report.to_json()

    async def suspend(self, *, force: bool = False) -> None:
        """Release the sandbox's compute (KernelBusy while a cell runs, unless ``force``)."""
        if self._session is not None:
            await background().run(self._session.suspend(force=force))

    async def resume(self) -> None:
        if self._session is not None:
            await background().run(self._session.resume())

    def describe(self) -> dict[str, Any]:
        return self._session.describe() if self._session else {"claim": None}

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        return recommended

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        return max(recommended, self.claim_timeout)

    async def get_provisioner_info(self) -> dict[str, Any]:
        info: dict[str, Any] = await super().get_provisioner_info()
        info.update(
            {
                "pool": self.pool,
                "backend": self.backend,
                "claim": self._session.claim_name if self._session else None,
            }
        )
        return info


async def _plane(backend: str, options: dict[str, Any]) -> Any:
    return get_control_plane(backend, **options)


def _copyable(directory: str) -> bool:
    """Never copy the filesystem root into a sandbox."""
    if os.path.realpath(directory) == "/":
        log.warning("not copying / into the sandbox")
        return False
    return True
