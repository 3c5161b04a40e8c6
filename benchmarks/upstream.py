"""The upstream agent-sandbox programs used as baselines, built by build-upstream.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("build-upstream.sh")
NAMES = {"controller": "controller", "router": "Go sandbox-router"}


def upstream_program(what: str, build: bool) -> tuple[Path | None, str]:
    """The binary of upstream's ``controller`` or ``router`` (building it if
    ``build``), or None and why not."""
    argv = ["bash", str(SCRIPT), what] + ([] if build else ["--check"])
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines and Path(lines[-1]).is_file():
        return Path(lines[-1]), ""
    name = NAMES[what]
    if not build:
        return None, (
            f"the upstream agent-sandbox {name} is not built (quick mode does not build it; "
            f"run benchmarks/build-upstream.sh {what} or the full mode once)"
        )
    err = proc.stderr.strip().splitlines()
    return None, f"building the upstream {name} failed: {err[-1] if err else proc.returncode}"
