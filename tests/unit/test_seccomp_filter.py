"""The seccomp deny list and its compiled program (no process is confined here)."""

from __future__ import annotations

import errno
import os
import platform

import pytest

from jupyter_sandbox.control_plane.local import seccomp_filter as sf
from jupyter_sandbox.control_plane.local.seccomp_filter import CMP_EQ, CMP_GE, Rule

needs_libseccomp = pytest.mark.skipif(
    not sf.probe().available, reason=f"no seccomp filter here: {sf.probe().detail}"
)


def _by_name(name: str) -> list[Rule]:
    return [r for r in sf.rules() if r.syscall == name]


def _family_denied(family: int) -> bool:
    """Evaluate the socket family rules (arg 0 only) the way the kernel would."""
    for rule in _by_name("socket"):
        if len(rule.args) != 1:
            continue
        (check,) = rule.args
        if (check.op == CMP_EQ and family == check.value) or (
            check.op == CMP_GE and family >= check.value
        ):
            return True
    return False


@pytest.mark.parametrize(
    ("name", "expected_errno"),
    [
        ("unshare", errno.EPERM),
        ("setns", errno.EPERM),
        ("keyctl", errno.EPERM),
        ("add_key", errno.EPERM),
        ("request_key", errno.EPERM),
        ("ptrace", errno.EPERM),
        ("process_vm_readv", errno.EPERM),
        ("process_vm_writev", errno.EPERM),
        ("mount", errno.EPERM),
        ("umount2", errno.EPERM),
        ("pivot_root", errno.EPERM),
        ("chroot", errno.EPERM),
        ("syslog", errno.EPERM),
        ("uselib", errno.EPERM),
        ("acct", errno.EPERM),
        ("modify_ldt", errno.EPERM),
        ("quotactl", errno.EPERM),
        ("perf_event_open", errno.EPERM),
        ("bpf", errno.EPERM),
        ("userfaultfd", errno.EPERM),
        ("kexec_load", errno.EPERM),
        ("kexec_file_load", errno.EPERM),
        ("init_module", errno.EPERM),
        ("finit_module", errno.EPERM),
        ("delete_module", errno.EPERM),
        ("open_by_handle_at", errno.EPERM),
        ("clone3", errno.ENOSYS),
        ("fsopen", errno.ENOSYS),
        ("io_uring_setup", errno.ENOSYS),
    ],
)
def test_denied_unconditionally(name: str, expected_errno: int) -> None:
    assert [(r.errno, r.args) for r in _by_name(name)] == [(expected_errno, ())]


def test_clone_denied_only_with_clone_newuser() -> None:
    (rule,) = _by_name("clone")
    (check,) = rule.args
    assert (check.op, check.mask, check.value) == (
        sf.CMP_MASKED_EQ,
        sf.CLONE_NEWUSER,
        sf.CLONE_NEWUSER,
    )
    assert check.index == (1 if platform.machine().startswith("s390") else 0)


def test_ioctl_denies_tiocsti_and_tioclinux_only() -> None:
    requests = sorted(r.args[0].value for r in _by_name("ioctl"))
    assert requests == [sf.TIOCSTI, sf.TIOCLINUX]
    assert all(r.args[0].mask == 0xFFFFFFFF and r.args[0].index == 1 for r in _by_name("ioctl"))


def test_personality_only_per_linux() -> None:
    (rule,) = _by_name("personality")
    assert rule.args == (sf.ArgCheck(0, sf.CMP_NE, sf.PER_LINUX),)


@pytest.mark.parametrize("family", range(64))
def test_socket_families(family: int) -> None:
    assert _family_denied(family) == (family not in sf.ALLOWED_SOCKET_FAMILIES)


def test_netlink_only_route() -> None:
    (rule,) = [r for r in _by_name("socket") if len(r.args) == 2]
    assert rule.errno == errno.EPROTONOSUPPORT
    assert rule.args == (
        sf.ArgCheck(0, CMP_EQ, sf.AF_NETLINK),
        sf.ArgCheck(2, sf.CMP_NE, sf.NETLINK_ROUTE),
    )


@needs_libseccomp
def test_program_is_cached_and_well_formed() -> None:
    compiled = sf.compile_filter()
    assert sf.compile_filter() is compiled
    assert sf.bpf_program() is compiled.program
    assert len(compiled.program) % 8 == 0 and len(compiled.program) > 8 * 50


@needs_libseccomp
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 specific ABIs")
def test_x86_64_covers_compat_abis() -> None:
    compiled = sf.compile_filter()
    assert compiled.architectures == ("x86_64", "x86", "x32")
    # Only socket's argument checks are impossible, and only on i386 (socketcall).
    assert compiled.skipped
    assert all(s.startswith("x86: socket ") for s in compiled.skipped)


@needs_libseccomp
def test_program_fd_is_fresh_readable_and_not_inherited() -> None:
    first, second = sf.program_fd(), sf.program_fd()
    try:
        assert first != second
        assert not os.get_inheritable(first)
        for fd in (first, second):
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
            assert data == sf.bpf_program()
    finally:
        os.close(first)
        os.close(second)


def test_probe_reports_missing_libseccomp(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise sf.SeccompUnavailable("libseccomp is not usable: Unable to find libseccomp")

    monkeypatch.setattr(sf, "_load_binding", missing)
    sf.compile_filter.cache_clear()
    sf.probe.cache_clear()
    try:
        support = sf.probe()
        assert not support.available
        assert "libseccomp" in support.detail
    finally:
        sf.compile_filter.cache_clear()
        sf.probe.cache_clear()


@needs_libseccomp
def test_probe_available() -> None:
    support = sf.probe()
    assert support.available
    assert "BPF ops" in support.detail


def _denies(name: str, args: dict[int, int]) -> bool:
    """Whether the deny rules for ``name`` match these argument values."""
    for rule in _by_name(name):
        if all((args.get(c.index, 0) & c.mask) == c.value for c in rule.args):
            return True
    return False


@pytest.mark.parametrize(
    ("name", "args", "denied"),
    [
        ("chmod", {1: 0o4755}, True),
        ("chmod", {1: 0o2755}, True),
        ("chmod", {1: 0o755}, False),
        ("chmod", {1: 0o1777}, False),  # sticky is harmless
        ("fchmod", {1: 0o6755}, True),
        ("fchmodat", {2: 0o4700}, True),
        ("fchmodat", {2: 0o644}, False),
        ("fchmodat2", {2: 0o2755}, True),
        ("creat", {1: 0o4755}, True),
        ("mknodat", {2: 0o104755}, True),
        ("openat", {2: os.O_CREAT | os.O_WRONLY, 3: 0o4755}, True),
        ("openat", {2: os.O_CREAT | os.O_WRONLY, 3: 0o644}, False),
        ("openat", {2: os.O_RDONLY, 3: 0o4755}, False),  # no file made: mode is ignored
        ("openat", {2: os.O_TMPFILE | os.O_WRONLY, 3: 0o2755}, True),
        ("open", {1: os.O_CREAT, 2: 0o6000}, True),
    ],
)
def test_no_set_id_bit_can_be_given(name: str, args: dict[int, int], denied: bool) -> None:
    assert _denies(name, args) is denied
    assert all(r.errno == errno.EPERM for r in _by_name(name))


def test_openat2_falls_back_since_its_mode_is_unreadable() -> None:
    assert [r.errno for r in _by_name("openat2")] == [errno.ENOSYS]
