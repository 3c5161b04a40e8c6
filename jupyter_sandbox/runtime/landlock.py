"""Landlock rules a sandbox's first process puts on itself and everything it starts.

Landlock is the kernel's unprivileged access control for file hierarchies (Linux
5.13 and later): a process can give up rights for good, before it runs anything
it does not trust, and its children inherit the restriction. The daemon writes
a :class:`Policy` (paths by kind); the runtime server turns it into rules in its
own view of the filesystem and applies them before it starts anything else
(``python -m jupyter_sandbox.runtime --confine POLICY``).

:func:`confinement` closes the whole filesystem but for what the sandbox needs:
the system and the Python installation read-only, its own directories
read-write, and the notebook's directory, bound from the host, as data only: no
symbolic link, FIFO, socket or device node can be created beneath it
(``MAKE_SYM``, ``MAKE_FIFO``, ``MAKE_SOCK``, ``MAKE_CHAR``, ``MAKE_BLOCK``),
because host tools (jupyter_server's checkpoints, git, a shell) follow or open
what they find there (where it lies beneath a read-write place, such as the
sandbox's /tmp, that place keeps them only in the directories beside the path
down to it, as they are at the start). With ABI 6 no signal or abstract Unix socket reaches
anything outside, and Landlock keeps a confined process from ptracing any process
outside its domain.

* Where bubblewrap is missing this is the sandbox's confinement, with TCP
  connections only to the ports named (ABI 4).
* Inside bubblewrap it is a second layer over the sandbox's own view (its
  mounts), so that one layer's mistake is not an escape; TCP is left to the
  network namespace there.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import asdict, dataclass

from .paths import within

# Syscall numbers are the same on every architecture that has Landlock.
SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
RULE_NET_PORT = 2
PR_SET_NO_NEW_PRIVS = 38

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: denied everywhere unless granted, handled or not
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
# What a bound directory may not receive.
SPECIAL_FILES = MAKE_SYM | MAKE_FIFO | MAKE_SOCK | MAKE_CHAR | MAKE_BLOCK
# Every file-system right an ABI knows (index: ABI version).
FS_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
READ = EXECUTE | READ_FILE | READ_DIR
# What a sandbox without a network namespace of its own may connect to: DNS and the web.
WEB_PORTS = (53, 80, 443)
CONNECT_TCP = 1 << 1  # handled_access_net, ABI 4 (bind is 1 << 0, left to the sandbox)
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # scoped, ABI 6
SCOPE_SIGNAL = 1 << 1


class LandlockError(OSError):
    """Landlock is missing here, or refused a rule."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


# This process's own C library, loaded once: looking it up by name later may need
# a temporary directory that a confined process no longer reaches.
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long


def libc() -> ctypes.CDLL:
    """The C library, for the system calls the standard library has no wrapper for."""
    return _LIBC


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none)."""
    libc = _LIBC
    version = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    return max(int(version), 0)


@dataclass(frozen=True)
class Rules:
    """Rights handled by a rule set, and what each hierarchy is granted of them."""

    handled: int
    grants: tuple[tuple[str, int], ...]
    handled_net: int = 0
    ports: tuple[int, ...] = ()  # TCP ports connect() may reach
    scoped: int = 0

    @property
    def abi(self) -> int:
        """The least ABI that can express these rules."""
        if self.scoped:
            return 6
        if self.handled & IOCTL_DEV:
            return 5
        if self.handled_net:
            return 4
        return 3 if self.handled & TRUNCATE else 2


@dataclass(frozen=True)
class Policy:
    """What a sandbox may touch, by path, before the paths are looked at: the daemon
    writes it, the runtime turns it into Rules (``confinement``) in its own view of
    the filesystem, which inside bubblewrap is not the daemon's."""

    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    data_only: str | None = None
    # TCP ports connect() may reach; None leaves TCP alone (a network namespace
    # of its own and the daemon's egress policy decide there).
    connect_ports: tuple[int, ...] | None = WEB_PORTS
    # Directories whose entries may be listed, not read: a source checkout on the
    # kernel's path (Python's importer lists a path entry to find a package in it).
    list_only: tuple[str, ...] = ()
    # Names host tools run are kept out of ``data_only`` (write_guard.py).
    write_guard: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        data = json.loads(text)
        ports = data.get("connect_ports")
        return cls(
            read_only=tuple(str(p) for p in data["read_only"]),
            read_write=tuple(str(p) for p in data["read_write"]),
            data_only=str(data["data_only"]) if data.get("data_only") else None,
            connect_ports=tuple(int(p) for p in ports) if ports is not None else None,
            list_only=tuple(str(p) for p in data.get("list_only", ())),
            write_guard=bool(data.get("write_guard", False)),
        )

    def rules(self, abi: int | None = None) -> Rules:
        return confinement(
            read_only=list(self.read_only),
            read_write=list(self.read_write),
            data_only=self.data_only,
            list_only=list(self.list_only),
            connect_ports=self.connect_ports,
            abi=abi,
        )


def confinement(
    *,
    read_only: list[str],
    read_write: list[str],
    data_only: str | None,
    list_only: list[str] | None = None,
    devices: str = "/dev",
    connect_ports: tuple[int, ...] | None = WEB_PORTS,
    abi: int | None = None,
) -> Rules:
    """A whole process confined by Landlock, as far as this kernel's ABI goes.

    Paths that do not exist are left out. ``data_only`` (the bound notebook
    directory) is read-write without SPECIAL_FILES; ``list_only`` directories may
    be listed, not read. ``connect_ports`` None: TCP is not handled.
    """
    abi = abi_version() if abi is None else abi
    if abi < 2:
        raise LandlockError("Landlock (ABI 2 or later) is not available on this kernel")
    everything = FS_RIGHTS[max(v for v in FS_RIGHTS if v <= abi)]
    grants: list[tuple[str, int]] = []
    for path in read_only:
        if os.path.exists(path):
            grants.append((path, READ if os.path.isdir(path) else READ & ~READ_DIR))
    if os.path.isdir(devices):
        grants.append((devices, READ_FILE | WRITE_FILE | READ_DIR | (IOCTL_DEV & everything)))
    for path in read_write:
        if not os.path.isdir(path):
            continue
        if data_only is not None and _beneath(path, data_only):
            # Rights add up down a hierarchy and Landlock cannot take one back
            # beneath a grant: the read-write place keeps special files only in
            # the directories beside the path down to the bound one, as they are
            # now (one made later gets none).
            grants.append((path, everything & ~SPECIAL_FILES))
            grants += [(p, SPECIAL_FILES) for p in _beside_the_path(path, data_only)]
        else:
            grants.append((path, everything))
    if data_only is not None and os.path.isdir(data_only):
        grants.append((data_only, everything & ~SPECIAL_FILES))
    grants += [(path, READ_DIR) for path in list_only or () if os.path.isdir(path)]
    return Rules(
        handled=everything,
        grants=tuple(grants),
        handled_net=CONNECT_TCP if abi >= 4 and connect_ports is not None else 0,
        ports=tuple(connect_ports) if abi >= 4 and connect_ports is not None else (),
        scoped=SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0,
    )


# What only the write guard (write_guard.py) may do in a bound directory.
GUARDED_WRITES = WRITE_FILE | TRUNCATE | MAKE_REG | MAKE_DIR


@dataclass(frozen=True)
class GuardLayer:
    """A second rule set over :func:`confinement`'s: no file opened for writing,
    truncated or made, no directory made, in the bound directory (nor directly in
    its ancestors); everywhere else these rights are left to the first layer."""

    rules: Rules
    bound: str
    # Where the layer grants them: every directory beside the path down to ``bound``.
    granted: tuple[str, ...]


def guard_layer(bound: str, abi: int | None = None) -> GuardLayer:
    """The layer a bound directory's write guard puts under the runtime and kernel.

    Landlock cannot take a right back beneath a grant, so the rights are granted
    beside the path from ``/`` down to ``bound`` (as it is now), never above it.
    """
    abi = abi_version() if abi is None else abi
    if abi < 2:
        raise LandlockError("Landlock (ABI 2 or later) is not available on this kernel")
    rights = GUARDED_WRITES & FS_RIGHTS[max(v for v in FS_RIGHTS if v <= abi)]
    bound = os.path.realpath(bound)
    granted = tuple(_beside_the_path("/", bound))
    # Every rule set handles REFER, listed or not: granted everywhere, or files
    # could no longer be moved between directories anywhere.
    grants = (("/", REFER), *((p, rights) for p in granted))
    return GuardLayer(Rules(rights | REFER, grants), bound, granted)


def _beneath(top: str, path: str) -> bool:
    top, path = os.path.normpath(top), os.path.normpath(path)
    return path != top and within(path, top)


def _beside_the_path(top: str, bound: str) -> list[str]:
    """Every directory beside the path from ``top`` down to ``bound`` (not on it)."""
    out: list[str] = []
    here = os.path.normpath(top)
    for part in os.path.relpath(os.path.normpath(bound), here).split(os.sep):
        try:
            entries = sorted(os.listdir(here))
        except OSError:
            break
        for entry in entries:
            path = os.path.join(here, entry)
            if entry != part and os.path.isdir(path) and not os.path.islink(path):
                out.append(path)
        here = os.path.join(here, part)
    return out


def restrict_self(rules: Rules) -> None:
    """Put ``rules`` on this process and everything it starts, for good.

    Raises LandlockError when the kernel's Landlock is older than the rules need
    (ABI 2, for REFER, at least) or refuses.
    Call it before any thread is started: other threads keep their rights.
    """
    if abi_version() < rules.abi:
        raise LandlockError(f"Landlock ABI {rules.abi} is not available on this kernel")
    libc = _LIBC
    attr = _RulesetAttr(rules.handled, rules.handled_net, rules.scoped)
    # the struct as long as the ABI that the rules need knows it
    size = 24 if rules.scoped else 16 if rules.handled_net else 8
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path, rights in rules.grants:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                beneath = _PathBeneathAttr(rights & rules.handled, fd)
                if libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(beneath), 0):
                    raise _error(f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        for port in rules.ports:
            net = _NetPortAttr(CONNECT_TCP, port)
            if libc.syscall(SYS_ADD_RULE, ruleset, RULE_NET_PORT, ctypes.byref(net), 0):
                raise _error(f"landlock_add_rule port {port}")
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, 0):
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _error(what: str) -> LandlockError:
    errno = ctypes.get_errno()
    return LandlockError(errno, f"{what}: {os.strerror(errno)}")
