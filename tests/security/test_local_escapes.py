"""Attacks on the local backend, driven as an attacker drives them.

Each test puts code inside a sandbox (or plays a user starting the daemon from
an unlucky directory) and checks that what the review reached is out of reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from jupyter_client.manager import AsyncKernelManager

from jupyter_sandbox.client import Sandbox, SandboxClient
from jupyter_sandbox.control_plane.base import ClaimRequest
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.isolation import probe

from .attacker import run_attacker

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}")

VISIBILITY_PROBE = """
import json, os
paths = json.loads({paths!r})
print(json.dumps({{name: os.path.exists(path) for name, path in paths.items()}}))
"""


def attacker_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user whose HOME is ``home`` and who has no daemon yet."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JUPYTER_SANDBOX_HOME", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"))
    }
    env.update(
        HOME=str(home),
        PYTHONPATH=str(REPO),
        JUPYTER_SANDBOX_DEFAULT_REPLICAS="1",
        JUPYTER_SANDBOX_IDLE_TIMEOUT="0",
        **extra,
    )
    return env


def attack_from(cwd: Path, home: Path, paths: dict[str, str]) -> dict[str, object]:
    """Start a fresh daemon as a user whose HOME is ``home``, from ``cwd``, and probe inside."""
    env = attacker_env(home)
    code = VISIBILITY_PROBE.format(paths=json.dumps(paths))
    try:
        return run_attacker(code, env, cwd)
    finally:
        _kill_processes_mentioning(str(home))


def _kill_processes_mentioning(text: str) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        if any(text in part for part in proc.info["cmdline"] or []):
            proc.kill()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: the state directory's sockets must fit in sun_path."""
    path = Path(tempfile.mkdtemp(prefix="jsbx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def fake_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("[default]\naws_secret_access_key=x\n")
    return home


def test_daemon_started_from_a_home_directory_exposes_nothing_of_it(short_tmp: Path) -> None:
    home = fake_home(short_tmp)
    state = home / ".local" / "share" / "jupyter" / "sandbox"
    result = attack_from(
        home,
        home,
        {
            "ssh key": str(home / ".ssh" / "id_ed25519"),
            "cloud credentials": str(home / ".aws" / "credentials"),
            "home": str(home),
            "state dir": str(state),
            "daemon socket": str(state / "daemon.sock"),
            # every runtime's socket: kernel channels without the router on the local backend
            "runtime sockets": str(state / "sockets"),
            "router secret": str(state / "router-secret"),
            "repository": str(REPO / ".git"),
        },
    )
    assert result["state_dir"] == str(state)
    seen = json.loads(str(result["stdout"]))
    assert not any(seen.values()), seen


def test_daemon_started_from_a_project_directory_exposes_nothing_of_it(short_tmp: Path) -> None:
    home = fake_home(short_tmp)
    project = short_tmp / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "config").write_text("[remote]\n")
    (project / ".env").write_text("DATABASE_PASSWORD=hunter2\n")
    result = attack_from(
        project,
        home,
        {
            "git": str(project / ".git" / "config"),
            "dotenv": str(project / ".env"),
            "project": str(project),
        },
    )
    seen = json.loads(str(result["stdout"]))
    assert not any(seen.values()), seen


def test_daemon_started_from_the_root_directory_still_starts_sandboxes(short_tmp: Path) -> None:
    home = fake_home(short_tmp)
    # Before, bwrap got --ro-bind / / and no sandbox could start at all.
    result = attack_from(Path("/"), home, {"shadow": "/etc/shadow", "logs": "/var/log"})
    seen = json.loads(str(result["stdout"]))
    assert seen == {"shadow": False, "logs": False}, seen


# -- attacks from inside a sandbox of the session's daemon ------------------------


@pytest.fixture
def client(warm_daemon: Path) -> Iterator[SandboxClient]:
    with SandboxClient() as sdk:
        yield sdk


def runtime_pid(sb: Sandbox) -> int:
    return int(sb.commands.run("python3 -c 'import os; print(os.getppid())'").stdout)


def runtime_started(sb: Sandbox) -> str:
    """When the runtime process started (boot-relative, the same in every namespace)."""
    code = "import os; print(open(f'/proc/{os.getppid()}/stat').read().split()[21])"
    return sb.commands.run(f'python3 -c "{code}"', timeout=10).stdout.strip()


def wait_for_new_runtime(sb: Sandbox, before: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            if runtime_started(sb) not in ("", before):
                return
        except Exception as exc:  # down or restarting
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"no new runtime answered within {timeout}s: {last}")


def wait_until_answering(sb: Sandbox, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            result = sb.commands.run("echo alive", timeout=5)
            if result.stdout.strip() == "alive":
                return result.stdout
        except Exception as exc:  # the runtime is down or restarting
            last = repr(exc)
        time.sleep(0.5)
    raise AssertionError(f"the sandbox did not answer again within {timeout}s: {last}")


def test_a_link_planted_for_the_router_reaches_nothing_but_the_sandbox(
    client: SandboxClient, sandbox_home: Path
) -> None:
    """The review replaced runtime.sock with a link to the daemon's socket and read every
    claim's token through the router with the sandbox's own token."""
    daemon_socket = sandbox_home / "daemon.sock"
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        plant = (
            "import os\n"
            f"os.symlink({str(daemon_socket)!r}, '/run/sandbox/link')\n"
            "os.replace('/run/sandbox/link', '/run/sandbox/runtime.sock')\n"
            "print('planted')\n"
        )
        sb.files.write("plant.py", plant)
        planted = sb.commands.run("python3 plant.py")
        assert "planted" in planted.stdout, planted
        # Concurrent requests: the router's pooled connections to the real runtime
        # cannot serve them all, so new connections are made to whatever the path is.
        responses = asyncio.run(_concurrent_get(sb, "api/claims", 12))
        for response in responses:
            assert response.status_code == 404, response.text[:500]
            assert "token" not in response.text
        # The sandbox itself is still reached, through the path it cannot touch.
        assert sb.commands.run("echo still-here").stdout.strip() == "still-here"


async def _concurrent_get(sb: Sandbox, path: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as http:
        return await asyncio.gather(
            *(http.get(sb.endpoint.url(path), headers=sb.endpoint.headers()) for _ in range(count))
        )


PROC_WRITE_PROBE = """
import json
out = {}
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/core_uses_pid",
             "/proc/sys/fs/protected_symlinks", "/proc/sys/net/core/somaxconn",
             "/proc/sysrq-trigger"):
    try:
        with open(path, "w"):
            out[path] = "writable"
    except OSError as e:
        out[path] = e.strerror
out["hostname"] = open("/proc/sys/kernel/hostname").read().strip()
print(json.dumps(out))
"""


def test_host_wide_kernel_settings_are_read_only_inside(client: SandboxClient) -> None:
    """The review opened /proc/sys/kernel/core_pattern for writing from a sandbox of
    a daemon running as root (its uid maps to host root, and bwrap leaves /proc/sys
    alone): a pipe there plus a crash runs a command as host root."""
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        sb.files.write("probe.py", PROC_WRITE_PROBE)
        got = json.loads(sb.commands.run("python3 probe.py").stdout)
    hostname = got.pop("hostname")
    assert {path: why for path, why in got.items() if why == "writable"} == {}
    # read-only, not hidden: the sandbox still reads its own namespaced values
    assert hostname == "sandbox"


SITECUSTOMIZE = """
import os
cmdline = open("/proc/self/cmdline", "rb").read()
if b"jupyter_sandbox.runtime" in cmdline and b"ipykernel" not in cmdline:
    with open("/workspace/runtime-hijacked", "w") as marker:
        marker.write(str(os.getpid()))
"""


def test_the_runtime_restarts_from_the_installation_not_the_workspace(
    client: SandboxClient,
) -> None:
    """The review planted sitecustomize.py in the workspace's packages (on the
    runtime's own PYTHONPATH), killed the runtime, and the daemon restarted it with
    the attacker's code in place of the runtime server."""
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        pid, started = runtime_pid(sb), runtime_started(sb)
        sb.files.write(".local/packages/sitecustomize.py", SITECUSTOMIZE)
        sb.commands.run(f"/bin/sh -c '(sleep 0.5; kill -KILL {pid}) >/dev/null 2>&1 &'")
        wait_for_new_runtime(sb, started, 90)
        assert not sb.files.exists("runtime-hijacked"), "the restarted runtime ran sitecustomize"
        # the kernel still gets the workspace's packages on its path
        sb.files.write(".local/packages/planted_module.py", "VALUE = 42\n")
        run = sb.commands.run("python3 -c 'import planted_module; print(planted_module.VALUE)'")
        assert run.stdout.strip() == "42", run


def test_a_dangling_link_in_the_runtime_directory_does_not_wedge_the_claim(
    client: SandboxClient,
) -> None:
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        pid, started = runtime_pid(sb), runtime_started(sb)
        plant = (
            "import os\n"
            "os.symlink('/nonexistent', '/run/sandbox/link')\n"
            "os.replace('/run/sandbox/link', '/run/sandbox/runtime.sock')\n"
            "print('planted')\n"
        )
        sb.files.write("plant.py", plant)
        assert "planted" in sb.commands.run("python3 plant.py").stdout
        # Kill the runtime from inside: the daemon restarts the sandbox.
        sb.commands.run(f"/bin/sh -c '(sleep 0.5; kill -KILL {pid}) >/dev/null 2>&1 &'")
        wait_for_new_runtime(sb, started, 90)
        deadline = time.monotonic() + 60
        while sb.status()[0] != "SandboxReady" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sb.status()[0] == "SandboxReady", sb.status()


def test_a_stopped_runtime_is_detected_and_the_sandbox_restarted(
    client: SandboxClient,
) -> None:
    """SIGSTOP from inside left the claim Ready while every request timed out."""
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        sb.files.write("kept.txt", "workspace survives")
        pid = runtime_pid(sb)
        sb.commands.run(f"/bin/sh -c '(sleep 0.5; kill -STOP {pid}) >/dev/null 2>&1 &'")
        time.sleep(1.5)
        with pytest.raises(Exception):  # noqa: B017 - any failure: the runtime is frozen
            sb.commands.run("echo frozen", timeout=2)
        wait_until_answering(sb, 60)
        assert sb.files.read("kept.txt") == b"workspace survives"


# -- the daemon's own state ---------------------------------------------------------


async def test_warm_workspaces_are_recreated_and_state_made_private(short_tmp: Path) -> None:
    """A file planted in a warm sandbox's workspace was handed to a later claimant."""
    base = short_tmp / "state"
    (base / "workspaces").mkdir(parents=True)
    base.chmod(0o755)
    (base / "workspaces").chmod(0o755)
    plane = LocalControlPlane(base)
    try:
        await plane.ensure_daemon()
        await plane.apply_pool("default", {"replicas": 1})
        workspace = await _warm_workspace(plane, base)
        (workspace / "planted.py").write_text("print('owned')\n")
        await plane.stop_daemon()
        await plane.ensure_daemon()
        claim = await plane.claim(ClaimRequest(pool="default"))
        claim = await plane.wait_ready(claim.name, 120)
        planted = [p for p in (base / "workspaces").rglob("planted.py")]
        assert planted == [], planted
        for path in (base, base / "workspaces", base / "sockets", base / "logs", base / "run"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        for workspace in (base / "workspaces").iterdir():
            assert stat.S_IMODE(workspace.stat().st_mode) == 0o700, workspace
        await plane.release(claim.name)
    finally:
        await plane.stop_daemon()
        await plane.close()
        _kill_processes_mentioning(str(base))


async def _warm_workspace(plane: LocalControlPlane, base: Path) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pools = await plane.list_pools()
        if any(p.name == "default" and p.ready >= 1 for p in pools):
            return next((base / "workspaces").iterdir())
        await asyncio.sleep(0.2)
    raise TimeoutError("the pool did not fill")


# -- the kernel channels on the host ------------------------------------------------


async def test_kernel_channels_are_not_open_to_other_local_processes(warm_daemon: Path) -> None:
    """The bridge's ZMQ ports were loopback TCP: any local process could subscribe."""
    me = psutil.Process()
    listening_before = {c.laddr for c in me.net_connections("tcp") if c.status == "LISTEN"}
    km = AsyncKernelManager(kernel_name="sandbox-default")
    await km.start_kernel()
    try:
        info = km.get_connection_info()
        assert info["transport"] == "ipc", info
        directory = Path(str(info["ip"])).parent
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        listening_after = {c.laddr for c in me.net_connections("tcp") if c.status == "LISTEN"}
        assert listening_after <= listening_before
        kc = km.client()
        kc.start_channels()
        try:
            reply = await kc.execute("x = 6 * 7", reply=True, timeout=60)
            assert reply["content"]["status"] == "ok"
        finally:
            kc.stop_channels()
        await km.restart_kernel()
        # jupyter_client removes ipc files on restart; the bridge binds them again.
        for channel in ("shell", "iopub", "stdin", "control", "hb"):
            assert os.path.exists(f"{info['ip']}-{info[f'{channel}_port']}"), channel
    finally:
        await km.shutdown_kernel()
    assert not directory.exists()


def test_a_mount_too_many_is_still_out_of_reach(tmp_path: Path) -> None:
    """Defense in depth: were bubblewrap's command line to bind a host directory it
    should not (a mistake in one layer), the Landlock layer the runtime puts on
    itself (the sandbox's own view, isolation.landlock_policy_inside) still refuses
    it. Real bubblewrap, real Landlock: the mistake is made on purpose here."""
    from jupyter_sandbox.control_plane.local import isolation
    from jupyter_sandbox.runtime import landlock

    if landlock.abi_version() < 2:
        pytest.skip("no Landlock ABI 2 on this kernel")
    secret = tmp_path / "keys"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE KEY")
    secret.chmod(0o755)
    (secret / "id_rsa").chmod(0o644)
    (tmp_path / "ws").mkdir()
    policy = isolation.landlock_policy_inside()
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from jupyter_sandbox.runtime import landlock\n"
        "print(open('/mistake/id_rsa').read())\n"
        f"landlock.restrict_self(landlock.Policy.from_json({policy.to_json()!r}).rules())\n"
        "try:\n"
        "    open('/mistake/id_rsa').read(); print('read')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
        "open('/workspace/mine', 'w').write('ok'); print('own workspace')\n"
    )
    argv = isolation.bwrap_command(
        workspace=str(tmp_path / "ws"),
        inner=[sys.executable, "-I", "-c", code],
        env={"PATH": "/usr/bin:/bin"},
        confinement=isolation.Confinement(),
    )
    # the mistake: one bind too many, among the others (before / is made read-only)
    mistake = ["--ro-bind", str(secret), "/mistake"]
    at = next(i for i in range(len(argv)) if argv[i : i + 2] == ["--remount-ro", "/"])
    argv = [*argv[:at], *mistake, *argv[at:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["PRIVATE KEY", "refused", "own workspace"], done
