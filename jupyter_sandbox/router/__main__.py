"""``jupyter-sandbox router``: the router as its own server (Kubernetes deployments).

Without a resolver of its own it routes like upstream's sandbox-router, to
``<id>.<namespace>.svc.<cluster domain>``; with ``--token-secret-file`` it admits
only callers holding a token scoped to the sandbox they address.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from tornado.httpserver import HTTPServer

from .app import make_router_app
from .settings import RouterContext
from .tokens import TokenAuthority
from .upstreams import Upstream


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="jupyter-sandbox router")
    parser.add_argument("--port", type=int, default=int(os.environ.get("ROUTER_PORT", "8080")))
    parser.add_argument("--address", default="0.0.0.0")
    parser.add_argument(
        "--cluster-domain", default=os.environ.get("CLUSTER_DOMAIN", "cluster.local")
    )
    parser.add_argument("--default-namespace", default="default")
    parser.add_argument(
        "--token-secret-file",
        default=os.environ.get("ROUTER_TOKEN_SECRET_FILE"),
        help="secret for scoped sandbox tokens; without it the router "
        "admits every caller (upstream's in-cluster behaviour)",
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    authority = None
    if args.token_secret_file:
        with open(args.token_secret_file) as handle:
            authority = TokenAuthority(handle.read().strip())

    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        return Upstream(host=f"{name}.{namespace}.svc.{args.cluster_domain}", port=port)

    ctx = RouterContext(
        lookup=lookup, authority=authority, default_namespace=args.default_namespace
    )
    server = HTTPServer(make_router_app(ctx), max_body_size=1 << 34)
    server.listen(args.port, address=args.address)
    logging.getLogger(__name__).info(
        "router on %s:%s (auth: %s)",
        args.address,
        args.port,
        "scoped tokens" if authority else "none",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
