"""Real processes under the seccomp filter and in resource-limited cgroups.

Every attack is also run without the protection (a control), so a test fails if
the attack would not have worked anyway and the protection proves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

from jupyter_sandbox.control_plane.local import seccomp_filter
from jupyter_sandbox.control_plane.local.cgroups import CgroupLimits, SandboxCgroup

BWRAP = shutil.which("bwrap")

# Runs inside the sandbox; prints {check: "ok" | errno name | "failed ..."} as JSON.
# argv[1]: JSON of native system call numbers; argv[2], if given: a descriptor holding a
# BPF program to load with prctl (no bwrap needed).
PROBE = r"""
import ctypes, errno, json, os, socket, subprocess, sys, threading, time

numbers = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}

def run(name, fn):
    try:
        value = fn()
        ok = value is None or value is True or value == 0  # not "in": 1 == True
        results[name] = "ok" if ok else f"failed {value}"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def syscall(name, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    r = libc.syscall(ctypes.c_long(numbers[name]), *args)
    if r < 0:
        raise OSError(ctypes.get_errno(), name)
    return r

def load_filter(fd):
    program = b""
    while chunk := os.read(fd, 65536):
        program += chunk
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
    prog = Prog(len(program) // 8, program)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp")

if len(sys.argv) > 2:
    load_filter(int(sys.argv[2]))

# What a sandbox must still be able to do.
def threads():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
run("thread", threads)
run("subprocess", lambda: subprocess.run(["true"]).returncode)
def inet():
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        server.accept()[0].close()
run("af_inet", inet)
run("af_inet6", lambda: socket.socket(socket.AF_INET6).close())
run("af_unix", lambda: [s.close() for s in socket.socketpair()] and None)
run("netlink_route", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
run("pip", lambda: subprocess.run([sys.executable, "-m", "pip", "--version"],
                                  capture_output=True).returncode)

# What it must not.
run("unshare_cmd", lambda: subprocess.run(["unshare", "-Ur", "true"],
                                          capture_output=True).returncode)
run("keyctl", lambda: syscall("keyctl", 0, -3, 1) and None)  # GET_KEYRING_ID, session
def attach():
    child = subprocess.Popen(["sleep", "30"])
    try:
        syscall("ptrace", 16, child.pid, 0, 0)  # PTRACE_ATTACH
    finally:
        child.kill()
        child.wait()
run("ptrace_attach", attach)
run("clone3", lambda: syscall("clone3", 0, 0))  # EINVAL unfiltered, ENOSYS filtered
run("af_packet", lambda: socket.socket(17, socket.SOCK_RAW).close())
run("netlink_audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9).close())
def personality():
    if libc.personality(0x0008) == -1:  # PER_LINUX32
        raise OSError(ctypes.get_errno(), "personality")
    libc.personality(0)
run("personality", personality)
def clone_newuser():
    pid = syscall("clone", 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
run("clone_newuser", clone_newuser)
# Last: on success this leaves the process in a new user namespace.
def unshare_userns():
    if libc.unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
run("unshare_userns", unshare_userns)
print(json.dumps(results))
"""

ATTACKS = {
    "unshare_cmd": "failed 1",
    "keyctl": "EPERM",
    "ptrace_attach": "EPERM",
    "clone3": "ENOSYS",
    "clone_newuser": "EPERM",
    "unshare_userns": "EPERM",
    "personality": "EPERM",
    "af_packet": "EAFNOSUPPORT",
    "netlink_audit": "EPROTONOSUPPORT",
}
# Attacks that work in the unfiltered control (so the filter is what stops them).
CONTROLLED = ("unshare_cmd", "keyctl", "ptrace_attach", "clone_newuser", "unshare_userns")
MUST_WORK = ("thread", "subprocess", "af_inet", "af_inet6", "af_unix", "netlink_route", "pip")
SYSCALLS = ("keyctl", "ptrace", "clone", "clone3")


def _syscall_numbers() -> str:
    import pyseccomp

    return json.dumps({n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in SYSCALLS})


needs_seccomp = pytest.mark.skipif(
    not seccomp_filter.probe().available,
    reason=f"no seccomp filter here: {seccomp_filter.probe().detail}",
)


def _python_dirs() -> list[str]:
    dirs: list[str] = []
    for path in {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}:
        if not path.startswith("/usr") and not any(path.startswith(d + "/") for d in dirs):
            dirs.append(path)
    return dirs


def _bwrap(seccomp_fd: int | None) -> list[str]:
    """A minimal sandbox: read-only system and Python, private /tmp, user+pid namespaces."""
    assert BWRAP is not None
    args = [BWRAP, "--unshare-user", "--unshare-pid", "--die-with-parent"]
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in _python_dirs():
        args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return [*args, "--"]


def _bwrap_works() -> str:
    if BWRAP is None:
        return "bwrap is not installed"
    result = subprocess.run([*_bwrap(None), "true"], capture_output=True, timeout=20, check=False)
    if result.returncode != 0:
        return "bwrap cannot create user namespaces here: " + result.stderr.decode().strip()
    return ""


needs_bwrap = pytest.mark.skipif(bool(_bwrap_works()), reason=_bwrap_works() or "ok")


def _probe(prefix: list[str], extra: list[str], pass_fds: tuple[int, ...]) -> dict[str, str]:
    result = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE, _syscall_numbers(), *extra],
        capture_output=True,
        text=True,
        timeout=20,
        pass_fds=pass_fds,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_filtered(results: dict[str, str]) -> None:
    assert {k: results[k] for k in MUST_WORK} == dict.fromkeys(MUST_WORK, "ok")
    assert {k: results[k] for k in ATTACKS} == ATTACKS


def _assert_unfiltered(results: dict[str, str]) -> None:
    assert {k: results[k] for k in MUST_WORK} == dict.fromkeys(MUST_WORK, "ok")
    assert {k: results[k] for k in CONTROLLED} == dict.fromkeys(CONTROLLED, "ok")
    assert results["clone3"] == "EINVAL"  # reached the kernel


@needs_seccomp
@needs_bwrap
def test_bwrap_with_filter_blocks_escapes_and_keeps_python_working() -> None:
    fd = seccomp_filter.program_fd()
    try:
        results = _probe(_bwrap(fd), [], (fd,))
    finally:
        os.close(fd)
    _assert_filtered(results)


@needs_bwrap
def test_bwrap_without_filter_lets_the_attacks_through() -> None:
    """The control: the same sandbox without ``--seccomp`` allows every attack above."""
    _assert_unfiltered(_probe(_bwrap(None), [], ()))


@needs_seccomp
def test_program_loaded_directly_with_prctl() -> None:
    """The exported bytes themselves, loaded without bwrap (works without user namespaces
    for the checks that need none; ``unshare -Ur`` needs them for the control)."""
    fd = seccomp_filter.program_fd()
    try:
        os.set_inheritable(fd, True)
        results = _probe([], [str(fd)], (fd,))
    finally:
        os.close(fd)
    _assert_filtered(results)


# --- cgroups -----------------------------------------------------------------------

LIMITS = CgroupLimits()
MB = 1 << 20


def _needs(*controllers: str) -> pytest.MarkDecorator:
    capability = LIMITS.probe()
    missing = [c for c in controllers if c not in capability.controllers]
    return pytest.mark.skipif(
        bool(missing), reason=f"no writable cgroup for {', '.join(missing)}: {capability}"
    )


@pytest.fixture
def make_group() -> Iterator[Callable[..., SandboxCgroup]]:
    created: list[SandboxCgroup] = []

    def make(**limits: int) -> SandboxCgroup:
        group = LIMITS.create(f"test-{os.getpid()}-{uuid.uuid4().hex[:8]}", **limits)
        created.append(group)
        return group

    yield make
    for group in created:
        assert group.remove(), f"{group} could not be removed"
    LIMITS.remove_parents()


def _run_in(group: SandboxCgroup, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``group`` (it enters the cgroup before exec), output captured."""
    return subprocess.run(
        argv, preexec_fn=group.enter, capture_output=True, text=True, timeout=20, check=False
    )


FORK_BOMB = r"""
import subprocess, sys
started = []
for _ in range(300):
    try:
        started.append(subprocess.Popen(["sleep", "30"]))
    except OSError:
        pass
print(len(started), flush=True)
for p in started:
    p.kill()
"""


@_needs("pids")
def test_fork_bomb_stops_at_max_pids(make_group: Callable[..., SandboxCgroup]) -> None:
    group = make_group(max_pids=50)
    result = _run_in(group, [sys.executable, "-c", FORK_BOMB])
    started = int(result.stdout.split()[0])
    assert 30 <= started < 50, result.stderr  # the python itself counts as one
    control = subprocess.run(
        [sys.executable, "-c", FORK_BOMB], capture_output=True, text=True, timeout=20
    )
    assert int(control.stdout.split()[0]) == 300


def _tmpfs_writer(size_mb: int) -> list[str]:
    """Write ``size_mb`` MiB into a fresh private tmpfs; print the size that landed."""
    script = (
        f"dd if=/dev/zero of=/tmp/fill bs=1M count={size_mb} 2>/dev/null; "
        "echo written $(stat -c %s /tmp/fill)"
    )
    if not _bwrap_works():
        return [*_bwrap(None), "sh", "-c", script]
    if os.geteuid() == 0 and shutil.which("unshare"):
        return ["unshare", "-m", "sh", "-c", f"mount -t tmpfs tmpfs /tmp && {script}"]
    pytest.skip("neither bwrap nor root to mount a private tmpfs")


@_needs("memory")
def test_tmpfs_is_charged_to_the_memory_limit(make_group: Callable[..., SandboxCgroup]) -> None:
    size = 1536
    group = make_group(memory_bytes=256 * MB)
    result = _run_in(group, _tmpfs_writer(size))
    assert f"written {size * MB}" not in result.stdout
    usage = group.usage()
    assert usage.memory_peak_bytes is None or usage.memory_peak_bytes <= 256 * MB
    assert usage.oom_kills is None or usage.oom_kills >= 1
    control = subprocess.run(_tmpfs_writer(size), capture_output=True, text=True, timeout=20)
    assert f"written {size * MB}" in control.stdout, control.stderr


ALLOCATE = "data = b'x' * (512 << 20); print(len(data))"


@_needs("memory")
def test_allocation_beyond_the_limit_fails(make_group: Callable[..., SandboxCgroup]) -> None:
    group = make_group(memory_bytes=256 * MB)
    result = _run_in(group, [sys.executable, "-c", ALLOCATE])
    assert result.returncode in (-signal.SIGKILL, 1), result  # OOM-killed or MemoryError
    assert str(512 * MB) not in result.stdout
    assert (group.usage().oom_kills or 0) >= 1 or "MemoryError" in result.stderr
    control = subprocess.run([sys.executable, "-c", ALLOCATE], capture_output=True, text=True)
    assert control.stdout.strip() == str(512 * MB)


@_needs("pids")
def test_remove_kills_what_is_left(make_group: Callable[..., SandboxCgroup]) -> None:
    group = make_group(max_pids=20)
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], preexec_fn=group.enter)
    try:
        for _ in range(100):
            if len(group.pids()) >= 3:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        assert len(group.pids()) >= 3
        assert group.remove()
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert all(not os.path.exists(d) for d in group.dirs.values())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
