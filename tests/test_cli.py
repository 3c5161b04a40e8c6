"""The jupyter-sandbox command line, as users and the deploy/ manifests call it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from tornado import httpclient

from .helpers import Server, free_port, start_kernel, wait_for


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
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
    # closed by default: no way to authorize callers is an error, not an open router
    result = cli("router", "--resolve=dns")
    assert result.returncode == 2 and "no way to authorize callers" in result.stderr
    result = cli("router", "--resolve=dns", "--previous-token-secret-file=old")
    assert result.returncode == 2 and "needs --token-secret-file" in result.stderr
    # runtime tokens name the Sandbox's uid, which only the API resolver knows
    result = cli("router", "--resolve=dns", "--allow-unauthenticated", "--runtime-key-file=k")
    assert result.returncode == 2 and "--runtime-key-file needs --resolve=api" in result.stderr


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

    result = cli(*argv, env={**os.environ, "JUPYTER_SANDBOX_HOME": str(tmp_path / "none")})
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


@asynccontextmanager
async def lab_server(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[Server]:
    """`jupyter-sandbox lab` as the README runs it, on a free port, once it answers."""
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
                *extra,
                "--no-browser",
                f"--port={port}",
                "--ServerApp.ip=127.0.0.1",
                "--allow-root",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={tmp_path}",
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = Server(f"http://127.0.0.1:{port}", token, proc, tmp_path, log)
    try:

        async def up() -> bool:
            try:
                return bool(await server.request("GET", "/api/status"))
            except (OSError, ValueError):
                return False

        await wait_for(up, 90)
        yield server
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.usefixtures("warm_daemon")
async def test_jupyter_sandbox_lab_serves_sandboxed_kernels(tmp_path: Path) -> None:
    """The README's run command: JupyterLab, sandbox kernelspecs, the culling-aware manager."""
    async with lab_server(tmp_path) as server:
        log = server.log
        specs = await server.request("GET", "/api/kernelspecs")
        assert specs["default"] == "sandbox-default", "File > New makes a sandboxed notebook"
        spec = specs["kernelspecs"]["sandbox-default"]["spec"]
        assert spec["display_name"] == "Python 3 (sandbox: default)"
        assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "sandbox-provisioner"
        page = await httpclient.AsyncHTTPClient().fetch(f"{server.url}/lab?token={server.token}")
        assert b"JupyterLab" in page.body
        kernel_id = await start_kernel(server)
        model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}", expect=200)
        assert model["sandbox"]["pool"] == "default"
        # suspend/resume exist only with the culling-aware kernel manager `lab` selects
        await server.request("POST", f"/api/sandbox/kernels/{kernel_id}/suspend", expect=200)
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        # It says what it set up, culling included, and its culling defaults apply.
        said = log.read_text()
        for words in ("jupyter-sandbox: daemon", "isolation:", "pool default:", "culling:"):
            assert words in said, said[:3000]
        # How limits are enforced is said once: in the isolation line when it has it.
        lines = said.splitlines()
        isolation = next(line for line in lines if line.startswith("  isolation:"))
        if "limits" in isolation:
            assert not any(line.startswith("  limits") for line in lines), said[:3000]
        assert "suspended after 60 min, open tabs or not" in said


def test_help_is_plain_text_with_help_for_each_command() -> None:
    result = cli("--help")
    assert result.returncode == 0
    assert "``" not in result.stdout and "uninstall-kernelspec" in result.stdout
    for argv in (["pool", "create", "--help"], ["claims", "--help"], ["daemon", "--help"]):
        shown = cli(*argv).stdout
        assert "help" in shown and "``" not in shown, shown
    create_help = " ".join(cli("pool", "create", "-h").stdout.split())
    assert "read-write (default), read-only, or not at all" in create_help


def test_a_kubernetes_kernelspec_without_its_namespace_and_router_is_refused(
    tmp_path: Path,
) -> None:
    result = cli("install-kernelspec", "--backend", "kubernetes", "--prefix", str(tmp_path))
    assert result.returncode == 2
    assert "needs --namespace" in result.stderr and "--router-url" in result.stderr
    assert not list(tmp_path.rglob("kernel.json")), "nothing half-installed"


@pytest.mark.usefixtures("warm_daemon")
def test_json_goes_before_or_after_the_subcommand_and_pool_delete_takes_its_kernelspec(
    tmp_path: Path,
) -> None:
    import json

    for argv in (["pool", "list", "--json"], ["pool", "--json", "list"]):
        result = cli(*argv)
        assert result.returncode == 0, result.stderr
        assert "default" in [p["name"] for p in json.loads(result.stdout)]
    assert json.loads(cli("claims", "list", "--json").stdout) is not None

    created = cli("pool", "create", "cli-gone", "--replicas", "0", "--files", "ro", "--kernelspec")
    assert created.returncode == 0, created.stderr
    specs = cli_specs()
    assert "sandbox-cli-gone" in specs
    deleted = cli("pool", "delete", "cli-gone")
    assert deleted.returncode == 0, deleted.stderr
    assert "kernelspec sandbox-cli-gone removed" in deleted.stdout
    assert "sandbox-cli-gone" not in cli_specs()
    missing = cli("uninstall-kernelspec", "--pool", "cli-gone")
    assert missing.returncode == 2 and "no kernelspec 'sandbox-cli-gone'" in missing.stderr


def cli_specs() -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import json

    return list(json.loads(listed.stdout)["kernelspecs"])


def test_daemon_stop_leaves_no_warm_workspaces_behind(tmp_path: Path) -> None:
    import json
    import os
    import time

    env = {
        **os.environ,
        "JUPYTER_SANDBOX_HOME": str(tmp_path / "home"),
        "JUPYTER_SANDBOX_DEFAULT_REPLICAS": "1",
    }

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return cli(*argv, env=env, timeout=120)

    started = run("daemon", "start")
    assert started.returncode == 0 and "running since" in started.stdout, started
    try:
        # in words (no raw JSON, no epoch seconds), or as JSON when asked
        said = run("daemon", "status").stdout
        assert "running since" in said and "isolation:" in said and "{" not in said, said
        info = json.loads(run("daemon", "status", "--json").stdout)
        assert info["pid"] > 0 and info["started"] > 0
        deadline = time.monotonic() + 120
        while True:
            pools = json.loads(run("pool", "list", "--json").stdout)
            if pools and pools[0]["ready"] == 1:
                break
            assert time.monotonic() < deadline, pools
            time.sleep(0.5)
        workspaces = tmp_path / "home" / "workspaces"
        assert len(list(workspaces.iterdir())) == 1
    finally:
        stopped = run("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert list(workspaces.iterdir()) == [], "warm workspaces are removed with the daemon"
    # and so are its sandboxes' cgroups (the review found them left behind, empty)
    from jupyter_sandbox.control_plane.local.cgroups import CgroupLimits

    limits = CgroupLimits()
    if limits.probe().enforced:
        prefix = hashlib.sha256(str(tmp_path / "home").encode()).hexdigest()[:8]
        assert [n for n in limits.sandboxes() if n.startswith(prefix)] == []


async def test_claims_suspend_refuses_a_busy_kernel_unless_forced(tmp_path: Path) -> None:
    """The CLI (and the SDK: both ask the daemon) keep a running cell unless told."""
    import asyncio

    from .helpers import KernelSocket, claims_for, jupyter_server

    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            (claim,) = await claims_for(kernel_id)
            running = asyncio.ensure_future(
                ws.execute("import time; time.sleep(8); print('finished')")
            )

            async def busy() -> bool:
                model = await server.request("GET", "/api/sandbox/kernels")
                return any(k["execution_state"] == "busy" for k in model["kernels"])

            await wait_for(busy, 30, interval=0.1)
            refused = await asyncio.to_thread(cli, "claims", "suspend", claim.name)
            assert refused.returncode == 2, refused
            assert "running a cell" in refused.stderr and "force" in refused.stderr
            result = await running
            assert "finished" in "".join(o["content"].get("text", "") for o in result.outputs)

            running = asyncio.ensure_future(ws.execute("import time; time.sleep(60)"))
            await wait_for(busy, 30, interval=0.1)
            forced = await asyncio.to_thread(cli, "claims", "suspend", "--force", claim.name)
            assert forced.returncode == 0 and "Suspend" in forced.stdout, forced
            running.cancel()
        finally:
            ws.close()
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_lab_leaves_the_users_culling_settings_alone(tmp_path: Path) -> None:
    """A cull_idle_timeout in the user's Jupyter config was overridden by the
    command-line defaults `lab` added, and the banner said 60 min whatever was set."""
    import json
    import os

    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"MappingKernelManager": {"cull_idle_timeout": 120}})
    )
    async with lab_server(
        tmp_path, env={**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
    ) as server:
        log = server.log

        async def culling_started() -> bool:
            return "Culling kernels" in log.read_text()

        kernel_id = await start_kernel(server)  # the culler starts with the first kernel
        await wait_for(culling_started, 30)
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        said = log.read_text()
        assert "suspended after 2 min, open tabs or not" in said, said[:3000]
        # the server itself culls after the user's 120 s, at lab's default interval
        assert "idle durations > 120 seconds at 300 second intervals" in said, said[-3000:]


async def test_lab_sandbox_only_offers_nothing_else(tmp_path: Path) -> None:
    """--sandbox-only: only sandbox kernelspecs, any kernel name sandboxed, no host terminal."""
    async with lab_server(tmp_path, "--sandbox-only") as server:
        log = server.log
        specs = await server.request("GET", "/api/kernelspecs")
        assert specs["default"] == "sandbox-default"
        assert specs["kernelspecs"] and all(
            name.startswith("sandbox-") for name in specs["kernelspecs"]
        ), list(specs["kernelspecs"])
        terminals = await httpclient.AsyncHTTPClient().fetch(
            f"{server.url}/api/terminals", headers=server.headers(), raise_error=False
        )
        assert terminals.code == 404, "no shell on this machine"
        assert "sandbox only: kernels sandbox-default" in log.read_text()


async def test_ctrl_c_after_a_failed_start_stops_the_server(tmp_path: Path) -> None:
    """A notebook whose kernel could not start (no such pool) leaves nothing
    behind: no kernel is listed, and Ctrl-C stops the server at once, without
    waiting on the failed kernel."""
    import signal

    async with lab_server(tmp_path) as server:
        body = {"path": "a.ipynb", "type": "notebook", "kernel": {"name": "sandbox-missing"}}
        answer = await server.request("POST", "/api/sessions", body)
        assert "pool 'missing' does not exist" in answer["message"], answer
        assert await server.request("GET", "/api/kernels") == []
        assert await server.request("GET", "/api/sessions") == []
        server.proc.send_signal(signal.SIGINT)
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            pytest.fail("the server was still running 20 s after Ctrl-C:\n" + server.log_text())


async def test_the_daemon_lab_started_goes_when_lab_does(tmp_path: Path) -> None:
    """It stayed up an hour after JupyterLab exited, warm sandboxes and all. The
    daemon `lab` starts now exits once that JupyterLab has exited and its kernels
    are released; a daemon that ran before is not lab's to stop."""
    import json
    import os

    import psutil

    home = tmp_path / "home"
    env = {**os.environ, "JUPYTER_SANDBOX_HOME": str(home), "JUPYTER_SANDBOX_DEFAULT_REPLICAS": "1"}
    async with lab_server(tmp_path, env=env) as server:
        daemon = psutil.Process(json.loads((home / "daemon.json").read_text())["pid"])
        kernel_id = await start_kernel(server)
        await server.request("GET", f"/api/sandbox/kernels/{kernel_id}", expect=200)
        assert daemon.is_running()
    # lab_server stopped JupyterLab (SIGTERM): it shut its kernel down on the way out.
    daemon.wait(60)
    assert not (home / "daemon.json").exists()
    assert "exited: exiting" in (home / "daemon.log").read_text()
