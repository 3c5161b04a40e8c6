"""Kernel figures: start-to-ready, execute round trip, output throughput, resume, memory."""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from queue import Empty
from typing import Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from jupyter_sandbox.control_plane.base import ClaimRequest
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.utils.background import background

from .ports import free_port
from .stats import Figure, Series

SANDBOX = "sandbox-bench"
SANDBOX_FILES = "sandbox-bench-files"  # binds the notebook's directory: a sandbox per kernel
PLAIN = "python3"


async def wait_pool_warm(plane: LocalControlPlane, pool: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = next(p for p in await plane.list_pools() if p.name == pool)
        if status.ready >= status.replicas:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"pool {pool} not warm: {status}")
        await asyncio.sleep(0.1)


async def start_ready(
    kernel_name: str, cwd: str | None = None
) -> tuple[float, AsyncKernelManager, Any]:
    """Seconds from start_kernel to the first kernel_info reply (the kernel answers).

    Not to the return of ``wait_for_ready``: after the reply that also waits for
    one more IOPub message and then drains IOPub until 0.2 s pass in silence, a
    fixed client-side wait that would put a floor under every kernel's figure.
    ``wait_for_ready`` still runs afterwards, untimed, so the client is in the
    same state as in normal use.
    """
    km = AsyncKernelManager(kernel_name=kernel_name)
    started = time.perf_counter()
    await km.start_kernel(**({"cwd": cwd} if cwd else {}))
    kc = km.client()
    kc.start_channels()
    deadline = started + 120
    sent: set[str] = set()
    while True:
        sent.add(kc.kernel_info())  # again every 0.5 s, as wait_for_ready does
        try:
            reply = await kc.get_shell_msg(timeout=0.5)
        except Empty:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{kernel_name}: no kernel_info reply") from None
            continue
        if reply["parent_header"].get("msg_id") in sent:
            break
    seconds = time.perf_counter() - started
    await kc.wait_for_ready(timeout=120)
    return seconds, km, kc


async def stop(km: AsyncKernelManager, kc: Any) -> None:
    kc.stop_channels()
    await km.shutdown_kernel(now=True)


async def start_to_ready(plane: LocalControlPlane, reps: int) -> Figure:
    sandbox, plain = Series("sandbox, warm pool", "s"), Series("plain ipykernel", "s")
    for _ in range(reps):
        await wait_pool_warm(plane, "bench")
        seconds, km, kc = await start_ready(SANDBOX)
        sandbox.values.append(seconds)
        await stop(km, kc)
        seconds, km, kc = await start_ready(PLAIN)
        plain.values.append(seconds)
        await stop(km, kc)
    return Figure("kernel start-to-ready (local)", sandbox, plain, "sandbox <= 0.2x")


async def start_in_notebook_dir(reps: int) -> Figure:
    """A notebook's kernel: its directory bound, so a sandbox started for it (no warm one)."""
    sandbox = Series("sandbox, notebook directory bound", "s")
    plain = Series("plain ipykernel", "s")
    with tempfile.TemporaryDirectory(prefix="bench-notebooks-") as folder:
        for _ in range(reps):
            seconds, km, kc = await start_ready(SANDBOX_FILES, cwd=folder)
            sandbox.values.append(seconds)
            await stop(km, kc)
            seconds, km, kc = await start_ready(PLAIN, cwd=folder)
            plain.values.append(seconds)
            await stop(km, kc)
    return Figure("kernel start-to-ready in a notebook directory (local)", sandbox, plain, "")


async def round_trips(kc: Any, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        reply = await kc.execute_interactive("pass", timeout=60)
        assert reply["content"]["status"] == "ok"
        times.append(time.perf_counter() - started)
    return times


async def execute_round_trip(plane: LocalControlPlane, reps: int) -> list[Figure]:
    """`pass` round trips, and the CPU every process on the way spent on them."""
    await wait_pool_warm(plane, "bench")
    _, skm, skc = await start_ready(SANDBOX)
    _, pkm, pkc = await start_ready(PLAIN)
    # The claim made the pool start a replacement; measure after it, not beside it.
    await wait_pool_warm(plane, "bench")
    sandbox_provisioner: Any = skm.provisioner
    plain_provisioner: Any = pkm.provisioner
    try:
        await round_trips(skc, 5)
        await round_trips(pkc, 5)
        sandbox, plain = Series("sandbox", "ms"), Series("plain ipykernel", "ms")
        sandbox_cpu = Series("sandbox", "us")
        plain_cpu = Series("plain ipykernel", "us")
        sides = [
            # (label, client, the kernel's process tree: bwrap, runtime, kernel; or the kernel)
            (
                "sandbox",
                skc,
                sandbox_provisioner.session.status.resources["pid"],
                sandbox,
                sandbox_cpu,
            ),
            ("plain", pkc, plain_provisioner.pid, plain, plain_cpu),
        ]
        roles: dict[str, list[float]] = {}
        for _ in range(max(1, reps // 10)):  # interleave so drift hits both alike
            for label, kc, tree, times, cpu in sides:
                before = cpu_by_role(tree)
                block = await round_trips(kc, 10)
                spent = {role: ns - before.get(role, 0) for role, ns in cpu_by_role(tree).items()}
                times.values += [t * 1000 for t in block]
                cpu.values.append(sum(spent.values()) / len(block) / 1000)
                for role, ns in spent.items():
                    roles.setdefault(f"{label} {role}", []).append(ns / len(block) / 1000)
    finally:
        await stop(skm, skc)
        await stop(pkm, pkc)
    per_role = ", ".join(f"{role} {statistics.median(v):.0f}" for role, v in sorted(roles.items()))
    return [
        Figure("execute round trip of `pass`", sandbox, plain, "<= 1.3x"),
        Figure(
            "CPU per `pass` round trip, every process on the way",
            sandbox_cpu,
            plain_cpu,
            "none set",
            notes=f"medians per round trip, in us: {per_role}",
        ),
    ]


def cpu_by_role(tree: int) -> dict[str, int]:
    """CPU time (ns) spent so far by this process (the client, and the bridge's thread)
    and by the kernel's process tree (a plain kernel; or bwrap, runtime and kernel)."""
    spent: dict[str, int] = {}
    bridge_thread = background().thread.native_id
    for tid in os.listdir("/proc/self/task"):
        role = "bridge thread" if int(tid) == bridge_thread else "client process"
        spent[role] = spent.get(role, 0) + _schedstat_ns(f"/proc/self/task/{tid}")
    try:
        root = psutil.Process(tree)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return spent
    for process in processes:
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        role = "runtime" if "jupyter_sandbox.runtime" in command else "kernel"
        if "bwrap" in command.split(" ", 1)[0]:
            role = "bwrap"
        for tid in _tasks(process.pid):
            spent[role] = spent.get(role, 0) + _schedstat_ns(f"/proc/{process.pid}/task/{tid}")
    return spent


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _schedstat_ns(task: str) -> int:
    """Time on a CPU, in ns (the scheduler's own count, finer than clock ticks)."""
    try:
        with open(f"{task}/schedstat") as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


async def _throughput(kc: Any, code: str, expected_bytes: int) -> float:
    received = 0

    def hook(msg: dict[str, Any]) -> None:
        nonlocal received
        if msg["msg_type"] == "stream":
            received += len(msg["content"]["text"])
        elif msg["msg_type"] == "comm_open":
            received += sum(len(b) for b in msg.get("buffers", []))

    started = time.perf_counter()
    await kc.execute_interactive(code, timeout=600, output_hook=hook)
    elapsed = time.perf_counter() - started
    assert received >= expected_bytes * 0.99, (received, expected_bytes)
    return expected_bytes / elapsed / 1e6


def output_cells(size: int) -> list[tuple[str, str]]:
    """(label, code) of the cells that print ``size`` bytes and send them as a comm buffer."""
    printing = (
        f"import sys\nchunk = 'x' * 999 + '\\n'\n"
        f"for _ in range({size // 1000}):\n    sys.stdout.write(chunk)\nsys.stdout.flush()"
    )
    buffer = (
        "from comm import create_comm\n"
        f"c = create_comm(target_name='bench', buffers=[b'\\x00' * {size}])"
    )
    return [("print", printing), ("binary buffer", buffer)]


async def output_throughput(plane: LocalControlPlane, megabytes: int, reps: int) -> list[Figure]:
    size = megabytes * 1_000_000
    await wait_pool_warm(plane, "bench")
    _, skm, skc = await start_ready(SANDBOX)
    _, pkm, pkc = await start_ready(PLAIN)
    await wait_pool_warm(plane, "bench")  # the pool's replacement has started
    figures = []
    try:
        for label, code in output_cells(size):
            sandbox = Series("sandbox", "MB/s")
            plain = Series("plain ipykernel", "MB/s")
            for _ in range(reps):
                sandbox.values.append(await _throughput(skc, code, size))
                plain.values.append(await _throughput(pkc, code, size))
            figures.append(
                Figure(
                    f"output throughput, {megabytes} MB {label}",
                    sandbox,
                    plain,
                    ">= 0.7x",
                    higher_is_better=True,
                )
            )
    finally:
        await stop(skm, skc)
        await stop(pkm, pkc)
    return figures


async def resume_vs_cold(plane: LocalControlPlane, reps: int) -> Figure:
    resumed, cold = Series("resume after suspend", "s"), Series("cold start", "s")
    for _ in range(reps):
        await wait_pool_warm(plane, "bench")
        claim = await plane.claim(ClaimRequest(pool="bench"))
        await plane.wait_ready(claim.name, 60)
        # The claim made the pool start a replacement: resume after it, not beside it,
        # as the cold start below runs beside nothing.
        await wait_pool_warm(plane, "bench")
        await plane.suspend(claim.name)
        await _wait_phase(plane, claim.name, "Suspended")
        started = time.perf_counter()
        await plane.resume(claim.name)
        await plane.wait_ready(claim.name, 120)
        resumed.values.append(time.perf_counter() - started)
        await plane.release(claim.name)

        started = time.perf_counter()
        # An env forces a cold start (no warm sandbox can carry it).
        claim = await plane.claim(ClaimRequest(pool="bench", env={"BENCH": uuid.uuid4().hex}))
        await plane.wait_ready(claim.name, 120)
        cold.values.append(time.perf_counter() - started)
        await plane.release(claim.name)
    return Figure("resume after suspend to kernel ready", resumed, cold, "stated")


async def _wait_phase(plane: LocalControlPlane, name: str, phase: str) -> None:
    while True:
        status = await plane.status(name)
        if status is not None and status.phase == phase:
            return
        await asyncio.sleep(0.05)


def _tree_rss(pid: int) -> int:
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


async def idle_memory(plane: LocalControlPlane) -> Figure:
    await wait_pool_warm(plane, "bench")
    claim = await plane.claim(ClaimRequest(pool="bench"))
    await plane.wait_ready(claim.name, 60)
    await asyncio.sleep(3)
    pid = claim.resources["pid"]
    sandbox = Series("runtime + kernel (bwrap tree)", "MB", [_tree_rss(pid) / 1e6])
    await plane.release(claim.name)

    # The approach other products take: a jupyter_server in the sandbox, plus its kernel.
    port = free_port()
    token = uuid.uuid4().hex
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            f"--port={port}",
            "--no-browser",
            f"--IdentityProvider.token={token}",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        from tornado.httpclient import AsyncHTTPClient

        client = AsyncHTTPClient()
        for _ in range(300):
            try:
                await client.fetch(
                    f"http://127.0.0.1:{port}/api/kernels",
                    headers={"Authorization": f"token {token}"},
                    method="POST",
                    body='{"name": "python3"}',
                )
                break
            except Exception:
                await asyncio.sleep(0.1)
        await asyncio.sleep(3)
        baseline = Series("jupyter_server + ipykernel", "MB", [_tree_rss(server.pid) / 1e6])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
    return Figure("memory of one idle warm sandbox", sandbox, baseline, "lower")
