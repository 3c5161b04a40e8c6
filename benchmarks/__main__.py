"""``python -m benchmarks [--quick]``: measure, print a table, write JSON.

Every figure is measured beside its baseline in the same run and reported as a
ratio with median and p90. ``--quick`` (what CI runs) uses few repetitions so the
benchmarks never rot; it asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from .stats import Figure, table


async def local_figures(args: argparse.Namespace) -> list[Figure]:
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane
    from jupyter_sandbox.kernelspec import install_kernelspec

    from . import browser_path, hostile_runtime, kernel_state, kernels, server_path, write_guard

    prefix = tempfile.mkdtemp(prefix="bench-kernels-")
    install_kernelspec("bench", prefix=prefix, name=kernels.SANDBOX)
    install_kernelspec("bench-files", prefix=prefix, name=kernels.SANDBOX_FILES)
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [os.path.join(prefix, "share", "jupyter"), *filter(None, [os.environ.get("JUPYTER_PATH")])]
    )
    plane = LocalControlPlane()
    await plane.ensure_daemon()
    # Kernels started here pass no notebook directory: the warm pool's figures.
    await plane.apply_pool("bench", {"replicas": 2, "files": "none"})
    await plane.apply_pool("bench-files", {"replicas": 0})
    figures: list[Figure] = [await hostile_runtime.neighbour_during_flood(args.round_trips)]
    try:
        await kernels.wait_pool_warm(plane, "bench")
        figures.append(await kernels.start_to_ready(plane, args.reps))
        figures.append(await kernels.start_in_notebook_dir(args.reps))
        figures += await write_guard.file_writes(max(1, args.reps // 3))
        figures += await kernels.execute_round_trip(plane, args.round_trips)
        figures += await server_path.server_figures(
            kernels.SANDBOX,
            kernels.PLAIN,
            args.round_trips,
            args.megabytes,
            max(1, args.reps // 3),
            settle=lambda: kernels.wait_pool_warm(plane, "bench"),
        )
        reason = browser_path.unavailable_reason()
        if reason:
            print(f"skipping the chromium figure: {reason}")
        else:
            figures.append(
                await browser_path.browser_round_trip(
                    kernels.SANDBOX,
                    kernels.PLAIN,
                    args.round_trips,
                    settle=lambda: kernels.wait_pool_warm(plane, "bench"),
                )
            )
        figures += await kernels.output_throughput(plane, args.megabytes, max(1, args.reps // 3))
        figures.append(await kernels.resume_vs_cold(plane, max(1, args.reps // 2)))
        figures += await kernel_state.state_figures(
            plane, [10] if args.quick else [10, 100, 1000], 1 if args.quick else 3
        )
        figures.append(await kernels.idle_memory(plane))
    finally:
        await plane.delete_pool("bench")
        await plane.delete_pool("bench-files")
        if args.own_daemon:
            await plane.stop_daemon()
        await plane.close()
    return figures


def kubernetes_figures(args: argparse.Namespace) -> list[Figure]:
    from . import kubernetes

    reason = kubernetes.unavailable_reason()
    if reason:
        print(f"skipping the Kubernetes figures: {reason}")
        return []
    exe, why = kubernetes.upstream_controller(build=not args.quick)
    if exe is None:
        print(f"Kubernetes claim burst without its upstream baseline: {why}")
    opts = kubernetes.Options(
        quick=args.quick,
        reps=5 if args.quick else 15,
        bursts=(20, 50) if args.quick else (100, 500),
        # single bursts scatter widely (16-68 claims/s for one controller): a median of 3
        rounds=1 if args.quick else 3,
        upstream=exe,
        upstream_note=why,
        profile=Path(args.profile_operator) if args.profile_operator else None,
    )
    return kubernetes.kubernetes_figures(opts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few repetitions (CI)")
    parser.add_argument(
        "--output", default="benchmarks/results", help="directory for the JSON report"
    )
    parser.add_argument("--only", choices=["local", "router", "kubernetes"], action="append")
    parser.add_argument(
        "--profile-operator",
        metavar="FILE",
        help="py-spy the operator during the largest claim burst (.svg, or .txt for raw)",
    )
    args = parser.parse_args(argv)
    args.reps = 3 if args.quick else 15
    args.round_trips = 30 if args.quick else 300
    args.megabytes = 5 if args.quick else 50
    args.router_seconds = 2 if args.quick else 5
    args.router_reps = 1 if args.quick else 3
    args.own_daemon = "JUPYTER_SANDBOX_HOME" not in os.environ
    if args.own_daemon:
        os.environ["JUPYTER_SANDBOX_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
        os.environ.setdefault("JUPYTER_SANDBOX_IDLE_TIMEOUT", "0")

    only = set(args.only or ["local", "router", "kubernetes"])
    figures: list[Figure] = []
    started = time.time()
    if "local" in only:
        figures += asyncio.run(local_figures(args))
    if "router" in only:
        from .router_load import router_figures

        figures += router_figures(args.router_seconds, args.router_reps, build=not args.quick)
    if "kubernetes" in only:
        figures += kubernetes_figures(args)
    print(table(figures))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "quick": args.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "figures": [f.to_json() for f in figures],
    }
    path = out / f"bench-{int(started)}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
