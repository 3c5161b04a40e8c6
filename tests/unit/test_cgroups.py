"""Pure parts of the cgroup limits: parsing, layout, and what gets written where.

The "fake cgroupfs" tests build a directory tree shaped like a cgroup filesystem
(with the control files the kernel would create) and point the parser at it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.local import cgroups
from jupyter_sandbox.control_plane.local.cgroups import (
    CgroupLimits,
    CgroupMount,
    cgroup_dir,
    cpu_max,
    parse_mountinfo,
    parse_proc_cgroup,
)

# A Firecracker VM: v1 controllers plus an empty cgroup2 at .../unified.
MOUNTINFO_V1 = """\
25 1 253:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
# A desktop with systemd: only the unified hierarchy.
MOUNTINFO_V2 = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""
# Debian 10 style hybrid with cpu,cpuacct joined, and optional fields before " - ".
MOUNTINFO_HYBRID = """\
30 24 0:26 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate
33 24 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct
34 24 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory
"""
# Inside a container: only part of the hierarchy is mounted; a space in a mount point.
MOUNTINFO_CONTAINER = """\
700 690 0:30 /docker/abc /sys/fs/cgroup ro,nosuid master:9 - cgroup2 cgroup rw
701 690 0:31 /x /mnt/my\\040cg rw - cgroup cgroup rw,pids
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            MOUNTINFO_V1,
            [
                CgroupMount(1, "/sys/fs/cgroup/cpu", "/", frozenset({"cpu"})),
                CgroupMount(1, "/sys/fs/cgroup/cpuacct", "/", frozenset()),
                CgroupMount(1, "/sys/fs/cgroup/memory", "/", frozenset({"memory"})),
                CgroupMount(1, "/sys/fs/cgroup/pids", "/", frozenset({"pids"})),
                CgroupMount(1, "/sys/fs/cgroup/systemd", "/", frozenset()),
                CgroupMount(2, "/sys/fs/cgroup/unified", "/", frozenset()),
            ],
        ),
        (MOUNTINFO_V2, [CgroupMount(2, "/sys/fs/cgroup", "/", frozenset())]),
        (
            MOUNTINFO_HYBRID,
            [
                CgroupMount(2, "/sys/fs/cgroup/unified", "/", frozenset()),
                CgroupMount(1, "/sys/fs/cgroup/cpu,cpuacct", "/", frozenset({"cpu"})),
                CgroupMount(1, "/sys/fs/cgroup/memory", "/", frozenset({"memory"})),
            ],
        ),
        (
            MOUNTINFO_CONTAINER,
            [
                CgroupMount(2, "/sys/fs/cgroup", "/docker/abc", frozenset()),
                CgroupMount(1, "/mnt/my cg", "/x", frozenset({"pids"})),
            ],
        ),
        ("", []),
        ("garbage line without separator\n", []),
    ],
)
def test_parse_mountinfo(text: str, expected: list[CgroupMount]) -> None:
    assert parse_mountinfo(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/545c\n1:cpu:/\n0::/\n",
            {"name=systemd": "/", "pids": "/", "memory": "/process_api/545c", "cpu": "/", "": "/"},
        ),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope\n",
            {"": "/user.slice/user-1000.slice/user@1000.service/app.slice/x.scope"},
        ),
        ("4:cpu,cpuacct:/a:b\n", {"cpu": "/a:b", "cpuacct": "/a:b"}),  # ':' in a path
        ("", {}),
    ],
)
def test_parse_proc_cgroup(text: str, expected: dict[str, str]) -> None:
    assert parse_proc_cgroup(text) == expected


@pytest.mark.parametrize(
    ("root", "path", "expected"),
    [
        ("/", "/", "/m"),
        ("/", "/a/b", "/m/a/b"),
        ("/docker/abc", "/docker/abc", "/m"),
        ("/docker/abc", "/docker/abc/sub", "/m/sub"),
        ("/docker/abc", "/docker/abcd", None),  # a sibling, not below the mounted root
        ("/docker/abc", "/", None),
    ],
)
def test_cgroup_dir(root: str, path: str, expected: str | None) -> None:
    assert cgroup_dir(CgroupMount(2, "/m", root, frozenset()), path) == expected


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [(1.0, (100_000, 100_000)), (0.5, (50_000, 100_000)), (2.5, (250_000, 100_000)),
     (0.001, (1_000, 100_000)), (0.000001, (1_000, 100_000))],
)  # fmt: skip
def test_cpu_max(fraction: float, expected: tuple[int, int]) -> None:
    assert cpu_max(fraction) == expected


@pytest.mark.parametrize("fraction", [0, -1])
def test_cpu_max_rejects_nonpositive(fraction: float) -> None:
    with pytest.raises(ValueError):
        cpu_max(fraction)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\0b"])
def test_invalid_names(name: str) -> None:
    assert not cgroups.valid_name(name)


def test_v1_memsw_written_after_memory_limit() -> None:
    writes = cgroups._v1_writes(256 << 20, 50, 0.5)
    files = [w[1] for w in writes]
    assert files.index("memory.limit_in_bytes") < files.index("memory.memsw.limit_in_bytes")
    assert ("cpu", "cpu.cfs_quota_us", "50000", False) in writes
    assert ("pids", "pids.max", "50", False) in writes


def test_v2_writes_disable_swap() -> None:
    writes = cgroups._v2_writes(1 << 30, None, 1.5)
    assert ("memory", "memory.max", str(1 << 30), False) in writes
    assert ("memory", "memory.swap.max", "0", True) in writes
    assert ("cpu", "cpu.max", "150000 100000", False) in writes
    assert not any(w[0] == "pids" for w in writes)


def test_no_cgroup_filesystem() -> None:
    capability = cgroups.probe_from("25 1 253:0 / / rw - ext4 /dev/vda rw\n", "0::/\n")
    assert not capability.enforced
    assert str(capability).startswith("none: ")


# --- fake cgroup filesystems ---------------------------------------------------

V1_FILES = {
    "memory": ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.usage_in_bytes"],
    "pids": ["pids.max", "pids.current"],
    "cpu": ["cpu.cfs_quota_us", "cpu.cfs_period_us"],
}
V2_FILES = ["memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.subtree_control"]


def _touch(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ["cgroup.procs", *names]:
        (directory / name).touch()


def _write_sources(tmp_path: Path, mountinfo: str, proc_cgroup: str) -> CgroupLimits:
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "cgroup").write_text(proc_cgroup)
    return CgroupLimits(
        mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "cgroup"), uid=1000
    )


def test_fake_v1(tmp_path: Path) -> None:
    fs = tmp_path / "fs"
    mountinfo = "".join(
        f"3{i} 1 0:{i} / {fs / c} rw - cgroup cgroup rw,{c}\n" for i, c in enumerate(V1_FILES)
    )
    limits = _write_sources(tmp_path, mountinfo, "4:memory:/svc\n3:pids:/\n2:cpu:/\n0::/\n")
    _touch(fs / "memory" / "svc", [])
    _touch(fs / "pids", [])
    _touch(fs / "cpu", [])
    for controller, files in V1_FILES.items():
        own = fs / controller / ("svc" if controller == "memory" else "")
        _touch(own / "jupyter-sandbox" / "1000" / "sb", files)

    capability = limits.probe()
    assert str(capability) == "cgroup v1: memory, pids, cpu"
    group = limits.create("sb", memory_bytes=256 << 20, max_pids=50, cpu_quota_fraction=0.5)

    sb = {
        c: fs / c / ("svc" if c == "memory" else "") / "jupyter-sandbox/1000/sb" for c in V1_FILES
    }
    assert (sb["memory"] / "memory.limit_in_bytes").read_text() == str(256 << 20)
    assert (sb["memory"] / "memory.memsw.limit_in_bytes").read_text() == str(256 << 20)
    assert (sb["pids"] / "pids.max").read_text() == "50"
    assert (sb["cpu"] / "cpu.cfs_quota_us").read_text() == "50000"
    assert (sb["cpu"] / "cpu.cfs_period_us").read_text() == "100000"
    assert group.procs_files == sorted(str(d / "cgroup.procs") for d in sb.values())
    group.enter()
    assert all(Path(p).read_text() == "0" for p in group.procs_files)
    assert limits.sandboxes() == ["sb"]


def test_fake_v1_without_memsw(tmp_path: Path) -> None:
    """Kernels without swap accounting have no memsw file: the limit is still written."""
    fs = tmp_path / "fs"
    limits = _write_sources(
        tmp_path, f"35 1 0:3 / {fs} rw - cgroup cgroup rw,memory\n", "4:memory:/\n"
    )
    _touch(fs, [])
    _touch(fs / "jupyter-sandbox/1000/sb", ["memory.limit_in_bytes"])
    assert str(limits.probe()) == "cgroup v1: memory"
    limits.create("sb", memory_bytes=1 << 30)
    assert (fs / "jupyter-sandbox/1000/sb/memory.limit_in_bytes").read_text() == str(1 << 30)
    with pytest.raises(cgroups.CgroupError, match="cannot limit pids"):
        limits.create("sb", max_pids=10)


def _fake_v2(tmp_path: Path, controllers: str) -> tuple[CgroupLimits, Path]:
    fs = tmp_path / "fs"
    scope = "user.slice/user@1000.service/app.slice/jsbx.scope"
    limits = _write_sources(
        tmp_path, f"35 1 0:30 / {fs} rw - cgroup2 cgroup2 rw\n", f"0::/{scope}\n"
    )
    own = fs / scope
    _touch(own, ["cgroup.subtree_control"])
    (own / "cgroup.controllers").write_text(controllers + "\n")
    (own / "cgroup.procs").write_text("4242\n")
    _touch(own / "daemon", [])
    for directory in ("jupyter-sandbox", "jupyter-sandbox/1000"):
        _touch(own / directory, ["cgroup.subtree_control"])
    _touch(own / "jupyter-sandbox/1000/sb", V2_FILES)
    return limits, own


def test_fake_v2_delegated(tmp_path: Path) -> None:
    limits, own = _fake_v2(tmp_path, "cpuset cpu io memory pids")
    capability = limits.probe()
    assert str(capability) == "cgroup v2: memory, pids, cpu"
    group = limits.create("sb", memory_bytes=512 << 20, max_pids=64, cpu_quota_fraction=2)

    # The daemon left its cgroup for a leaf, then controllers were passed down.
    assert (own / "daemon/cgroup.procs").read_text() == "4242"
    for directory in (own, own / "jupyter-sandbox", own / "jupyter-sandbox/1000"):
        assert (directory / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    sb = own / "jupyter-sandbox/1000/sb"
    assert (sb / "memory.max").read_text() == str(512 << 20)
    assert (sb / "memory.swap.max").read_text() == "0"
    assert (sb / "pids.max").read_text() == "64"
    assert (sb / "cpu.max").read_text() == "200000 100000"
    assert group.procs_files == [str(sb / "cgroup.procs")]


def test_fake_v2_without_controllers(tmp_path: Path) -> None:
    limits, _ = _fake_v2(tmp_path, "hugetlb")
    capability = limits.probe()
    assert not capability.enforced
    assert "no memory, pids or cpu controller" in str(capability)
    with pytest.raises(cgroups.CgroupError):
        limits.create("sb", memory_bytes=1 << 30)


def test_v1_preferred_when_v2_is_empty(tmp_path: Path) -> None:
    """This machine's layout: controllers are in v1, the cgroup2 mount has none of them."""
    fs = tmp_path / "fs"
    mountinfo = (
        f"35 1 0:3 / {fs / 'memory'} rw - cgroup cgroup rw,memory\n"
        f"41 1 0:4 / {fs / 'unified'} rw - cgroup2 cgroup2 rw\n"
    )
    limits = _write_sources(tmp_path, mountinfo, "4:memory:/\n0::/\n")
    _touch(fs / "memory", [])
    _touch(fs / "unified", ["cgroup.subtree_control"])
    (fs / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    assert str(limits.probe()) == "cgroup v1: memory"


def test_remove_stale_keeps_live_and_wanted_groups(tmp_path: Path) -> None:
    fs = tmp_path / "fs"
    limits = _write_sources(tmp_path, f"39 1 0:3 / {fs} rw - cgroup cgroup rw,pids\n", "8:pids:/\n")
    _touch(fs, [])
    parent = fs / "jupyter-sandbox" / "1000"
    for name in ("stale", "kept"):
        (parent / name).mkdir(parents=True)  # empty: what rmdir of a real cgroup sees
    _touch(parent / "busy", [])
    (parent / "busy" / "cgroup.procs").write_text(f"{2**22 + 1}\n")  # no such pid
    assert limits.sandboxes() == ["busy", "kept", "stale"]
    assert limits.remove_stale(keep=["kept"]) == ["stale"]
    assert limits.sandboxes() == ["busy", "kept"]
    limits.remove_parents()  # not empty: nothing removed
    assert parent.is_dir()
