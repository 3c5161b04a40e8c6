"""Landlock rules a sandbox's first process puts on itself and everything it starts.

Landlock is the kernel's unprivileged access control for file hierarchies (Linux
5.13 and later): a process can give up rights for good, before it runs anything
it does not trust, and its children inherit the restriction. The runtime server
makes and applies them from its own view of the filesystem before it starts
anything else (``python -m jupyter_sandbox.runtime --data-only DIR``).

One rule set so far, :func:`bound_tree_carries_data`: beneath the notebook's
directory, bound from the host, no symbolic link, FIFO, socket or device node can
be created (``MAKE_SYM``, ``MAKE_FIFO``, ``MAKE_SOCK``, ``MAKE_CHAR``,
``MAKE_BLOCK``), because host tools (jupyter_server's checkpoints, git, a shell)
follow or open what they find there; everywhere else the sandbox keeps them.
Landlock cannot exclude a directory from a grant on its parent, so the grant is
made on every sibling along the path down to the bound directory instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

# Syscall numbers are the same on every architecture that has Landlock.
SYS_CREATE_RULESET = 444
SYS_ADD_RULE = 445
SYS_RESTRICT_SELF = 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

MAKE_CHAR = 1 << 6
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: denied everywhere unless granted, handled or not
# What a bound directory may not receive.
SPECIAL_FILES = MAKE_SYM | MAKE_FIFO | MAKE_SOCK | MAKE_CHAR | MAKE_BLOCK


class LandlockError(OSError):
    """Landlock is missing here, or refused a rule."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


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

    Raises LandlockError when the kernel has no Landlock ABI 2 (REFER) or refuses.
    Call it before any thread is started: other threads keep their rights.
    """
    if abi_version() < 2:
        raise LandlockError("Landlock (ABI 2 or later) is not available on this kernel")
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    attr = _RulesetAttr(rules.handled)
    ruleset = libc.syscall(
        SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
    )
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
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0):
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, 0):
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)


def _error(what: str) -> LandlockError:
    errno = ctypes.get_errno()
    return LandlockError(errno, f"{what}: {os.strerror(errno)}")
