"""``jupyter-sandbox router``: the router as its own server (Kubernetes deployments).

``--resolve=api`` (the default inside a cluster) finds sandboxes through a
watch-backed cache of Sandbox status (pod IPs, service FQDN; see
``router/kubernetes.py``), falling back to DNS for sandboxes it does not know;
``--resolve=dns`` routes like upstream's sandbox-router, to
``<id>.<namespace>.svc.<cluster domain>``.  ``--allowed-namespaces`` refuses
every other namespace.  With ``--token-secret-file`` it admits only callers
holding a token scoped to the sandbox they address.  With ``--hub-api-url``
it also admits JupyterHub users, each only to the sandboxes whose claims name
them (``router/authorization.py``); that needs ``--resolve=api``.  The secret
must be 32 bytes or more; the same file serves upstream sandbox-router's
``--authz-scoped-token-secret-file``, whose ``v1.`` tokens are accepted too.

Timeouts (seconds, environment): ``PROXY_TIMEOUT_SECONDS`` for an exchange with a
sandbox, ``ROUTER_IDLE_TIMEOUT_SECONDS`` for a connection to send a request head
(and to idle between requests), ``ROUTER_BODY_TIMEOUT_SECONDS`` for a request body;
see ``router/settings.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from tornado.httpserver import HTTPServer

from ..protocol import runtime_auth
from .app import make_router_app
from .hub_auth import HubIdentity
from .settings import RouterContext
from .tokens import TokenAuthority
from .upstreams import Upstream

log = logging.getLogger(__name__)


def _in_cluster() -> bool:
    from ..kubernetes_credentials import in_cluster_available

    return in_cluster_available()


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
        help="secret for scoped sandbox tokens (or --hub-api-url, or both)",
    )
    parser.add_argument(
        "--previous-token-secret-file",
        default=os.environ.get("ROUTER_PREVIOUS_TOKEN_SECRET_FILE") or None,
        help="while rotating the token secret: tokens made with this one are accepted "
        "too (none are issued with it)",
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=os.environ.get("ROUTER_ALLOW_UNAUTHENTICATED", "") in ("1", "true", "yes"),
        help="with neither a token secret nor a hub, admit every caller that can reach "
        "the router (upstream's in-cluster behaviour); otherwise it refuses to start",
    )
    parser.add_argument(
        "--hub-api-url",
        default=os.environ.get("ROUTER_HUB_API_URL") or None,
        help="JupyterHub API (e.g. http://hub.jhub.svc:8081/hub/api): admit a hub user's "
        "API token to the sandboxes whose SandboxClaim is annotated with that user",
    )
    parser.add_argument(
        "--resolve",
        choices=["api", "dns"],
        default=os.environ.get("ROUTER_RESOLVE") or None,
        help="find sandboxes from the Kubernetes API (watch cache, default in a cluster) "
        "or by DNS name <id>.<ns>.svc.<cluster-domain> (default elsewhere)",
    )
    parser.add_argument(
        "--allowed-namespaces",
        default=os.environ.get("ROUTER_ALLOWED_NAMESPACES", ""),
        help="comma-separated namespaces the router serves; others are refused (404). "
        "With --resolve=api it then watches only these (a namespaced Role suffices)",
    )
    parser.add_argument(
        "--runtime-key-file",
        default=os.environ.get(runtime_auth.KEY_FILE_ENV) or None,
        help="the key sandbox runtimes' tokens are derived from (the operator's "
        "--runtime-key-file): the router presents each sandbox's token to its runtime",
    )
    parser.add_argument("--kubeconfig", default=None, help="for --resolve=api out of cluster")
    parser.add_argument("--context", default=None)
    parser.add_argument(
        "--no-dns-fallback",
        dest="dns_fallback",
        action="store_false",
        help="with --resolve=api, refuse sandboxes the API does not know",
    )
    args = parser.parse_args(argv)
    if args.resolve is None:
        args.resolve = "api" if (args.kubeconfig or _in_cluster()) else "dns"
    if args.previous_token_secret_file and not args.token_secret_file:
        parser.error("--previous-token-secret-file needs --token-secret-file")
    if not (args.token_secret_file or args.hub_api_url or args.allow_unauthenticated):
        parser.error(
            "no way to authorize callers: give --token-secret-file "
            "(ROUTER_TOKEN_SECRET_FILE) or --hub-api-url (ROUTER_HUB_API_URL); "
            "--allow-unauthenticated (ROUTER_ALLOW_UNAUTHENTICATED=1) admits every "
            "caller that can reach the router"
        )
    if args.runtime_key_file and args.resolve != "api":
        parser.error("--runtime-key-file needs --resolve=api (tokens name the sandbox's uid)")
    if args.hub_api_url:
        if args.resolve != "api":
            parser.error("--hub-api-url needs --resolve=api (claims name their users)")
        if not args.hub_api_url.startswith(("http://", "https://")):
            parser.error(f"--hub-api-url must be an http(s) URL, not {args.hub_api_url!r}")
    return args


async def make_lookup(args: argparse.Namespace) -> tuple[Any, Any]:
    """The router's lookup for ``args``, and the resolver to stop (or None)."""
    allowed = {n.strip() for n in args.allowed_namespaces.split(",") if n.strip()}
    if args.resolve == "api":
        from ..kube.client import Client, load_config
        from ..kubernetes_credentials import CredentialsError
        from .kubernetes import SandboxResolver

        try:
            settings = await asyncio.to_thread(load_config, args.kubeconfig, args.context)
        except CredentialsError as exc:
            raise SystemExit(f"jupyter-sandbox router: {exc}") from None
        resolver = SandboxResolver(
            Client(settings, user_agent="jupyter-sandbox-router"),
            allowed_namespaces=allowed or None,
            cluster_domain=args.cluster_domain,
            fallback_dns=args.dns_fallback,
            track_owners=bool(args.hub_api_url),
            runtime_key=load_runtime_key(args.runtime_key_file),
        ).start()
        return resolver.lookup, resolver

    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        if allowed and namespace not in allowed:
            return None
        return Upstream(host=f"{name}.{namespace}.svc.{args.cluster_domain}", port=port)

    return lookup, None


def load_authority(path: str, previous: str | None = None) -> TokenAuthority:
    """The token authority for the secret in ``path`` (and, while rotating, the one
    in ``previous``); exits with the reason if unusable (unreadable, or under 32
    bytes: such a secret makes every sandbox's token forgeable)."""
    secrets: list[bytes] = []
    for flag, where in (("--token-secret-file", path), ("--previous-token-secret-file", previous)):
        if where is None:
            continue
        try:
            with open(where, "rb") as handle:
                secret = handle.read()
            TokenAuthority(secret)  # each checked on its own, so the message names it
        except (OSError, ValueError) as exc:
            raise SystemExit(f"jupyter-sandbox router: {flag} {where}: {exc}") from None
        secrets.append(secret)
    return TokenAuthority(secrets[0], secrets[1:])


def load_runtime_key(path: str | None) -> bytes | None:
    """The runtime key in ``path`` (None: no path); exits with the reason if unusable."""
    if path is None:
        return None
    try:
        return runtime_auth.load_key(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"jupyter-sandbox router: --runtime-key-file {path}: {exc}") from None


async def serve(args: argparse.Namespace) -> None:
    authority = (
        load_authority(args.token_secret_file, args.previous_token_secret_file)
        if args.token_secret_file
        else None
    )

    lookup, resolver = await make_lookup(args)
    # Listen only once the Sandbox cache is filled: before that every known sandbox
    # would be routed by its DNS name, and a caller's X-Sandbox-Pod-IP refused.
    if resolver is not None and not await resolver.wait_synced(60.0):
        log.warning("the Sandbox cache did not sync in 60 s; routing by DNS until it does")
    hub = HubIdentity(args.hub_api_url) if args.hub_api_url else None
    ctx = RouterContext(
        lookup=lookup,
        authority=authority,
        hub=hub,
        owner_of=resolver.owner_of if hub is not None else None,
        default_namespace=args.default_namespace,
    )
    server = HTTPServer(make_router_app(ctx), max_body_size=1 << 34, **ctx.server_options())
    server.listen(args.port, address=args.address)
    log.info(
        "router on %s:%s (resolve: %s, auth: %s, runtime tokens: %s)",
        args.address,
        args.port,
        args.resolve,
        ctx.auth.describe(),
        "presented" if args.runtime_key_file else "none (runtimes must not ask for them)",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    await ctx.close()
    if resolver is not None:
        await resolver.stop()
        await resolver.client.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
