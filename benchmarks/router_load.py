"""Router HTTP proxy: requests/s and p99 latency with wrk, router vs direct to the runtime."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from jupyter_sandbox.router.tokens import Scope, TokenAuthority

from .stats import Figure, Series

SECRET = "benchmark-secret-0123456789abcdef0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


@contextmanager
def _process(argv: list[str], port: int) -> Iterator[None]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port)
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def wrk(url: str, connections: int, seconds: int, headers: dict[str, str]) -> tuple[float, float]:
    """Requests/s and p99 latency (ms)."""
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    for key, value in headers.items():
        argv += ["-H", f"{key}: {value}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    assert p99 is not None, out
    value, unit = float(p99.group(1)), p99.group(2)
    ms = value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    return rps, ms


def router_figures(seconds: int, reps: int) -> list[Figure]:
    if shutil.which("wrk") is None:
        print("wrk is not installed: skipping the router load figures", file=sys.stderr)
        return []
    runtime_port, router_port = _free_port(), _free_port()
    workspace = tempfile.mkdtemp(prefix="bench-runtime-")
    token = TokenAuthority(SECRET).issue(Scope("bench", "bench"))
    headers = {
        "X-Sandbox-ID": "bench",
        "X-Sandbox-Namespace": "bench",
        "Authorization": f"Bearer {token}",
    }
    figures = []
    runtime = [
        sys.executable,
        "-m",
        "jupyter_sandbox.runtime",
        "--ip",
        "127.0.0.1",
        "--port",
        str(runtime_port),
        "--workspace",
        workspace,
        "--no-kernel",
    ]
    router = [
        sys.executable,
        "-m",
        "benchmarks.router_server",
        "--port",
        str(router_port),
        "--upstream",
        f"127.0.0.1:{runtime_port}",
        "--secret",
        SECRET,
    ]
    env_note = f"GET /healthz, wrk -t1, {seconds}s per run"
    with _process(runtime, runtime_port), _process(router, router_port):
        for connections in (10, 50):
            via_rps, via_p99 = Series("via router", "req/s"), Series("via router", "ms")
            direct_rps, direct_p99 = Series("direct", "req/s"), Series("direct", "ms")
            for _ in range(reps):
                rps, p99 = wrk(
                    f"http://127.0.0.1:{router_port}/healthz", connections, seconds, headers
                )
                via_rps.values.append(rps)
                via_p99.values.append(p99)
                rps, p99 = wrk(f"http://127.0.0.1:{runtime_port}/healthz", connections, seconds, {})
                direct_rps.values.append(rps)
                direct_p99.values.append(p99)
            figures.append(
                Figure(
                    f"router requests/s, concurrency {connections}",
                    via_rps,
                    direct_rps,
                    "stated",
                    higher_is_better=True,
                    notes=env_note,
                )
            )
            figures.append(
                Figure(
                    f"router p99 latency, concurrency {connections}",
                    via_p99,
                    direct_p99,
                    "stated",
                    notes=env_note,
                )
            )
    shutil.rmtree(workspace, ignore_errors=True)
    return figures
