"""Starting and stopping one sandbox's runtime process."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from socket import socket as Socket
from typing import Any

from tornado.netutil import bind_unix_socket

from ...runtime import landlock, write_guard
from ...runtime.paths import PACKAGES_DIR
from . import seccomp_filter
from .cgroups import SandboxCgroup
from .disk_images import AttachedImage
from .host_uid import (
    HostIdentity,
    IdmappedMount,
    become_sandbox_user_code,
    drop_capabilities,
    mount_idmapped,
)
from .isolation import (
    POOL_PACKAGES,
    RUNTIME_DIR,
    WORKSPACE,
    Confinement,
    Isolation,
    bwrap_command,
    landlock_policy,
    landlock_policy_inside,
    package_parent,
)
from .network import NetnsHandshake, UserNetwork, user_network_available, write_sandbox_resolv_conf
from .paths import make_dirs_inside, private_dir

log = logging.getLogger(__name__)

BASE_ENV = {
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "USER": "sandbox",
    "LOGNAME": "sandbox",
    "SHELL": "/bin/sh",
    "TERM": "xterm-256color",
    "PYTHONUNBUFFERED": "1",
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
}


@dataclass
class Limits:
    # Without a memory cgroup: each process's private writable memory (RLIMIT_DATA).
    # Never the address space (RLIMIT_AS): importing numpy and pandas reserves a GB
    # of it with a tenth of that resident, so such a limit refused honest work.
    memory_bytes: int | None = None
    cpu_seconds: int | None = None
    max_processes: int | None = None
    max_open_files: int | None = 4096

    def apply(self) -> None:
        """Run in the child before exec: rlimits are inherited by everything inside."""
        if self.memory_bytes:
            resource.setrlimit(resource.RLIMIT_DATA, (self.memory_bytes, self.memory_bytes))
        if self.cpu_seconds:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds))
        if self.max_processes:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.max_processes, self.max_processes))
        if self.max_open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_open_files, self.max_open_files))


@dataclass
class LaunchSpec:
    name: str
    workspace: Path
    runtime_dir: Path
    listen_socket: Path
    log_file: Path
    state_dir: Path | None = None
    kernel_name: str = "python3"
    network: bool = True
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    tmp_bytes: int | None = None
    cgroup: SandboxCgroup | None = None
    files_dir: Path | None = None  # the notebook's directory: the kernel's working directory
    files_read_only: bool = False
    pool_packages: Path | None = None  # the pool's installed requirements (read-only)
    ro_files: tuple[str, ...] = ()  # host files shown read-only at their own path
    image: AttachedImage | None = None  # the workspace's image, for this start only
    packages_dir: Path | None = None  # the project's %pip packages (see Sandbox)
    packages_image: AttachedImage | None = None  # ... as an image, shared while in use


def sandbox_env(spec: LaunchSpec, isolation: Isolation) -> dict[str, str]:
    """A fresh environment: nothing of the daemon's (or Jupyter server's) own."""
    python_bin = os.path.dirname(sys.executable)
    env = dict(BASE_ENV)
    env["PATH"] = f"{python_bin}:/usr/local/bin:/usr/bin:/bin"
    home = WORKSPACE if isolation.isolated else str(spec.workspace)
    env["HOME"] = home
    env["SANDBOX_BASE_DIR"] = home
    env["JUPYTER_SANDBOX_NAME"] = spec.name
    env["TMPDIR"] = "/tmp" if isolation.isolated else str(spec.runtime_dir / "tmp")
    packages = os.path.join(home, PACKAGES_DIR)
    env["PIP_TARGET"] = packages
    env["PATH"] += f":{packages}/bin"
    pool = None
    if spec.pool_packages is not None:
        # After the sandbox's own: a %pip install in the notebook wins.
        pool = POOL_PACKAGES if isolation.isolated else str(spec.pool_packages)
        env["PATH"] += f":{pool}/bin"
    parent = package_parent()
    # An editable install binds only the package directory: it goes on the path too.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, packages, pool) if p)
    env.update(spec.env)
    return env


@functools.cache
def landlock_available() -> bool:
    """Whether bubblewrap sandboxes get their Landlock layer (ABI 2+), which also
    keeps a bound notebook directory to data."""
    available = landlock.abi_version() >= 2
    if not available:
        log.warning(
            "no Landlock (ABI 2+) on this kernel: sandboxes have no second layer under "
            "their mounts, and can create links and FIFOs in a notebook directory bound "
            "from the host"
        )
    return available


@functools.cache
def bound_directory_refusal() -> str | None:
    """Why a notebook directory may not be bound read-write into a confined
    sandbox here (its files are copied instead), or None when it may: nothing
    else keeps links, FIFOs and names host tools run (.git, conftest.py, ...) out
    of it."""
    why: str | None
    if landlock.abi_version() < 2:
        why = "this kernel has no Landlock (ABI 2, Linux 5.19)"
    else:
        probe = write_guard.probe()
        why = f"its write guard cannot run here ({probe})" if probe else None
    if why is not None:
        log.warning(
            "notebook directories are copied into sandboxes, not bound: %s, and nothing "
            "else keeps names host tools run (.git/config, conftest.py, ...) out of them",
            why,
        )
    return why


def runtime_python(become_sandbox_user: bool = False) -> list[str]:
    """How a sandbox's runtime server is started: from the installation alone.

    ``-I`` (isolated mode) ignores ``PYTHONPATH``, every other ``PYTHON*`` variable,
    the user's site directory and the working directory: the runtime never imports
    what the sandbox wrote (a ``sitecustomize.py`` in the workspace's packages
    replaced the runtime at its next restart). The kernel it starts still gets the
    sandbox's ``PYTHONPATH``, with the workspace's and the pool's packages. An
    editable install or a source checkout puts the package's parent on the path
    here, a directory the sandbox sees read-only. ``become_sandbox_user``: it
    starts as uid 0 of a root daemon's sandbox namespace and first becomes the
    sandbox user (host_uid.py).
    """
    parent = package_parent()
    path = f"sys.path.insert(0, {parent!r}); " if parent else ""
    become = become_sandbox_user_code() if become_sandbox_user else ""
    bootstrap = (
        f"{become}import runpy, sys; {path}"
        "runpy.run_module('jupyter_sandbox.runtime', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-I", "-u", "-c", bootstrap]


class SandboxProcess:
    """A runtime server (and its pre-started kernel) in one sandbox."""

    def __init__(self, spec: LaunchSpec, isolation: Isolation) -> None:
        self.spec = spec
        self.isolation = isolation
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.kernel_info: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.supervisor: asyncio.Task[None] | None = None
        self._ready_reader: asyncio.Task[None] | None = None
        self.network: UserNetwork | None = None
        self._idmapped: list[IdmappedMount] = []
        self.on_exit: list[Callable[[], None]] = []  # run once, when the process is gone

    @property
    def socket(self) -> Path:
        return self.spec.listen_socket

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _bind_listener(self) -> Socket:
        """Bind the runtime's socket here, where the sandbox cannot reach the path."""
        path = self.spec.listen_socket
        private_dir(path.parent)
        if os.path.lexists(path):
            path.unlink()
        return bind_unix_socket(str(path), mode=0o600)

    async def start(self) -> None:
        """Start the sandbox; with network, attach user-mode networking before it runs.

        Raises OSError (or NetworkSetupError) with nothing left running.
        """
        spec = self.spec
        private_dir(spec.workspace)
        if not self.isolation.isolated:  # (bubblewrap's is a sized tmpfs inside)
            private_dir(spec.runtime_dir)
        # Present from the start, so packages installed later import without a
        # restart (in an image: made by the child once it has mounted it).
        if spec.image is None and not make_dirs_inside(spec.workspace, PACKAGES_DIR):
            log.warning("%s: %s is not a directory; not made", spec.name, PACKAGES_DIR)
        env = sandbox_env(spec, self.isolation)
        self._idmapped = self._idmapped_dirs()
        shake = NetnsHandshake() if self._wants_user_network() else None
        listener = self._bind_listener()
        read_fd, write_fd = os.pipe()
        seccomp_fd = self._seccomp_fd()
        owned = [write_fd] + ([seccomp_fd] if seccomp_fd is not None else [])
        passed = [*owned, listener.fileno(), *(shake.child_fds if shake else ())]
        if self._userns_fd is not None:
            passed.append(self._userns_fd)
        try:
            argv, child_env = self._command(
                env, listener.fileno(), write_fd, seccomp_fd, shake.bwrap_args() if shake else []
            )
            log_handle = open(spec.log_file, "ab")
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=log_handle,
                    env=child_env,
                    cwd=str(spec.workspace),
                    pass_fds=passed,
                    preexec_fn=self._in_child,
                    start_new_session=True,
                )
            finally:
                log_handle.close()
        except BaseException:
            os.close(read_fd)
            if shake is not None:
                shake.close()
            raise
        finally:
            for fd in owned:  # the child holds its own copies
                os.close(fd)
            listener.close()
            if spec.image is not None:  # mounted in the child (or never): let go
                spec.image.release()
                spec.image = None
        if shake is not None:
            try:
                await self._attach_network(shake)
            except BaseException:
                os.close(read_fd)
                raise
        self._ready_reader = asyncio.create_task(self._read_ready(read_fd))

    @property
    def _host(self) -> HostIdentity | None:
        """A root daemon's identity for its bubblewrap sandboxes (host_uid.py)."""
        return self.isolation.host if self.isolation.isolated else None

    @property
    def _userns_fd(self) -> int | None:
        return self._host.userns_fd if self._host is not None else None

    def _idmapped_dirs(self) -> list[IdmappedMount]:
        """The directories this sandbox writes, shown with their owner as its host uid."""
        host = self._host
        if host is None:
            return []
        spec = self.spec
        dirs = [spec.workspace]
        if not self.isolation.isolated:
            dirs.append(spec.runtime_dir)
        if spec.files_dir is not None:
            dirs.append(spec.files_dir)
        if spec.packages_dir is not None:
            dirs.append(spec.packages_dir)
        return [host.idmapped(path) for path in dirs]

    def _wants_user_network(self) -> bool:
        return self.spec.network and self.isolation.isolated and user_network_available() is None

    async def _attach_network(self, shake: NetnsHandshake) -> None:
        """Give the waiting sandbox its network, or kill it before it runs anything."""
        shake.spawned()
        self.network = UserNetwork(log_path=self.spec.log_file)
        try:
            await self.network.attach(await shake.child_pid())
            shake.release()
        except BaseException:
            shake.abort()
            await self.stop(grace=0)
            await self.network.close()
            raise
        finally:
            shake.close()

    def _resolv_conf(self) -> str | None:
        """A resolver the sandbox can reach: slirp's, which forwards to the host's."""
        if self.spec.state_dir is None:
            return None
        return str(write_sandbox_resolv_conf(private_dir(self.spec.state_dir / "net")))

    def _seccomp_fd(self) -> int | None:
        if not self.isolation.isolated or not seccomp_filter.probe().available:
            return None
        return seccomp_filter.program_fd()

    def _in_child(self) -> None:
        """Between fork and exec: limits that everything in the sandbox inherits."""
        self.spec.limits.apply()
        if self.spec.cgroup is not None:
            self.spec.cgroup.enter()
        if self._idmapped or self.spec.image or self.spec.packages_image:
            mount_idmapped(self._idmapped, first=self._mount_images)
        if self.isolation.kind == "landlock" and os.geteuid() == 0:
            drop_capabilities()  # (bubblewrap drops them in its own sandboxes)

    def _mount_images(self) -> None:
        """In the child's own mount namespace: the workspace's image over it, and
        the project's packages' over theirs."""
        spec = self.spec
        if spec.image is not None:
            spec.image.mount_over(str(spec.workspace))
            make_dirs_inside(spec.workspace, PACKAGES_DIR)
        if spec.packages_image is not None and spec.packages_dir is not None:
            spec.packages_image.mount_over(str(spec.packages_dir))

    def _command(
        self,
        env: dict[str, str],
        listen_fd: int,
        ready_fd: int,
        seccomp_fd: int | None,
        netns_args: list[str],
    ) -> tuple[list[str], dict[str, str]]:
        spec = self.spec
        isolated = self.isolation.isolated
        workspace = WORKSPACE if isolated else str(spec.workspace)
        inner = [
            *runtime_python(become_sandbox_user=self._host is not None),
            "--listen-fd",
            str(listen_fd),
            "--workspace",
            workspace,
            "--runtime-dir",
            f"{RUNTIME_DIR}/kernel" if isolated else str(spec.runtime_dir / "kernel"),
            "--kernel-name",
            spec.kernel_name,
            "--ready-fd",
            str(ready_fd),
        ]
        if spec.files_dir is not None:
            inner += ["--kernel-cwd", str(spec.files_dir)]
        confinement = self._confinement(seccomp_fd, netns_args)
        if not isolated:
            (spec.runtime_dir / "tmp").mkdir(exist_ok=True)
            if self.isolation.kind == "landlock":
                policy = landlock_policy(
                    workspace=str(spec.workspace),
                    runtime_dir=str(spec.runtime_dir),
                    confinement=confinement,
                )
                inner += ["--confine", policy.to_json()]
            return inner, env
        if landlock_available():
            # a second layer: what the mounts show, again as Landlock rules
            inner += ["--confine", landlock_policy_inside(confinement).to_json()]
        argv = bwrap_command(
            workspace=str(spec.workspace),
            inner=inner,
            env=env,
            confinement=confinement,
        )
        return argv, {"PATH": env["PATH"]}

    def _confinement(self, seccomp_fd: int | None, netns_args: list[str]) -> Confinement:
        spec = self.spec
        return Confinement(
            state_dir=str(spec.state_dir) if spec.state_dir else None,
            tmp_bytes=spec.tmp_bytes,
            seccomp_fd=seccomp_fd,
            netns_args=tuple(netns_args),
            resolv_conf=self._resolv_conf() if netns_args else None,
            files_dir=str(spec.files_dir) if spec.files_dir is not None else None,
            files_read_only=spec.files_read_only,
            packages_dir=str(spec.packages_dir) if spec.packages_dir is not None else None,
            pool_packages=str(spec.pool_packages) if spec.pool_packages else None,
            ro_files=spec.ro_files,
            userns_fd=self._userns_fd,
            write_guard=bound_directory_refusal() is None,  # (for a bound files_dir)
        )

    async def _read_ready(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb")
        )
        try:
            line = await reader.readline()
        finally:
            transport.close()
        if line:
            try:
                self.kernel_info = json.loads(line).get("kernel", {})
            except ValueError:
                pass
            self.ready.set()

    async def wait(self) -> int:
        assert self.proc is not None
        code = await self.proc.wait()
        self.exit_code = code
        if self.network is not None:
            await self.network.close()
        if self.spec.cgroup is not None:  # whatever is left in it goes too
            await asyncio.to_thread(self.spec.cgroup.remove)
        self.exited()
        return code

    def exited(self) -> None:
        """Run the ``on_exit`` callbacks (once): the process is gone or never ran."""
        callbacks, self.on_exit = self.on_exit, []
        for callback in callbacks:
            callback()

    async def stop(self, grace: float = 3.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
