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
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...runtime import landlock
from ...runtime.paths import PACKAGES_DIR, within

if TYPE_CHECKING:
    from .host_uid import HostIdentity

WORKSPACE = "/workspace"
RUNTIME_DIR = "/run/sandbox"
# The runtime directory holds the kernel's sockets and connection file: a few KB.
# A tmpfs of this size, so that nothing written there reaches the host's disk.
RUNTIME_DIR_BYTES = 16 * 1024 * 1024
# Where a pool's installed requirements appear, read-only.
POOL_PACKAGES = "/run/pool-packages"
POOLS_SUBDIR = "pools"
PROJECTS_SUBDIR = "projects"  # notebook projects' %pip packages, kept across kernels
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
    kind: str  # "bubblewrap", "landlock" (no bubblewrap) or "none"
    detail: str
    # A root daemon's sandboxes as an unprivileged host uid (bubblewrap only).
    host: HostIdentity | None = field(default=None, compare=False)

    @property
    def isolated(self) -> bool:
        """In namespaces of its own (bubblewrap): its own /, /tmp, network, pids."""
        return self.kind == "bubblewrap"

    @property
    def confined(self) -> bool:
        """Confined at all: by bubblewrap, or by Landlock where bubblewrap is missing."""
        return self.kind != "none"


NO_BWRAP_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt install bubblewrap; Fedora: dnf install "
    "bubblewrap) for namespaces, network isolation and seccomp"
)


@functools.cache
def probe(disabled: bool = False) -> Isolation:
    """Find out once how sandboxes can be confined here: bubblewrap's namespaces,
    else Landlock alone, else not at all (the daemon then refuses to start sandboxes
    unless isolation was disabled on purpose)."""
    if disabled:
        return Isolation("none", "isolation disabled by configuration")
    found = _bubblewrap()
    if found.isolated:
        return found
    return _landlock_only(found.detail)


def _landlock_only(why: str) -> Isolation:
    abi = landlock.abi_version()
    if abi < 2:
        return Isolation("none", f"{why}, and this kernel has no Landlock; {NO_BWRAP_HINT}")
    ports = ", ".join(map(str, landlock.WEB_PORTS))
    reach = f"TCP only to ports {ports}" if abi >= 4 else "network NOT confined"
    scope = "; no signals or abstract sockets outside" if abi >= 6 else ""
    return Isolation(
        "landlock",
        f"Landlock only ({why}): files confined to the sandbox's own directories, the "
        f"system and Python read-only; {reach}{scope}; no namespaces, network isolation "
        f"or seccomp: {NO_BWRAP_HINT}",
    )


def _bubblewrap() -> Isolation:
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
                *ro_binds(SYSTEM_DIRS),
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
        "bubblewrap: user, pid, ipc, uts, net namespaces, no nested user namespaces, "
        "sized private /tmp, read-only system, workspace-only home",
    )


def ro_binds(paths: tuple[str, ...] | list[str]) -> list[str]:
    args: list[str] = []
    for path in paths:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


class UnsafeMount(RuntimeError):
    """A directory the sandbox's Python needs would expose the user's files or the daemon's."""


def installation_paths() -> list[str]:
    """Where the Python installation running us lives: prefixes, stdlib and site directories.

    Deliberately not ``sys.path``: its first entry is the working directory of
    whoever started the daemon (often the home directory), and ``PYTHONPATH``
    entries can be anything.
    """
    paths = sysconfig.get_paths()
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        paths.get("stdlib", ""),
        paths.get("platstdlib", ""),
        paths.get("purelib", ""),
        paths.get("platlib", ""),
    ]
    if site.ENABLE_USER_SITE:
        candidates.append(site.getusersitepackages())
    return [c for c in candidates if c]


def package_dir() -> str:
    """This package's own directory (outside site-packages for an editable install)."""
    import jupyter_sandbox

    return os.path.dirname(os.path.abspath(jupyter_sandbox.__file__))


def python_paths(
    state_dir: str | os.PathLike[str] | None = None, home: str | None = None
) -> list[str]:
    """Directories to bind read-only so the sandbox's Python and this package import.

    Raises UnsafeMount for a directory that is, or contains, the user's home or the
    daemon's state directory (say, a Python installed into the home directory
    itself): binding it would hand every sandbox the user's files, the router's
    secret and the other sandboxes' workspaces.
    """
    home = os.path.realpath(home or os.path.expanduser("~"))
    state = os.path.realpath(state_dir) if state_dir is not None else None
    wanted: list[str] = []
    for raw in [*installation_paths(), package_dir()]:
        if not os.path.isabs(raw):
            continue
        path = os.path.realpath(raw)
        if not os.path.isdir(path) or path.startswith(SYSTEM_DIRS):
            continue
        reason = _exposure(path, home, state)
        if reason:
            raise UnsafeMount(
                f"refusing to expose {path} to sandboxes: {reason}. Install Python and "
                "jupyter-sandbox in a directory of their own (for example a virtualenv)."
            )
        if any(within(path, w) for w in wanted):
            continue
        wanted = [w for w in wanted if not within(w, path)]
        wanted.append(path)
    return sorted(wanted)


def _exposure(path: str, home: str, state: str | None) -> str:
    """Why binding ``path`` would expose the home or the daemon's state ("": it would not)."""
    if within(home, path):
        return f"it contains your home directory {home}"
    if state is not None and (within(state, path) or within(path, state)):
        return f"it overlaps the sandbox daemon's state directory {state}"
    return ""


def check_files_dir(
    path: object, state_dir: str | os.PathLike[str] | None = None, home: str | None = None
) -> str:
    """The notebook directory a sandbox may see, resolved; UnsafeMount when it may not.

    Never the filesystem root, the home directory or one of its parents (the whole
    home, keys included, would be in the sandbox), anything that overlaps the
    daemon's state directory (the router's secret, the other sandboxes), a system
    directory, or a directory inside the Python installation the sandboxes share.
    """
    if not isinstance(path, str) or not os.path.isabs(path):
        raise UnsafeMount(f"the notebook directory must be an absolute path, not {path!r}")
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise UnsafeMount(f"the notebook directory {path} does not exist")
    home = os.path.realpath(home or os.path.expanduser("~"))
    state = os.path.realpath(state_dir) if state_dir is not None else None
    reason = _files_dir_refusal(real, home, state)
    if reason:
        raise UnsafeMount(
            f"a sandbox cannot work in {real}: {reason}. Keep notebooks in a project "
            "directory of their own (for example ~/notebooks), or use a pool created "
            "with --files none."
        )
    return real


def _files_dir_refusal(real: str, home: str, state: str | None) -> str:
    if real == "/":
        return "it is the root of the filesystem"
    if real == home:
        return "it is your home directory"
    exposure = _exposure(real, home, state)
    if exposure:
        return exposure
    if any(within(real, system) for system in SYSTEM_DIRS):
        return "it is a system directory"
    if any(within(real, os.path.realpath(p)) for p in installation_paths()):
        return "it is inside the Python installation the sandboxes share"
    return ""


def check_pool_packages(path: str, state_dir: str | os.PathLike[str] | None) -> str:
    """A pool's package directory, resolved; UnsafeMount unless it is exactly
    ``<state>/pools/<pool>/<digest>``: the only part of the state directory a sandbox
    may see, and only read-only."""
    if state_dir is None or not os.path.isabs(path):
        raise UnsafeMount(f"refusing to expose {path!r}: not a pool's package directory")
    real = os.path.realpath(path)
    pools = os.path.join(os.path.realpath(state_dir), POOLS_SUBDIR)
    relative = os.path.relpath(real, pools)
    parts = relative.split(os.sep)
    if (
        len(parts) != 2
        or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
        or not os.path.isdir(real)
    ):
        raise UnsafeMount(f"refusing to expose {path}: not a pool's package directory")
    return real


def check_ro_file(path: str, state_dir: str | os.PathLike[str] | None) -> str:
    """A single file (a CA bundle) to show read-only at its own path; UnsafeMount if not."""
    real = os.path.realpath(path) if os.path.isabs(path) else ""
    if not real or not os.path.isfile(real) or real.startswith(("/proc/", "/sys/", "/dev/")):
        raise UnsafeMount(f"refusing to expose {path!r}: not a regular file")
    if state_dir is not None and within(real, os.path.realpath(state_dir)):
        raise UnsafeMount(f"refusing to expose {path}: it is in the sandbox daemon's state")
    return real


def package_parent() -> str | None:
    """The directory to put on the sandbox's PYTHONPATH when the package is not installed
    into the interpreter's site directories (an editable install or a source checkout)."""
    parent = os.path.dirname(package_dir())
    site_dirs = {os.path.realpath(p) for p in installation_paths()}
    return None if os.path.realpath(parent) in site_dirs else parent


# Host-wide kernel settings and triggers under /proc: read-only in every sandbox.
# bwrap covers a few of these only where the sandbox's uid can already write them
# (it checks access(W_OK)), so it skips /proc/sys itself (a 0555 directory) while
# the root-owned files in it stay writable to a sandbox mapped to host root.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")


def proc_covers() -> list[str]:
    """bwrap arguments binding PROC_READ_ONLY read-only over the sandbox's /proc.

    The bind's source is the host's /proc entry: the same kernel objects, and the
    namespaced ones (net.*, kernel.hostname, ...) are still the reader's own,
    since sysctl lookups follow the namespaces of the process that looks.
    """
    args: list[str] = []
    for name in PROC_READ_ONLY:
        path = f"/proc/{name}"
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


@dataclass(frozen=True)
class Confinement:
    """What one sandbox's bubblewrap is given besides its directories."""

    state_dir: str | None = None  # never exposed; refuse installs that overlap it
    tmp_bytes: int | None = None  # size of the private /tmp (also charged to a memory cgroup)
    seccomp_fd: int | None = None  # a compiled seccomp program for ``--seccomp``
    # network.NetnsHandshake's arguments: bwrap reports the sandbox's pid and waits
    # until the daemon has attached user-mode networking to its namespace.
    netns_args: tuple[str, ...] = ()
    resolv_conf: str | None = None  # replaces /etc/resolv.conf (a resolver reachable inside)
    files_dir: str | None = None  # the notebook's directory, bound at its own path
    files_read_only: bool = False
    packages_dir: str | None = None  # the project's %pip packages, over PACKAGES_DIR
    # The sandboxes' user namespace when a root daemon runs them as another host uid
    # (host_uid.py); None: bubblewrap makes one that maps SANDBOX_UID to the caller.
    userns_fd: int | None = None
    pool_packages: str | None = None  # the pool's requirements, read-only at POOL_PACKAGES
    ro_files: tuple[str, ...] = ()  # single files (CA bundles), read-only at their own path
    write_guard: bool = False  # keep names host tools run out of files_dir (write_guard.py)


# What of /proc a sandbox without its own PID namespace may read: the machine-wide
# files libraries ask for, not /proc itself: Landlock does not keep a confined
# process from reading /proc/<pid>/environ of the user's other processes (the
# Jupyter server's, with its tokens), so no process directory is granted.
PROC_GLOBAL = tuple(
    f"/proc/{name}"
    for name in ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "filesystems", "sys")
)


def landlock_policy(
    *,
    workspace: str,
    runtime_dir: str,
    confinement: Confinement = Confinement(),
) -> landlock.Policy:
    """What a sandbox without bubblewrap may touch: the same directories a
    bubblewrap sandbox sees, at their host paths."""
    c = confinement
    read_only = [*SYSTEM_DIRS, *ETC_FILES, "/etc/passwd", "/etc/group", "/sys", *PROC_GLOBAL]
    read_only += python_paths(c.state_dir)
    read_only += [check_ro_file(path, c.state_dir) for path in c.ro_files]
    if c.pool_packages:
        read_only.append(check_pool_packages(c.pool_packages, c.state_dir))
    # /dev/shm: POSIX semaphores (multiprocessing, joblib) live there
    read_write = [workspace, runtime_dir, "/dev/shm"]
    return _policy(read_only, read_write, c, connect_ports=landlock.WEB_PORTS)


def landlock_policy_inside(confinement: Confinement = Confinement()) -> landlock.Policy:
    """The second layer inside bubblewrap: what its mounts show the sandbox, again
    as Landlock rules (at the sandbox's paths), so that a mount too many is not an
    escape. Its own /proc (own PID namespace) is readable; TCP is left to its
    network namespace."""
    c = confinement
    read_only = [*SYSTEM_DIRS, *ETC_FILES, "/proc", *python_paths(c.state_dir), *c.ro_files]
    if c.pool_packages:
        read_only.append(POOL_PACKAGES)
    read_write = [WORKSPACE, RUNTIME_DIR, "/tmp", "/dev/shm"]
    return _policy(read_only, read_write, c, connect_ports=None)


def _policy(
    read_only: list[str],
    read_write: list[str],
    c: Confinement,
    connect_ports: tuple[int, ...] | None,
) -> landlock.Policy:
    if c.files_dir and c.files_read_only:
        read_only.append(c.files_dir)
    data_only = c.files_dir if c.files_dir and not c.files_read_only else None
    # An editable install puts its checkout on the kernel's path: listed, not read.
    parent = package_parent()
    listed = (parent,) if parent else ()
    return landlock.Policy(
        tuple(read_only),
        tuple(read_write),
        data_only,
        connect_ports,
        listed,
        write_guard=c.write_guard and data_only is not None,
    )


def _parents(path: str, made: set[str]) -> list[str]:
    """``--dir`` for each ancestor of a bind's destination not made yet, 0755.

    bubblewrap makes missing ancestors 0700 and owned by its uid 0: the sandbox
    user could not pass through them when that uid 0 is not the sandbox user's
    own (a root daemon's sandboxes, host_uid.py). An ancestor that exists (in a
    bind made before) keeps its mode.
    """
    args: list[str] = []
    ancestors: list[str] = []
    parent = os.path.dirname(path)
    while parent not in ("", "/"):
        ancestors.append(parent)
        parent = os.path.dirname(parent)
    for ancestor in reversed(ancestors):
        if ancestor not in made:
            made.add(ancestor)
            args += ["--perms", "0755", "--dir", ancestor]
    return args


def _sized(size: int | None) -> list[str]:
    return ["--size", str(size)] if size else []


def bwrap_command(
    *,
    workspace: str,
    inner: list[str],
    env: dict[str, str],
    confinement: Confinement = Confinement(),
) -> list[str]:
    """The bwrap command line for one sandbox.

    Every sandbox gets its own network namespace: with no network it has only
    loopback; with network the daemon attaches user-mode networking to it while
    bwrap waits on ``block_fd``. Nested user namespaces are disabled, so nothing
    inside can regain capabilities.
    """
    c = confinement
    bwrap = shutil.which("bwrap") or "bwrap"
    if c.userns_fd is None:
        identity = ["--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID)]
        identity += ["--gid", str(SANDBOX_UID)]
        capabilities = ["--cap-drop", "ALL"]
    else:
        # uid 0 of that namespace is root, to reach root-only sources; the runtime
        # becomes SANDBOX_UID first thing, which is why these two are kept.
        identity = ["--userns", str(c.userns_fd)]
        capabilities = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    args = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        *identity,
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        *capabilities,
    ]
    args += ro_binds(SYSTEM_DIRS)
    made: set[str] = set()
    for path in ETC_FILES:
        if path == "/etc/resolv.conf" and c.resolv_conf:
            args += [*_parents(path, made), "--ro-bind", c.resolv_conf, path]
        elif os.path.exists(path):
            args += [*_parents(path, made), "--ro-bind", path, path]
    # The private /tmp goes in before the Python installation: a virtualenv under
    # /tmp must be bound on top of it, not hidden by it.
    args += ["--proc", "/proc", *proc_covers(), "--dev", "/dev"]
    # bwrap's /dev is an unsized tmpfs the sandbox's uid owns: a file written there
    # or in /dev/shm (a directory of it) escaped every memory bound. /dev/shm gets a
    # tmpfs of its own, sized like /tmp, and /dev itself is made read-only (its
    # device nodes are bind mounts of their own and keep working).
    args += [*_sized(c.tmp_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--remount-ro", "/dev"]
    args += [*_sized(c.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    args += ["--perms", "0755", "--dir", "/run"]
    # The notebook's directory goes in before the Python installation, so a
    # virtualenv kept inside a project stays read-only on top of it.
    made |= {"/tmp", "/run", "/dev", "/proc"}
    if c.files_dir:
        bind = "--ro-bind" if c.files_read_only else "--bind"
        args += [*_parents(c.files_dir, made), bind, c.files_dir, c.files_dir]
        # Hooks written into a repository would run on the host at the next git command.
        git = os.path.join(c.files_dir, ".git")
        if not c.files_read_only and os.path.isdir(git) and not os.path.islink(git):
            args += ["--ro-bind", git, git]
    for path in python_paths(c.state_dir):
        args += [*_parents(path, made), "--ro-bind", path, path]
    if c.pool_packages:
        args += ["--ro-bind", check_pool_packages(c.pool_packages, c.state_dir), POOL_PACKAGES]
    for path in c.ro_files:
        real = check_ro_file(path, c.state_dir)
        if not any(within(path, shown) for shown in (*SYSTEM_DIRS, *ETC_FILES)):
            # (system files are there already)
            args += [*_parents(path, made), "--ro-bind", real, path]
    args += ["--bind", workspace, WORKSPACE]
    # Sockets only: a sized tmpfs of its own (it was a host directory, unbounded).
    args += [*_sized(RUNTIME_DIR_BYTES), "--perms", "1777", "--tmpfs", RUNTIME_DIR]
    if c.packages_dir:
        args += ["--bind", c.packages_dir, f"{WORKSPACE}/{PACKAGES_DIR}"]
    # bwrap's root is an unsized tmpfs the sandbox user owns (its own uid's, as an
    # ordinary user): a file written into /, /etc or /run escaped every memory
    # bound. Read-only once every mount point is made; the binds keep their modes.
    args += ["--remount-ro", "/"]
    args += [
        "--chdir",
        # bubblewrap's uid 0 there may not enter the workspace: the runtime does, as itself
        "/" if c.userns_fd is not None else WORKSPACE,
        "--clearenv",
    ]
    if c.seccomp_fd is not None:
        args += ["--seccomp", str(c.seccomp_fd)]
    args += [arg for arg in c.netns_args if arg != "--unshare-net"]
    for key, value in sorted(env.items()):
        args += ["--setenv", key, value]
    return [*args, "--", *inner]
