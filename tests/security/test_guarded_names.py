"""A bound notebook directory gets no name a host tool would run.

The review, from a kernel in bind mode: in a notebook directory inside a
repository (``.git`` in a parent) or without one, the sandbox created
``.git/{HEAD,config}`` with ``core.fsmonitor`` set, and ``git status`` on the host
in that directory ran the command. The same for any file a host tool executes
or trusts when it meets it (``.envrc``, ``.vscode/``, ``conftest.py``, bytecode).
Driven as it was: a real Jupyter server on the notebook directory, the kernel's
own code, then ``git status`` on the host. And the race an attacker would try
against a guard that checks a path: another thread flipping the name between
the check and the call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_sandbox.runtime import landlock, write_guard
from tests.helpers import KernelSocket, jupyter_server
from tests.security.attacker import ATTEMPT
from tests.test_notebook_files import project, start_notebook_kernel

pytestmark = [
    pytest.mark.skipif(landlock.abi_version() < 2, reason="no Landlock ABI 2 on this kernel"),
    pytest.mark.skipif(write_guard.probe() is not None, reason="no seccomp user notification"),
]

ATTACK = (
    ATTEMPT
    + r"""
import ctypes, os, shutil, sqlite3, threading
def write(path, text="x"):
    with open(path, "w") as f:
        f.write(text)
def repo(where):
    os.makedirs(f"{where}/.git/objects", exist_ok=True)
    write(f"{where}/.git/HEAD", "ref: refs/heads/main\n")
    write(f"{where}/.git/config", FSMONITOR)
os.makedirs("sub", exist_ok=True)
# names host tools run, made or changed
attempt(".git here", lambda: repo("."))
attempt(".git as a file", lambda: write(".git", "gitdir: /tmp/elsewhere\n"))
attempt(".git deeper", lambda: repo("sub"))
attempt(".Git, another case", lambda: os.mkdir("sub/.Git"))
attempt("a bare repository's HEAD", lambda: write("sub/HEAD", "ref: refs/heads/main\n"))
attempt(".envrc", lambda: write(".envrc", "touch pwned\n"))
attempt("conftest.py", lambda: write("conftest.py", "import os\n"))
attempt("__pycache__", lambda: os.mkdir("__pycache__"))
attempt("bytecode", lambda: write("helper.cpython-311.pyc"))
attempt("a .pth file", lambda: write("evil.pth", "import os\n"))
attempt("the user's .vscode, changed", lambda: write(".vscode/settings.json", "{}"))
attempt("the user's .vscode, truncated", lambda: os.truncate(".vscode/settings.json", 0))
attempt("the user's .vscode, moved away", lambda: os.rename(".vscode", "vscode-old"))
write("plain.txt")
attempt("renamed to .envrc", lambda: os.rename("plain.txt", ".envrc"))
attempt("a repository moved in", lambda: (repo("/tmp/r"), shutil.move("/tmp/r", "moved-repo")))
# the race: another thread flips the name between the guard's look and the call
name = ctypes.create_string_buffer(b"racy.txt\0\0\0\0", 16)
stop = []
def flip():
    while not stop:
        ctypes.memmove(name, b"conftest.py\0", 12)
        ctypes.memmove(name, b"racy.txt\0\0\0\0", 12)
flipper = threading.Thread(target=flip)
flipper.start()
libc = ctypes.CDLL(None, use_errno=True)
opened = 0
for _ in range(2000):
    fd = libc.open(name, os.O_WRONLY | os.O_CREAT, 0o644)
    if fd >= 0:
        opened += 1
        os.close(fd)
stop.append(1)
flipper.join()
out["race: racy.txt opened"] = opened
# ordinary work still goes
attempt("a data file", lambda: write("out.csv", "a\n1\n"))
attempt("a results tree", lambda: (os.makedirs("results/2024"), write("results/2024/r.txt")))
def atomic_save():
    write("final.part", "v2")
    os.replace("final.part", "final.txt")
attempt("an atomic save", atomic_save)
attempt("appended", lambda: open("out.csv", "a").write("2\n"))
def database():
    with sqlite3.connect("runs.sqlite") as db:
        db.execute("create table runs (x)")
        db.execute("insert into runs values (1)")
attempt("sqlite", database)
def move_in():
    write("/tmp/f.txt", "moved")
    shutil.move("/tmp/f.txt", "moved.txt")
attempt("a file moved in", move_in)
attempt("renamed", lambda: os.rename("out.csv", "data-out.csv"))
attempt("truncated", lambda: os.truncate("final.txt", 1))
attempt("removed", lambda: os.remove("data.csv"))
print(json.dumps(out))
"""
)

REFUSED = [
    ".git here",
    ".git as a file",
    ".git deeper",
    ".Git, another case",
    "a bare repository's HEAD",
    ".envrc",
    "conftest.py",
    "__pycache__",
    "bytecode",
    "a .pth file",
    "the user's .vscode, changed",
    "the user's .vscode, truncated",
    "the user's .vscode, moved away",
    "renamed to .envrc",
]
MADE = [
    "a data file",
    "a results tree",
    "an atomic save",
    "appended",
    "sqlite",
    "a file moved in",
    "renamed",
    "truncated",
    "removed",
]


def _git(*args: str, cwd: Path, ceiling: Path) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(ceiling),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CEILING_DIRECTORIES": str(ceiling),
    }
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_host_tools_find_nothing_to_run_next_to_the_notebook(tmp_path: Path) -> None:
    marker = tmp_path / "fsmonitor-ran"
    with jupyter_server(tmp_path) as server:
        # The notebook directory lies inside the user's repository (.git in a parent).
        assert _git("init", "-q", cwd=server.root, ceiling=tmp_path).returncode == 0
        folder = project(server.root)
        (folder / ".vscode").mkdir()
        (folder / ".vscode" / "settings.json").write_text('{"editor.tabSize": 4}')
        kernel_id = await start_notebook_kernel(server, "project/analysis.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            fsmonitor = f"[core]\n\tfsmonitor = touch {marker}\n"
            result = await ws.execute(f"FSMONITOR = {fsmonitor!r}\n" + ATTACK, timeout=180)
        finally:
            ws.close()
        assert result.status == "ok", result.reply
        outcome = json.loads(result.stdout.splitlines()[-1])
        for name in REFUSED:
            assert outcome[name] == "PermissionError", (name, outcome)
        # moved in entry by entry, the repository's .git refused on the way
        assert outcome["a repository moved in"] != "made", outcome
        assert outcome["race: racy.txt opened"] > 0, outcome  # the calls went through
        for name in MADE:
            assert outcome[name] == "made", (name, outcome)
        # what the host finds
        guarded = {".git", "head", ".envrc", "conftest.py", "__pycache__"}
        for path in folder.rglob("*"):
            assert path.name.casefold() not in guarded, path
            assert path.suffix not in (".pyc", ".pth"), path
        assert (folder / ".vscode" / "settings.json").read_text() == '{"editor.tabSize": 4}'
        assert (folder / "final.txt").read_text() == "v"
        assert (folder / "moved.txt").read_text() == "moved"
        assert (folder / "results" / "2024" / "r.txt").is_file()
        assert not (folder / "data.csv").exists()
        for where in (folder, folder / "sub", folder / "moved-repo"):
            if where.is_dir():
                status = _git("status", "--porcelain", cwd=where, ceiling=tmp_path)
                assert status.returncode == 0, status.stderr  # the user's own repository
        assert not marker.exists(), "git ran a command the sandbox planted"
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


WITHOUT_BUBBLEWRAP = """
import json, os, sys
sys.path.insert(0, {package!r})
from jupyter_sandbox.runtime import landlock
from jupyter_sandbox.runtime.__main__ import confine
policy = landlock.Policy(
    read_only=tuple(p for p in ("/usr", "/etc", "/lib", "/lib64", "/bin") if os.path.exists(p))
    + tuple({python!r}),
    read_write=({workspace!r}, "/dev/shm"),
    data_only={bound!r},
    connect_ports=None,
    write_guard=True,
)
confine(policy)
os.chdir({bound!r})
FSMONITOR = "[core]\\n\\tfsmonitor = touch {marker}\\n"
"""


def test_the_guard_holds_where_landlock_is_the_whole_sandbox(tmp_path: Path) -> None:
    """Without bubblewrap the runtime confines itself with Landlock alone, in the
    host's own view of the filesystem: the guard works there too."""
    bound = tmp_path / "project"
    bound.mkdir()
    (bound / "data.csv").write_text("a\n")
    (bound / ".vscode").mkdir()
    (bound / ".vscode" / "settings.json").write_text('{"editor.tabSize": 4}')
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    package = str(Path(write_guard.__file__).resolve().parents[2])
    python = sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.executable), package})
    marker = tmp_path / "fsmonitor-ran"
    prelude = WITHOUT_BUBBLEWRAP.format(
        package=package,
        python=tuple(python),
        workspace=str(workspace),
        bound=str(bound),
        marker=marker,
    )
    # /tmp is not the sandbox's here: its moves come from the workspace instead
    attack = ATTACK.replace('"/tmp/', f'"{workspace}/')
    script = textwrap.dedent(prelude) + attack
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    for name in REFUSED:
        assert outcome[name] == "PermissionError", (name, outcome)
    for name in MADE:
        assert outcome[name] == "made", (name, outcome)
    assert outcome["a repository moved in"] != "made", outcome
    assert not (bound / "moved-repo" / ".git").exists()
    assert not (bound / "conftest.py").exists()
    assert "refused in" in done.stderr  # the guard says what it refused


IN_A_POD = """
import os, subprocess, sys
sys.path.insert(0, {package!r})
from jupyter_sandbox.runtime.__main__ import guard_home
home, kept = {home!r}, {kept!r}
os.environ["HOME"] = home  # z2jh: the volume is the pod's home
guard_home(home, kept, {workspace!r})
# a kernel starts and answers, its own dotfiles in the workspace
from jupyter_client import KernelManager
km = KernelManager(kernel_name="python3")
km.start_kernel(cwd=os.path.join(home, "project"))
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
def hook(msg):
    if msg["msg_type"] == "stream":
        out["kernel's HOME"] = msg["content"]["text"].strip()
kc.execute_interactive("import os; print(os.environ['HOME'])", timeout=60, output_hook=hook)
km.shutdown_kernel(now=True)
def write(name):
    path = os.path.join(home, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write("print('planted')\\n")
for name in (".jupyter/jupyter_server_config.py", ".bashrc", ".profile",
             ".ipython/profile_default/startup/00-x.py", ".local/share/jupyter/kernels/x/k.json",
             "project/.git/config", "project/notes.txt", "project/deeper/out.csv",
             kept + "/pkg/__init__.py", kept + "/evil.pth"):
    attempt(name.replace(kept, "KEPT"), lambda: write(name))
print(json.dumps(out))
"""


def test_a_users_home_volume_keeps_its_dotfiles(tmp_path: Path) -> None:
    """Kubernetes, a pool with the user's volume: it is their home, whose dotfiles
    their own (unsandboxed) server and shells run. The runtime in the pod guards it
    alone (``guard_home``); driven here as a process, as the pod runs it."""
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    kept = home / ".local/share/jupyter-sandbox/packages/0123456789abcdef"
    package = str(Path(write_guard.__file__).resolve().parents[2])
    workspace = tmp_path / "workspace"
    code = ATTEMPT + IN_A_POD.format(
        package=package, home=str(home), kept=str(kept), workspace=str(workspace)
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.splitlines()[-1])
    refused = [
        ".jupyter/jupyter_server_config.py",
        ".bashrc",
        ".profile",
        ".ipython/profile_default/startup/00-x.py",
        ".local/share/jupyter/kernels/x/k.json",
        "project/.git/config",
    ]
    for name in refused:
        assert outcome[name] == "PermissionError", (name, outcome)
    for name in ("project/notes.txt", "project/deeper/out.csv", "KEPT/pkg/__init__.py"):
        assert outcome[name] == "made", (name, outcome)
    assert outcome["KEPT/evil.pth"] == "made", outcome  # pip's own, in the sandbox's packages
    assert outcome["kernel's HOME"] == str(workspace), outcome
    assert sorted(p.name for p in home.iterdir()) == [".local", "project"]
    assert not (home / ".local/share/jupyter").exists()
