"""A seccomp filter for sandbox processes, handed to ``bwrap --seccomp FD``.

The policy follows Flatpak's ``setup_seccomp`` (flatpak-run.c) and Docker's default
profile: everything is allowed except a list of system calls a Python kernel never
needs and that either widen the kernel's attack surface or escape the sandbox's
view of the system. Denied calls fail with ``EPERM``, or ``ENOSYS`` where user space
is expected to fall back to an older call (``clone3`` -> ``clone``, io_uring -> plain
I/O, the new mount API).

bubblewrap loads the program right before it executes the sandbox's first process,
after it has set up the mounts and namespaces, so the filter only has to let the
runtime, ipykernel, pip and their subprocesses work: ``mount``, ``pivot_root`` and
friends can be denied outright.

Choices that differ from a pure allow-list or that deserve a note:

* ``ptrace`` is denied entirely (as Flatpak does without ``--devel`` and Docker does
  on older kernels), as are ``process_vm_readv``/``process_vm_writev``. Debuggers
  that attach to a child (gdb, py-spy) do not work inside a sandbox; ``pdb`` and
  ``faulthandler`` need no ptrace and do.
* ``unshare`` and ``setns`` are denied entirely; ``clone`` only with
  ``CLONE_NEWUSER`` in its flags (the other namespace flags need capabilities the
  sandbox does not have).
* ``personality`` is allowed only with ``PER_LINUX`` (0), exactly as Flatpak.
  libseccomp cannot express "any of several values" for a deny rule, so even the
  query ``personality(0xffffffff)`` fails with ``EPERM``.
* ``socket`` is allowed for ``AF_UNSPEC``, ``AF_UNIX``, ``AF_INET``, ``AF_INET6`` and
  ``AF_NETLINK`` (glibc's ``getaddrinfo`` and ``psutil`` use ``NETLINK_ROUTE``);
  every other family fails with ``EAFNOSUPPORT``. Netlink is restricted further
  than Flatpak does, to ``NETLINK_ROUTE`` only (other protocols fail with
  ``EPROTONOSUPPORT``). Argument checks on ``socket`` are only possible where it
  is a system call of its own: on i386 the multiplexed ``socketcall`` cannot be
  inspected, so 32-bit programs are not restricted by family (Flatpak has the
  same limitation).
* Set-user-ID and set-group-ID bits cannot be set: not by ``chmod`` and friends,
  not in the mode of a file being created (``open``/``openat``/``creat``/``mknod``
  with ``O_CREAT`` or ``O_TMPFILE``). A root daemon's sandboxes write the notebook
  directory through an idmapped mount, so what they create is owned on disk by
  the directory's owner, often root: a set-user-ID copy of a shell there would be
  root for any host user who runs it. ``openat2``, whose mode seccomp cannot
  read, fails with ``ENOSYS`` (nothing falls back to it; glibc's ``open`` does
  not use it).
* On x86-64 the program also covers the i386 and x32 ABIs (like Flatpak), so a
  32-bit binary cannot bypass the rules through the compat system call table.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import platform
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
PER_LINUX = 0
AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
NETLINK_ROUTE = 0
S_ISUID = 0o4000
S_ISGID = 0o2000
O_CREAT = 0o100
O_TMPFILE_ONLY = 0o20000000  # __O_TMPFILE: O_TMPFILE without its O_DIRECTORY
# Where the mode is, for calls that set one: (flags index or None, mode index).
MODE_ARGUMENTS = {
    "chmod": (None, 1),
    "fchmod": (None, 1),
    "fchmodat": (None, 2),
    "fchmodat2": (None, 2),
    "creat": (None, 1),
    "mknod": (None, 1),
    "mknodat": (None, 2),
    "open": (1, 2),
    "openat": (2, 3),
}
ALLOWED_SOCKET_FAMILIES = (0, AF_UNIX, AF_INET, AF_INET6, AF_NETLINK)  # 0 is AF_UNSPEC

# Comparison operators, as numbered by libseccomp (enum scmp_compare).
CMP_NE = 1
CMP_EQ = 4
CMP_GE = 5
CMP_MASKED_EQ = 7


@dataclass(frozen=True)
class ArgCheck:
    """One comparison of a system call argument: ``arg[index] <op> value`` (masked)."""

    index: int
    op: int
    value: int
    mask: int = 0  # only for CMP_MASKED_EQ: (arg & mask) == value


@dataclass(frozen=True)
class Rule:
    """Deny ``syscall`` with ``errno`` when all of ``args`` hold (always, if there are none)."""

    syscall: str
    errno: int
    args: tuple[ArgCheck, ...] = ()
    exact: bool = False  # the argument check must not be rewritten (socket on i386)
    why: str = ""


def _clone_flags_index() -> int:
    """s390 and CRIS pass clone's flags second (CONFIG_CLONE_BACKWARDS2)."""
    return 1 if platform.machine().startswith("s390") else 0


def _plain(names: Iterable[str], err: int, why: str) -> list[Rule]:
    return [Rule(name, err, why=why) for name in names]


def rules() -> list[Rule]:
    """The deny list, in the order it is added to the filter."""
    eperm, enosys = errno.EPERM, errno.ENOSYS
    out: list[Rule] = []
    out += _plain(["syslog"], eperm, "kernel log (dmesg)")
    out += _plain(["uselib", "acct", "modify_ldt", "quotactl"], eperm, "obsolete or host-wide")
    out += _plain(["add_key", "keyctl", "request_key"], eperm, "kernel keyring")
    out += _plain(
        ["move_pages", "mbind", "get_mempolicy", "set_mempolicy", "migrate_pages"],
        eperm,
        "NUMA memory policy",
    )
    out += _plain(["unshare", "setns"], eperm, "no new namespaces")
    out.append(
        Rule(
            "clone",
            eperm,
            (ArgCheck(_clone_flags_index(), CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER),),
            why="no nested user namespaces",
        )
    )
    # seccomp cannot read clone3's struct clone_args; ENOSYS makes glibc use clone.
    out.append(Rule("clone3", enosys, why="flags unreadable; fall back to clone"))
    out += _plain(
        ["mount", "umount", "umount2", "pivot_root", "chroot"], eperm, "mount table is fixed"
    )
    out += _plain(
        ["open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"],
        enosys,
        "new mount API",
    )
    for request in (TIOCSTI, TIOCLINUX):
        check = (ArgCheck(1, CMP_MASKED_EQ, request, 0xFFFFFFFF),)
        out.append(Rule("ioctl", eperm, check, why="faking terminal input"))
    out += _plain(["ptrace", "process_vm_readv", "process_vm_writev"], eperm, "other processes")
    out += _plain(["perf_event_open", "bpf", "userfaultfd"], eperm, "kernel attack surface")
    out += _plain(
        ["io_uring_setup", "io_uring_enter", "io_uring_register"], enosys, "kernel attack surface"
    )
    out += _plain(
        ["kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"],
        eperm,
        "kernel modules",
    )
    out += _plain(
        ["create_module", "get_kernel_syms", "query_module", "nfsservctl", "_sysctl", "sysfs"],
        eperm,
        "obsolete",
    )
    out += _plain(["open_by_handle_at", "lookup_dcookie"], eperm, "bypass path checks")
    out += _plain(
        ["reboot", "swapon", "swapoff", "iopl", "ioperm", "vm86", "vm86old"], eperm, "host-wide"
    )
    out += _plain(["clock_settime", "clock_adjtime", "settimeofday", "stime"], eperm, "host clock")
    out.append(
        Rule("personality", eperm, (ArgCheck(0, CMP_NE, PER_LINUX),), why="no other personality")
    )
    out += _socket_rules()
    out += _set_id_rules()
    return out


def _set_id_rules() -> list[Rule]:
    """No set-user-ID or set-group-ID bit in any mode a file is given or made with."""
    out: list[Rule] = []
    for name, (flags, mode) in MODE_ARGUMENTS.items():
        for bit in (S_ISUID, S_ISGID):
            has_bit = ArgCheck(mode, CMP_MASKED_EQ, bit, bit)
            if flags is None:
                out.append(Rule(name, errno.EPERM, (has_bit,), why="set-id bits"))
                continue
            for creating in (O_CREAT, O_TMPFILE_ONLY):
                makes = ArgCheck(flags, CMP_MASKED_EQ, creating, creating)
                out.append(Rule(name, errno.EPERM, (makes, has_bit), why="set-id bits"))
    out.append(Rule("openat2", errno.ENOSYS, why="mode unreadable"))
    return out


def _socket_rules() -> list[Rule]:
    """Deny every family between and after the allowed ones (they are sorted)."""
    out: list[Rule] = []
    previous = -1
    for family in ALLOWED_SOCKET_FAMILIES:
        for denied in range(previous + 1, family):
            check = (ArgCheck(0, CMP_EQ, denied),)
            out.append(Rule("socket", errno.EAFNOSUPPORT, check, exact=True, why="family"))
        previous = family
    check = (ArgCheck(0, CMP_GE, previous + 1),)
    out.append(Rule("socket", errno.EAFNOSUPPORT, check, exact=True, why="family"))
    # Within AF_NETLINK only NETLINK_ROUTE (protocol 0). libseccomp allows one
    # comparison per argument, so the family is tested on arg 0 and the protocol on arg 2.
    out.append(
        Rule(
            "socket",
            errno.EPROTONOSUPPORT,
            (ArgCheck(0, CMP_EQ, AF_NETLINK), ArgCheck(2, CMP_NE, NETLINK_ROUTE)),
            exact=True,
            why="netlink protocol",
        )
    )
    return out


class SeccompUnavailable(RuntimeError):
    """No filter can be built here (libseccomp or its Python binding is missing)."""


@dataclass(frozen=True)
class SeccompSupport:
    available: bool
    detail: str


@dataclass(frozen=True)
class CompiledFilter:
    program: bytes  # struct sock_filter[]: 8 bytes per instruction
    architectures: tuple[str, ...]
    skipped: tuple[str, ...]  # "arch: rule: error" for rules an architecture cannot express


def _load_binding() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: no libseccomp.so
        raise SeccompUnavailable(f"libseccomp is not usable: {exc}") from exc
    return pyseccomp


def _architectures(seccomp: Any) -> list[tuple[str, int]]:
    """The native ABI first, then the compat ABIs its kernel may also run."""
    native = seccomp.system_arch()
    arch = seccomp.Arch
    names = {
        arch.X86_64: "x86_64",
        arch.X86: "x86",
        arch.X32: "x32",
        arch.AARCH64: "aarch64",
        arch.ARM: "arm",
    }
    extra = {arch.X86_64: [arch.X86, arch.X32], arch.AARCH64: [arch.ARM]}.get(native, [])
    return [(names.get(a, hex(a)), a) for a in [native, *extra]]


def _add_rule(seccomp: Any, filt: Any, rule: Rule) -> None:
    args = []
    for a in rule.args:
        if a.op == CMP_MASKED_EQ:
            args.append(seccomp.Arg(a.index, a.op, a.mask, a.value))
        else:
            args.append(seccomp.Arg(a.index, a.op, a.value))
    add = filt.add_rule_exactly if rule.exact else filt.add_rule
    add(seccomp.ERRNO(rule.errno), rule.syscall, *args)


def _filter_for(seccomp: Any, arch: int, native: bool, skipped: list[str], label: str) -> Any:
    filt = seccomp.SyscallFilter(seccomp.ALLOW)
    if not native:
        filt.add_arch(arch)
        filt.remove_arch(seccomp.Arch.NATIVE)
    for rule in rules():
        try:
            _add_rule(seccomp, filt, rule)
        except OSError as exc:
            # Unknown on this ABI, or an exact argument check it cannot express.
            skipped.append(f"{label}: {rule.syscall} {rule.args}: {exc.strerror}")
    return filt


def _export(filt: Any) -> bytes:
    with tempfile.TemporaryFile() as tmp:
        filt.export_bpf(tmp)
        tmp.seek(0)
        return tmp.read()


@functools.cache
def compile_filter() -> CompiledFilter:
    """Build the BPF program once (it never changes). Raises SeccompUnavailable."""
    seccomp = _load_binding()
    archs = _architectures(seccomp)
    skipped: list[str] = []
    main = None
    used: list[str] = []
    for index, (label, arch) in enumerate(archs):
        try:
            filt = _filter_for(seccomp, arch, index == 0, skipped, label)
            if main is None:
                main = filt
            else:
                main.merge(filt)
        except OSError as exc:
            if index == 0:
                raise SeccompUnavailable(f"libseccomp failed to build the filter: {exc}") from exc
            skipped.append(f"{label}: architecture not supported: {exc.strerror}")
            continue
        used.append(label)
    program = _export(main)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed program ({len(program)} B)")
    for line in skipped:
        log.debug("seccomp rule not added for %s", line)
    return CompiledFilter(program, tuple(used), tuple(skipped))


def bpf_program() -> bytes:
    """The compiled program: what ``bwrap --seccomp`` reads from its descriptor."""
    return compile_filter().program


@functools.cache
def probe() -> SeccompSupport:
    """Whether a filter can be built here, and if not, why."""
    try:
        compiled = compile_filter()
    except SeccompUnavailable as exc:
        return SeccompSupport(False, str(exc))
    instructions = len(compiled.program) // 8
    archs = ", ".join(compiled.architectures)
    return SeccompSupport(True, f"seccomp: {len(rules())} rules, {instructions} BPF ops ({archs})")


def program_fd() -> int:
    """A new readable descriptor positioned at the program's start, for ``--seccomp FD``.

    bwrap reads to end of file, so every bwrap needs its own descriptor. It is a
    memfd (or an unlinked temporary file), close-on-exec: pass it with
    ``pass_fds`` and close it in the parent once bwrap has started.
    """
    program = bpf_program()
    try:
        fd = os.memfd_create("jupyter-sandbox-seccomp", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        tmp = tempfile.TemporaryFile()  # already unlinked
        fd = os.dup(tmp.fileno())  # os.dup makes a close-on-exec copy
        tmp.close()
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
