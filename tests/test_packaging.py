"""The sandbox image as deploy/docker/Dockerfile.runtime builds it, minus Docker.

The build stage's ``COPY`` lines pick the files of a clean checkout (``git
ls-files``: no built JupyterLab extension), its ``ENV`` and ``RUN pip wheel``
run with an ``npm`` first on PATH that fails if anything calls it, and the wheel
is installed the way the final stage does, into a fresh virtualenv: only the
base requirements, which are the runtime's.  Then the image's ``CMD`` runs and
a cell executes in its kernel.  Before, the wheel build ran npm, and the
runtime image carried jupyter-server, the Kubernetes client and aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tornado import httpclient, websocket

from jupyter_sandbox.protocol import framing
from tests.helpers import free_port, stop_process, wait_ready

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile.runtime"
SERVER_SIDE = ("jupyter_server", "kubernetes", "aiohttp", "jupyterlab", "httpx", "jwt")


def build_stage(dockerfile: Path) -> tuple[list[list[str]], dict[str, str], list[str]]:
    """The first stage's COPY sources, ENV settings and RUN commands."""
    copies: list[list[str]] = []
    env: dict[str, str] = {}
    runs: list[str] = []
    stages = 0
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if line.startswith("FROM "):
            stages += 1
            if stages > 1:
                break
        elif line.startswith("COPY ") and "--from" not in line:
            copies.append(shlex.split(line)[1:-1])
        elif line.startswith("ENV "):
            key, _, value = line[4:].partition("=")
            env[key.strip()] = value.strip()
        elif line.startswith("RUN "):
            runs.append(line[4:])
    return copies, env, runs


def final_cmd(dockerfile: Path) -> list[str]:
    cmd = [line for line in dockerfile.read_text().splitlines() if line.startswith("CMD ")][-1]
    return list(json.loads(cmd[4:]))


def clean_checkout_context(dest: Path, sources: list[str]) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *sources],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        rel = name.decode()
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout")
    work = tmp_path_factory.mktemp("image")
    context, wheels, fake_bin = work / "src", work / "wheels", work / "bin"
    context.mkdir()
    fake_bin.mkdir()
    copies, env, runs = build_stage(DOCKERFILE)
    clean_checkout_context(context, [src for sources in copies for src in sources])
    assert not (context / "jupyter_sandbox" / "labextension").exists()
    npm_log = work / "npm-called"
    (fake_bin / "npm").write_text(f'#!/bin/sh\necho "$@" >> {npm_log}\nexit 97\n')
    (fake_bin / "npm").chmod(0o755)

    (wheel_cmd,) = [r for r in runs if "pip wheel" in r]
    argv = shlex.split(wheel_cmd.replace("/wheels", str(wheels)))
    assert argv[:3] == ["python", "-m", "pip"], argv
    build_env = {**os.environ, **env, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(
        [sys.executable, *argv[1:], "--quiet"], cwd=context, env=build_env, check=True, timeout=600
    )
    assert not npm_log.exists(), f"the image build ran npm: {npm_log.read_text()}"
    (wheel,) = wheels.glob("jupyter_sandbox-*.whl")

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        timeout=900,
    )
    return venv


def test_the_runtime_image_holds_no_server_side(runtime_venv: Path) -> None:
    probe = (
        "import importlib.util, json, sys;"
        f"print(json.dumps([m for m in {list(SERVER_SIDE)!r} if importlib.util.find_spec(m)]))"
    )
    out = subprocess.run(
        [str(runtime_venv / "bin" / "python"), "-c", probe],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(out) == []


def test_the_image_command_serves_a_kernel_that_runs_a_cell(
    runtime_venv: Path, tmp_path: Path
) -> None:
    port = free_port()
    cmd = final_cmd(DOCKERFILE)
    assert cmd[:3] == ["python", "-m", "jupyter_sandbox.runtime"], cmd
    args = cmd[3:]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--workspace") + 1] = str(tmp_path)
    log = tmp_path / "runtime.log"
    proc = subprocess.Popen(
        [
            str(runtime_venv / "bin" / "python"),
            "-m",
            "jupyter_sandbox.runtime",
            *args,
            *("--ip", "127.0.0.1", "--runtime-dir", str(tmp_path / "rt")),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,  # not the checkout: the installed wheel only
        start_new_session=True,
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/readyz", log, timeout=90)
        assert asyncio.run(run_cell(port, "print(6 * 7)")) == "42\n"
    finally:
        stop_process(proc, grace=15)


async def run_cell(port: int, code: str) -> str:
    """The stdout of one execute_request over the runtime's kernel WebSocket."""
    ws = await websocket.websocket_connect(
        httpclient.HTTPRequest(f"ws://127.0.0.1:{port}/api/kernel/channels"),
        subprotocols=[framing.SUBPROTOCOL],
    )
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "t",
        "session": uuid.uuid4().hex,
        "date": "2026-01-01T00:00:00Z",
        "version": "5.3",
    }
    content = {"code": code, "silent": False}
    parts = [json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]
    ws.write_message(framing.encode("shell", parts), binary=True)
    out = ""
    try:
        while True:
            raw = await asyncio.wait_for(ws.read_message(), 60)
            assert isinstance(raw, bytes), raw
            channel, reply = framing.decode(raw)
            if len(reply) < 4:  # the runtime's own notices, not kernel messages
                continue
            parent = json.loads(reply[1] or b"{}")
            if channel != "iopub" or parent.get("msg_id") != msg_id:
                continue
            msg_type = json.loads(reply[0])["msg_type"]
            body = json.loads(reply[3])
            if msg_type == "stream":
                out += body["text"]
            elif msg_type == "status" and body["execution_state"] == "idle":
                return out
    finally:
        ws.close()


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["operator"], "kubernetes"),
        (["router", "--help"], "kubernetes"),
        (["lab"], "lab"),
    ],
)
def test_a_role_without_its_extra_says_what_to_install(runtime_venv: Path, argv, extra) -> None:
    proc = subprocess.run(
        [str(runtime_venv / "bin" / "jupyter-sandbox"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"pip install 'jupyter-sandbox[{extra}]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_runtime_command_needs_no_extra(runtime_venv: Path) -> None:
    proc = subprocess.run(
        [str(runtime_venv / "bin" / "jupyter-sandbox"), "runtime", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--workspace" in proc.stdout
