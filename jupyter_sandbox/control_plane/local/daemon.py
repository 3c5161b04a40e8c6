"""``python -m jupyter_sandbox.control_plane.local.daemon``: the per-user sandbox daemon.

One per user and state directory (a file lock makes sure). It keeps the warm pools
filled, runs the router on a loopback port, and serves its API on a Unix socket
in the state directory that only its user can open.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import psutil
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets, bind_unix_socket

from ..._version import __version__
from ...router.local import die_with_parent
from ...router.tokens import TokenAuthority, new_secret
from . import disk_images, host_uid, seccomp_filter
from .api import DaemonContext, make_api_app
from .cgroups import CgroupLimits
from .controller import LocalController
from .disk_images import DiskImages
from .isolation import Isolation, UnsafeMount, probe, python_paths
from .model import NAMESPACE, PoolSpec
from .network import user_network_available
from .packages import host_forwarding
from .paths import check_socket_room, private_dir, socket_path, state_dir
from .process import bound_directory_refusal

log = logging.getLogger("jupyter_sandbox.daemon")

OWNER_POLL_SECONDS = 2.0

DEFAULT_POOL = "default"


def load_secret(base: Path) -> str:
    path = base / "router-secret"
    if path.exists():
        return path.read_text().strip()
    secret = new_secret()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    return secret


async def serve(args: argparse.Namespace) -> int:
    base = private_dir(Path(args.state_dir).absolute()) if args.state_dir else state_dir()
    # Nothing of the caller's working directory may matter to the daemon or its children.
    os.chdir("/")
    try:
        check_socket_room(base)
    except ValueError as exc:
        log.error("cannot start: %s", exc)
        return 2
    lock = open(base / "daemon.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("another daemon already serves %s", base)
        return 0

    isolation = probe(disabled=args.no_isolation)
    if not isolation.confined and not args.no_isolation:
        log.error(
            "cannot start sandboxes: no way to confine them here (%s). To run them as "
            "plain, unconfined processes anyway, pass --no-isolation "
            "(JUPYTER_SANDBOX_NO_ISOLATION=1)",
            isolation.detail,
        )
        return 2
    if not isolation.isolated:
        log.warning("sandboxes are NOT isolated: %s", isolation.detail)
    if isolation.confined:
        try:
            python_paths(base)
        except UnsafeMount as exc:
            log.error("cannot start sandboxes: %s", exc)
            return 2
    if isolation.isolated:
        isolation = with_host_identity(isolation, base)
    cgroups = CgroupLimits()
    isolation, limits = describe_confinement(isolation, cgroups)
    if "not enforced" in limits:
        log.warning("sandbox %s", limits)
    images, disk = workspace_images(base)
    limits = f"{limits}; {disk}"
    if isolation.isolated:  # its detail lists the limits: the disk's too
        isolation = Isolation(isolation.kind, f"{isolation.detail}; {disk}", isolation.host)
    controller = LocalController(
        base,
        isolation,
        orphan_grace=args.orphan_grace,
        disk_check_seconds=args.disk_check_seconds,
        cgroups=cgroups,
        limits=limits,
        pip=host_forwarding(str(base)),
        disk_images=images,
    )
    controller.load([PoolSpec(name=DEFAULT_POOL, replicas=args.default_replicas)])
    controller.remove_stale_cgroups()
    authority = TokenAuthority(load_secret(base))

    router = RouterProcess(base, args.router_port)
    router_url = await router.start()

    info = {
        "version": __version__,
        "pid": os.getpid(),
        "router_url": router_url,
        "namespace": NAMESPACE,
        "isolation": isolation.kind,
        "isolation_detail": isolation.detail,
        "limits": limits,
        "state_dir": str(base),
        "started": time.time(),
    }
    ctx = DaemonContext(controller, authority, router_url, info)
    sock_path = socket_path(base)
    if sock_path.exists():
        sock_path.unlink()
    api = HTTPServer(make_api_app(ctx))
    api.add_socket(bind_unix_socket(str(sock_path), mode=0o600))
    (base / "daemon.json").write_text(json.dumps(info))
    log.info(
        "daemon %s ready: api %s, router %s, isolation %s",
        os.getpid(),
        sock_path,
        router_url,
        isolation.kind,
    )

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, ctx.stop.set)
    runner = asyncio.create_task(controller.run())
    liveness = asyncio.create_task(controller.probe_liveness())
    disk_watch = asyncio.create_task(controller.watch_disk())
    idle_task = asyncio.create_task(
        _idle_watch(controller, ctx.stop, args.idle_timeout, _owner(args.exit_with))
    )
    await ctx.stop.wait()
    log.info("daemon stopping")
    runner.cancel()
    liveness.cancel()
    disk_watch.cancel()
    idle_task.cancel()
    api.stop()
    await router.stop()
    await controller.shutdown()
    for path in (sock_path, base / "daemon.json"):
        path.unlink(missing_ok=True)
    lock.close()
    return 0


def with_host_identity(isolation: Isolation, base: Path) -> Isolation:
    """As root, the unprivileged host uid the sandboxes run as (host_uid.py)."""
    if os.geteuid() != 0:
        return isolation
    identity = host_uid.probe(str(base))
    if isinstance(identity, str):
        log.warning("sandboxes run as host root (uid 0 to the kernel): %s", identity)
        detail = f"{isolation.detail}; sandboxes are host uid 0 ({identity})"
        return Isolation(isolation.kind, detail)
    detail = f"{isolation.detail}; {identity.sandbox_description}"
    return Isolation(isolation.kind, detail, identity)


def workspace_images(base: Path) -> tuple[DiskImages | None, str]:
    """A root daemon's workspace images (disk_images.py) and how disk is limited, in words."""
    if os.geteuid() != 0:
        return (
            None,
            "disk: each workspace measured against its pool's disk_mb (enforcing needs root)",
        )
    found = disk_images.probe(base)
    if isinstance(found, str):
        log.warning("workspace sizes are not enforced: %s", found)
        return None, f"disk: measured, not enforced ({found})"
    return found, "disk: each workspace an ext4 image of its pool's disk_mb"


def describe_confinement(isolation: Isolation, cgroups: CgroupLimits) -> tuple[Isolation, str]:
    """The isolation with what seccomp adds, and how resource limits are enforced."""
    capability = cgroups.probe()
    if capability.enforced:
        limits = f"limits: {capability}"
    else:
        limits = (
            "limits not enforced by cgroups, rlimits only: memory per process "
            f"(RLIMIT_DATA; /tmp and /dev/shm by their size), processes ({capability.detail})"
        )
    files = notebook_directories(isolation)
    if not isolation.isolated:
        if files:
            isolation = Isolation(isolation.kind, f"{isolation.detail}; {files}", isolation.host)
        return isolation, limits
    seccomp = seccomp_filter.probe()
    extra = seccomp.detail if seccomp.available else f"NO seccomp filter: {seccomp.detail}"
    unavailable = user_network_available()
    network = (
        "network: own namespace each, slirp4netns without host loopback or private ranges"
        if unavailable is None
        else f"network: own namespace each, loopback only (user-mode networking: {unavailable})"
    )
    detail = f"{isolation.detail}; {extra}; {network}; {files}; {limits}"
    return Isolation(isolation.kind, detail, isolation.host), limits


def notebook_directories(isolation: Isolation) -> str:
    """How a confined sandbox gets its notebook's directory, and why ("": not confined)."""
    if not isolation.confined:
        return ""
    why = bound_directory_refusal()
    if why is None:
        return "notebook directories: bound, write guard on (no .git, conftest.py, ... made there)"
    return f"notebook directories: copied, not bound ({why})"


class RouterProcess:
    """The router as a child process, restarted on the same port whenever it exits.

    Keeping the port lets bridges reconnect to the same URL after a router restart.
    """

    def __init__(self, base: Path, port: int) -> None:
        self.base = base
        self.port = port or _remembered_port(base)
        self.proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> str:
        self.port = _usable_port(self.port)
        (self.base / "router-port").write_text(str(self.port))
        await self._spawn()
        self._watch = asyncio.create_task(self._keep_running())
        return f"http://127.0.0.1:{self.port}"

    async def _spawn(self) -> None:
        log_file = open(self.base / "router.log", "ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "jupyter_sandbox.router.local",
                "--state-dir",
                str(self.base),
                "--port",
                str(self.port),
                "--parent",
                str(os.getpid()),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                preexec_fn=die_with_parent,
            )
        finally:
            log_file.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.returncode is None:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.05)
        log.error("the router did not start listening; see %s", self.base / "router.log")

    async def _keep_running(self) -> None:
        delay = 0.1
        while not self._stopping:
            assert self.proc is not None
            code = await self.proc.wait()
            if self._stopping:
                return
            log.warning("router exited with %s; restarting it on port %s", code, self.port)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            await self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def _remembered_port(base: Path) -> int:
    try:
        return int((base / "router-port").read_text())
    except (OSError, ValueError):
        return 0


def _usable_port(port: int) -> int:
    """``port`` if it can be bound on loopback now, else a free one."""
    for candidate in ([port] if port else []) + [0]:
        try:
            sockets = bind_sockets(candidate, address="127.0.0.1")
        except OSError:
            continue
        chosen = int(sockets[0].getsockname()[1])
        for sock in sockets:
            sock.close()
        return chosen
    raise OSError("no loopback port for the router")


async def _idle_watch(
    controller: LocalController,
    stop: asyncio.Event,
    timeout: float,
    owner: psutil.Process | None = None,
) -> None:
    """Exit after ``timeout`` seconds without any claim, so warm pools don't linger
    forever; and, with an ``owner`` (the JupyterLab that started this daemon), as
    soon as it has exited and no claim is left."""
    if timeout <= 0 and owner is None:
        return
    idle_since = time.monotonic()
    while True:
        await asyncio.sleep(OWNER_POLL_SECONDS if owner is not None else min(timeout, 10))
        if controller.store.claims:
            idle_since = time.monotonic()
        elif owner is not None and not _alive(owner):
            log.info("the JupyterLab that started this daemon (pid %s) exited: exiting", owner.pid)
            stop.set()
            return
        elif timeout > 0 and time.monotonic() - idle_since >= timeout:
            log.info("no claims for %ss: exiting", timeout)
            stop.set()
            return


def _alive(process: psutil.Process) -> bool:
    """Still running, and still the same process (not a reused pid)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _owner(pid: int | None) -> psutil.Process | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None  # gone already: the idle timeout alone applies


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jupyter-sandbox daemon")
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--router-port", type=int, default=0)
    parser.add_argument(
        "--default-replicas",
        type=int,
        default=int(os.environ.get("JUPYTER_SANDBOX_DEFAULT_REPLICAS", "2")),
    )
    parser.add_argument(
        "--orphan-grace",
        type=float,
        default=float(os.environ.get("JUPYTER_SANDBOX_ORPHAN_GRACE", "30")),
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=float(os.environ.get("JUPYTER_SANDBOX_IDLE_TIMEOUT", "3600")),
    )
    parser.add_argument(
        "--exit-with",
        type=int,
        default=None,
        metavar="PID",
        help="exit once this process (the JupyterLab that started the daemon) has exited "
        "and no claim is left",
    )
    parser.add_argument(
        "--disk-check-seconds",
        type=float,
        default=float(os.environ.get("JUPYTER_SANDBOX_DISK_CHECK_SECONDS", "30")),
        help="how often claimed workspaces are measured against their pool's disk_mb",
    )
    parser.add_argument(
        "--detach",
        action="store_true",
        help="fork into the background (the starting process can exit)",
    )
    parser.add_argument(
        "--no-isolation",
        action="store_true",
        default=os.environ.get("JUPYTER_SANDBOX_NO_ISOLATION") == "1",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.detach and os.fork() != 0:
        # The parent returns at once; the daemon is re-parented, never left a zombie.
        os._exit(0)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
