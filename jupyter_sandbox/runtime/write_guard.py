"""The write guard: a bound directory gets no name its host's tools would run.

Landlock can keep special files out of a directory (landlock.py) but cannot look
at names. So, where a notebook directory is bound from the host, the runtime
splits in two before it runs anything:

* The runtime, and the kernel and everything it starts, get a second Landlock
  layer (``landlock.guard_layer``) under which nothing in the bound directory can
  be opened for writing, truncated or made, and a seccomp filter that stops each
  call which could (``open``/``openat`` with a writing flag, ``creat``,
  ``mkdir(at)``, ``rename(at/at2)``, ``truncate``) and hands it to
* the guard, a child process that stays in the first layer. It reads the call's
  path from the caller's memory once, resolves it as the caller sees it, and, when
  it lies in the bound directory, refuses it if any part of it is a guarded name
  (guarded_names.py), else makes the call itself and passes the result back
  (an opened file as a descriptor put into the caller).

The guard never lets the caller's own call go on with a path in the bound
directory: seccomp's "continue" re-reads the path, which another thread may have
changed. A call it lets go on (a path elsewhere) that was changed to point into
the bound directory meets the second Landlock layer and fails with EACCES. If the
guard dies, every stopped call fails (ENOSYS): the guard fails closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from . import guarded_names
from .landlock import PR_SET_NO_NEW_PRIVS, GuardLayer, LandlockError, Rules, libc, restrict_self
from .paths import within

log = logging.getLogger("jupyter_sandbox.runtime.write_guard")

SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
PR_SET_DUMPABLE = 4
AT_FDCWD = -100
O_ACCMODE = 0o3
WRITING_FLAGS = (os.O_CREAT, os.O_TRUNC)
RENAME_FLAGS_ALL = 0x7  # NOREPLACE, EXCHANGE, WHITEOUT

# struct seccomp_notif (80 bytes), seccomp_notif_resp (24), seccomp_notif_addfd (24)
NOTIF = struct.Struct("=QII iIQ 6Q")
RESP = struct.Struct("=QqiI")
ADDFD = struct.Struct("=QIIII")
ID = struct.Struct("=Q")


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | nr


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (ord("!") << 8) | nr


IOCTL_RECV = _iowr(0, NOTIF.size)
IOCTL_SEND = _iowr(1, RESP.size)
IOCTL_ID_VALID = _iow(2, ID.size)
IOCTL_ADDFD = _iow(3, ADDFD.size)
FLAG_CONTINUE = 1
ADDFD_FLAG_SEND = 1 << 1
PATH_MAX = 4096
LOGGED_REFUSALS = 20  # then one line in a thousand
MODE_BITS = 0o1777  # never a set-user-ID or set-group-ID bit on what the guard makes

# The calls stopped, and where their path arguments are: (dirfd index or None, path index).
PATHS: dict[str, tuple[tuple[int | None, int], ...]] = {
    "open": ((None, 0),),
    "openat": ((0, 1),),
    "creat": ((None, 0),),
    "mkdir": ((None, 0),),
    "mkdirat": ((0, 1),),
    "rename": ((None, 0), (None, 1)),
    "renameat": ((0, 1), (2, 3)),
    "renameat2": ((0, 1), (2, 3)),
    "truncate": ((None, 0),),
}
OPEN_FLAGS_INDEX = {"open": 1, "openat": 2}


class GuardUnavailable(RuntimeError):
    """The write guard cannot run here (no libseccomp, no user notification)."""


# ---------------------------------------------------------------- the filter


def _seccomp() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise GuardUnavailable(f"libseccomp is not usable: {exc}") from exc
    return pyseccomp


def filter_program() -> tuple[bytes, dict[int, str]]:
    """The BPF program that hands writing calls to the guard, and the native
    numbers of the calls it stops (by name). Raises GuardUnavailable."""
    seccomp = _seccomp()
    try:
        filt = seccomp.SyscallFilter(seccomp.ALLOW)
        # Other ABIs (i386, x32) are not stopped: the Landlock layer refuses their
        # writes in the bound directory, which is all that is lost.
        numbers: dict[int, str] = {}
        for name in PATHS:
            try:
                number = seccomp.resolve_syscall(seccomp.system_arch(), name)
            except (OSError, ValueError):
                continue
            if number < 0:
                continue  # not on this architecture (aarch64 has no open, mkdir, ...)
            numbers[number] = name
            index = OPEN_FLAGS_INDEX.get(name)
            if index is None:
                filt.add_rule(seccomp.NOTIFY, name)
                continue
            for access in (os.O_WRONLY, os.O_RDWR):
                filt.add_rule(
                    seccomp.NOTIFY, name, seccomp.Arg(index, seccomp.MASKED_EQ, O_ACCMODE, access)
                )
            for flag in WRITING_FLAGS:
                filt.add_rule(
                    seccomp.NOTIFY, name, seccomp.Arg(index, seccomp.MASKED_EQ, flag, flag)
                )
        with os.fdopen(os.memfd_create("write-guard", os.MFD_CLOEXEC), "w+b") as tmp:
            filt.export_bpf(tmp)
            tmp.seek(0)
            program = tmp.read()
    except OSError as exc:
        raise GuardUnavailable(f"libseccomp cannot build the guard's filter: {exc}") from exc
    if not program or len(program) % 8:
        raise GuardUnavailable(f"libseccomp exported a malformed program ({len(program)} B)")
    return program, numbers


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_RENAMEAT2 = libc().renameat2
_RENAMEAT2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]


def load_filter(program: bytes) -> int:
    """Load ``program`` on this thread (and what it starts), returning the listener.

    Needs no_new_privs (Landlock's restrict_self sets it) and no other thread.
    """
    number = SYS_SECCOMP.get(os.uname().machine)
    if number is None:
        raise GuardUnavailable(f"no seccomp system call number known for {os.uname().machine}")
    code = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    fd = libc().syscall(
        number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, ctypes.byref(prog)
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise GuardUnavailable(f"seccomp user notification: {os.strerror(err)}")
    return int(fd)


# ---------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Continue:
    """Let the caller's own call go on (its path is not in the bound directory)."""


@dataclass(frozen=True)
class Answer:
    """The call's result: a value, or an error number."""

    value: int = 0
    error: int = 0


@dataclass(frozen=True)
class Descriptor:
    """An opened file, to be put into the caller as the call's result."""

    fd: int
    cloexec: bool


Action = Continue | Answer | Descriptor


def where(path: str, layer: GuardLayer) -> str:
    """``bound`` (the bound directory or beneath), ``granted`` (beneath a place the
    guard layer leaves alone) or ``other`` (an ancestor of the bound directory, or
    beneath one but made after the start): the guard acts for the caller in the
    first and last."""
    if within(path, layer.bound):
        return "bound"
    if any(within(path, top) for top in layer.granted):
        return "granted"
    return "other"


class CallerGone(Exception):
    """The stopped call is no more (its process died, or a signal interrupted it)."""


class Caller:
    """The stopped caller, as the guard reads it: memory, working directory, umask."""

    def __init__(self, pid: int, listener: int | None = None, notif_id: int = 0) -> None:
        self.pid = pid
        self.listener = listener
        self.notif_id = notif_id

    def confirm(self) -> None:
        """Raise CallerGone unless the call is still waiting: then what was read of
        ``/proc/<pid>`` was the caller's, not a process that took its pid after it."""
        if self.listener is None:
            return
        try:
            fcntl.ioctl(self.listener, IOCTL_ID_VALID, ID.pack(self.notif_id))
        except OSError as exc:
            raise CallerGone() from exc

    def string(self, address: int) -> bytes:
        """A NUL-terminated string at ``address``, read once (ENAMETOOLONG past PATH_MAX)."""
        if address == 0:
            raise OSError(errno.EFAULT, "null path")
        out = b""
        with open(f"/proc/{self.pid}/mem", "rb", buffering=0) as mem:
            while len(out) < PATH_MAX:
                # up to the page's end: the next page may not be mapped
                chunk = min(4096 - (address + len(out)) % 4096, PATH_MAX - len(out))
                data = os.pread(mem.fileno(), chunk, address + len(out))
                if not data:
                    raise OSError(errno.EFAULT, "path not readable")
                end = data.find(b"\0")
                if end >= 0:
                    return out + data[:end]
                out += data
        raise OSError(errno.ENAMETOOLONG, "path too long")

    def directory(self, dirfd: int) -> str | None:
        """The directory a relative path starts from, or None when it is not a
        plain directory of the caller's view (deleted, a pipe, ...)."""
        link = f"/proc/{self.pid}/cwd" if dirfd == AT_FDCWD else f"/proc/{self.pid}/fd/{dirfd}"
        target = os.readlink(link)
        if not target.startswith("/") or target.endswith(" (deleted)"):
            return None
        return target

    def umask(self) -> int:
        with open(f"/proc/{self.pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
        return 0o022


@dataclass(frozen=True)
class Target:
    """A path the caller named: its parent resolved in the caller's view, its last part."""

    parent: str
    name: str

    @property
    def path(self) -> str:
        return os.path.join(self.parent, self.name)


def resolve(caller: Caller, dirfd: int, raw: bytes) -> Target | None:
    """Where a path argument points, or None to let the call go on unexamined
    (``/proc``'s magic links, an empty path, ``.`` and ``..``: the kernel and the
    Landlock layer handle those)."""
    path = os.fsdecode(raw)
    if not path:
        return None
    if not path.startswith("/"):
        base = caller.directory(dirfd)
        if base is None:
            return None
        path = os.path.join(base, path)
    parent, name = os.path.split(path.rstrip("/") or "/")
    if name in ("", ".", "..") or within(os.path.normpath(path), "/proc"):
        return None
    real_parent = os.path.realpath(parent)
    if within(real_parent, "/proc"):
        return None
    return Target(real_parent, name)


class Guard:
    """Decides, and acts for, one stopped call.

    ``home``: the bound directory is a user's home (Kubernetes), where no hidden
    entry at its top may be made either, but for ``kept`` beneath it (the
    project's %pip packages) and the way down to it (guarded_names.home_refusal).
    """

    def __init__(
        self,
        layer: GuardLayer,
        numbers: dict[int, str],
        *,
        home: bool = False,
        kept: str | None = None,
    ) -> None:
        self.layer = layer
        self.numbers = numbers
        self.home = home
        self.kept = os.path.relpath(kept, layer.bound) if kept else None
        self.refused = 0

    def decide(self, caller: Caller, nr: int, args: tuple[int, ...]) -> Action:
        name = self.numbers.get(nr)
        if name is None:
            return Continue()
        targets: list[Target] = []
        for dirfd_index, path_index in PATHS[name]:
            dirfd = AT_FDCWD if dirfd_index is None else _signed32(args[dirfd_index])
            target = resolve(caller, dirfd, caller.string(args[path_index]))
            if target is None:
                return Continue()
            targets.append(target)
        caller.confirm()
        if name in ("open", "openat", "creat"):
            flags = (
                os.O_CREAT | os.O_WRONLY | os.O_TRUNC
                if name == "creat"
                else args[OPEN_FLAGS_INDEX[name]]
            )
            mode = args[1] if name == "creat" else args[OPEN_FLAGS_INDEX[name] + 1]
            return self._open(caller, targets[0], int(flags) & 0xFFFFFFFF, int(mode) & MODE_BITS)
        if name in ("mkdir", "mkdirat"):
            mode = args[1] if name == "mkdir" else args[2]
            return self._mkdir(caller, targets[0], int(mode) & MODE_BITS)
        if name == "truncate":
            return self._truncate(targets[0], args[1])
        flags = args[4] if name == "renameat2" else 0
        return self._rename(targets[0], targets[1], int(flags) & 0xFFFFFFFF)

    def _gate(self, directory: str, path: str, making_dir: bool = False) -> Action | None:
        """What becomes of a call on ``path`` in ``directory`` before the guard makes
        it: the caller's own call goes on (a place the guard layer leaves alone), a
        refusal (a guarded name in the bound directory), or None: the guard makes it."""
        place = where(directory, self.layer)
        if place == "granted":
            return Continue()
        if place == "bound":
            return self._refusal(path, making_dir)
        return None

    def _refusal(self, path: str, making_dir: bool = False) -> Answer | None:
        relative = os.path.relpath(path, self.layer.bound)
        if self.home:
            why = guarded_names.home_refusal(relative, self.kept, making_dir)
        else:
            why = guarded_names.refusal(relative)
        if why is None:
            return None
        self.refused += 1
        # The log is the host's: a loop of refusals must not fill it.
        if self.refused <= LOGGED_REFUSALS or self.refused % 1000 == 0:
            log.warning("refused in %s (%d so far): %s", self.layer.bound, self.refused, why)
        return Answer(error=errno.EPERM)

    def _open(self, caller: Caller, target: Target, flags: int, mode: int) -> Action:
        path = target.path
        # Where the kernel would create or open: a link the user made is followed
        # unless the call says not to (a sandbox can make none there).
        if not flags & os.O_NOFOLLOW and not (flags & os.O_CREAT and flags & os.O_EXCL):
            path = os.path.realpath(path)
        # O_TMPFILE names the directory its unnamed file goes in.
        tmpfile = flags & os.O_TMPFILE == os.O_TMPFILE
        if gated := self._gate(path if tmpfile else os.path.dirname(path), path):
            return gated
        try:
            with _umask(caller.umask()):
                fd = os.open(path, (flags | os.O_NOFOLLOW | os.O_CLOEXEC), mode)
        except OSError as exc:
            return Answer(error=exc.errno or errno.EIO)
        return Descriptor(fd, cloexec=bool(flags & os.O_CLOEXEC))

    def _mkdir(self, caller: Caller, target: Target, mode: int) -> Action:
        if gated := self._gate(target.parent, target.path, making_dir=True):
            return gated
        try:
            with _umask(caller.umask()):
                os.mkdir(target.path, mode)
        except OSError as exc:
            return Answer(error=exc.errno or errno.EIO)
        return Answer()

    def _truncate(self, target: Target, length: int) -> Action:
        path = os.path.realpath(target.path)
        if gated := self._gate(os.path.dirname(path), path):
            return gated
        try:
            os.truncate(path, _signed64(length))
        except OSError as exc:
            return Answer(error=exc.errno or errno.EIO)
        return Answer()

    def _rename(self, old: Target, new: Target, flags: int) -> Action:
        places = (where(old.parent, self.layer), where(new.parent, self.layer))
        if places == ("granted", "granted"):
            return Continue()
        if places[1] == "bound" and places[0] != "bound":
            # Into the bound directory from elsewhere: what it brings was never
            # looked at. EXDEV makes mv and shutil.move copy it, entry by entry,
            # through the guard.
            return Answer(error=errno.EXDEV)
        for target, place in zip((old, new), places, strict=True):
            if place == "bound" and (refused := self._refusal(target.path)):
                return refused
        if flags & ~RENAME_FLAGS_ALL:
            return Answer(error=errno.EINVAL)
        result = _RENAMEAT2(AT_FDCWD, os.fsencode(old.path), AT_FDCWD, os.fsencode(new.path), flags)
        if result != 0:
            return Answer(error=ctypes.get_errno() or errno.EIO)
        return Answer()


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """The caller's umask for what the guard makes (it is single-threaded)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & (1 << 31) else value


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value & (1 << 63) else value


# ---------------------------------------------------------------- the loop


def serve(listener: int, guard: Guard) -> NoReturn:
    """Answer stopped calls until no process is left under the filter.

    (A parent-death signal cannot end the guard: Landlock's signal scope keeps the
    runtime, in a nested domain, from signalling it, even as it dies.)
    """
    buf = bytearray(NOTIF.size)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    while True:
        events = poller.poll()
        if any(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, mask in events):
            os._exit(0)  # every process under the filter is gone
        buf[:] = bytes(NOTIF.size)
        try:
            fcntl.ioctl(listener, IOCTL_RECV, buf, True)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # the caller went before it was read
                continue
            log.error("write guard stops: %s", exc)
            os._exit(1)
        notif_id, pid, _flags, nr, _arch, _ip, *args = NOTIF.unpack(buf)
        caller = Caller(pid, listener, notif_id)
        try:
            action = guard.decide(caller, nr, tuple(args))
        except CallerGone:
            continue
        except OSError as exc:
            # The caller's memory or view could not be read: refuse, never guess.
            action = Answer(
                error=exc.errno if exc.errno in (errno.ENAMETOOLONG, errno.EFAULT) else errno.EPERM
            )
        except Exception:  # a bug here must not stop the guard: refuse this call
            log.exception("write guard failed on a call; refused")
            action = Answer(error=errno.EPERM)
        _respond(listener, notif_id, action)


def _respond(listener: int, notif_id: int, action: Action) -> None:
    try:
        if isinstance(action, Descriptor):
            try:
                # ENOENT, and no file put anywhere, when the caller is gone
                flags = os.O_CLOEXEC if action.cloexec else 0
                fcntl.ioctl(
                    listener,
                    IOCTL_ADDFD,
                    ADDFD.pack(notif_id, ADDFD_FLAG_SEND, action.fd, 0, flags),
                )
            finally:
                os.close(action.fd)
            return
        if isinstance(action, Continue):
            response = RESP.pack(notif_id, 0, 0, FLAG_CONTINUE)
        else:
            response = RESP.pack(notif_id, action.value, -action.error if action.error else 0, 0)
        fcntl.ioctl(listener, IOCTL_SEND, response)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # ENOENT: the caller is gone, or was interrupted
            log.warning("write guard could not answer a call: %s", exc)


# ---------------------------------------------------------------- start


def start(
    layer: GuardLayer,
    then: Rules | None = None,
    *,
    home: bool = False,
    kept: str | None = None,
) -> int:
    """Split this process: the guard goes on in a child, in this Landlock domain;
    this process takes ``then`` (rules the guard keeps and it gives up), the guard
    layer and the filter. Returns the guard's pid. ``home`` and ``kept``: Guard's.

    Call it before any thread exists. Raises GuardUnavailable or LandlockError
    with nothing changed in this process but the fork.
    """
    program, numbers = filter_program()
    guard = Guard(layer, numbers, home=home, kept=kept)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runtime = os.getpid()
    pid = os.fork()
    if pid == 0:  # the guard
        ours.close()
        _become_guard(theirs, runtime, guard)
    theirs.close()
    try:
        libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # (a set-uid bootstrap clears it)
        if then is not None:
            restrict_self(then)
        restrict_self(layer.rules)
        listener = load_filter(program)
    except (LandlockError, GuardUnavailable):
        ours.close()  # the guard, given nothing, goes (it may not be signalled from here)
        os.waitpid(pid, 0)
        raise
    try:
        socket.send_fds(ours, [b"L"], [listener])
    finally:
        os.close(listener)
        ours.close()
    return pid


def _become_guard(channel: socket.socket, runtime: int, guard: Guard) -> NoReturn:
    try:
        if os.getppid() != runtime:
            os._exit(0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _message, fds, _flags, _address = socket.recv_fds(channel, 1, 1)
        channel.close()
        if not fds:
            os._exit(0)  # the runtime could not load the filter
        listener = fds[0]
        # Nothing of the runtime's but stderr (its log) and the listener.
        os.closerange(3, listener)
        os.closerange(listener + 1, 1 << 16)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.close(devnull)
        serve(listener, guard)
    except BaseException:
        log.exception("write guard failed to start")
    os._exit(1)


def probe() -> str | None:
    """Why the guard cannot run on this machine, or None when it can (tried for real
    in a throwaway process)."""
    import subprocess

    parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        f"import os, sys; sys.path.insert(0, {parent!r}); "
        "from jupyter_sandbox.runtime import write_guard as w; "
        "p, _ = w.filter_program(); "
        f"w.libc().prctl({PR_SET_NO_NEW_PRIVS}, 1, 0, 0, 0); os.close(w.load_filter(p))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the write guard could not be tried: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    return None
