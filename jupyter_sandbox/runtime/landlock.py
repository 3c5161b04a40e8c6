"""Landlock rules a sandbox's first process puts on itself and everything it starts.

Landlock is the kernel's unprivileged access control for file hierarchies (Linux
5.13 and later): a process can give up rights for good, before it runs anything
it does not trust, and its children inherit the restriction. The runtime server
makes and applies them from its own view of the filesystem before it starts
anything else (``python -m jupyter_sandbox.runtime --data-only DIR``).

Two rule sets:

* :func:`bound_tree_carries_data` (inside bubblewrap): beneath the notebook's
  directory, bound from the host, no symbolic link, FIFO, socket or device node
  can be created (``MAKE_SYM``, ``MAKE_FIFO``, ``MAKE_SOCK``, ``MAKE_CHAR``,
  ``MAKE_BLOCK``), because host tools (jupyter_server's checkpoints, git, a shell)
  follow or open what they find there; everywhere else the sandbox keeps them.
  Landlock cannot exclude a directory from a grant on its parent, so the grant is
  made on every sibling along the path down to the bound directory instead.
* :func:`confinement` (where bubblewrap is missing): the whole filesystem is
  closed but for what the sandbox needs (the system and the Python installation
  read-only, its own directories read-write, the bound directory as data), TCP
  connections only to the ports named (ABI 4), and no signals or abstract Unix
  sockets to anything outside (ABI 6). Landlock also keeps a confined process
  from ptracing (or reading ``/proc/<pid>/environ`` of) any process outside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from dataclasses import asdict, dataclass

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


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def abi_version() -> int:
    """The Landlock ABI this kernel offers (0: none)."""
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
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


def confinement(
    *,
    read_only: list[str],
    read_write: list[str],
    data_only: str | None,
    devices: str = "/dev",
    connect_ports: tuple[int, ...] = (53, 80, 443),
    abi: int | None = None,
) -> Rules:
    """A whole process confined by Landlock alone, as far as this kernel's ABI goes.

    Paths that do not exist are left out. ``data_only`` (the bound notebook
    directory) is read-write without SPECIAL_FILES.
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
        if os.path.isdir(path):
            grants.append((path, everything))
    if data_only is not None and os.path.isdir(data_only):
        grants.append((data_only, everything & ~SPECIAL_FILES))
    return Rules(
        handled=everything,
        grants=tuple(grants),
        handled_net=CONNECT_TCP if abi >= 4 else 0,
        ports=tuple(connect_ports) if abi >= 4 else (),
        scoped=SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0,
    )


def bound_tree_carries_data(bound: str, root: str = "/") -> Rules:
    """No special files beneath ``bound``; everything as before elsewhere.

    Grants SPECIAL_FILES and REFER on every directory beside the path from
    ``root`` down to ``bound``, as it is now (a directory made later beside an
    ancestor of ``bound`` does not get them), and REFER alone on ``bound``:
    renames and links within it stay possible (links across mounts never were).
    """
    bound = os.path.normpath(bound)
    grants: list[tuple[str, int]] = []
    here = os.path.normpath(root)
    for part in os.path.relpath(bound, here).split(os.sep):
        for entry in sorted(os.listdir(here)):
            path = os.path.join(here, entry)
            if entry != part and os.path.isdir(path) and not os.path.islink(path):
                grants.append((path, SPECIAL_FILES | REFER))
        here = os.path.join(here, part)
    grants.append((bound, REFER))
    return Rules(SPECIAL_FILES | REFER, tuple(grants))


def restrict_self(rules: Rules) -> None:
    """Put ``rules`` on this process and everything it starts, for good.

    Raises LandlockError when the kernel's Landlock is older than the rules need
    (ABI 2, for REFER, at least) or refuses.
    Call it before any thread is started: other threads keep their rights.
    """
    if abi_version() < rules.abi:
        raise LandlockError(f"Landlock ABI {rules.abi} is not available on this kernel")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
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


def to_json(rules: Rules) -> str:
    return json.dumps(asdict(rules))


def from_json(text: str) -> Rules:
    data = json.loads(text)
    return Rules(
        handled=int(data["handled"]),
        grants=tuple((str(p), int(r)) for p, r in data["grants"]),
        handled_net=int(data.get("handled_net", 0)),
        ports=tuple(int(p) for p in data.get("ports", ())),
        scoped=int(data.get("scoped", 0)),
    )
