"""``python -m jupyter_sandbox.router.local``: the local backend's router, a process of its own.

The daemon starts it and restarts it if it dies; it can be killed and come back
without touching any sandbox, just as the router Deployment can on Kubernetes.
Sandbox ``NAME`` in namespace ``local`` is the socket the daemon binds for its
runtime in ``<state dir>/sockets/`` (see ``listen_socket``), where no sandbox can reach; the
token secret is the daemon's.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import stat
import sys
from pathlib import Path

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from ..control_plane.local.model import NAMESPACE
from ..control_plane.local.paths import listen_socket
from .app import make_router_app
from .settings import RouterContext
from .tokens import TokenAuthority
from .upstreams import Upstream

log = logging.getLogger("jupyter_sandbox.router.local")

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Run in the child before exec: the kernel sends SIGTERM when the daemon dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


async def serve(state_dir: Path, port: int, parent: int | None) -> None:
    authority = TokenAuthority((state_dir / "router-secret").read_text().strip())

    async def lookup(namespace: str, name: str, _port: int) -> Upstream | None:
        if namespace != NAMESPACE:
            return None
        path = listen_socket(state_dir, name)
        try:
            is_socket = stat.S_ISSOCK(os.lstat(path).st_mode)
        except OSError:
            return None
        return Upstream(unix_socket=str(path)) if is_socket else None

    ctx = RouterContext(lookup=lookup, authority=authority, default_namespace=NAMESPACE)
    server = HTTPServer(make_router_app(ctx), max_body_size=1 << 34, **ctx.server_options())
    server.add_sockets(bind_sockets(port, address="127.0.0.1"))
    log.info("local router on 127.0.0.1:%s for %s", port, state_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 10)
        except TimeoutError:
            await ctx.prune()
            if parent is not None and os.getppid() != parent:
                break  # the daemon is gone
    server.stop()
    await ctx.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jupyter_sandbox.router.local")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--parent", type=int, default=None, help="exit when this pid is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    asyncio.run(serve(args.state_dir, args.port, args.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
