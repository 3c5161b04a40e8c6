"""A router process with one static route, so its load can be measured alone.

``python -m benchmarks.router_server --port P --upstream HOST:PORT --secret S``
routes sandbox ``bench`` in namespace ``bench`` to the given runtime.
"""

from __future__ import annotations

import argparse
import asyncio

from tornado.httpserver import HTTPServer

from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import RouterContext
from jupyter_sandbox.router.tokens import TokenAuthority
from jupyter_sandbox.router.upstreams import Upstream


async def serve(port: int, upstream: Upstream, secret: str) -> None:
    async def lookup(namespace: str, name: str, _port: int) -> Upstream | None:
        return upstream if (namespace, name) == ("bench", "bench") else None

    ctx = RouterContext(lookup=lookup, authority=TokenAuthority(secret))
    HTTPServer(make_router_app(ctx)).listen(port, "127.0.0.1")
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--secret", required=True)
    args = parser.parse_args()
    host, _, port = args.upstream.rpartition(":")
    asyncio.run(serve(args.port, Upstream(host=host, port=int(port)), args.secret))


if __name__ == "__main__":
    main()
