"""``jupyter-sandbox claim-service``: claims for hub users, with the service's credentials.

Run it in the namespace of the hub and its SandboxWarmPools, as a service
account with the Role of ``deploy/jupyterhub/rbac.yaml``; point the
single-user servers' kernelspec at it (backend option ``claim_service_url``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from tornado.httpserver import HTTPServer

from ..control_plane.base import ClaimError
from ..router.hub_auth import HubIdentity
from .app import ServiceContext, make_app
from .limits import Limits, UserLimits

if TYPE_CHECKING:
    from ..control_plane.kubernetes import KubernetesControlPlane

log = logging.getLogger(__name__)


def _limit(kind: type) -> Any:
    def convert(text: str) -> Any:
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError("a limit is 0 (none) or more")
        return value

    return convert


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="jupyter-sandbox claim-service")
    parser.add_argument("--port", type=int, default=int(env("CLAIM_SERVICE_PORT", "8090")))
    parser.add_argument("--address", default="0.0.0.0")
    parser.add_argument(
        "--hub-api-url",
        default=env("CLAIM_SERVICE_HUB_API_URL") or None,
        help="JupyterHub API (e.g. http://hub:8081/hub/api): who holds a token",
    )
    parser.add_argument(
        "--router-url",
        default=env("CLAIM_SERVICE_ROUTER_URL") or None,
        help="the router's URL as the single-user servers reach it (put in each claim's endpoint)",
    )
    parser.add_argument(
        "--namespace",
        default=env("CLAIM_SERVICE_NAMESPACE") or None,
        help="where the claims and pools are (default: the service's own namespace)",
    )
    parser.add_argument(
        "--max-claims-per-user",
        type=_limit(int),
        default=int(env("CLAIM_SERVICE_MAX_CLAIMS_PER_USER", "10")),
        help="claims (running or suspended) a user may hold at once; 0: no limit",
    )
    parser.add_argument(
        "--cold-starts-per-minute",
        type=_limit(float),
        default=float(env("CLAIM_SERVICE_COLD_STARTS_PER_MINUTE", "10")),
        help="claims a user may make per minute while the pool has no warm sandbox; 0: no limit",
    )
    parser.add_argument("--kubeconfig", default=None, help="out of cluster")
    parser.add_argument("--context", default=None)
    args = parser.parse_args(argv)
    if not args.hub_api_url:
        parser.error("--hub-api-url (CLAIM_SERVICE_HUB_API_URL) is required: it says who calls")
    if not args.hub_api_url.startswith(("http://", "https://")):
        parser.error(f"--hub-api-url must be an http(s) URL, not {args.hub_api_url!r}")
    if not args.router_url or not args.router_url.startswith(("http://", "https://")):
        parser.error("--router-url (CLAIM_SERVICE_ROUTER_URL) must be the router's http(s) URL")
    return args


def make_plane(args: argparse.Namespace) -> KubernetesControlPlane:
    from ..control_plane.kubernetes import KubernetesControlPlane

    options: dict[str, Any] = {
        "router_url": args.router_url,
        "router_auth": "none",  # each caller shows the router its own hub token
        "save_state": False,  # the caller saves its kernel's state through the router
    }
    for key in ("namespace", "kubeconfig", "context"):
        if getattr(args, key):
            options[key] = getattr(args, key)
    return KubernetesControlPlane(**options)


async def serve(args: argparse.Namespace) -> None:
    try:
        plane = make_plane(args)
    except ClaimError as exc:
        raise SystemExit(f"jupyter-sandbox claim-service: {exc}") from None
    try:
        await plane.list_pools()  # the credentials and the Role, checked before serving
    except ClaimError as exc:
        await plane.close()
        raise SystemExit(f"jupyter-sandbox claim-service: {exc}") from None
    limits = Limits(args.max_claims_per_user, args.cold_starts_per_minute)
    ctx = ServiceContext(plane, HubIdentity(args.hub_api_url), UserLimits(limits))
    server = HTTPServer(make_app(ctx), max_body_size=1024 * 1024, idle_connection_timeout=120)
    server.listen(args.port, address=args.address)
    log.info(
        "claim service on %s:%s for namespace %s (at most %s claims per user, %s cold starts "
        "per minute; 0 is no limit)",
        args.address,
        args.port,
        plane.namespace,
        limits.max_claims_per_user,
        f"{limits.cold_starts_per_minute:g}",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    await ctx.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
