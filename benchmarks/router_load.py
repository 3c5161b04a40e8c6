"""Router HTTP proxy: requests/s and p99 latency with wrk, our router against the
runtime reached directly and against upstream's Go sandbox-router (built from the
same module as the upstream controller, ``build-upstream.sh router``) in front of
the same runtime."""

from __future__ import annotations

import contextlib
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

from .ports import free_port
from .stats import Figure, Series
from .upstream import upstream_program

SECRET = "benchmark-secret-0123456789abcdef0123456789"


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
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if errors:  # a figure of error answers would measure nothing
        raise RuntimeError(f"{url}: {errors.group(1)} non-2xx answers under load")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    assert p99 is not None, out
    amount = float(p99.group(1))
    unit = p99.group(2)
    ms = amount / 1000 if unit == "us" else amount * 1000 if unit == "s" else amount
    return rps, ms


def _go_router(exe: str, port: int) -> list[str]:
    return [
        exe,
        f"--http-bind-address=127.0.0.1:{port}",
        f"--metrics-bind-address=127.0.0.1:{free_port()}",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        # the benchmark's runtime listens on loopback, named by X-Sandbox-Pod-IP
        "--allow-loopback-pod-ip",
    ]


def router_figures(seconds: int, reps: int, build: bool = False) -> list[Figure]:
    if shutil.which("wrk") is None:
        print("wrk is not installed: skipping the router load figures", file=sys.stderr)
        return []
    go_exe, why = upstream_program("router", build)
    if go_exe is None:
        print(f"router load without the upstream Go router: {why}", file=sys.stderr)
    runtime_port, router_port, go_port = free_port(), free_port(), free_port()
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
    # a small runtime endpoint every router proxies (the Go router answers /healthz
    # itself, and /readyz is 503 on a runtime without a kernel)
    path = "/exists/bench.txt"
    env_note = f"GET {path}, wrk -t1, {seconds}s per run"
    go_note = (
        f"{env_note}; ours checks a scoped token per request, the Go router runs with its "
        "default authorizer (allow all) and X-Sandbox-Pod-IP"
    )
    go_headers = {
        "X-Sandbox-ID": "bench",
        "X-Sandbox-Namespace": "bench",
        "X-Sandbox-Port": str(runtime_port),
        "X-Sandbox-Pod-IP": "127.0.0.1",
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process(runtime, runtime_port))
        stack.enter_context(_process(router, router_port))
        if go_exe is not None:
            stack.enter_context(_process(_go_router(str(go_exe), go_port), go_port))
        for connections in (10, 50):
            via_rps, via_p99 = Series("via router", "req/s"), Series("via router", "ms")
            direct_rps, direct_p99 = Series("direct", "req/s"), Series("direct", "ms")
            go_rps, go_p99 = Series("Go sandbox-router", "req/s"), Series("Go sandbox-router", "ms")
            for _ in range(reps):
                rps, p99 = wrk(
                    f"http://127.0.0.1:{router_port}{path}", connections, seconds, headers
                )
                via_rps.values.append(rps)
                via_p99.values.append(p99)
                rps, p99 = wrk(f"http://127.0.0.1:{runtime_port}{path}", connections, seconds, {})
                direct_rps.values.append(rps)
                direct_p99.values.append(p99)
                if go_exe is not None:
                    rps, p99 = wrk(
                        f"http://127.0.0.1:{go_port}{path}", connections, seconds, go_headers
                    )
                    go_rps.values.append(rps)
                    go_p99.values.append(p99)
            if go_exe is not None:
                figures.append(
                    Figure(
                        f"router requests/s vs upstream Go router, concurrency {connections}",
                        via_rps,
                        go_rps,
                        "stated",
                        higher_is_better=True,
                        notes=go_note,
                    )
                )
                figures.append(
                    Figure(
                        f"router p99 latency vs upstream Go router, concurrency {connections}",
                        via_p99,
                        go_p99,
                        "stated",
                        notes=go_note,
                    )
                )
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
