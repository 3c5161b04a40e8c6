"""The jupyter-sandbox command line, as users and the deploy/ manifests call it."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tornado import httpclient

from .helpers import Server, free_port, start_kernel, wait_for


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "argv,expect",
    [
        # deploy/operator: `jupyter-sandbox operator --leader-elect ...`
        (["operator", "--leader-elect", "--help"], "--leader-election-namespace"),
        # deploy/router: `jupyter-sandbox router --resolve=api --port=8080`
        (["router", "--resolve=dns", "--port=8080", "--help"], "--allowed-namespaces"),
        (["runtime", "--port", "8888", "--help"], "--unix-socket"),
    ],
)
def test_program_subcommands_take_their_own_options(argv: list[str], expect: str) -> None:
    result = cli(*argv)
    assert result.returncode == 0, result.stderr
    assert expect in result.stdout


def test_bad_input_is_a_clear_error() -> None:
    result = cli("install-kernelspec", "--pool", "Not A Pool")
    assert result.returncode == 2
    assert "error: pool name 'Not A Pool' is not valid" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("frobnicate")
    assert result.returncode == 2 and "invalid choice" in result.stderr
    # hub authorization needs the claims, so the API resolver
    result = cli("router", "--resolve=dns", "--hub-api-url=http://hub:8081/hub/api")
    assert result.returncode == 2 and "--hub-api-url needs --resolve=api" in result.stderr
    result = cli("router", "--resolve=api", "--hub-api-url=hub:8081")
    assert result.returncode == 2 and "must be an http(s) URL" in result.stderr


@pytest.mark.usefixtures("warm_daemon")
def test_releasing_an_unknown_claim_is_an_error_not_a_success() -> None:
    result = cli("claims", "release", "nosuch")
    assert result.returncode == 2, result.stdout
    assert "error: claim 'nosuch' does not exist" in result.stderr
    assert "released" not in result.stdout


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["daemon", "stop"], "daemon was not running"),
        (["claims", "list"], "no claims: the local sandbox daemon is not running"),
    ],
)
def test_commands_about_a_daemon_that_is_not_running_do_not_start_one(
    tmp_path: Path, argv: list[str], said: str
) -> None:
    import os

    env = {**os.environ, "JUPYTER_SANDBOX_HOME": str(tmp_path / "none")}
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == said
    assert not (tmp_path / "none" / "daemon.sock").exists(), "no daemon may be started"


@pytest.mark.usefixtures("warm_daemon")
def test_a_kernelspec_for_a_pool_that_does_not_exist_is_flagged(tmp_path: Path) -> None:
    result = cli("install-kernelspec", "--pool", "nosuch", "--prefix", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "warning: the local daemon has no pool 'nosuch' yet" in result.stderr
    assert "jupyter-sandbox pool create nosuch" in result.stderr
    result = cli("install-kernelspec", "--pool", "default", "--prefix", str(tmp_path))
    assert result.returncode == 0 and "warning" not in result.stderr


@pytest.mark.usefixtures("warm_daemon")
async def test_jupyter_sandbox_lab_serves_sandboxed_kernels(tmp_path: Path) -> None:
    """The README's run command: JupyterLab, sandbox kernelspecs, the culling-aware manager."""
    port = free_port()
    token = uuid.uuid4().hex
    log = tmp_path / "lab.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_sandbox.cli",
                "lab",
                "--no-browser",
                f"--port={port}",
                "--ServerApp.ip=127.0.0.1",
                "--allow-root",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={tmp_path}",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", token, proc, tmp_path, log)
    try:

        async def up() -> bool:
            try:
                return bool(await server.request("GET", "/api/status"))
            except (OSError, ValueError):
                return False

        await wait_for(up, 90)
        specs = await server.request("GET", "/api/kernelspecs")
        spec = specs["kernelspecs"]["sandbox-default"]["spec"]
        assert spec["display_name"] == "Python 3 (sandbox: default)"
        assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "sandbox-provisioner"
        page = await httpclient.AsyncHTTPClient().fetch(f"{server.url}/lab?token={token}")
        assert b"JupyterLab" in page.body
        kernel_id = await start_kernel(server)
        model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}", expect=200)
        assert model["sandbox"]["pool"] == "default"
        # suspend/resume exist only with the culling-aware kernel manager `lab` selects
        await server.request("POST", f"/api/sandbox/kernels/{kernel_id}/suspend", expect=200)
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        proc.terminate()
        proc.wait(30)
