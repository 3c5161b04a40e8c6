"""Entry point: ``python -m jupyter_sandbox.operator`` and ``jupyter-sandbox operator``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import time
from typing import Any

from ..protocol import runtime_auth

_STD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                out[k] = v if isinstance(v, str | int | float | bool | None) else str(v)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _labels(s: str) -> dict[str, str]:
    out = {}
    for part in filter(None, s.split(",")):
        k, _, v = part.partition("=")
        out[k.strip()] = v.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jupyter-sandbox operator", description="agent-sandbox v1beta1 operator"
    )
    p.add_argument(
        "--kubeconfig",
        default=None,
        help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    p.add_argument("--namespace", default=None, help="watch only this namespace (default: all)")
    p.add_argument(
        "--workers", type=int, default=8, help="worker scale; sandbox and claim controllers get 2x"
    )
    p.add_argument(
        "--leader-elect", dest="leader_elect", action=argparse.BooleanOptionalAction, default=True
    )
    p.add_argument(
        "--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default")
    )
    p.add_argument("--leader-election-id", default="jupyter-sandbox-operator")
    p.add_argument(
        "--identity", default=None, help="leader election identity (default: hostname_random)"
    )
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    p.add_argument(
        "--metrics-bind-address",
        default="127.0.0.1:8080",
        help='host:port for /metrics, /healthz, /readyz; "0" disables',
    )
    p.add_argument("--cluster-domain", default="cluster.local")
    p.add_argument(
        "--warm-pool-replenish-delay",
        type=float,
        default=0.0,
        help="seconds to hold pool refill after members are adopted; re-armed while the pool "
        "keeps draining (0: refill at once)",
    )
    p.add_argument(
        "--router-namespace",
        default="agent-sandbox-system",
        help="namespace of the router pods (NetworkPolicy ingress)",
    )
    p.add_argument(
        "--router-pod-labels",
        default="app=sandbox-router",
        help="k=v,... labels of the router pods",
    )
    p.add_argument(
        "--runtime-key-file",
        default=os.environ.get(runtime_auth.KEY_FILE_ENV) or None,
        help="key for each sandbox's runtime token (the router's --runtime-key-file): "
        "the token goes into a Secret of the sandbox's own and its runtime's environment",
    )
    p.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(args.log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    from ..kubernetes_credentials import CredentialsError
    from .manager import Operator, Options

    identity = args.identity or f"{socket.gethostname()}_{os.getpid()}"
    runtime_key = None
    if args.runtime_key_file:
        try:
            runtime_key = runtime_auth.load_key(args.runtime_key_file)
        except (OSError, ValueError) as exc:
            print(f"jupyter-sandbox operator: error: --runtime-key-file: {exc}", file=sys.stderr)
            return 2
    opts = Options(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=args.namespace,
        workers=args.workers,
        leader_elect=args.leader_elect,
        leader_election_namespace=args.leader_election_namespace,
        leader_election_id=args.leader_election_id,
        identity=identity,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        metrics_bind_address=args.metrics_bind_address,
        cluster_domain=args.cluster_domain,
        warm_pool_replenish_delay=args.warm_pool_replenish_delay,
        router_namespace=args.router_namespace,
        router_labels=_labels(args.router_pod_labels),
        runtime_key=runtime_key,
    )
    logging.getLogger("jupyter_sandbox.operator").info(
        "starting operator", extra={"identity": identity}
    )
    try:
        return asyncio.run(Operator(opts).run())
    except CredentialsError as exc:
        print(f"jupyter-sandbox operator: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
