"""``python -m jupyter_sandbox.runtime``: the server inside a sandbox."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from dataclasses import replace

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets, bind_unix_socket

from ..protocol import runtime_auth
from . import landlock, write_guard
from .app import DEFAULT_MAX_BODY, make_app
from .kernel_state import has_state
from .paths import GUARD_HOME_ENV, KERNEL_CWD_ENV, PACKAGES_DIR, PACKAGES_DIR_ENV, kernel_cwd
from .state import RuntimeState

RESTORE_TIMEOUT = 300.0

log = logging.getLogger("jupyter_sandbox.runtime")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jupyter-sandbox-runtime", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--port", type=int, default=None, help="TCP port (default 8888)")
    where.add_argument("--unix-socket", help="listen on this Unix socket instead of TCP")
    where.add_argument(
        "--listen-fd",
        type=int,
        help="serve on this inherited, already listening socket (socket activation)",
    )
    parser.add_argument("--ip", default="0.0.0.0", help="address for --port")
    parser.add_argument("--workspace", default=os.environ.get("SANDBOX_BASE_DIR", "/workspace"))
    parser.add_argument("--runtime-dir", default=None, help="where kernel IPC sockets live")
    parser.add_argument(
        "--kernel-cwd",
        default=os.environ.get(KERNEL_CWD_ENV) or None,
        help=f"the kernel's working directory, the notebook's (default: ${KERNEL_CWD_ENV}, "
        "else the workspace; the workspace too when it is not a directory)",
    )
    parser.add_argument("--kernel-name", default="python3")
    parser.add_argument("--no-kernel", action="store_true", help="do not pre-start the kernel")
    parser.add_argument("--max-upload-bytes", type=int, default=DEFAULT_MAX_BODY)
    parser.add_argument(
        "--confine",
        default=None,
        metavar="POLICY",
        help="a Landlock policy (JSON, landlock.Policy): made into rules from this "
        "process's view of the filesystem and put on it and everything it starts before "
        "anything else runs; the runtime does not start without them",
    )
    parser.add_argument(
        "--ready-fd",
        type=int,
        default=None,
        help="write one JSON line to this fd when the kernel is ready",
    )
    return parser.parse_args(argv)


def pip_target_env(env: dict[str, str], kept: str | None = None) -> None:
    """``%pip install`` goes into ``kept`` (the project's directory on the user's
    volume, from the operator) or else the workspace, unless the launcher chose
    already. The local backend sets it for its sandboxes; in a pod it is set here."""
    if "PIP_TARGET" in env:
        return
    packages = os.path.join(env["HOME"], PACKAGES_DIR)
    if kept:
        try:
            os.makedirs(kept, exist_ok=True)
            packages = kept
        except OSError as exc:
            log.warning("packages stay in the workspace: %s cannot be made (%s)", kept, exc)
    # Present from the start, so packages installed later import without a restart.
    os.makedirs(packages, exist_ok=True)
    env["PIP_TARGET"] = packages
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), packages) if p)
    env["PATH"] = os.pathsep.join(p for p in (env.get("PATH"), f"{packages}/bin") if p)


async def serve(args: argparse.Namespace) -> None:
    workspace = os.path.realpath(args.workspace)
    os.makedirs(workspace, exist_ok=True)
    runtime_dir = args.runtime_dir or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"sandbox-runtime-{os.getpid()}"
    )
    # The kernel gets no SANDBOX_RUNTIME_* (the token among them).
    token = os.environ.pop(runtime_auth.ENV, "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_RUNTIME_")}
    env.setdefault("HOME", workspace)
    pip_target_env(env, os.environ.get(PACKAGES_DIR_ENV))
    state = RuntimeState(
        workspace=workspace,
        runtime_dir=runtime_dir,
        kernel_name=args.kernel_name,
        env=env,
        kernel_cwd=kernel_cwd(args.kernel_cwd, workspace),
    )
    app = make_app(state, max_upload_bytes=args.max_upload_bytes, runtime_token=token)
    # Uploads stream and enforce their own bound; other bodies are small JSON.
    server = HTTPServer(app, max_body_size=max(args.max_upload_bytes, 1 << 20) + 1)
    if args.listen_fd is not None:
        listener = socket.socket(fileno=args.listen_fd)
        listener.setblocking(False)
        server.add_socket(listener)
        where = f"inherited socket {listener.getsockname() or args.listen_fd}"
    elif args.unix_socket:
        server.add_socket(bind_unix_socket(args.unix_socket, mode=0o600))
        where = args.unix_socket
    else:
        port = args.port if args.port is not None else 8888
        server.add_sockets(bind_sockets(port, address=args.ip))
        where = f"{args.ip}:{port}"
    log.info("runtime listening on %s, workspace %s", where, workspace)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    if not args.no_kernel:
        await state.kernel.start()
        if has_state(state.state_dir):  # a resume: the variables saved at suspend
            await state.kernel.restore_state(state.state_dir, RESTORE_TIMEOUT)
    if args.ready_fd is not None:
        with os.fdopen(args.ready_fd, "w") as ready:
            ready.write(json.dumps({"ready": True, "kernel": state.kernel.state.to_json()}) + "\n")
    await stop.wait()
    server.stop()
    await state.kernel.shutdown()


def confine(policy: landlock.Policy) -> None:
    """Put the policy's rules on this process; with a write guard, split off the
    guard first (write_guard.py), in a domain that may also read /proc (the
    callers' memory), which this process then gives up."""
    rules = policy.rules()
    if not (policy.write_guard and policy.data_only):
        landlock.restrict_self(rules)
        return
    if "/proc" in policy.read_only:
        guard_rules, then = rules, None
    else:
        guard_rules = replace(policy, read_only=(*policy.read_only, "/proc")).rules()
        then = rules
    landlock.restrict_self(guard_rules)
    pid = write_guard.start(landlock.guard_layer(policy.data_only), then=then)
    log.info("write guard %d keeps host-run names out of %s", pid, policy.data_only)


def guard_home(home: str, kept: str | None, workspace: str) -> None:
    """In a pod with the user's volume (their home, which their own server and
    shells read): the write guard over it, nothing else (the pod is the sandbox).

    When ``$HOME`` is on that volume (z2jh's /home/jovyan) it becomes the
    workspace, for this process and the kernel: their own dotfiles (IPython's
    profile and history, caches) could not be written there.
    """
    if not os.path.isdir(home):
        raise write_guard.GuardUnavailable(f"{home} is not a directory")
    layer = landlock.guard_layer(home)
    current = os.path.realpath(os.environ.get("HOME") or "/")
    if current == layer.bound or current.startswith(layer.bound + os.sep):
        os.makedirs(workspace, exist_ok=True)
        os.environ["HOME"] = os.path.realpath(workspace)
    pid = write_guard.start(layer, home=True, kept=kept)
    log.info("write guard %d keeps dotfiles and host-run names out of %s", pid, home)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.confine is not None:
        # Before any thread exists (the loop, ZMQ's I/O threads): they would keep
        # their rights. The rules are made here, from this process's own view of
        # the filesystem (inside bubblewrap, a sandbox's).
        confine(landlock.Policy.from_json(args.confine))
    elif os.environ.get(GUARD_HOME_ENV):
        try:
            guard_home(os.environ[GUARD_HOME_ENV], os.environ.get(PACKAGES_DIR_ENV), args.workspace)
        except (landlock.LandlockError, write_guard.GuardUnavailable) as exc:
            log.error(
                "the user's volume cannot be kept to data here (%s): the runtime does not "
                "start. Give the pod a node with Landlock (Linux 5.19+) and seccomp user "
                "notification (5.14+) allowed by its seccomp profile, or mount the volume "
                "read-only (template annotation jupyter-sandbox/user-volume-read-only)",
                exc,
            )
            return 3
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
