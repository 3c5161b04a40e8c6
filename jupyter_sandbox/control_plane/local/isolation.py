"""Building the bubblewrap command line that confines a sandbox process.

The sandbox sees read-only system directories and the Python installation, its own
workspace read-write at /workspace, a private /tmp, its own PID, IPC and UTS
namespaces, a user namespace, optionally no network, and nothing of the user's
home directory. Where bubblewrap or user namespaces are missing the sandbox runs
as a plain process and says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

WORKSPACE = "/workspace"
RUNTIME_DIR = "/run/sandbox"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/localtime",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/fonts",
    "/etc/matplotlibrc",
)
# Sandboxes see a fixed, unprivileged passwd so tools that look the user up work.
SANDBOX_UID = 1000


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bubblewrap" or "none"
    detail: str

    @property
    def isolated(self) -> bool:
        return self.kind != "none"


@functools.cache
def probe(disabled: bool = False) -> Isolation:
    """Find out once whether bubblewrap can create the namespaces we ask for."""
    if disabled:
        return Isolation("none", "isolation disabled by configuration")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Isolation("none", "bubblewrap (bwrap) is not installed")
    try:
        result = subprocess.run(
            [
                bwrap,
                "--unshare-all",
                "--unshare-user",
                "--die-with-parent",
                *_ro_binds(SYSTEM_DIRS),
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "true",
            ],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation("none", f"bubblewrap failed to run: {exc}")
    if result.returncode != 0:
        reason = result.stderr.decode(errors="replace").strip() or f"exit {result.returncode}"
        return Isolation("none", f"bubblewrap cannot create namespaces here: {reason}")
    return Isolation(
        "bubblewrap",
        "bubblewrap: user, pid, ipc, uts namespaces, private /tmp, "
        "read-only system, workspace-only home",
    )


def _ro_binds(paths: tuple[str, ...] | list[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def python_paths() -> list[str]:
    """Directories the sandbox's Python needs: its prefixes and every sys.path entry."""
    wanted: list[str] = []
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sysconfig.get_paths().get("purelib", ""),
        *sys.path,
    ]
    for raw in candidates:
        if not raw or not os.path.isabs(raw):
            continue
        path = os.path.realpath(raw)
        if not os.path.exists(path) or path.startswith(SYSTEM_DIRS):
            continue
        if os.path.isfile(path):  # zip entries on sys.path
            path = os.path.dirname(path)
        if any(path == w or path.startswith(w + os.sep) for w in wanted):
            continue
        wanted = [w for w in wanted if not w.startswith(path + os.sep)]
        wanted.append(path)
    return sorted(wanted)


def bwrap_command(
    *,
    workspace: str,
    runtime_dir: str,
    inner: list[str],
    env: dict[str, str],
    network: bool,
) -> list[str]:
    bwrap = shutil.which("bwrap") or "bwrap"
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
    ]
    if not network:
        args.append("--unshare-net")
    args += _ro_binds(SYSTEM_DIRS)
    for path in ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    # The private /tmp goes in before the Python installation: a virtualenv under
    # /tmp must be bound on top of it, not hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/run"]
    for path in python_paths():
        args += ["--ro-bind", path, path]
    args += [
        "--bind",
        workspace,
        WORKSPACE,
        "--bind",
        runtime_dir,
        RUNTIME_DIR,
        "--chdir",
        WORKSPACE,
        "--clearenv",
    ]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, "--", *inner]
