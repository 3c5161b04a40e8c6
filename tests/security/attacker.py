"""An attacker's session, run as its own process: ``python -m tests.security.attacker``.

It starts (through the SDK, as any user would) a local daemon for the ``HOME``
and working directory it is given, claims a sandbox, runs the probe code given
on standard input *inside* the sandbox and prints one JSON line: what the probe
printed, plus the claim's endpoint so the caller can drive the router with the
sandbox's own token. The daemon is stopped before it exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from jupyter_sandbox.client import SandboxClient
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.paths import state_dir

# Probe code run inside a sandbox starts with this: ``attempt(name, act)``
# records in ``out`` "made", or the type of the OSError it met.
ATTEMPT = """
import json
out = {}
def attempt(name, act):
    try:
        act()
        out[name] = "made"
    except OSError as exc:
        out[name] = type(exc).__name__
"""


def run_attacker(code: str, env: dict[str, str], cwd: Path) -> dict[str, object]:
    """Run this harness in a fresh process: ``code`` runs inside a sandbox it claims.

    Answers the harness's report (``stdout``, ``stderr``, ``exit_code`` of the code).
    """
    done = subprocess.run(
        [sys.executable, "-m", "tests.security.attacker"],
        cwd=cwd,
        env=env,
        input=code,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0, result
    return result


def main() -> int:
    probe = sys.stdin.read()
    result: dict[str, object] = {"state_dir": str(state_dir())}
    # A pool of the attacker's choosing: ATTACK_POOL_SPEC is its JSON spec.
    pool = "default"
    spec = os.environ.get("ATTACK_POOL_SPEC")
    try:
        if spec:
            pool = "attack"
            asyncio.run(_apply_pool(pool, json.loads(spec)))
        with SandboxClient() as client:
            with client.create_sandbox(warmpool=pool, sandbox_ready_timeout=120) as sb:
                run = sb.commands.run(f"python3 -c {_quote(probe)}", timeout=60)
                result.update(stdout=run.stdout, stderr=run.stderr, exit_code=run.exit_code)
    finally:
        asyncio.run(_stop())
    print(json.dumps(result))
    return 0


def _quote(code: str) -> str:
    return "'" + code.replace("'", "'\"'\"'") + "'"


async def _apply_pool(name: str, spec: dict[str, object]) -> None:
    plane = LocalControlPlane()
    try:
        await plane.apply_pool(name, spec)
    finally:
        await plane.close()


async def _stop() -> None:
    plane = LocalControlPlane(autostart=False)
    try:
        await plane.stop_daemon()
    finally:
        await plane.close()


if __name__ == "__main__":
    sys.exit(main())
