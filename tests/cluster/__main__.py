"""Bring the test control plane up or down by hand.

    python -m tests.cluster up      # idempotent; prints the kubeconfig path
    python -m tests.cluster status
    python -m tests.cluster down    # idempotent; kills everything, removes data

    python -m tests.cluster node-up     # a second control plane (no kwok) + a real
                                        # node (containerd, runc, CNI, kubelet)
    python -m tests.cluster node-down   # idempotent; processes, mounts, links, cgroups

    python -m tests.cluster generate-crds   # deploy/crds/ from api/crds/ (tests/cluster/crdgen.py)

State lives in ``$JUPYTER_SANDBOX_CACHE/run/cluster.json`` and ``run/node-cluster/``
(outside the repo).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from .controlplane import ControlPlane, cache_root, missing_binaries, write_state


def state_file() -> Path:
    d = cache_root() / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d / "cluster.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _read_state() -> dict | None:
    f = state_file()
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text())
    except ValueError:
        return None


def cmd_up(args: argparse.Namespace) -> int:
    st = _read_state()
    if st and all(_alive(p) for p in st["pids"].values()):
        print(st["kubeconfig"])
        return 0
    if st:
        cmd_down(args)
    missing = missing_binaries(with_kwok=not args.no_kwok)
    if missing:
        print(f"missing binaries: {missing}; run tests/cluster/build.sh", file=sys.stderr)
        return 1
    workdir = cache_root() / "run" / "cluster"
    shutil.rmtree(workdir, ignore_errors=True)
    cp = ControlPlane(workdir=workdir, with_kwok=not args.no_kwok, nodes=args.nodes)
    t0 = time.monotonic()
    cp.start()
    write_state(cp, state_file())
    print(f"control plane up in {time.monotonic() - t0:.1f}s at {cp.url}", file=sys.stderr)
    print(cp.kubeconfig)
    # the children run in their own sessions and outlive us; forget them so
    # Popen's destructor does not complain
    cp.procs.clear()
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    st = _read_state()
    if not st:
        return 0
    pids = list(st["pids"].values())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if _alive(pid):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
            for pid in pids:  # reap if they happen to be our children
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not any(_alive(p) for p in pids):
            break
    shutil.rmtree(st["workdir"], ignore_errors=True)
    state_file().unlink(missing_ok=True)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    st = _read_state()
    if not st:
        print("down")
        return 1
    alive = {n: _alive(p) for n, p in st["pids"].items()}
    print(json.dumps({"url": st["url"], "kubeconfig": st["kubeconfig"], "alive": alive}, indent=2))
    return 0 if all(alive.values()) else 1


def node_dir() -> Path:
    return cache_root() / "run" / "node-cluster"


def cmd_node_up(args: argparse.Namespace) -> int:
    from .node import Node, default_node_ip, missing_node_parts

    st = _read_node_state()
    if st and all(_alive(p) for p in st["pids"].values()):
        print(st["kubeconfig"])
        return 0
    cmd_node_down(args)
    missing = missing_binaries(with_kwok=False) + missing_node_parts()
    if missing:
        print(f"missing: {missing}; run tests/cluster/build.sh --node", file=sys.stderr)
        return 1
    d = node_dir()
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cp = ControlPlane(
        workdir=d / "controlplane", with_kwok=False, pod_reachable_address=default_node_ip()
    )
    cp.start()
    (d / "controlplane.json").write_text(
        json.dumps({"workdir": str(cp.workdir), "pids": {n: p.pid for n, p in cp.procs.items()}})
    )
    node = Node(cp, workdir=d / "node", kube_proxy=True)
    try:
        node.start()
    except BaseException:
        cmd_node_down(args)
        raise
    state = {
        "url": cp.url,
        "kubeconfig": str(cp.kubeconfig),
        "images": node.images,
        "node": node.name,
        "pids": {n: p.pid for n, p in cp.procs.items()} | {n: p.pid for n, p in node.procs.items()},
    }
    (d / "state.json").write_text(json.dumps(state, indent=1))
    timings = " ".join(f"{k}={v:.1f}s" for k, v in node.timings.items())
    print(f"node cluster up in {time.monotonic() - t0:.1f}s ({timings})", file=sys.stderr)
    print(f"images: {node.images}", file=sys.stderr)
    print(cp.kubeconfig)
    cp.procs.clear()
    node.procs.clear()
    return 0


def _read_node_state() -> dict | None:
    f = node_dir() / "state.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def cmd_node_down(args: argparse.Namespace) -> int:
    from .node import load_state, orphaned_states, teardown

    if getattr(args, "all", False):
        for st in orphaned_states():
            for line in teardown(st):
                print(f"node-down ({st.workdir}): {line}", file=sys.stderr)
    d = node_dir()
    if not d.exists():
        return 0
    nst = load_state(d / "node")
    if nst:
        for line in teardown(nst):
            print(f"node-down: {line}", file=sys.stderr)
    try:
        cst = json.loads((d / "controlplane.json").read_text())
    except (OSError, ValueError):
        cst = None
    if cst:
        # its data is thrown away: no need to wait long for a graceful shutdown
        pids = list(cst["pids"].values())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                if _alive(pid):
                    try:
                        os.killpg(pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.1)
            if not any(_alive(p) for p in pids):
                break
    shutil.rmtree(d, ignore_errors=True)
    return 0


def cmd_generate_crds(args: argparse.Namespace) -> int:
    from . import crdgen

    for path in crdgen.write(crdgen.kubernetes_schemas()):
        print(path.relative_to(crdgen.REPO))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cluster")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--no-kwok", action="store_true", help="no scheduler/kwok (pods never run)")
    up.add_argument("--nodes", type=int, default=1)
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("node-up")
    nd = sub.add_parser("node-down")
    nd.add_argument(
        "--all", action="store_true", help="also nodes of test runs that were killed (temp dirs)"
    )
    sub.add_parser("generate-crds", help="deploy/crds/ from api/crds/ and Kubernetes' schemas")
    a = p.parse_args(argv)
    cmds = {
        "up": cmd_up,
        "down": cmd_down,
        "status": cmd_status,
        "node-up": cmd_node_up,
        "node-down": cmd_node_down,
        "generate-crds": cmd_generate_crds,
    }
    return cmds[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
