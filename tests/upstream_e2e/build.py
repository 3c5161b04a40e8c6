"""Build what upstream's e2e suites need: their compiled test binaries and, for a
new upstream version, upstream's controller.

Imports nothing beyond the standard library, PyYAML and tests/cluster's build
helpers, so CI can build these in the background before the Python packages
are installed (``python -m tests.upstream_e2e --build-only``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from tests.cluster import crdgen
from tests.cluster.controlplane import cache_root

REPO = Path(__file__).resolve().parents[2]
VERSION = crdgen.UPSTREAM_VERSION
SUITES = {"e2e": "./test/e2e", "extensions": "./test/e2e/extensions"}


def log(msg: str) -> None:
    print(f"[upstream-e2e] {msg}", file=sys.stderr, flush=True)


def _go_env() -> dict[str, str]:
    env = {
        **os.environ,
        "GOMODCACHE": str(cache_root() / "gomodcache"),
        "GOCACHE": str(cache_root() / "gocache"),
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }
    env.pop("GOFLAGS", None)
    return env


def build_suites() -> dict[str, Path]:
    """The compiled test binaries of both suites (cached by version)."""
    out_dir = cache_root() / f"agent-sandbox-{VERSION}" / "e2e"
    out_dir.mkdir(parents=True, exist_ok=True)
    module = crdgen.go_module(crdgen.UPSTREAM_MODULE, VERSION)
    go = crdgen.go_binary()
    assert go is not None
    binaries = {}
    # one build at a time per cache (two CI runs, or a run and a developer)
    with open(out_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for suite, package in SUITES.items():
            binaries[suite] = _build_suite(out_dir, suite, package, module, go)
    return binaries


def _build_suite(out_dir: Path, suite: str, package: str, module: Path, go: str) -> Path:
    exe = out_dir / f"{suite}.test"
    if not exe.exists():
        log(f"building {package} of {crdgen.UPSTREAM_MODULE}@{VERSION}")
        tmp = exe.with_suffix(".tmp")
        subprocess.run(
            [go, "test", "-c", "-o", str(tmp), package],
            cwd=module,
            env=_go_env(),
            check=True,
            timeout=1800,
        )
        tmp.rename(exe)
    return exe


def build_upstream_controller() -> Path:
    env = {**os.environ, "AGENT_SANDBOX_VERSION": VERSION}
    out = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "build-upstream.sh"), "controller"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    ).stdout
    return Path(out.strip().splitlines()[-1])
